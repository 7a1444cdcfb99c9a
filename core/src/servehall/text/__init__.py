"""Text handling on the request path: tokenizer loading, chat templates, incremental
detokenization and stop-string matching."""

from servehall.text.detokenize import IncrementalDetokenizer
from servehall.text.stops import StopMatcher
from servehall.text.tokenizer import TextTokenizer, load_tokenizer

__all__ = ["IncrementalDetokenizer", "StopMatcher", "TextTokenizer", "load_tokenizer"]
