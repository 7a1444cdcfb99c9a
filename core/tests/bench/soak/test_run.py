"""The soak's run (servehall.bench.soak.run.run_soak) against a real servehall API in this
process (``live_server``: Hypercorn, the ``null`` engine): a one-second soak of every
request shape from two clients, its printed report, its JSON report, the RSS sampler,
the invariants that pass, the one that fails on a server answering 5xx, and the options
refused before any request. The full soak (a started server, faults, database checks)
runs in tests/test_soak_e2e.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from live_server import serving

from servehall.bench.soak.invariants import exit_status
from servehall.bench.soak.mix import WEIGHTS
from servehall.bench.soak.options import SoakError, SoakOptions
from servehall.bench.soak.run import run_soak


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("soak-run"), tokens_per_s=4000) as url:
        yield url


def _opts(url: str, tmp_path: Path, **kw: object) -> SoakOptions:
    base = {
        "duration_s": 1.0,
        "clients": 2,
        "url": url,
        "demo": False,
        "model": "m",
        "schemas": 3,
        "workdir": tmp_path / "work",
        "output_json": tmp_path / "soak.json",
    }
    return SoakOptions(**{**base, **kw})  # type: ignore[arg-type]


async def test_a_short_soak_against_a_running_server(server: str, tmp_path: Path) -> None:
    out = io.StringIO()
    opts = _opts(server + "/v1/", tmp_path, pids=(os.getpid(),))
    results = await run_soak(opts, out)
    by_key = {r.key: r for r in results}
    assert list(by_key) == ["I1", "I2", "I3", "I4", "I5", "I6"]  # no faults: no F
    assert exit_status(results) == 0, out.getvalue()
    report = json.loads(opts.output_json.read_text())  # type: ignore[union-attr]
    # I1 saw every answer, and none was a 5xx
    # (each client sends at least one request; how many more depends on the machine)
    assert by_key["I1"].checked == report["requests"] >= 2
    assert by_key["I1"].violations == []
    assert set(report["by_status"]) <= {"200", "400", "404", "413", "415", "422"}
    assert report["by_category"] and set(report["by_category"]) <= set(WEIGHTS)
    # the database is unknown with --url and neither --config nor --db-url
    for key in ("I2", "I3", "I4", "I5"):
        assert "the database is unknown" in str(by_key[key].skipped)
    # the RSS of the given pid (this process) was sampled, once a second from the start
    assert by_key["I6"].checked >= 1 and report["rss_baseline_mib"] > 10
    assert 1.0 <= report["duration_s"] < 10
    text = out.getvalue()
    # the URL's /v1 is dropped: the shapes carry their own paths
    assert text.startswith(f"soak {server}: 2 clients, 1 s; shapes: valid ")
    assert "recorded client bodies: " in text and "openai " in text
    assert "I1 PASS" in text and "I2 SKIP" in text and "server log" not in text
    assert report["invariants"]["I1"]["violation_count"] == 0
    assert (tmp_path / "work").is_dir()  # the work directory is made even with --url


async def test_a_server_that_answers_5xx_fails_i1(tmp_path: Path) -> None:
    out = io.StringIO()
    # every request asking for more than one token fails in the engine; with seed 0 the
    # second shape drawn (the second client's first) is a plain completion of 8 tokens
    with serving(tmp_path, test_fail_every=1) as url:
        results = await run_soak(
            _opts(url, tmp_path, duration_s=0.5, output_json=None, seed=0), out
        )
    i1 = results[0]
    assert i1.key == "I1" and i1.violations, out.getvalue()
    assert exit_status(results) == 1
    assert "I1 FAIL" in out.getvalue()
    assert not (tmp_path / "soak.json").exists()  # no --output-json, no file


async def test_what_cannot_run_is_refused_before_any_request(tmp_path: Path) -> None:
    out = io.StringIO()
    with pytest.raises(SoakError, match="give --url, --config or --demo"):
        await run_soak(SoakOptions(demo=False, workdir=tmp_path / "a"), out)
    dead = "http://127.0.0.1:9"
    with pytest.raises(SoakError, match="needs a server the soak starts"):
        await run_soak(_opts(dead, tmp_path, faults=("worker-kill",)), out)
    assert out.getvalue() == ""
    assert not (tmp_path / "a").exists() and not (tmp_path / "work").exists()


async def test_the_report_goes_to_stdout_as_it_is_when_the_soak_runs(
    server: str, tmp_path: Path
) -> None:
    # (the default was bound to sys.stdout at import: a later redirection got nothing)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        await run_soak(_opts(server, tmp_path, duration_s=0.3, output_json=None))
    assert buf.getvalue().startswith(f"soak {server}: 2 clients")
    assert "I1 PASS" in buf.getvalue()
