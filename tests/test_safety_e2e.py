"""End-to-end tests of the safety-filter plugin against real ``servehall serve`` processes
(Hypercorn, HTTP/2 via httpx, the demo model under greedy decoding).

* ``plain`` server: safety_filter with input rules only. Input block (400
  ``content_filter`` naming the rule, never the matched text), input redaction the model
  really receives (echo, prompt tokens and the greedy completion equal those of the
  literally redacted prompt), and the unfiltered greedy baseline for the output tests.
* ``tenants`` server: auth + safety_filter, API keys made with the real CLI in a real
  SQLite file, SQL request log. Per-tenant policies: ``team-word`` blocks a word the demo
  model really produces (found from the baseline at test time), ``team-phrase`` blocks a
  two-word phrase that the baseline stream splits across SSE chunks, ``team-trial`` runs
  the word rule in monitor mode, any other tenant gets the default (no output rules).
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServerHandle, demo_config, dump_toml, run_cli

PROMPT = "Tell me a story about a cat."
MAX_TOKENS = 40
PEPPER = "safety-e2e-pepper-0123456789abcdef"


# --- helpers ---------------------------------------------------------------------------


def client(server: ServerHandle) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, http1=False, http2=True, timeout=120.0)


def chat_body(stream: bool, content: str = PROMPT) -> dict[str, Any]:
    return {
        "model": "demo",
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
        # always MAX_TOKENS of text to derive the rules from: the demo weights (and so
        # where the greedy answer ends) differ between CPUs
        "ignore_eos": True,
    }


@dataclass
class Streamed:
    deltas: list[str]
    finish_reason: str | None
    raw_lines: list[str]

    @property
    def text(self) -> str:
        return "".join(self.deltas)


def stream_chat(c: httpx.Client, headers: dict[str, str] | None = None) -> Streamed:
    """POST a streaming chat completion; collect content deltas, finish reason, lines."""
    deltas: list[str] = []
    finish: str | None = None
    lines: list[str] = []
    with c.stream("POST", "/v1/chat/completions", json=chat_body(True), headers=headers) as r:
        assert r.status_code == 200, r.read()
        assert r.http_version == "HTTP/2"
        for line in r.iter_lines():
            if not line.strip():
                continue
            lines.append(line)
            assert line.startswith("data: ")
            data = line[len("data: ") :]
            if data == "[DONE]":
                continue
            event = json.loads(data)
            for ch in event.get("choices", []):
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    deltas.append(piece)
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
    return Streamed(deltas, finish, lines)


def complete_chat(c: httpx.Client, headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = c.post("/v1/chat/completions", json=chat_body(False), headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def first_word_at(text: str, word: str) -> int:
    """Start of the first whole-word, case-insensitive occurrence of ``word``."""
    m = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.IGNORECASE)
    assert m is not None
    return m.start()


@dataclass
class Baseline:
    """The unfiltered greedy output of :data:`PROMPT` and the rules derived from it."""

    stream: Streamed
    completion: dict[str, Any]
    word: str  # a word the model produces, first seen after some text
    phrase: str  # two words whose first occurrence crosses an SSE chunk boundary


VERDICT_WORDS = frozenset(
    {"rule", "action", "block", "stage", "output", "count", "monitor", "true", "false", "null"}
    | {"demo", "word", "phrase"}
)
"""Words of a stored verdict's own JSON (keys, values, rule names): a rule word among them
would be found in the verdicts without the matched text being stored."""


def derive_rules(s: Streamed) -> tuple[str, str]:
    text = s.text
    boundaries = set()
    pos = 0
    for d in s.deltas[:-1]:
        pos += len(d)
        boundaries.add(pos)
    words = list(re.finditer(r"[A-Za-z]{4,}", text))
    word = next(
        m.group()
        for m in words
        if m.start() >= 10
        and first_word_at(text, m.group()) >= 10
        and m.group().lower() not in VERDICT_WORDS
    )
    phrase = ""
    for a, b in itertools.pairwise(re.finditer(r"[A-Za-z]{3,}", text)):
        candidate = text[a.start() : b.end()]
        if not re.fullmatch(r"[A-Za-z]+ [A-Za-z]+", candidate) or word.lower() in candidate.lower():
            continue
        start = first_word_at(text, candidate)
        if start >= 10 and any(start < x < start + len(candidate) for x in boundaries):
            phrase = candidate
            break
    assert phrase, f"no two-word phrase crossing a chunk boundary in {s.deltas!r}"
    return word, phrase


def cli(config: Path, *args: str) -> str:
    """Run the real ``servehall`` CLI; return stdout."""
    proc = run_cli(config, *args, cwd=config.parent)
    assert proc.returncode == 0, f"servehall {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def request_log(db: Path, n: int, timeout: float = 15.0) -> list[dict[str, Any]]:
    """Rows of request_log (newest last), polling until at least ``n`` exist."""
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            conn.row_factory = sqlite3.Row
            rows = [dict(r) for r in conn.execute("SELECT * FROM request_log ORDER BY rowid")]
        if len(rows) >= n:
            return rows
        time.sleep(0.25)
    return rows


# --- servers ---------------------------------------------------------------------------

INPUT_RULES = [
    {"name": "no-magic-words", "keywords": ["xyzzy", "open sesame"], "stages": ["input"]},
    {"name": "pii-email", "detector": "email", "action": "redact", "stages": ["input"]},
    {"name": "pii-card", "detector": "payment_card", "action": "redact", "stages": ["input"]},
]


def per_step(cfg: dict[str, Any]) -> None:
    """One step message per engine step (``worker.stream_interval_s = 0``): these tests
    need streams of many small chunks (phrases split across chunk boundaries), which the
    default 20 ms interval merges on the fast demo model."""
    cfg["models"][0]["worker"] = {"stream_interval_s": 0}


@pytest.fixture(scope="module")
def plain(servehall_server: Any, demo_model_dir: Path) -> Iterator[ServerHandle]:
    cfg = demo_config(
        demo_model_dir,
        plugins={"enabled": ["safety_filter"]},
        safety_filter={"rules": INPUT_RULES},
    )
    per_step(cfg)
    with servehall_server(cfg, name="safety-plain") as srv:
        yield srv


@pytest.fixture(scope="module")
def baseline(plain: ServerHandle) -> Baseline:
    # The server coalesces deltas that arrive while the client is behind (a loaded machine
    # sends fewer, longer chunks), so look at a few streams for one whose chunk boundary
    # splits a two-word phrase; greedy output is the same text every time.
    with client(plain) as c:
        completion = complete_chat(c)
        for _ in range(8):
            s = stream_chat(c)
            assert completion["choices"][0]["message"]["content"] == s.text  # greedy
            try:
                word, phrase = derive_rules(s)
            except AssertionError:
                continue
            return Baseline(s, completion, word, phrase)
    word, phrase = derive_rules(s)  # raises with the last stream's chunks
    return Baseline(s, completion, word, phrase)


@dataclass
class Tenants:
    server: ServerHandle
    db: Path
    keys: dict[str, str]

    def auth(self, team: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[team]}"}


@pytest.fixture(scope="module")
def tenants(
    servehall_server: Any,
    demo_model_dir: Path,
    baseline: Baseline,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Tenants]:
    work = tmp_path_factory.mktemp("safety-tenants")
    db = work / "servehall.db"
    cfg = demo_config(
        demo_model_dir,
        plugins={"enabled": ["auth", "safety_filter"]},
        database={"url": f"sqlite+aiosqlite:///{db}"},
        sinks=[{"name": "sql", "options": {"linger_s": 0.05}}],
        auth={"pepper": PEPPER, "key_cache_ttl_s": 0},
        safety_filter={
            "default_policy": "open",
            "tenant_policies": {
                "team-word": "word",
                "team-phrase": "phrase",
                "team-trial": "trial",
            },
            "rules": [
                {"name": "demo-word", "keywords": [baseline.word], "stages": ["output"]},
                {"name": "demo-phrase", "keywords": [baseline.phrase], "stages": ["output"]},
            ],
            "policies": {
                "open": {"rules": []},
                "word": {"rules": ["demo-word"]},
                "phrase": {"rules": ["demo-phrase"]},
                "trial": {"rules": ["demo-word"], "mode": "monitor"},
            },
        },
    )
    per_step(cfg)
    config = work / "deploy.toml"
    config.write_text(dump_toml(cfg))
    cli(config, "db", "upgrade")
    keys = {}
    for team in ("team-word", "team-phrase", "team-trial", "team-other"):
        out = cli(config, "keys", "create", "--tenant", team, "--json")
        keys[team] = json.loads(out)["key"]
    out = cli(config, "keys", "create", "--tenant", "ops", "--scopes", "inference,admin", "--json")
    keys["ops"] = json.loads(out)["key"]
    with servehall_server(config.read_text(), name="safety-tenants") as srv:
        yield Tenants(srv, db, keys)


# --- input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    ["please say XYZZY", "say ＯＰＥＮ\u200b  sesame now", "x\u200by\u200bz\u200bz\u200by"],
)
def test_input_block(plain: ServerHandle, content: str) -> None:
    with client(plain) as c:
        r = c.post("/v1/chat/completions", json=chat_body(False, content))
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == "content_filter"
        assert err["type"] == "invalid_request_error"
        assert "no-magic-words" in err["message"]
        for secret in ("xyzzy", "XYZZY", "sesame", "ＯＰＥＮ"):
            assert secret not in r.text
        # streaming requests are refused the same way, before any SSE
        r = c.post("/v1/chat/completions", json=chat_body(True, content))
        assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter"


def test_input_redaction_is_what_the_model_receives(plain: ServerHandle) -> None:
    raw = "Mail Jane.Doe@Example.com, card 4111 1111 1111 1111. Then"
    redacted = "Mail [EMAIL], card [CARD]. Then"
    with client(plain) as c:

        def complete(prompt: str) -> dict[str, Any]:
            r = c.post(
                "/v1/completions",
                json={
                    "model": "demo",
                    "prompt": prompt,
                    "max_tokens": 8,
                    "temperature": 0,
                    "echo": True,
                },
            )
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

        got = complete(raw)
        want = complete(redacted)  # the literal redacted prompt passes unchanged
    text = got["choices"][0]["text"]
    assert text.startswith(redacted)
    assert "Jane" not in text and "4111" not in text
    assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
    assert text == want["choices"][0]["text"]  # same tokens in, same greedy tokens out


def test_input_redaction_in_chat_messages(plain: ServerHandle) -> None:
    def ask(c: httpx.Client, system: str, user: str) -> dict[str, Any]:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": user}]},
        ]
        body = {"model": "demo", "temperature": 0, "max_tokens": 6, "messages": messages}
        answer: dict[str, Any] = c.post("/v1/chat/completions", json=body).json()
        return answer

    with client(plain) as c:
        a = ask(c, "Write to ops@corp.example", "me: a@b.io")
        b = ask(c, "Write to [EMAIL]", "me: [EMAIL]")
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    assert a["choices"][0]["message"] == b["choices"][0]["message"]


# --- output ----------------------------------------------------------------------------


def test_baseline_is_unfiltered_and_contains_the_rules(baseline: Baseline) -> None:
    text = baseline.stream.text
    assert baseline.stream.finish_reason == "length"
    assert baseline.word.lower() in text.lower() and baseline.phrase in text


def test_output_block_streaming(tenants: Tenants, baseline: Baseline) -> None:
    with client(tenants.server) as c:
        s = stream_chat(c, tenants.auth("team-word"))
    prefix = baseline.stream.text[: first_word_at(baseline.stream.text, baseline.word)]
    assert s.text == prefix  # everything before the word, nothing of it
    assert baseline.word.lower() not in s.text.lower()
    assert s.finish_reason == "content_filter"
    assert s.raw_lines[-1] == "data: [DONE]"
    last = json.loads(s.raw_lines[-2][len("data: ") :])
    assert last["choices"][0]["finish_reason"] == "content_filter"


def test_output_block_non_streaming(tenants: Tenants, baseline: Baseline) -> None:
    with client(tenants.server) as c:
        body = complete_chat(c, tenants.auth("team-word"))
        # the same request with room for 1500 tokens that EOS cannot end: unaborted, the
        # engine would report exactly 1500; the block aborts it right after the word (a
        # 40-token limit could be reached before the abort lands on a loaded machine)
        r = c.post(
            "/v1/chat/completions",
            json={**chat_body(False), "max_tokens": 1500, "ignore_eos": True},
            headers=tenants.auth("team-word"),
        )
        assert r.status_code == 200, r.text
        long = r.json()
    text = baseline.stream.text
    for b in (body, long):
        choice = b["choices"][0]
        assert choice["finish_reason"] == "content_filter"
        assert choice["message"]["content"] == text[: first_word_at(text, baseline.word)]
    assert long["usage"]["completion_tokens"] < 1500


def greedy_tokens_within(c: httpx.Client, chars: int) -> int:
    """The tokens of the unfiltered greedy output whose text lies within its first
    ``chars`` characters: the largest ``k`` whose ``max_tokens: k`` output is no longer
    (greedy: every output is a prefix of the longest)."""
    lo, hi = 0, MAX_TOKENS
    while lo < hi:
        mid = (lo + hi + 1) // 2
        r = c.post("/v1/chat/completions", json={**chat_body(False), "max_tokens": mid})
        assert r.status_code == 200, r.text
        if len(r.json()["choices"][0]["message"]["content"]) <= chars:
            lo = mid
        else:
            hi = mid - 1
    return lo


def test_blocked_usage_is_the_text_sent_streamed_and_not(
    tenants: Tenants, plain: ServerHandle, baseline: Baseline
) -> None:
    """Issue 33: on a block, ``usage.completion_tokens`` (and the request log) counts the
    tokens of the text sent, however the worker merged steps: identical streamed and not,
    and for a request that could have run to 1500 tokens."""
    text = baseline.stream.text
    cut = first_word_at(text, baseline.word)
    with client(plain) as c:
        expected = greedy_tokens_within(c, cut)
    assert 0 < expected < MAX_TOKENS
    headers = tenants.auth("team-word")
    counts: list[int] = []
    with client(tenants.server) as c:
        before = len(request_log(tenants.db, 0))
        for _ in range(3):
            body = {**chat_body(True), "stream_options": {"include_usage": True}}
            usage = None
            with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        usage = json.loads(line[6:]).get("usage") or usage
            assert usage is not None
            counts.append(usage["completion_tokens"])
            for extra in ({}, {"max_tokens": 1500}):
                r = c.post(
                    "/v1/chat/completions", json={**chat_body(False), **extra}, headers=headers
                )
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["finish_reason"] == "content_filter"
                counts.append(r.json()["usage"]["completion_tokens"])
    assert counts == [expected] * len(counts), (counts, expected)
    rows = request_log(tenants.db, before + len(counts))[before:]
    logged = [r["completion_tokens"] for r in rows if r["tenant"] == "team-word"]
    assert logged == [expected] * len(counts), logged


def test_output_phrase_split_across_chunks(tenants: Tenants, baseline: Baseline) -> None:
    text = baseline.stream.text
    start = first_word_at(text, baseline.phrase)
    with client(tenants.server) as c:
        s = stream_chat(c, tenants.auth("team-phrase"))
        body = complete_chat(c, tenants.auth("team-phrase"))
    assert s.text == text[:start] and s.finish_reason == "content_filter"
    assert s.raw_lines[-1] == "data: [DONE]"
    assert body["choices"][0]["message"]["content"] == text[:start]
    assert body["choices"][0]["finish_reason"] == "content_filter"


def test_monitor_mode_and_default_policy_pass_output(tenants: Tenants, baseline: Baseline) -> None:
    with client(tenants.server) as c:
        for team in ("team-trial", "team-other"):
            s = stream_chat(c, tenants.auth(team))
            assert s.text == baseline.stream.text, team
            assert s.finish_reason == "length"
            body = complete_chat(c, tenants.auth(team))
            assert body["choices"][0]["message"]["content"] == baseline.stream.text


def test_verdicts_are_in_the_request_log(tenants: Tenants, baseline: Baseline) -> None:
    with client(tenants.server) as c:
        before = len(request_log(tenants.db, 0))
        complete_chat(c, tenants.auth("team-word"))
        complete_chat(c, tenants.auth("team-trial"))
        complete_chat(c, tenants.auth("team-other"))
    rows = request_log(tenants.db, before + 3)[before:]
    by_tenant = {r["tenant"]: r for r in rows}
    assert set(by_tenant) >= {"team-word", "team-trial", "team-other"}

    def verdicts(team: str) -> list[dict[str, Any]]:
        v = by_tenant[team]["filter_verdicts"]
        return json.loads(v) if isinstance(v, str) else list(v)

    assert by_tenant["team-word"]["finish_reason"] == "content_filter"
    assert verdicts("team-word") == [
        {"rule": "demo-word", "action": "block", "stage": "output", "count": 1, "monitor": False}
    ]
    assert by_tenant["team-trial"]["finish_reason"] == "length"
    trial = verdicts("team-trial")
    assert trial and all(
        v["rule"] == "demo-word" and v["action"] == "block" and v["monitor"] for v in trial
    )
    n = len(re.findall(rf"(?<!\w){re.escape(baseline.word)}(?!\w)", baseline.stream.text, re.I))
    assert sum(v["count"] for v in trial) == n
    assert verdicts("team-other") == []
    # never the matched text
    for r in rows:
        assert baseline.word.lower() not in json.dumps(r["filter_verdicts"]).lower()


def test_block_counts_reach_metrics(tenants: Tenants) -> None:
    def blocks(c: httpx.Client) -> float:
        r = c.get("/metrics", headers=tenants.auth("ops"))
        assert r.status_code == 200, r.text
        for line in r.text.splitlines():
            if line.startswith("servehall_content_filter_blocks_total{") and (
                'rule="demo-word"' in line and 'stage="output"' in line
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    with client(tenants.server) as c:
        before = blocks(c)
        complete_chat(c, tenants.auth("team-word"))
        complete_chat(c, tenants.auth("team-trial"))  # monitored: not a block
        assert blocks(c) == before + 1
        text = c.get("/metrics", headers=tenants.auth("ops")).text
    assert 'servehall_content_filter_verdicts_total{action="block",mode="monitor"' in text


def test_every_choice_has_its_own_filter(tenants: Tenants, baseline: Baseline) -> None:
    text = baseline.stream.text
    prefix = text[: first_word_at(text, baseline.word)]
    body = {**chat_body(False), "n": 2}
    with client(tenants.server) as c:
        r = c.post("/v1/chat/completions", json=body, headers=tenants.auth("team-word"))
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        assert [ch["finish_reason"] for ch in choices] == ["content_filter"] * 2
        assert [ch["message"]["content"] for ch in choices] == [prefix] * 2
        texts = {0: "", 1: ""}
        finishes = {}
        with c.stream(
            "POST",
            "/v1/chat/completions",
            json={**body, "stream": True},
            headers=tenants.auth("team-word"),
        ) as s:
            lines = [ln for ln in s.iter_lines() if ln.strip()]
        assert lines[-1] == "data: [DONE]"
        for ln in lines[:-1]:
            for ch in json.loads(ln[len("data: ") :])["choices"]:
                texts[ch["index"]] += (ch.get("delta") or {}).get("content") or ""
                if ch.get("finish_reason"):
                    finishes[ch["index"]] = ch["finish_reason"]
    assert texts == {0: prefix, 1: prefix}
    assert finishes == {0: "content_filter", 1: "content_filter"}
