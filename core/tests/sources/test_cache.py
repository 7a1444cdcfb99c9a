"""Tests of servehall.sources.cache: the node-local model cache (layout, commit, by-URL
memory, LRU eviction honouring use and pull locks). The flock locks are real: two
descriptors of one lock file conflict even inside one process."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from servehall.sources.cache import ModelCache, url_hash
from servehall.sources.errors import SourceError


def _put(cache: ModelCache, key: str, nbytes: int, source: str = "", age_s: float = 0) -> Path:
    """Commit an entry of ``nbytes`` (recorded) through a partial dir, ``age_s`` old."""
    partial = cache.partial_dir(key)
    partial.mkdir(parents=True)
    (partial / "weights.bin").write_bytes(b"x" * 8)
    dest = cache.commit(key, source or f"s3://b/{key}", nbytes)
    then = time.time() - age_s
    os.utime(dest, (then, then))
    return dest


@pytest.fixture
def cache(tmp_path: Path) -> ModelCache:
    c = ModelCache(tmp_path / "cache", max_bytes=100)
    c.ensure()
    return c


def test_commit_moves_the_partial_into_place_and_records_the_source(cache: ModelCache) -> None:
    assert not cache.is_complete("k1")
    dest = _put(cache, "k1", 42, "s3://bucket/llama/")
    assert dest == cache.entry_dir("k1") and (dest / "weights.bin").exists()
    assert not cache.partial_dir("k1").exists() and cache.is_complete("k1")
    assert json.loads((cache.root / "k1.json").read_text()) == {
        "source": "s3://bucket/llama/",
        "bytes": 42,
    }
    # by-url ignores a trailing slash
    assert cache.known("s3://bucket/llama") == "k1"
    assert (cache.root / "by-url" / url_hash("s3://bucket/llama")).read_text() == "k1"


def test_url_hash_is_32_hex_and_slash_insensitive() -> None:
    h = url_hash("https://m/x/")
    assert h == url_hash("https://m/x") and len(h) == 32 and int(h, 16) >= 0
    assert url_hash("https://m/y") != h


def test_known_forgets_urls_whose_entry_is_gone(cache: ModelCache) -> None:
    assert cache.known("s3://never") is None
    cache.remember("s3://b/m", "missing-key")
    assert cache.known("s3://b/m") is None
    _put(cache, "k2", 1, "s3://b/m")
    assert cache.known("s3://b/m") == "k2"
    cache.remember("s3://b/m", "")
    assert cache.known("s3://b/m") is None
    assert [p.name for p in (cache.root / "by-url").iterdir()] == [url_hash("s3://b/m")]


def test_entries_skip_partials_trash_and_by_url_and_order_by_last_use(cache: ModelCache) -> None:
    _put(cache, "new", 10, age_s=0)
    _put(cache, "old", 20, age_s=100)
    cache.partial_dir("pulling").mkdir()
    (cache.root / "gone.trash-1234").mkdir()
    (cache.root / "k.json").write_text("{}")  # a plain file is not an entry either
    entries = cache.entries()
    assert [e.key for e in entries] == ["old", "new"]
    assert [e.bytes for e in entries] == [20, 10] and entries[0].source == "s3://b/old"
    assert cache.usage_bytes() == 30
    cache.touch("old")
    assert [e.key for e in cache.entries()] == ["new", "old"]
    cache.touch("no-such-key")  # harmless


def test_entry_with_a_broken_record_still_lists(cache: ModelCache) -> None:
    _put(cache, "k", 5)
    (cache.root / "k.json").write_text("not json")
    [entry] = cache.entries()
    assert (entry.key, entry.bytes, entry.source, entry.last_used) == ("k", 0, "", 0.0)


def test_entries_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    assert ModelCache(tmp_path / "nope").entries() == []


def test_lease_marks_in_use_until_released(cache: ModelCache) -> None:
    _put(cache, "k", 5)
    lease = cache.lease("k")
    other = cache.lease("k")  # shared: two holders at once
    assert cache.entries()[0].in_use
    lease.release()
    lease.release()  # idempotent
    assert cache.entries()[0].in_use
    other.release()
    assert not cache.entries()[0].in_use


def test_evict_removes_least_recently_used_until_it_fits(cache: ModelCache) -> None:
    _put(cache, "a", 40, age_s=300)
    _put(cache, "b", 40, age_s=200)
    _put(cache, "c", 40, age_s=100)
    # 120 cached + 30 needed > 100: drop "a" (→110), then "b" (→70)
    assert cache.evict(30, keep=set()) == ["a", "b"]
    assert [e.key for e in cache.entries()] == ["c"]
    assert not (cache.root / "a.json").exists()
    assert not any(".trash-" in p.name for p in cache.root.iterdir())
    assert cache.evict(0, keep=set()) == []  # fits already


def test_evict_skips_kept_leased_and_pulling_entries(cache: ModelCache) -> None:
    for i, key in enumerate(["kept", "leased", "pulling", "free"]):
        _put(cache, key, 40, age_s=400 - i * 100)
    lease = cache.lease("leased")
    with cache.pulling("pulling"):
        assert cache.evict(0, keep={"kept"}) == ["free"]
    lease.release()
    # kept + leased + pulling = 120 > 100: the oldest free one ("leased") goes, then it fits
    assert cache.evict(0, keep={"kept"}) == ["leased"]


def test_unbounded_cache_never_evicts(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path, max_bytes=0)
    cache.ensure()
    _put(cache, "a", 10**12)
    assert cache.evict(10**12, keep=set()) == []
    assert cache.is_complete("a")


def test_pulling_is_exclusive_between_holders(cache: ModelCache) -> None:
    order: list[str] = []
    with cache.pulling("k"):
        t = threading.Thread(target=lambda: _hold(cache, order))
        t.start()
        time.sleep(0.1)
        order.append("first done")
    t.join(5)
    assert order == ["first done", "second got it"]


def _hold(cache: ModelCache, order: list[str]) -> None:
    with cache.pulling("k"):
        order.append("second got it")


def test_ensure_fails_with_a_source_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SourceError, match="cannot create the model cache"):
        ModelCache(blocker / "cache").ensure()
