"""``/v1/batches`` against a real ``servehall serve`` (Hypercorn, HTTP/2, the demo model)
with the auth plugin and a SQLite records database, driven by the official ``openai``
client: a chat batch with plain, tool, json_schema and invalid lines runs to
``completed``; the output and error files hold every ``custom_id`` exactly once; each
result equals the answer of the same body sent online (temperature 0); every line that
ran left a request record naming the batch and its ``custom_id``; cancel stops the
batch; another principal's batch is a 404; bad creates are 400/404 envelopes; create and
cancel are audit events. Last, a server killed with SIGKILL mid-batch and started again
finishes the batch with no ``custom_id`` twice.
"""

from __future__ import annotations

import concurrent.futures
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import KeyedServer, create_keys, keyed_demo_config, run_cli

PEPPER = "batches-pepper-" + uuid.uuid4().hex
PEPPER_ENV = "SERVEHALL_E2E_BATCHES_PEPPER"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 16}},
    "required": ["answer"],
    "additionalProperties": False,
}
WORDS = ["cat", "river", "blue", "seven", "moon", "tree", "salt", "iron", "wind", "song"]


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "max_tokens": 8,
        **extra,
    }


def chat_bodies() -> dict[str, dict[str, Any]]:
    """``custom_id`` → body: plain chats, a tool line, json_schema lines and invalid
    lines (an unknown model, a bad max_tokens, a broken schema)."""
    bodies = {f"plain-{i}": chat(f"Tell me about the {w} {i}") for i, w in enumerate(WORDS * 2)}
    bodies["tool-forced"] = chat(
        "What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=24,
    )
    bodies["tool-auto"] = chat("What is the weather in Rome?", tools=[WEATHER])
    for i in range(2):
        bodies[f"schema-{i}"] = chat(
            f"Answer in JSON {i}",
            max_tokens=24,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": SCHEMA, "strict": True},
            },
        )
    bodies["bad-model"] = {**chat("hi"), "model": "no-such-model"}
    bodies["bad-max-tokens"] = chat("hi", max_tokens=-3)
    bodies["bad-schema"] = chat(
        "hi",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": {"type": "nope"}},
        },
    )
    bodies["bad-messages"] = {"model": "demo", "messages": "not a list", "temperature": 0}
    return bodies


def jsonl(url: str, bodies: dict[str, dict[str, Any]]) -> bytes:
    return "".join(
        json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": b}) + "\n"
        for cid, b in bodies.items()
    ).encode()


Batches = KeyedServer
"""The running server, its database file, its config file and three principals' keys."""


def make_config(
    work: Path, model_dir: Path, scheduler: dict[str, Any] | None = None, **batches: Any
) -> tuple[Path, Callable[..., str], Path]:
    """A migrated demo deployment with the auth plugin and ``[batches]`` (polled every
    0.1 s, then ``batches``): ``(config file, cli, SQLite file)``."""
    extra = {"scheduler": scheduler} if scheduler else {}
    return keyed_demo_config(
        work,
        model_dir,
        PEPPER_ENV,
        PEPPER,
        **extra,
        files={"dir": str(work / "store")},
        batches={"poll_s": 0.1, **batches},
    )


@pytest.fixture(scope="module")
def batches(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Batches]:
    work = tmp_path_factory.mktemp("batches")
    config, cli, db = make_config(work, demo_model_dir, max_concurrent_lines=4)
    keys = create_keys(cli, alice=(), bob=(), admin_only=("admin",))
    with servehall_server(config.read_text(), env={PEPPER_ENV: PEPPER}, name="batches") as server:
        yield Batches(server, db, keys, config, timeout=120)


def submit(client: openai.OpenAI, data: bytes, endpoint: str, tmp_path: Path) -> Any:
    path = tmp_path / f"in-{uuid.uuid4().hex[:6]}.jsonl"
    path.write_bytes(data)
    with path.open("rb") as f:
        made = client.files.create(file=f, purpose="batch")
    return client.batches.create(
        input_file_id=made.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        metadata={"job": "e2e"},
    )


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = client.batches.retrieve(batch_id)
        if got.status in ("completed", "failed", "expired", "cancelled"):
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.3)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).read().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def comparable(status: int, body: Any) -> Any:
    """What must match between a batch result and the online answer: the status and
    the choices (tool call ids and the response id/created differ), or the error code."""
    if status != 200:
        return status, body["error"]["code"], body["error"]["param"]
    choices = []
    for c in body["choices"]:
        msg = dict(c.get("message") or {})
        calls = [
            {"type": t["type"], "function": t["function"]}
            for t in msg.pop("tool_calls", None) or []
        ]
        choices.append((c.get("finish_reason"), msg.get("content"), calls, c.get("text")))
    return status, choices, body["usage"]


def test_chat_batch_matches_online(batches: Batches, tmp_path: Path) -> None:
    client = batches.openai("alice")
    bodies = chat_bodies()
    bodies["stream"] = chat("hello", stream=True)
    batch = submit(client, jsonl("/v1/chat/completions", bodies), "/v1/chat/completions", tmp_path)
    assert batch.status == "validating" and batch.id.startswith("batch_")
    assert batch.endpoint == "/v1/chat/completions" and batch.completion_window == "24h"
    assert batch.metadata == {"job": "e2e"} and batch.request_counts.total == len(bodies)
    assert batch.expires_at is not None and batch.expires_at - batch.created_at == 24 * 3600
    done = wait_done(client, batch.id)
    assert done.status == "completed", done
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = lines_of(client, done.output_file_id)
    err = lines_of(client, done.error_file_id)
    ids = [x["custom_id"] for x in out + err]
    assert sorted(ids) == sorted(bodies), "every custom_id exactly once"
    assert done.request_counts.total == len(bodies)
    assert done.request_counts.completed == len(out)
    assert done.request_counts.failed == len(err)
    bad = {"bad-model", "bad-max-tokens", "bad-schema", "bad-messages", "stream"}
    assert bad <= {x["custom_id"] for x in err}
    assert {f"plain-{i}" for i in range(20)} <= {x["custom_id"] for x in out}
    for x in out:
        assert set(x) == {"id", "custom_id", "response", "error"} and x["error"] is None
        assert x["id"].startswith("batch_req_") and x["response"]["status_code"] == 200
        assert x["response"]["request_id"] == x["response"]["body"]["id"]
    for x in err:
        assert set(x["error"]) == {"code", "message"} and x["error"]["code"]
    stream_line = next(x for x in err if x["custom_id"] == "stream")
    assert stream_line["response"] is None
    schema_line = next(x for x in out + err if x["custom_id"] == "schema-0")
    if schema_line["response"]["status_code"] == 200:
        json.loads(schema_line["response"]["body"]["choices"][0]["message"]["content"])
    meta = client.files.retrieve(done.output_file_id)
    assert meta.purpose == "batch_output"

    # the same bodies sent online by the same principal give the same answers
    ran = {x["custom_id"]: x for x in out + err if x["response"] is not None}
    with batches.http("alice") as c:
        for cid, line in ran.items():
            r = c.post("/v1/chat/completions", json=bodies[cid])
            got = line["response"]
            assert comparable(got["status_code"], got["body"]) == comparable(
                r.status_code, r.json()
            ), cid

    # one request record per line that ran, naming the batch and the line
    deadline = time.monotonic() + 15
    while True:
        rows = batches.rows(
            "SELECT custom_id, principal_id, status_code, request_id FROM request_log "
            "WHERE batch_id = ?",
            batch.id,
        )
        if len(rows) >= len(ran) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sorted(r[0] for r in rows) == sorted(ran)
    assert len({r[1] for r in rows}) == 1 and rows[0][1].startswith("sh-")
    by_id = {r[0]: r for r in rows}
    for cid, line in ran.items():
        assert by_id[cid][2] == line["response"]["status_code"]
        assert by_id[cid][3] == line["response"]["request_id"]


def test_completions_batch(batches: Batches, tmp_path: Path) -> None:
    client = batches.openai("alice")
    bodies = {
        f"c-{i}": {"model": "demo", "prompt": f"Once upon a {w}", "max_tokens": 6, "temperature": 0}
        for i, w in enumerate(WORDS[:5])
    }
    batch = submit(client, jsonl("/v1/completions", bodies), "/v1/completions", tmp_path)
    done = wait_done(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 5
    assert done.error_file_id is None
    out = {x["custom_id"]: x for x in lines_of(client, done.output_file_id)}
    with batches.http("alice") as c:
        for cid, body in bodies.items():
            online = c.post("/v1/completions", json=body).json()
            got = out[cid]["response"]["body"]
            assert got["choices"][0]["text"] == online["choices"][0]["text"]
            assert got["object"] == "text_completion"


def test_cancel(batches: Batches, tmp_path: Path) -> None:
    client = batches.openai("alice")
    bodies = {f"long-{i}": chat(f"Write a story {i}", max_tokens=48) for i in range(64)}
    batch = submit(client, jsonl("/v1/chat/completions", bodies), "/v1/chat/completions", tmp_path)
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).status == "validating":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at
    again = client.batches.cancel(batch.id)  # cancelling twice answers the batch
    assert again.status in ("cancelling", "cancelled")
    done = wait_done(client, batch.id, timeout=300)
    assert done.status == "cancelled" and done.cancelled_at
    ran = done.request_counts.completed + done.request_counts.failed
    assert ran < len(bodies)
    out = lines_of(client, done.output_file_id)
    assert len(out) == done.request_counts.completed
    time.sleep(1.5)
    records = batches.rows("SELECT COUNT(*) FROM request_log WHERE batch_id = ?", batch.id)[0][0]
    assert records == ran  # nothing started after the cancel was answered
    with batches.http("alice") as c:
        r = c.post(f"/v1/batches/{batch.id}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
    # a completed batch cannot be cancelled
    small = submit(
        client, jsonl("/v1/chat/completions", {"x": chat("hi")}), "/v1/chat/completions", tmp_path
    )
    wait_done(client, small.id)
    with batches.http("alice") as c:
        err = envelope(c.post(f"/v1/batches/{small.id}/cancel"), 409)
        assert err["code"] == "batch_not_cancellable"


def envelope(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert "Traceback" not in r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def upload(c: httpx.Client, data: bytes) -> str:
    r = c.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def test_bad_creates_and_privacy(batches: Batches) -> None:
    data = jsonl("/v1/chat/completions", {"a": chat("hi")})
    with batches.http("alice") as alice, batches.http("bob") as bob:
        fid = upload(alice, data)

        def create(c: httpx.Client, **over: Any) -> httpx.Response:
            body = {
                "input_file_id": fid,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                **over,
            }
            return c.post("/v1/batches", json=body)

        assert envelope(create(bob), 404)["code"] == "file_not_found"  # alice's file
        assert envelope(create(alice, input_file_id="file-nope"), 404)["code"] == "file_not_found"
        assert envelope(create(alice, endpoint="/v1/moderations"), 400)["param"] == "endpoint"
        assert envelope(create(alice, endpoint="/v1/completions"), 400)["code"] == (
            "invalid_batch_file"
        )
        assert envelope(create(alice, completion_window="1h"), 400)["param"] == (
            "completion_window"
        )
        assert envelope(create(alice, metadata={"k": 1}), 400)["param"] == "metadata"
        assert envelope(create(alice, input_file_id=None), 400)["param"] == "input_file_id"
        assert envelope(alice.post("/v1/batches", content=b"{"), 400)
        made = create(alice)
        assert made.status_code == 200, made.text
        bid = made.json()["id"]
        for r in (bob.get(f"/v1/batches/{bid}"), bob.post(f"/v1/batches/{bid}/cancel")):
            assert envelope(r, 404)["code"] == "batch_not_found"
        assert bid not in [b["id"] for b in bob.get("/v1/batches").json()["data"]]
        page = alice.get("/v1/batches", params={"limit": 1}).json()
        assert page["object"] == "list" and page["data"][0]["id"] == bid
        assert page["first_id"] == bid
        assert envelope(alice.get("/v1/batches", params={"limit": 0}), 400)["param"] == "limit"
        assert envelope(bob.get("/v1/batches", params={"after": bid}), 400)["param"] == "after"
        assert alice.get(f"/v1/batches/{bid}").json()["id"] == bid
    with batches.http("admin_only") as c:
        assert envelope(c.get("/v1/batches"), 403)["code"] == "insufficient_scope"


def test_create_and_cancel_are_audited(batches: Batches, tmp_path: Path) -> None:
    client = batches.openai("alice")
    batch = submit(
        client,
        jsonl("/v1/chat/completions", {f"q{i}": chat("hi", max_tokens=48) for i in range(20)}),
        "/v1/chat/completions",
        tmp_path,
    )
    client.batches.cancel(batch.id)
    deadline = time.monotonic() + 15
    while True:
        rows = batches.rows(
            "SELECT action, actor FROM audit_event WHERE target = ? ORDER BY id", batch.id
        )
        if len(rows) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [r[0] for r in rows] == ["batch.created", "batch.cancelled"]
    assert rows[0][1] == rows[1][1] and rows[0][1].startswith("sh-")


def test_metrics(batches: Batches) -> None:
    with batches.http("alice") as c:
        text = c.get("/metrics").text
    for name in (
        "servehall_batch_lines_queued",
        "servehall_batch_lines_running",
        'servehall_batch_lines_finished_total{outcome="completed"}',
    ):
        assert name in text


def test_cli_submit_status_results(batches: Batches, tmp_path: Path) -> None:
    bodies = {f"cli-{i}": chat(f"Say {w}") for i, w in enumerate(WORDS[:4])}
    bodies["cli-bad"] = {**chat("hi"), "model": "nope"}
    path = tmp_path / "cli.jsonl"
    path.write_bytes(jsonl("/v1/chat/completions", bodies))
    env = {"OPENAI_API_KEY": batches.keys["alice"], "SERVEHALL_URL": batches.server.base_url}

    def cli(*args: str) -> str:
        proc = run_cli(batches.config, "batch", *args, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    batch_id = cli("submit", str(path)).strip()
    assert batch_id.startswith("batch_")
    assert cli("status", batch_id, "--wait").startswith(
        f"{batch_id} completed: 4 completed, 1 failed"
    )
    out = [json.loads(x) for x in cli("results", batch_id).splitlines()]
    assert sorted(x["custom_id"] for x in out) == [f"cli-{i}" for i in range(4)]
    err = [json.loads(x) for x in cli("results", batch_id, "--errors").splitlines()]
    assert [x["custom_id"] for x in err] == ["cli-bad"]
    written = cli("results", batch_id, "--out", str(tmp_path / "res")).split()
    assert [Path(p).name for p in written] == [
        f"{batch_id}_output.jsonl",
        f"{batch_id}_error.jsonl",
    ]
    assert json.loads(cli("status", batch_id, "--json"))["status"] == "completed"
    bad = run_cli(batches.config, "batch", "status", "batch_nope", env=env, cwd=tmp_path)
    assert bad.returncode == 1 and "No such Batch object" in bad.stderr


def test_sigkill_mid_batch_resumes_once(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("batches-kill")
    config, cli, db = make_config(work, demo_model_dir, max_concurrent_lines=2, lease_s=3.0)
    key = json.loads(cli("keys", "create", "--tenant", "k", "--json"))["key"]
    env = {PEPPER_ENV: PEPPER}
    bodies = {f"k-{i}": chat(f"Count to {i}", max_tokens=32) for i in range(16)}
    server = servehall_server(config.read_text(), env=env, name="kill-1")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    batch = submit(client, jsonl("/v1/chat/completions", bodies), "/v1/chat/completions", work)
    deadline = time.monotonic() + 300
    while client.batches.retrieve(batch.id).request_counts.completed < 3:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    server.process.kill()
    server.process.wait(10)
    with sqlite3.connect(db) as conn:
        running = conn.execute(
            "SELECT COUNT(*) FROM batch_line WHERE batch_id = ? AND status = 'running'",
            (batch.id,),
        ).fetchone()[0]
    again = servehall_server(config.read_text(), env=env, name="kill-2")
    client = openai.OpenAI(base_url=again.base_url + "/v1", api_key=key, max_retries=0)
    done = wait_done(client, batch.id)
    assert done.status == "completed", done
    out = lines_of(client, done.output_file_id) + lines_of(client, done.error_file_id)
    ids = [x["custom_id"] for x in out]
    assert sorted(ids) == sorted(bodies), (running, ids)
    assert done.request_counts.completed == len(bodies)


def test_batch_lines_wait_behind_online_requests(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Under the ``priority`` policy with one slot, a batch keeps lines queued; online
    requests arriving meanwhile are admitted before every batch line still waiting."""
    work = tmp_path_factory.mktemp("batches-idle")
    config, cli, db = make_config(
        work,
        demo_model_dir,
        scheduler={"policy": "priority", "max_concurrency": 1, "queue_timeout_s": 600},
        max_concurrent_lines=4,
    )
    key = json.loads(cli("keys", "create", "--tenant", "i", "--json"))["key"]
    server = servehall_server(config.read_text(), env={PEPPER_ENV: PEPPER}, name="idle")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    long = {"max_tokens": 600, "ignore_eos": True}  # every line decodes 600 tokens
    bodies = {f"b-{i}": chat(f"Tell a long tale {i}", **long) for i in range(16)}
    batch = submit(client, jsonl("/v1/chat/completions", bodies), "/v1/chat/completions", work)
    deadline = time.monotonic() + 300
    while client.batches.retrieve(batch.id).request_counts.completed < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)

    def online(i: int) -> str:
        with httpx.Client(base_url=server.base_url, timeout=120) as c:
            r = c.post(
                "/v1/chat/completions",
                json=chat(f"Quick {i}"),
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200, r.text
            return str(r.headers["x-request-id"])

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        ids = list(pool.map(online, range(3)))
    assert wait_done(client, batch.id).status == "completed"
    deadline = time.monotonic() + 15
    while True:
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT request_id, batch_id, received_at, queue_time_s FROM request_log "
                "WHERE status_code = 200"
            ).fetchall()
        if len(rows) >= len(bodies) + 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    def admitted(r: Any) -> float:
        return datetime.fromisoformat(r[2]).timestamp() + (r[3] or 0.0)

    batch_admits = [admitted(r) for r in rows if r[1] == batch.id]
    assert len(batch_admits) == len(bodies)
    for r in rows:
        if r[0] not in ids:
            continue
        arrived = datetime.fromisoformat(r[2]).timestamp()
        ahead = [t for t in batch_admits if arrived + 0.05 < t < admitted(r)]
        assert not ahead, (r, ahead)  # no batch line was admitted while it waited


def test_online_request_preempts_running_lines(
    servehall_server: Any, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``[batches] preempt`` (the default): two long lines hold both engine slots; an
    online request arriving then is admitted at once (the lines are stopped, recorded
    499 ``preempted`` and run again later), no line is admitted while it runs, and the
    batch still completes with one 200 record per ``custom_id``."""
    work = tmp_path_factory.mktemp("batches-preempt")
    config, cli, db = make_config(
        work,
        demo_model_dir,
        scheduler={"policy": "priority", "max_concurrency": 2, "queue_timeout_s": 600},
        max_concurrent_lines=2,
        online_quiet_s=0.5,
    )
    key = json.loads(cli("keys", "create", "--tenant", "p", "--json"))["key"]
    server = servehall_server(config.read_text(), env={PEPPER_ENV: PEPPER}, name="preempt")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    long = {"max_tokens": 1500, "ignore_eos": True}
    bodies = {f"p-{i}": chat(f"Tell a long tale {i}", **long) for i in range(4)}
    batch = submit(client, jsonl("/v1/chat/completions", bodies), "/v1/chat/completions", work)
    deadline = time.monotonic() + 120
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server.base_url, timeout=120, headers=auth) as c:
        while "servehall_batch_lines_running 2.0" not in c.get("/metrics").text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)  # both lines are decoding now
        r = c.post("/v1/chat/completions", json=chat("Quick", max_tokens=4))
        assert r.status_code == 200, r.text
        online_id = r.headers["x-request-id"]
        metrics = c.get("/metrics").text
        assert "servehall_batch_lines_preempted_total 2.0" in metrics, metrics[-3000:]
    assert wait_done(client, batch.id).status == "completed"
    deadline = time.monotonic() + 15
    while True:
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT request_id, custom_id, status_code, error_code, received_at, "
                "queue_time_s, latency_s FROM request_log"
            ).fetchall()
        if sum(1 for r in rows if r[2] == 200) >= len(bodies) + 1:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.2)
    online = next(r for r in rows if r[0] == online_id)
    assert online[5] < 1.0, online  # not kept waiting for a 1500-token line
    preempted = [r for r in rows if r[3] == "preempted"]
    assert len(preempted) == 2 and all(r[2] == 499 and r[1] for r in preempted), [
        r[1:4] for r in rows
    ]
    done = sorted(r[1] for r in rows if r[1] and r[2] == 200)
    assert done == sorted(bodies)  # one answer per line, preempted ones included
    start = datetime.fromisoformat(online[4]).timestamp()
    end = start + online[6]
    for r in rows:
        if r[1] and r[2] == 200:
            admitted = datetime.fromisoformat(r[4]).timestamp() + (r[5] or 0.0)
            assert not start < admitted < end, (online, r)  # none ran beside it
