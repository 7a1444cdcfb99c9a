"""pytest plugin registered through the ``pytest11`` entry point of the core.

It is loaded in every pytest run where servehall is installed; it only defines fixtures
and helpers that a test asks for by name, so it costs nothing otherwise.
"""
