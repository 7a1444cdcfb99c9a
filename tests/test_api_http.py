"""The HTTP layer end to end: HTTP/2 (h2c prior knowledge, TLS + ALPN), the ``openai``
client, streaming vs non-streaming, and client disconnects freeing engine slots.

Real ``servehall serve`` subprocesses with the demo model on ``backend = "auto"``
(openvino_cpu, f32). Slot accounting is read from ``/health/ready``'s body (engine and
scheduler counters) and ``/metrics`` (the abort counter).
"""

from __future__ import annotations

import datetime
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import stream_then_drop

LONG = {"model": "demo", "prompt": "ABCDEFGH ABCDEFGH ABC", "temperature": 0, "max_tokens": 1500}
# ignore_eos: the trained demo weights differ between CPUs, and on some the greedy
# continuation of this prompt ends within a few tokens
LONG["ignore_eos"] = True
# several seconds of engine work even on a fast CPU, so a client that leaves after the
# first event is always still being served (the tiny demo model decodes ~2000 tokens/s)
SLOW = {**LONG, "max_tokens": 1900, "n": 4, "stream": True}


@pytest.fixture(scope="module")
def server(
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
) -> Iterator[Any]:
    cfg = demo_config_factory(demo_model_dir, scheduler={"max_concurrency": 2, "max_queue": 4})
    with servehall_server(cfg, name="api-http") as srv:
        yield srv


@pytest.fixture(scope="module")
def h2(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, http1=False, http2=True, timeout=60) as c:
        yield c


def stats(client: httpx.Client) -> dict[str, int]:
    m = client.get("/health/ready").json()["models"]["demo"]
    return {
        "engine_running": m["engine"]["running"],
        "engine_waiting": m["engine"]["waiting"],
        "slots": m["scheduler"]["running"],
        "queued": m["scheduler"]["waiting"],
    }


def aborts(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    m = re.search(
        r'servehall_request_aborts_total\{model="demo",reason="client_disconnect",version=""\}'
        r" ([0-9.e+]+)",
        text,
    )
    return float(m.group(1)) if m else 0.0


def wait_for(pred: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``pred()`` held; fails after ``timeout``."""
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


def idle(client: httpx.Client) -> bool:
    s = stats(client)
    return s == {"engine_running": 0, "engine_waiting": 0, "slots": 0, "queued": 0}


# --- HTTP/2 and TLS ---------------------------------------------------------------------


def test_h2c_prior_knowledge(h2: httpx.Client) -> None:
    r = h2.post(
        "/v1/chat/completions",
        json={"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert r.status_code == 200 and r.http_version == "HTTP/2"
    assert h2.get("/v1/models").http_version == "HTTP/2"


def test_http11_still_served(server: Any) -> None:
    r = httpx.get(server.base_url + "/v1/models", timeout=60)
    assert r.status_code == 200 and r.http_version == "HTTP/1.1"


def _self_signed(dir: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = dir / "cert.pem", dir / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certfile, keyfile


def test_tls_alpn_h2(
    servehall_server: Callable[..., Any],
    demo_model_dir: Path,
    demo_config_factory: Callable[..., dict[str, Any]],
    tmp_path: Path,
) -> None:
    certfile, keyfile = _self_signed(tmp_path)
    cfg = demo_config_factory(
        demo_model_dir, server={"certfile": str(certfile), "keyfile": str(keyfile)}
    )
    with servehall_server(cfg, name="api-tls") as srv:
        assert srv.base_url.startswith("https://")
        with httpx.Client(base_url=srv.base_url, http2=True, verify=str(certfile), timeout=60) as c:
            r = c.post(
                "/v1/chat/completions",
                json={
                    "model": "demo",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4,
                },
            )
            assert r.status_code == 200 and r.http_version == "HTTP/2"
            with c.stream(
                "POST",
                "/v1/completions",
                json={"model": "demo", "prompt": "Hi", "max_tokens": 4, "stream": True},
            ) as s:
                assert s.http_version == "HTTP/2"
                assert s.read().endswith(b"data: [DONE]\n\n")
        with httpx.Client(base_url=srv.base_url, verify=str(certfile), timeout=60) as c1:
            r = c1.get("/health/live")
            assert r.status_code == 200 and r.http_version == "HTTP/1.1"
        # clean SIGTERM shutdown: exit status 0, engines and hooks shut down
        assert srv.stop() == 0
        assert "servehall stopped" in srv.log_text()
        assert "Traceback" not in srv.log_text()


# --- openai client; streaming equals non-streaming ------------------------------------------


def test_openai_client_stream_equals_non_stream(server: Any) -> None:
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["demo"]
    card = client.models.retrieve("demo")
    assert (card.id, card.object, card.owned_by) == ("demo", "model", "servehall")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    messages = [{"role": "user", "content": "Tell me about the river"}]
    full = client.chat.completions.create(
        model="demo", messages=messages, max_tokens=40, temperature=0
    )
    text = full.choices[0].message.content
    assert text and full.usage.completion_tokens > 0
    pieces = []
    for chunk in client.chat.completions.create(
        model="demo", messages=messages, max_tokens=40, temperature=0, stream=True
    ):
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
    assert "".join(pieces) == text
    comp = client.completions.create(model="demo", prompt="The river", max_tokens=30, temperature=0)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="demo", prompt="The river", max_tokens=30, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == comp.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="demo", messages=[], max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=messages, max_tokens=4)


# --- client disconnects free the engine slot ------------------------------------------------


def test_stream_disconnect_frees_slot(server: Any, h2: httpx.Client) -> None:
    wait_for(lambda: idle(h2), 10)
    before = aborts(h2)
    got = stream_then_drop(server.port, SLOW)
    assert got.startswith(b"HTTP/1.1 200")
    # counted as an abort (a request left to run would not be); how fast the slot frees
    # is measured by bench/bench_reliability.py, not asserted on a shared CI machine
    wait_for(lambda: aborts(h2) == before + 1, 10)
    wait_for(lambda: idle(h2), 10)


def test_non_stream_disconnect_frees_slot(server: Any, h2: httpx.Client) -> None:
    wait_for(lambda: idle(h2), 10)
    before = aborts(h2)
    body = json.dumps({**LONG, "max_tokens": 1900}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        wait_for(lambda: stats(h2)["engine_running"] == 1, 5)
    wait_for(lambda: aborts(h2) == before + 1, 10)
    wait_for(lambda: idle(h2), 10)


class RawH2:
    """A minimal HTTP/2 client over a socket (h2 state machine), because httpx never
    sends RST_STREAM when a request is cancelled."""

    def __init__(self, port: int) -> None:
        import h2.config
        import h2.connection

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        self.data: dict[int, bytearray] = {}
        self.status: dict[int, int] = {}
        self.ended: set[int] = set()
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> int:
        sid = self.conn.get_next_available_stream_id()
        data = json.dumps(body).encode() if body is not None else b""
        headers = [
            (":method", method),
            (":path", path),
            (":scheme", "http"),
            (":authority", "127.0.0.1"),
        ]
        if body is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(data)))]
        self.conn.send_headers(sid, headers, end_stream=body is None)
        if body is not None:
            self.conn.send_data(sid, data, end_stream=True)
        self.data[sid] = bytearray()
        self.flush()
        return sid

    def pump(self, timeout: float = 0.05) -> None:
        import h2.events

        self.sock.settimeout(timeout)
        try:
            raw = self.sock.recv(1 << 20)
        except TimeoutError:
            return
        assert raw, "the server closed the HTTP/2 connection"
        for ev in self.conn.receive_data(raw):
            if isinstance(ev, h2.events.ResponseReceived):
                self.status[ev.stream_id] = int(dict(ev.headers)[":status"])
            elif isinstance(ev, h2.events.DataReceived):
                self.data.setdefault(ev.stream_id, bytearray()).extend(ev.data)
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded | h2.events.StreamReset):
                self.ended.add(ev.stream_id)
        self.flush()

    def pump_until(self, pred: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, "timed out"
            self.pump()

    def cancel(self, sid: int) -> None:
        from h2.errors import ErrorCodes

        self.conn.reset_stream(sid, error_code=ErrorCodes.CANCEL)
        self.flush()

    def close(self) -> None:
        self.sock.close()


def test_queued_disconnect_leaves_queue(server: Any, h2: httpx.Client) -> None:
    """RST_STREAM of a request waiting for a slot removes it from the queue."""
    wait_for(lambda: idle(h2), 10)
    c = RawH2(server.port)
    try:
        holders = [c.request("POST", "/v1/completions", SLOW) for _ in range(2)]
        queued = c.request("POST", "/v1/completions", LONG)
        c.pump_until(lambda: stats(h2)["queued"] == 1 and stats(h2)["slots"] == 2, 10)
        c.cancel(queued)
        c.pump_until(lambda: stats(h2)["queued"] == 0, 10)
        assert stats(h2)["slots"] == 2
        for sid in holders:
            c.cancel(sid)
        c.pump_until(lambda: idle(h2), 10)
    finally:
        c.close()


def test_c21_h2_stream_cancel_keeps_connection(server: Any, h2: httpx.Client) -> None:
    """Two streams on one HTTP/2 connection; RST_STREAM the first: its generation is
    aborted (counted as a client disconnect; the time it takes is a benchmark figure),
    the second completes, the connection stays open."""
    wait_for(lambda: idle(h2), 10)
    before = aborts(h2)
    c = RawH2(server.port)
    try:
        first = c.request("POST", "/v1/completions", SLOW)
        c.pump_until(lambda: len(c.data[first]) > 0, 30)
        second = c.request("POST", "/v1/completions", {**LONG, "max_tokens": 1000, "stream": True})
        c.pump_until(lambda: len(c.data[second]) > 0, 30)
        assert stats(h2)["engine_running"] >= 4  # the first request's four choices
        c.cancel(first)
        c.pump_until(lambda: aborts(h2) == before + 1, 10)
        c.pump_until(lambda: second in c.ended or stats(h2)["engine_running"] <= 1, 10)
        c.pump_until(lambda: second in c.ended, 60)
        assert c.status[second] == 200 and bytes(c.data[second]).endswith(b"data: [DONE]\n\n")
        live = c.request("GET", "/health/live")
        c.pump_until(lambda: live in c.ended, 10)
        assert c.status[live] == 200
    finally:
        c.close()
    wait_for(lambda: idle(h2), 1.0)


def test_metrics_exposed(h2: httpx.Client) -> None:
    r = h2.post("/v1/completions", json={**LONG, "max_tokens": 5})
    assert r.json()["usage"]["completion_tokens"] == 5
    text = h2.get("/metrics").text
    for name in (
        "servehall_requests_total",
        "servehall_time_to_first_token_seconds_count",
        "servehall_time_per_output_token_seconds_count",
        "servehall_e2e_request_latency_seconds_count",
        "servehall_queue_time_seconds_count",
        "servehall_prompt_tokens_total",
        "servehall_generation_tokens_total",
        "servehall_requests_running",
        "servehall_requests_waiting",
        "servehall_kv_cache_usage_ratio",
    ):
        assert re.search(rf"^{name}\{{.*model=\"demo\"", text, re.M), name
    assert re.search(
        r'servehall_requests_total\{endpoint="/v1/completions",model="demo",'
        r'status="200",version=""\} [1-9]',
        text,
    )


def test_c19_metrics_after_aborts(server: Any, h2: httpx.Client) -> None:
    """Five streams closed after their first bytes: abort counter +5, running gauge and
    KV-cache usage back to baseline without new traffic (the case says within 2 s; the
    deadline here is 10 s so a loaded CI machine cannot flip it — the time goes to
    bench/bench_reliability.py)."""
    wait_for(lambda: idle(h2), 10)

    def gauge(name: str) -> float:
        text = h2.get("/metrics").text
        m = re.search(rf'^{name}\{{model="demo",version=""\}} ([0-9.e+-]+)', text, re.M)
        assert m, name
        return float(m.group(1))

    kv_base = gauge("servehall_kv_cache_usage_ratio")
    before = aborts(h2)
    for _ in range(5):
        stream_then_drop(server.port, SLOW)
    seen: list[Any] = []

    def settled() -> bool:
        now = (
            aborts(h2) - before,
            gauge("servehall_requests_running"),
            gauge("servehall_kv_cache_usage_ratio"),
            stats(h2),
        )
        seen.append(now)
        return now[0] == 5 and now[1] == 0 and now[2] <= kv_base

    deadline = time.monotonic() + 10.0
    while not settled():
        assert time.monotonic() < deadline, f"not settled in 10 s: {seen[0]} … {seen[-1]}"
        time.sleep(0.02)
    r = h2.post("/v1/completions", json={"model": "demo", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-request-id"] == r.json()["id"]


def test_queue_full_is_503_with_retry_after(server: Any, h2: httpx.Client) -> None:
    """max_concurrency 2 + max_queue 4: the seventh concurrent request gets 503 at once."""
    wait_for(lambda: idle(h2), 10)
    c = RawH2(server.port)
    try:
        held = [c.request("POST", "/v1/completions", SLOW) for _ in range(6)]
        c.pump_until(lambda: stats(h2)["slots"] == 2 and stats(h2)["queued"] == 4, 10)
        r = h2.post("/v1/completions", json={"model": "demo", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        for sid in held:
            c.cancel(sid)
        c.pump_until(lambda: idle(h2), 10)
    finally:
        c.close()
    assert (
        h2.post(
            "/v1/completions", json={"model": "demo", "prompt": "Hi", "max_tokens": 2}
        ).status_code
        == 200
    )


def test_serve_demo_needs_no_config(
    servehall_server: Callable[..., Any], demo_model_dir: Path, tmp_path: Path
) -> None:
    """``servehall serve --demo`` with an empty config: the demo model (already built in
    the cache dir) on OpenVINO, records migrated into a local SQLite file."""
    import shutil

    cache = tmp_path / "cache"
    shutil.copytree(demo_model_dir, cache / "demo-model", symlinks=True)
    with servehall_server(
        "", name="demo-flag", extra_args=["--demo"], env={"SERVEHALL_CACHE_DIR": str(cache)}
    ) as srv:
        ready = httpx.get(srv.base_url + "/health/ready", timeout=60).json()
        assert ready["models"]["demo"]["backend"] == "openvino_cpu"
        r = httpx.post(
            srv.base_url + "/v1/chat/completions",
            json={
                "model": "demo",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            },
            timeout=60,
        )
        assert r.status_code == 200
        assert (srv.config_path.parent / "servehall.db").exists()
