"""Uploaded files (OpenAI's ``/v1/files``): where their contents are kept (``store``),
their metadata in the records database (``catalog``), the check of a batch input file
(``validate``). The HTTP routes are :mod:`servehall.api.files`."""
