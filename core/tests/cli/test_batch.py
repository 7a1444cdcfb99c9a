"""Tests of servehall.cli.batch (``servehall batch submit|status|results``) in-process with
Typer's runner: the server-root choice, the input file's endpoint, error answers, and the
requests the commands send and what they print, against a real local HTTP server that
answers like ``/v1/files`` and ``/v1/batches`` and records each request. The whole path
against a running servehall is tests/test_batches_e2e.py::test_cli_submit_status_results."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from servehall.cli.batch import _answer, _endpoint, _server, _summary, batch_app


@dataclass
class Api:
    """The local server: its root, the requests seen (method, path, body) and the states
    ``GET /v1/batches/<id>`` walks through (the last one repeats)."""

    url: str
    seen: list[tuple[str, str, bytes]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)


def _batch(status: str, **extra: Any) -> dict[str, Any]:
    counts = {"total": 3, "completed": 2, "failed": 1}
    return {"id": "batch_1", "status": status, "request_counts": counts, **extra}


@pytest.fixture
def api() -> Iterator[Api]:
    state = Api(url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _send(self, code: int, body: Any) -> None:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.seen.append(("POST", self.path, body))
            if self.headers.get("Authorization") != "Bearer k":
                self._send(401, {"error": {"message": "bad key"}})
            elif self.path == "/v1/files":
                self._send(200, {"id": "file_in"})
            elif self.path == "/v1/batches":
                self._send(200, _batch("validating", **json.loads(body)))
            else:
                self._send(404, b"not here")

        def do_GET(self) -> None:
            state.seen.append(("GET", self.path, b""))
            if self.path.startswith("/v1/batches/batch_1"):
                self._send(200, state.states.pop(0) if len(state.states) > 1 else state.states[0])
            elif self.path.startswith("/v1/files/") and self.path.endswith("/content"):
                name = self.path.split("/")[3]
                if name in state.files:
                    self._send(200, state.files[name])
                else:
                    self._send(404, {"error": {"message": f"No such File object: {name}"}})
            else:
                self._send(404, {"error": {"message": "No such Batch object"}})

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def _run(api: Api, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(batch_app, [*args, "--base-url", api.url + "/", "--api-key", "k"])
    return result.exit_code, result.stdout, result.stderr


def _lines(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


# --- pure parts ------------------------------------------------------------------------


def test_server_root_from_base_url_or_config_bind(tmp_path: Path) -> None:
    assert _server("http://h:1/", None) == "http://h:1"
    cfg = tmp_path / "c.toml"
    cfg.write_text('[server]\nbind = ["0.0.0.0:9001", "10.0.0.1:9002"]\n')
    assert _server(None, cfg) == "http://127.0.0.1:9001"  # any-address: the loopback
    cfg.write_text('[server]\nbind = ["10.0.0.1:9002"]\n')
    assert _server(None, cfg) == "http://10.0.0.1:9002"
    cfg.write_text('[server]\nbind = ["[::]:9003"]\n')
    assert _server(None, cfg) == "http://127.0.0.1:9003"


def test_endpoint_is_the_first_request_lines_url(tmp_path: Path) -> None:
    path = _lines(tmp_path, "", '{"url": "/v1/completions"}', '{"url": "/v1/embeddings"}')
    assert _endpoint(path) == "/v1/completions"
    for lines in (['{"custom_id": "a"}'], ["[1, 2]"], ["{nope"], ['{"url": 5}'], ["", " "]):
        with pytest.raises(typer.Exit) as exc:
            _endpoint(_lines(tmp_path, *lines))
        assert exc.value.exit_code == 1


def test_answer_returns_json_or_exits_with_the_servers_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _answer(httpx.Response(200, json={"id": "x"})) == {"id": "x"}
    with pytest.raises(typer.Exit):
        _answer(httpx.Response(404, json={"error": {"message": "No such Batch object"}}))
    assert capsys.readouterr().err == "error: 404: No such Batch object\n"
    with pytest.raises(typer.Exit):
        _answer(httpx.Response(502, text="bad gateway " + "x" * 600))
    err = capsys.readouterr().err
    assert err.startswith("error: 502: bad gateway") and len(err) < 530  # first 500 chars


def test_summary_counts_default_to_zero() -> None:
    assert _summary(_batch("in_progress")) == "batch_1 in_progress: 2 completed, 1 failed of 3"
    assert _summary({"id": "b", "status": "validating", "request_counts": None}) == (
        "b validating: 0 completed, 0 failed of 0"
    )


# --- commands against the local server -------------------------------------------------


def test_submit_uploads_then_creates_for_the_first_lines_endpoint(api: Api, tmp_path: Path) -> None:
    path = _lines(tmp_path, '{"custom_id": "a", "url": "/v1/chat/completions", "body": {}}')
    code, out, _ = _run(api, "submit", str(path))
    assert code == 0 and out == "batch_1\n"
    (m1, p1, b1), (m2, p2, b2) = api.seen
    assert (m1, p1) == ("POST", "/v1/files")
    assert b'name="purpose"' in b1 and b"batch" in b1 and b'"custom_id": "a"' in b1
    assert (m2, p2) == ("POST", "/v1/batches")
    assert json.loads(b2) == {
        "input_file_id": "file_in",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    code, out, _ = _run(api, "submit", str(path), "--endpoint", "/v1/embeddings", "--json")
    assert code == 0 and json.loads(out)["endpoint"] == "/v1/embeddings"


def test_submit_refusals_exit_1_with_one_error_line(api: Api, tmp_path: Path) -> None:
    path = _lines(tmp_path, '{"custom_id": "a", "url": "/v1/chat/completions"}')
    res = CliRunner().invoke(batch_app, ["submit", str(path), "--base-url", api.url])
    assert res.exit_code == 1 and res.stderr == "error: 401: bad key\n"
    assert [p for _, p, _ in api.seen] == ["/v1/files"]  # no batch after a failed upload
    code, _, err = _run(api, "submit", str(_lines(tmp_path, '{"custom_id": "a"}')))
    assert code == 1 and "names no 'url'" in err


def test_status_prints_the_summary_and_wait_polls_until_it_ends(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("servehall.cli.batch.time.sleep", slept.append)
    api.states = [_batch("validating"), _batch("in_progress"), _batch("completed")]
    code, out, _ = _run(api, "status", "batch_1")
    assert code == 0 and out == "batch_1 validating: 2 completed, 1 failed of 3\n"
    code, out, _ = _run(api, "status", "batch_1", "--wait", "--json")
    assert code == 0 and json.loads(out)["status"] == "completed"
    assert len(api.seen) == 3 and slept == [1.0]  # one GET, then polled until completed
    code, _, err = _run(api, "status", "batch_nope")
    assert code == 1 and err == "error: 404: No such Batch object\n"


def test_results_print_one_file_or_write_both(api: Api, tmp_path: Path) -> None:
    api.states = [_batch("completed", output_file_id="file_out", error_file_id="file_err")]
    api.files = {"file_out": b'{"custom_id": "a"}\n', "file_err": b'{"custom_id": "b"}\n'}
    assert _run(api, "results", "batch_1") == (0, '{"custom_id": "a"}\n', "")
    assert _run(api, "results", "batch_1", "--errors") == (0, '{"custom_id": "b"}\n', "")
    code, out, _ = _run(api, "results", "batch_1", "--out", str(tmp_path / "res"))
    assert code == 0
    written = [Path(p) for p in out.split()]
    assert [p.name for p in written] == ["batch_1_output.jsonl", "batch_1_error.jsonl"]
    assert [p.read_bytes() for p in written] == [api.files["file_out"], api.files["file_err"]]


def test_results_without_a_file_print_nothing_and_a_missing_file_exits_1(
    api: Api, tmp_path: Path
) -> None:
    api.states = [_batch("failed", output_file_id=None, error_file_id="file_gone")]
    assert _run(api, "results", "batch_1") == (0, "", "")
    code, out, _ = _run(api, "results", "batch_1", "--out", str(tmp_path / "res"))
    assert code == 1 and out == ""
    code, _, err = _run(api, "results", "batch_1", "--errors")
    assert code == 1 and err == "error: 404: No such File object: file_gone\n"
