"""Compiling a :class:`~servehall.StructuredConstraint` with xgrammar (engine side).

One xgrammar line serves every engine that compiles grammars itself: **0.1.31**, the
version OpenVINO GenAI 2026.4 links in (its 460 exported ``xgrammar::`` symbols all
match that wheel's and no other 0.1.x/0.2.x release's). An EBNF printed by a newer
xgrammar is refused by OpenVINO's parser inside ``pipeline.step()``; an EBNF printed and
re-parsed by the same version is not. So:

* :func:`constraint_ebnf` turns a constraint into an EBNF text and parses it back with
  ``xgrammar.Grammar.from_ebnf`` — the check a grammar passes *before* a request is
  queued for a step shared with other requests. JSON Schemas are converted with
  ``any_whitespace=False`` (one space after ``:`` and ``,``, none elsewhere: a weak model
  cannot spend its budget on whitespace) and ``strict_mode=True`` (no properties beyond
  the listed ones unless ``additionalProperties`` says so); a length-bounded string is
  first rewritten into a pattern over JSON-legal characters
  (:mod:`servehall.structured.json_text`: xgrammar's own bounded-string rule admits raw
  control characters). Numbers of a schema node
  are bounded by the API layer (:data:`servehall.structured.schema.NUMBER_BOUND`); the
  numbers of "any JSON" values (``{}``, ``json_object``, ``additionalProperties: true``),
  xgrammar's built-in ``basic_integer``/``basic_number`` rules, get the same digit cap
  here (:func:`bound_any_numbers`);
* :class:`GrammarCache` keeps the results per model in a bounded LRU (by constraint),
  counting hits, misses and compile seconds (``servehall bench`` and the metrics read
  them).

xgrammar (which imports torch) is imported on the first constrained request only.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from servehall.engines.contract import (
    GRAMMAR_COMPILE_BUCKETS,
    GrammarStats,
    StructuredConstraint,
    TokenDelta,
)
from servehall.structured.json_text import json_safe_lengths, json_safe_schema_text

T = TypeVar("T")

XGRAMMAR_VERSION = "0.1.31"
"""The xgrammar release whose EBNF dialect OpenVINO GenAI 2026.4 parses."""


class GrammarError(ValueError):
    """A constraint the grammar backend cannot compile (the request gets a 400)."""


def _quote(text: str) -> str:
    """An EBNF string literal (JSON escaping is the xgrammar dialect's)."""
    return json.dumps(text, ensure_ascii=False)


def constraint_ebnf(c: StructuredConstraint) -> str:
    """The EBNF text (root rule ``root``) of ``c``, checked by xgrammar's parser.

    Raises:
        GrammarError: the schema, regex or grammar does not compile; the message is
            xgrammar's first line.
    """
    import xgrammar as xgr

    try:
        if c.json_schema is not None:
            grammar = xgr.Grammar.from_json_schema(
                json_safe_schema_text(c.json_schema),
                any_whitespace=c.any_whitespace,
                strict_mode=True,
            )
        elif c.regex is not None:
            grammar = xgr.Grammar.from_regex(c.regex)
        elif c.choice is not None:
            grammar = xgr.Grammar.from_ebnf("root ::= " + " | ".join(map(_quote, c.choice)))
        elif c.grammar is not None:
            grammar = xgr.Grammar.from_ebnf(c.grammar)
        elif c.structural_tag is not None:
            grammar = _triggered_tags_grammar(xgr, c.structural_tag)
        else:
            raise GrammarError("the constraint is empty")
        text = str(grammar)
        if c.json_schema is not None or c.structural_tag is not None:
            text = bound_any_numbers(text)
        text = str(xgr.Grammar.from_ebnf(text))  # what the engine's own parser will read
    except GrammarError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GrammarError(first) from None
    return text


INTEGER_DIGITS = 15
"""Most digits of an "any JSON" number's integer part (as ``NUMBER_BOUND``'s 15)."""
FRACTION_DIGITS = 6
"""Most fraction digits of an "any JSON" number (xgrammar's own cap for ranged numbers)."""
EXPONENT_DIGITS = 3
"""Most exponent digits of an "any JSON" number."""

#: xgrammar 0.1.31's printed rules for the digits of "any JSON" numbers → bounded ones.
_ANY_NUMBER_RULES: dict[str, str] = {
    "basic_integer": f'(("0") | (basic_integer_1 [1-9] [0-9]{{0,{INTEGER_DIGITS - 1}}}))',
    "basic_number_7": f'(("0") | ([1-9] [0-9]{{0,{INTEGER_DIGITS - 1}}}))',
    "basic_number_2": f"([0-9]{{1,{FRACTION_DIGITS}}})",
    "basic_number_5": f"([0-9]{{1,{EXPONENT_DIGITS}}})",
}
_UNBOUNDED_ANY_NUMBER_RULES: dict[str, str] = {
    "basic_integer": '(("0") | (basic_integer_1 [1-9] [0-9]*))',
    "basic_number_7": '(("0") | ([1-9] [0-9]*))',
    "basic_number_2": "(([0-9] basic_number_2) | ([0-9]))",
    "basic_number_5": "(([0-9] basic_number_5) | ([0-9]))",
}


def bound_any_numbers(ebnf: str) -> str:
    """``ebnf`` (printed by xgrammar 0.1.31 from a JSON Schema) with the digits of its
    built-in "any JSON" number rules capped: integer part :data:`INTEGER_DIGITS`,
    fraction :data:`FRACTION_DIGITS`, exponent :data:`EXPONENT_DIGITS`. Without a cap a
    weak model writes digits until ``max_tokens``. Only a rule printed exactly as
    xgrammar 0.1.31 prints it is replaced (a user's regex or grammar is never touched);
    ``core/tests/structured/test_request.py`` fails if a new xgrammar prints them
    differently.
    """
    lines = ebnf.splitlines()
    for i, line in enumerate(lines):
        name, sep, body = line.partition(" ::= ")
        if sep and _UNBOUNDED_ANY_NUMBER_RULES.get(name) == body:
            lines[i] = f"{name} ::= {_ANY_NUMBER_RULES[name]}"
    return "\n".join(lines) + "\n"


def _triggered_tags_grammar(xgr: Any, text: str) -> Any:
    """The grammar of a ``triggered_tags`` structural tag (JSON text, xgrammar's newer
    format: ``{"type": "structural_tag", "format": {"type": "triggered_tags", "triggers",
    "tags": [{"begin", "content": {"type": "json_schema", "json_schema"}, "end"}],
    "stop_after_first"}}``) built with xgrammar 0.1.31's ``from_structural_tag(tags,
    triggers)``, the line OpenVINO GenAI bundles.

    ``stop_after_first`` (at most one call: ``parallel_tool_calls: false``), which
    0.1.31's ``from_structural_tag`` has no argument for, is expressed in its own grammar:
    the printed ``TagDispatch`` rule gets ``loop_after_dispatch=false``, so the output ends
    once the first call's end tag is written (free text before the trigger stays free).

    Raises:
        GrammarError: another structural tag type, or ``at_least_one``.
    """
    spec = json.loads(text)
    fmt = spec.get("format", spec) if isinstance(spec, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "triggered_tags":
        raise GrammarError("only triggered_tags structural tags are supported by this engine")
    if fmt.get("at_least_one"):
        raise GrammarError("at_least_one structural tags are not supported by this engine")
    items = [
        xgr.StructuralTagItem(
            begin=t["begin"],
            schema=json.dumps(json_safe_lengths(t["content"]["json_schema"])),
            end=t["end"],
        )
        for t in fmt["tags"]
    ]
    grammar = xgr.Grammar.from_structural_tag(items, list(fmt["triggers"]))
    if not fmt.get("stop_after_first"):
        return grammar
    text = str(grammar)
    if text.count(_LOOP_AFTER_DISPATCH) != 1:  # an xgrammar that prints it differently
        raise GrammarError("at most one tool call cannot be expressed by this grammar backend")
    return xgr.Grammar.from_ebnf(text.replace(_LOOP_AFTER_DISPATCH, "loop_after_dispatch=false"))


_LOOP_AFTER_DISPATCH = "loop_after_dispatch=true"
"""How xgrammar 0.1.31 prints a ``TagDispatch`` that dispatches again after a tag."""


@dataclass
class GrammarCache(Generic[T]):
    """A bounded, thread-safe LRU of compiled constraints.

    Args:
        compile: constraint → compiled value (may raise :class:`GrammarError`; failures
            are cached too, so a bad grammar costs one compile).
        capacity: entries kept (least recently used dropped first).
    """

    compile: Callable[[StructuredConstraint], T]
    capacity: int = 256
    hits: int = 0
    misses: int = 0
    compile_seconds: list[float] = field(default_factory=list)
    compile_seconds_sum: float = 0.0
    _buckets: list[int] = field(default_factory=lambda: [0] * len(GRAMMAR_COMPILE_BUCKETS))
    _items: OrderedDict[StructuredConstraint, T | GrammarError] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, c: StructuredConstraint) -> T:
        """The compiled ``c`` (compiled now on a miss).

        Raises:
            GrammarError: ``c`` does not compile.
        """
        with self._lock:
            got = self._items.get(c)
            if got is not None:
                self._items.move_to_end(c)
                self.hits += 1
        if got is None:
            t0 = time.perf_counter()
            try:
                got = self.compile(c)
            except GrammarError as exc:
                got = exc
            seconds = time.perf_counter() - t0
            with self._lock:
                self.misses += 1
                self.compile_seconds_sum += seconds
                for i, bound in enumerate(GRAMMAR_COMPILE_BUCKETS):
                    if seconds <= bound:
                        self._buckets[i] += 1
                self.compile_seconds.append(seconds)
                del self.compile_seconds[:-4096]
                self._items[c] = got
                while len(self._items) > self.capacity:
                    self._items.popitem(last=False)
        if isinstance(got, GrammarError):
            raise got
        return got

    def stats(self) -> GrammarStats:
        """The cumulative counters (for ``Engine.stats().grammar`` and the metrics)."""
        with self._lock:
            return GrammarStats(
                self.hits, self.misses, self.compile_seconds_sum, tuple(self._buckets)
            )


def compile_then(
    cache: GrammarCache[T],
    executor: Executor,
    constraint: StructuredConstraint,
    loop: asyncio.AbstractEventLoop,
    done: Callable[[T | None, TokenDelta | None], None],
) -> None:
    """Compile ``constraint`` through ``cache`` on ``executor`` (off the event loop and
    off the engine's step thread), then call ``done(compiled, None)`` — or ``done(None,
    error_delta)`` — on ``loop``. The error delta ends the request: ``code
    "invalid_request"`` (the host answers 400) for a constraint that does not compile, a
    plain engine error when the backend itself failed. The request never reaches a step
    shared with other requests before its grammar compiled (vLLM's idea of compiling
    grammars asynchronously before scheduling)."""

    def on_loop(fut: Future[T]) -> None:
        try:
            value = fut.result()
        except GrammarError as exc:
            error = f"The constraint does not compile: {exc}"
            done(None, TokenDelta((), "error", error=error, code="invalid_request"))
            return
        except Exception as exc:  # xgrammar missing or broken: this request only
            done(None, TokenDelta((), "error", error=f"grammar backend failed: {exc}"))
            return
        done(value, None)

    future = executor.submit(cache.get, constraint)
    future.add_done_callback(lambda fut: loop.call_soon_threadsafe(on_loop, fut))
