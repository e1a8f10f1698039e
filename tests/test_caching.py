"""BoundedCache (stratalog/caching.py): bounded by its values' size (bytes here), oldest out first, LRU
or first-in-first-out."""

from __future__ import annotations

import threading

import pytest

from stratalog.caching import BoundedCache


def _cache(size_max: int, *, lru: bool) -> BoundedCache[str, bytes]:
    return BoundedCache(size_max, len, lru=lru)


def test_the_oldest_entries_go_once_the_bytes_pass_the_bound() -> None:
    cache = _cache(10, lru=False)
    for key in "abc":
        cache.put(key, b"x" * 4)
    assert cache.keys() == ["b", "c"] and cache.size == 8
    assert cache.get("a") is None and cache.get("b") == b"xxxx"


def test_first_in_first_out_keeps_its_order_on_a_hit() -> None:
    cache = _cache(8, lru=False)
    cache.put("a", b"1234")
    cache.put("b", b"1234")
    assert cache.get("a") == b"1234"
    cache.put("c", b"1234")
    assert cache.keys() == ["b", "c"]


def test_lru_keeps_what_was_read_last() -> None:
    cache = _cache(8, lru=True)
    cache.put("a", b"1234")
    cache.put("b", b"1234")
    assert cache.get("a") == b"1234"
    cache.put("c", b"1234")
    assert cache.keys() == ["a", "c"]


def test_an_entry_put_at_the_cold_end_goes_first() -> None:
    """Read-ahead nobody asked for yet must not push out what readers use."""
    cache = _cache(8, lru=True)
    cache.put("used", b"1234")
    cache.put("ahead", b"1234", newest=False)
    cache.put("next", b"1234")
    assert cache.keys() == ["used", "next"]


def test_replacing_an_entry_counts_its_bytes_once() -> None:
    cache = _cache(100, lru=False)
    cache.put("a", b"x" * 10)
    cache.put("a", b"x" * 30)
    assert cache.size == 30 and len(cache) == 1


def test_a_value_larger_than_the_bound_is_not_kept_and_evicts_nothing() -> None:
    cache = _cache(8, lru=True)
    cache.put("a", b"1234")
    cache.put("big", b"x" * 9)
    assert cache.keys() == ["a"] and "big" not in cache and cache.size == 4


def test_pop_and_clear_give_the_bytes_back() -> None:
    cache = _cache(100, lru=False)
    cache.put("a", b"123")
    cache.put("b", b"45")
    assert cache.pop("a") == b"123" and cache.pop("a") is None and cache.size == 2
    cache.clear()
    assert len(cache) == 0 and cache.size == 0


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="size_max"):
        _cache(-1, lru=False)


@pytest.mark.parametrize("lru", [False, True])
def test_threads_sharing_a_cache_keep_its_count_of_bytes_exact(lru: bool) -> None:
    cache = _cache(4096, lru=lru)

    def work(seed: int) -> None:
        for i in range(3000):
            key = f"{(seed * 7 + i) % 300}"
            if cache.get(key) is None:
                cache.put(key, b"x" * (1 + i % 50))
            if i % 11 == 0:
                cache.pop(key)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.size == sum(len(v) for v in cache.values()) <= 4096


def test_put_says_how_many_entries_went_to_make_room() -> None:
    cache = _cache(8, lru=True)
    assert cache.put("a", b"12") == 0 and cache.put("b", b"34") == 0 and cache.put("c", b"5678") == 0
    assert cache.put("d", b"1234567") == 3 and cache.keys() == ["d"]


def test_an_entry_made_oldest_goes_first() -> None:
    """A block a sequential reader has read to its end goes before blocks not yet read."""
    cache = _cache(8, lru=True)
    cache.put("read", b"1234")
    cache.put("unread", b"1234")
    cache.make_oldest("unread")
    cache.make_oldest("gone")       # not held: nothing to do
    cache.put("next", b"1234")
    assert cache.keys() == ["read", "next"]
