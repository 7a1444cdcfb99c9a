"""The version router (:mod:`servehall.rollout.router`): weighted, sticky, health-gated."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

from servehall.config.models import ModelConfig, check_versions
from servehall.errors import InvalidRequestError
from servehall.rollout.router import Candidate, VersionRouter, pick_version, sticky_point


@dataclass
class _Engine:
    worker_up: bool = True


@dataclass
class _Served:
    name: str
    version: str
    weight: float
    engine: Any
    state: str = "serving"

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name


@dataclass
class _Host:
    models: dict[str, Any]


def _router(*versions: _Served) -> VersionRouter:
    host = _Host({v.key: v for v in versions})
    return VersionRouter(host, rng=random.Random(7).random)  # type: ignore[arg-type]


def test_weights_90_10_over_10000_principals_within_1_5_points_and_sticky() -> None:
    stable = _Served("m", "v1", 90, _Engine())
    canary = _Served("m", "v2", 10, _Engine())
    router = _router(stable, canary)
    first: dict[str, str] = {}
    for i in range(10_000):
        first[f"key-{i}"] = router.choose("m", f"key-{i}", None).version  # type: ignore[union-attr]
    share = sum(1 for v in first.values() if v == "v2") / len(first) * 100
    assert abs(share - 10.0) <= 1.5, share
    # every principal stays on its version, request after request
    for key in list(first)[:2000]:
        for _ in range(3):
            assert router.choose("m", key, None).version == first[key]  # type: ignore[union-attr]


def test_anonymous_requests_without_key_split_by_weight_too() -> None:
    router = _router(_Served("m", "a", 3, _Engine()), _Served("m", "b", 1, _Engine()))
    picks = [router.choose("m", None, None).version for _ in range(4000)]  # type: ignore[union-attr]
    assert abs(picks.count("b") / 4000 - 0.25) < 0.03


def test_a_version_not_ready_gets_no_traffic_and_its_weight_goes_to_the_ready_ones() -> None:
    loading = _Served("m", "v2", 50, _Engine(worker_up=False))
    draining = _Served("m", "v3", 50, _Engine(), state="draining")
    starting = _Served("m", "v4", 50, _Engine(), state="loading")
    router = _router(_Served("m", "v1", 50, _Engine()), loading, draining, starting)
    assert {router.choose("m", f"k{i}", None).version for i in range(500)} == {"v1"}  # type: ignore[union-attr]
    loading.engine.worker_up = True  # ready now: it takes its share at once
    got = [router.choose("m", f"k{i}", None).version for i in range(2000)]  # type: ignore[union-attr]
    assert 0.4 < got.count("v2") / 2000 < 0.6


def test_weight_change_moves_only_callers_across_the_boundary() -> None:
    a, b = _Served("m", "a", 90, _Engine()), _Served("m", "b", 10, _Engine())
    router = _router(a, b)
    before = {k: router.choose("m", f"k{k}", None).version for k in range(3000)}  # type: ignore[union-attr]
    a.weight, b.weight = 80, 20
    after = {k: router.choose("m", f"k{k}", None).version for k in range(3000)}  # type: ignore[union-attr]
    assert all(after[k] == "b" for k in before if before[k] == "b")  # canary users stay


def test_pin_header_picks_a_version_even_at_weight_zero_and_refuses_unknown() -> None:
    router = _router(_Served("m", "v1", 1, _Engine()), _Served("m", "v2", 0, _Engine()))
    assert {router.choose("m", f"k{i}", None).version for i in range(300)} == {"v1"}  # type: ignore[union-attr]
    assert router.choose("m", "k", "v2").version == "v2"  # type: ignore[union-attr]
    with pytest.raises(InvalidRequestError) as info:
        router.choose("m", "k", "v9")
    assert info.value.code == "model_version_not_found" and "v1" in info.value.message
    assert router.choose("other", "k", None) is None


def test_no_ready_version_falls_back_to_all_rather_than_nothing() -> None:
    cands = [Candidate("a", 1, False), Candidate("b", 0, False)]
    assert pick_version(cands, 0.99) == 0
    assert pick_version([Candidate("a", 0, True), Candidate("b", 0, True)], 0.75) == 1


def test_sticky_point_is_stable_and_uniformish() -> None:
    assert sticky_point("abc") == sticky_point("abc")  # not Python's salted hash
    pts = [sticky_point(str(i)) for i in range(10_000)]
    assert min(pts) >= 0 and max(pts) < 1
    assert abs(sum(pts) / len(pts) - 0.5) < 0.02


def test_check_versions_lists_every_problem() -> None:
    def mc(name: str, version: str = "", weight: float = 1) -> ModelConfig:
        return ModelConfig(name=name, version=version, weight=weight, path="/m")  # type: ignore[arg-type]

    errs = check_versions(
        [mc("a", "v1"), mc("a", "v1"), mc("a"), mc("b", weight=0), None, mc("c", "x")]
    )
    keys = [k for k, _ in errs]
    assert keys == ["models[1].version", "models[2].version", "models[3].weight"], errs
    assert "already models[0]" in errs[0][1]
    assert check_versions([mc("a", "v1", 90), mc("a", "v2", 10), mc("b")]) == []
