"""The soak's invariant checks (servehall.bench.soak.invariants): each one passes on
good data and fails on the data it exists to catch; the traffic mix and corpus are
deterministic and complete."""

from __future__ import annotations

import json

from servehall.bench.soak.corpus import (
    generated_schemas,
    hostile_shapes,
    schema_shapes,
    sdk_shapes,
)
from servehall.bench.soak.invariants import (
    FaultWindow,
    LeftoverFile,
    Observation,
    Rejection,
    Row,
    check_api_restarts,
    check_audit,
    check_no_5xx,
    check_no_leftovers,
    check_one_row_each,
    check_rows_match,
    check_rss,
    exit_status,
    rss_growth_mib,
)
from servehall.bench.soak.mix import Mix
from servehall.testing.bad_schemas import BAD_SCHEMAS, DRAFT_07


def obs(status: int = 200, rid: str | None = "r1", **kw: object) -> Observation:
    o = Observation("chat", "/v1/chat/completions", 10.0, 11.0, status, request_id=rid)
    for k, v in kw.items():
        setattr(o, k, v)
    return o


# --- I1 ----------------------------------------------------------------------------------


def test_i1_passes_on_2xx_and_4xx() -> None:
    r = check_no_5xx([obs(200), obs(400), obs(404), obs(499, disconnected=True)])
    assert r.ok and r.checked == 4


def test_i1_fails_on_a_500_a_503_and_a_stream_error_event() -> None:
    r = check_no_5xx([obs(500), obs(503), obs(200, stream_error=500), obs(200, stream_error=400)])
    assert len(r.violations) == 3
    assert exit_status([r]) == 1


def test_i1_fails_on_no_answer_and_on_a_cut_stream() -> None:
    r = check_no_5xx([obs(0, None, error="ReadTimeout"), obs(200, error="RemoteProtocolError")])
    assert len(r.violations) == 2


def test_i1_allows_503_only_inside_a_declared_fault_window() -> None:
    window = FaultWindow("worker-kill", 10.5, 12.0)
    outside = obs(503)
    outside.started, outside.ended = 20.0, 21.0
    busy = obs(503, "r2", error="engine_unavailable: the engine restarts")
    r = check_no_5xx([obs(503), obs(0, None, error="x"), outside, busy], [window])
    assert r.violations == ["chat /v1/chat/completions: status 503 (r1; None)"]
    assert "1 allowed: 503 (no code) during worker-kill" in r.notes
    assert "1 allowed: 503 (engine_unavailable) during worker-kill" in r.notes
    # a request that spans two windows is counted in the one its answer came in
    spans = obs(503, "r3", error="engine_unavailable: x")
    spans.started, spans.ended = 11.0, 30.5
    later = FaultWindow("api-kill", 30.0, 33.0)
    r = check_no_5xx([spans], [window, later])
    assert r.notes == ["1 allowed: 503 (engine_unavailable) during api-kill"]
    # a 500 is never allowed, fault or not
    assert not check_no_5xx([obs(500)], [window]).ok


# --- I2 ----------------------------------------------------------------------------------


def test_i2_passes_with_exactly_one_row_each() -> None:
    r = check_one_row_each([obs(rid="a"), obs(rid="b")], ["a", "b"])
    assert r.ok and r.checked == 2


def test_i2_fails_on_a_missing_row_a_duplicate_and_a_response_without_id() -> None:
    r = check_one_row_each([obs(rid="a"), obs(rid="b"), obs(500, None)], ["b", "b"])
    assert len(r.violations) == 3
    assert any("a (status 200): no row" in v for v in r.violations)
    assert any("2 rows" in v for v in r.violations)
    assert any("without x-request-id" in v for v in r.violations)


def test_i2_a_rejected_record_explains_a_missing_row() -> None:
    r = check_one_row_each([obs(rid="a")], [], rejected_ids={"a"})
    assert r.ok and "explained" in r.notes[0]


def test_i2_no_answer_needs_no_id() -> None:
    assert check_one_row_each([obs(0, None, error="ConnectError")], []).ok


def test_i2_leaves_out_the_routes_that_record_nothing() -> None:
    tok = [obs(200, None, path="/tokenize"), obs(400, None, path="/detokenize")]
    r = check_one_row_each([obs(rid="a"), *tok], ["a"])
    assert r.ok and r.checked == 1
    assert any("2 answer(s)" in n and "not recorded" in n for n in r.notes)
    r = check_one_row_each([obs(200, "x", path="/tokenize")], [])
    assert len(r.violations) == 1 and "records nothing" in r.violations[0]


# --- I3 ----------------------------------------------------------------------------------


def test_i3_passes_when_status_and_usage_agree() -> None:
    rows = {"a": Row("a", 200, 5, 8), "b": Row("b", 400, 0, 0), "c": Row("c", 499, 5, 2)}
    observed = [obs(rid="a", usage=(5, 8)), obs(400, "b"), obs(200, "c", disconnected=True)]
    r = check_rows_match(observed, rows)
    assert r.ok and r.checked == 3


def test_i3_fails_on_a_different_status_or_token_count() -> None:
    rows = {"a": Row("a", 200, 5, 7), "b": Row("b", 500, 0, 0)}
    r = check_rows_match([obs(rid="a", usage=(5, 8)), obs(400, "b")], rows)
    assert len(r.violations) == 2
    assert "client usage (5, 8), row (5, 7)" in r.violations[0]
    assert "client got 400, row says 500" in r.violations[1]


def test_i3_a_cut_response_may_be_recorded_as_a_client_that_left() -> None:
    rows = {"a": Row("a", 499, 5, 0), "b": Row("b", 200, 5, 8), "c": Row("c", 499, 0, 0)}
    cut = "RemoteProtocolError: Server disconnected"
    observed = [obs(rid="a", error=cut), obs(rid="b", error=cut), obs(400, "c")]
    r = check_rows_match(observed, rows)
    assert r.checked == 3 and r.violations == ["chat c: client got 400, row says 499"]


# --- A (api-kill) ------------------------------------------------------------------------


def test_a_passes_when_every_killed_frontend_came_back() -> None:
    kill = FaultWindow("api-kill", 10.5, 14.0)
    observed = [obs(), obs(0, None, error="ReadError"), obs(200, "r2", started=10.6)]
    r = check_api_restarts([kill], observed, 1.0, [7, 9], 2)
    assert r.ok and r.checked == 1
    assert "1 cut, 1 answered whole" in r.notes[0]


def test_a_fails_without_restarts_or_with_a_frontend_missing() -> None:
    kills = [FaultWindow("api-kill", 10.5, 14.0), FaultWindow("api-kill", 30.0, 33.0)]
    r = check_api_restarts(kills, [], 1.0, [7], 2)
    assert r.violations == [
        "2 API process(es) killed, 1 restart(s) counted",
        "1 frontend process(es) running after the traffic, 2 configured",
    ]
    r = check_api_restarts(kills, [], None, [7, 8], 2)
    assert r.violations == ["servehall_api_process_restarts_total could not be read"]


# --- I4 ----------------------------------------------------------------------------------


def test_i4_passes_with_nothing_left_or_explained_rejections() -> None:
    assert check_no_leftovers([], []).ok
    q = LeftoverFile("q.jsonl", "quarantine", 2, 2)
    r = check_no_leftovers([q, LeftoverFile("s.jsonl", "spill", 0, 0)], [Rejection("a", "bad")])
    assert r.ok


def test_i4_fails_on_a_spill_file_with_records_and_unexplained_rejections() -> None:
    r = check_no_leftovers(
        [LeftoverFile("s.jsonl", "spill", 3, 0), LeftoverFile("q.jsonl", "quarantine", 2, 1)],
        [Rejection("a", None)],
    )
    assert len(r.violations) == 3


# --- I5 ----------------------------------------------------------------------------------


def test_i5_follows_the_exit_status_of_audit_verify() -> None:
    assert check_audit(0, "OK: 2 audit event(s), chain intact\n").ok
    bad = check_audit(1, "FAIL: event 3: hash mismatch")
    assert not bad.ok and "hash mismatch" in bad.violations[0]
    assert not check_audit(None, "TimeoutExpired").ok


# --- I6 ----------------------------------------------------------------------------------

MIB = 2**20


def test_i6_counts_growth_after_the_warm_up() -> None:
    # caches fill during the warm-up (to 900 MiB), then flat: no growth
    samples = [(0.0, 500 * MIB), (5.0, 900 * MIB), (20.0, 880 * MIB), (40.0, 905 * MIB)]
    assert rss_growth_mib(samples, 10.0) == (900.0, 5.0)
    r = check_rss(samples, 64, warmup_s=10.0)
    assert r.ok and "growth after warm-up +5 MiB" in r.notes[0]


def test_i6_fails_on_steady_growth() -> None:
    samples = [(float(t), (500 + 10 * t) * MIB) for t in range(0, 100)]
    r = check_rss(samples, 256, warmup_s=25.0)
    assert not r.ok and "RSS grew by" in r.violations[0]


def test_i6_is_skipped_without_samples() -> None:
    r = check_rss([], 256)
    assert r.ok and r.skipped is not None and "SKIP" in r.lines()[0]


# --- the mix and corpus ---------------------------------------------------------------------


def test_the_mix_is_deterministic_and_holds_every_category() -> None:
    a = Mix("demo", schemas=30, seed=4, embed_model="e")
    b = Mix("demo", schemas=30, seed=4, embed_model="e")
    counts = a.counts()
    assert all(counts[c] > 0 for c in counts) and "embeddings" in counts
    draws = [a.draw() for _ in range(200)]
    assert draws == [b.draw() for _ in range(200)]
    assert {c for c, _ in draws} == set(counts)


def test_the_corpus_covers_the_issue_schemas_and_names_are_unique() -> None:
    issue_33 = [
        {"$schema": {}},
        {"$schema": [1]},
        {"$schema": DRAFT_07, "$defs": {"a": {"type": 5}}},
        {"$schema": DRAFT_07, "$defs": {"a": {"type": "integer", "minimum": "x"}}},
    ]
    schemas = [s for s, _ in BAD_SCHEMAS]
    assert all(s in schemas for s in issue_33)
    shapes = hostile_shapes("demo")
    names = [s.name for s in shapes]
    assert len(names) == len(set(names))
    assert all(s.content() is not None for s in shapes)
    # the soak sends the shared corpus, each schema in every field that carries one
    sent = [s.body for s in shapes if s.name.startswith("schema_bad_") and s.body]
    for schema in issue_33:
        fields = [
            b
            for b in sent
            if schema
            in (
                b.get("guided_json"),
                (b.get("structured_outputs") or {}).get("json"),
                ((b.get("response_format") or {}).get("json_schema") or {}).get("schema"),
                ((b.get("tools") or [{}])[0].get("function") or {}).get("parameters"),
            )
        ]
        assert len(fields) == 4, schema
    paths = {s.path for s in shapes}
    assert {"/tokenize", "/detokenize"} <= paths
    tok = Mix("demo", schemas=1).categories["tokenizer"]
    assert {s.path for s in tok} == {"/tokenize", "/detokenize"}
    assert len({s.name for s in tok}) == len(tok)


def test_generated_schemas_are_deterministic() -> None:
    one = generated_schemas(25, seed=1)
    assert len(one) == 25 and one == generated_schemas(25, seed=1)
    json.dumps(one)  # every schema can be sent
    shapes = schema_shapes("demo", one)
    assert {s.name for s in shapes} == {
        "gen_schema_rf",
        "gen_schema_guided_json",
        "gen_schema_structured_outputs",
        "gen_schema_tool",
    }
    assert any(s.stream for s in shapes) and not all(s.stream for s in shapes)


def test_recorded_sdk_bodies_are_loaded_with_the_model_replaced() -> None:
    shapes = sdk_shapes("m-1")
    libs = {s.name.split("_")[1] for s in shapes}
    assert "openai" in libs
    assert all(s.body is not None and s.body.get("model") == "m-1" for s in shapes)
    assert all(s.path in ("/v1/chat/completions", "/v1/completions") for s in shapes)
