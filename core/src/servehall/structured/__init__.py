"""Structured output: request fields → a checked :class:`~servehall.StructuredConstraint`
(:mod:`.request`, :mod:`.schema`), and the xgrammar compile path engines share
(:mod:`.grammar`)."""

from servehall.structured.grammar import GrammarCache, GrammarError, constraint_ebnf
from servehall.structured.request import StructuredRequest, structured_request
from servehall.structured.schema import check_json_schema

__all__ = [
    "GrammarCache",
    "GrammarError",
    "StructuredRequest",
    "check_json_schema",
    "constraint_ebnf",
    "structured_request",
]
