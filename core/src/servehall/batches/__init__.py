"""Batches (OpenAI's ``/v1/batches``): their rows and lines in the records database
(``store``), the owner's identity as stored (``principals``), the in-process call that
carries it into the request path (``call``), the output-file line format (``lines``) and
the runner each serve process starts (``runner``). The HTTP routes are
:mod:`servehall.api.batches`."""
