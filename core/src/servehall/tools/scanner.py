"""An incremental scanner of tool-call JSON in model output (one character at a time),
and :class:`JsonCallStream`, the :class:`~servehall.tools.calls.ToolCallStream` that
most tool-call formats are: calls written as ``{"name": ..., "arguments": {...}}``
objects, either between tags (Hermes: ``<tool_call>…</tool_call>``) or bare at the start
of the output (Llama 3 JSON, or a JSON array of calls).

The scanner reads only what it must: strings (with escapes) and bracket depth. The
arguments are the raw text of the ``arguments`` value as the model wrote it, streamed
as it arrives: nothing is re-serialised, so the streamed fragments concatenate to the
non-streamed text exactly, the final ``}`` included (vLLM #11392/#32152 lost it by
diffing re-serialised partial JSON). Text that could still become a marker (a ``<``
that may start ``</tool_call>``) is held back until it is decided.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from servehall.tools.calls import (
    IdFactory,
    ToolCallDelta,
    ToolOutput,
    is_json_object,
    new_call_id,
)

_WS = " \t\r\n"

# scanner states
_START, _KEY_OR_END, _KEY, _COLON, _VALUE_START, _VALUE, _AFTER, _DONE, _ERROR = range(9)


class _CallScanner:
    """One call object, fed one character at a time (see the module docstring)."""

    __slots__ = (
        "args",
        "args_keys",
        "args_open",
        "args_seen",
        "depth",
        "esc",
        "in_str",
        "key",
        "kind",
        "name",
        "raw",
        "state",
    )

    def __init__(self, args_keys: tuple[str, ...]) -> None:
        self.args_keys = args_keys
        self.state = _START
        self.key = ""
        self.raw: list[str] = []  # the key or value being read
        self.depth = 0
        self.in_str = False
        self.esc = False
        self.kind = ""  # the current value: "s" string, "c" container, "l" literal
        self.name: str | None = None
        self.args: list[str] = []  # arguments text read so far
        self.args_open = False  # reading the arguments value now
        self.args_seen = False

    @property
    def in_string(self) -> bool:
        return self.state == _KEY or (self.state == _VALUE and self.in_str)

    @property
    def ended(self) -> bool:
        return self.state in (_DONE, _ERROR)

    def feed(self, ch: str) -> bool:
        """Consume ``ch``; False when it is not part of the object (the object ended
        before it, or the text is not a call object: state ``_ERROR``)."""
        st = self.state
        if st == _VALUE:
            return self._value(ch)
        if ch in _WS and st not in (_KEY, _DONE, _ERROR):
            return True
        if st == _START:
            if ch == "{":
                self.state = _KEY_OR_END
                return True
        elif st == _KEY_OR_END:
            if ch == '"':
                self.state, self.raw, self.esc = _KEY, [ch], False
                return True
            if ch == "}":
                self.state = _DONE
                return True
        elif st == _KEY:
            self.raw.append(ch)
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                try:
                    self.key = json.loads("".join(self.raw))
                except ValueError:
                    self.key = ""
                self.state = _COLON
            return True
        elif st == _COLON:
            if ch == ":":
                self.state = _VALUE_START
                return True
        elif st == _VALUE_START:
            self.state, self.raw, self.depth, self.in_str, self.esc = _VALUE, [], 0, False, False
            self.kind = "s" if ch == '"' else "c" if ch in "{[" else "l"
            self.args_open = self.key in self.args_keys and not self.args_seen
            return self._value(ch)
        elif st == _AFTER:
            if ch == ",":
                self.state = _KEY_OR_END
                return True
            if ch == "}":
                self.state = _DONE
                return True
        if st in (_DONE, _ERROR):
            return False
        self.state = _ERROR
        return False

    def _value(self, ch: str) -> bool:
        kind = self.kind
        if kind == "l" and (ch in ",}" or ch in _WS):
            self._end_value()
            return self.feed(ch)  # the terminator belongs to the object
        self.raw.append(ch)
        if self.args_open:
            self.args.append(ch)
        done = False
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
                done = kind == "s"
        elif ch == '"':
            if (kind == "s" and self.raw == ['"']) or kind == "c":
                self.in_str = True
        elif kind == "c":
            if ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                done = self.depth == 0
        if done:
            self._end_value()
        return True

    def _end_value(self) -> None:
        if self.key == "name" and self.name is None and self.kind == "s":
            try:
                name = json.loads("".join(self.raw))
            except ValueError:
                name = None
            if isinstance(name, str) and name:
                self.name = name
        if self.args_open:
            self.args_open = False
            self.args_seen = True
        self.state = _AFTER

    def finish(self) -> None:
        """The text ended: a literal value in progress ends with it."""
        if self.state == _VALUE and self.kind == "l":
            self._end_value()


@dataclass(frozen=True, slots=True)
class CallFormat:
    """How a :class:`JsonCallStream` finds calls in the output.

    Attributes:
        start: the marker that opens a call (``"<tool_call>"``), anywhere in the output;
            "" for bare calls: they open with their ``{`` and come first in the output
            (once other text appears, the rest of the output is content).
        end: the marker that closes a tagged call (``"</tool_call>"``); a bare call ends
            with its object.
        args_keys: keys whose value is the arguments (``"arguments"``, ``"parameters"``).
        skip: bare formats only: characters allowed around and between calls besides
            whitespace (``";"`` for Llama 3, ``"[,]"`` for a JSON array of calls).
    """

    start: str
    end: str = ""
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    skip: str = ""


_TEXT, _CALL, _BETWEEN, _PLAIN = range(4)


class JsonCallStream:
    """A :class:`~servehall.tools.calls.ToolCallStream` for a :class:`CallFormat`.

    Content rules (the same for every split of the text): whitespace next to a call is
    dropped, other text outside calls is content; a call that ends without naming its
    function is content as written (markers included; with a bare format the rest of
    the output is content too). A call whose name was sent stays a call even when its
    arguments end malformed (cut by ``length``): it counts in ``failed``.
    """

    def __init__(self, fmt: CallFormat, new_id: IdFactory = new_call_id) -> None:
        self.fmt = fmt
        self.new_id = new_id
        self.parsed = 0
        self.failed = 0
        self._buf = ""
        self._mode = _TEXT
        self._ws = ""  # whitespace held back from the content
        self._held = ""  # whitespace before the open call (content if it is not a call)
        self._lead = ""  # bare formats: skipped text before the first call
        self._out = ToolOutput()
        self._calls = 0
        self._scan: _CallScanner | None = None
        self._raw: list[str] = []  # the open call's text as written (for content)
        self._id: str | None = None  # the open call's id once its name was sent
        self._args_sent = 0

    # --- output ---------------------------------------------------------------------

    def _content(self, text: str) -> None:
        if not text:
            return
        body = text.rstrip(_WS)
        if body:
            self._out.content += self._ws + body
            self._ws = text[len(body) :]
        else:
            self._ws += text

    def _take(self) -> ToolOutput:
        out, self._out = self._out, ToolOutput()
        return out

    # --- calls ------------------------------------------------------------------------

    def _open(self) -> None:
        self._mode = _CALL
        self._scan = _CallScanner(self.fmt.args_keys)
        self._raw = []
        self._id = None
        self._args_sent = 0
        self._held, self._ws = self._ws, ""

    def _progress(self) -> None:
        scan = self._scan
        assert scan is not None
        if self._id is None and scan.name is not None:
            self._id = self.new_id()
            self._out.calls.append(ToolCallDelta(self._calls, "", self._id, scan.name))
        if self._id is not None and len(scan.args) > self._args_sent:
            frag = "".join(scan.args[self._args_sent :])
            self._args_sent = len(scan.args)
            self._out.calls.append(ToolCallDelta(self._calls, frag))

    def _close(self, end_marker: str = "") -> None:
        scan = self._scan
        assert scan is not None
        scan.finish()
        self._progress()
        self._scan = None
        if self._id is not None:
            if is_json_object("".join(scan.args)):
                self.parsed += 1
            else:
                self.failed += 1
            self._calls += 1
            self._lead = ""
            self._mode = _BETWEEN if not self.fmt.start else _TEXT
            return
        self.failed += 1  # not a call: the text as written is content
        self._ws = self._held
        if not self.fmt.start:
            self._content(self._lead_take())
        self._content(self.fmt.start + "".join(self._raw) + end_marker)
        self._mode = _PLAIN if not self.fmt.start else _TEXT

    # --- the machine ------------------------------------------------------------------

    def feed(self, text: str) -> ToolOutput:
        """See :meth:`servehall.tools.calls.ToolCallStream.feed`."""
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self) -> ToolOutput:
        """See :meth:`servehall.tools.calls.ToolCallStream.finish`."""
        self._run(final=True)
        if self._mode == _CALL:
            self._close()
        self._content(self._lead_take() + self._buf)
        self._buf = ""
        if self._calls == 0:
            self._out.content += self._ws
        self._ws = ""
        return self._take()

    def _lead_take(self) -> str:
        lead, self._lead = self._lead, ""
        return lead

    def _run(self, final: bool) -> None:
        fmt = self.fmt
        buf = self._buf
        i, n = 0, len(buf)
        while i < n:
            mode = self._mode
            if mode == _CALL:
                scan = self._scan
                assert scan is not None
                ch = buf[i]
                if fmt.end and ch == fmt.end[0] and not scan.in_string:
                    head = buf[i : i + len(fmt.end)]
                    if head == fmt.end:
                        i += len(fmt.end)
                        self._close(fmt.end)
                        continue
                    if fmt.end.startswith(head) and not final:
                        break  # maybe the end marker: wait for more text
                if scan.feed(ch):
                    self._raw.append(ch)
                    i += 1
                    if self._id is None:
                        self._progress()  # the name goes out as soon as it is known
                    if scan.ended and not fmt.end:
                        self._close()
                elif not fmt.end:
                    self._close()  # a bare call ends where its object does
                else:
                    self._raw.append(ch)  # tagged: dropped up to the end marker
                    i += 1
            elif mode == _PLAIN:
                self._content(buf[i:])
                i = n
            elif fmt.start:  # tagged: look for the start marker
                j = buf.find(fmt.start[0], i)
                if j < 0:
                    self._content(buf[i:])
                    i = n
                    continue
                self._content(buf[i:j])
                i = j
                head = buf[i : i + len(fmt.start)]
                if head == fmt.start:
                    i += len(fmt.start)
                    self._open()
                elif fmt.start.startswith(head) and not final:
                    break  # maybe the start marker: wait for more text
                else:
                    self._content(buf[i])
                    i += 1
            else:  # bare calls: before the first call or between calls
                ch = buf[i]
                if ch == "{":
                    self._open()
                elif ch in _WS or ch in fmt.skip:
                    if mode == _TEXT:
                        self._lead += ch
                    i += 1
                else:
                    self._mode = _PLAIN
                    self._content(self._lead_take())
        self._buf = buf[i:]
        if self._scan is not None:
            self._progress()  # one arguments fragment per feed
