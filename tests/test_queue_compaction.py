"""Merging run objects (stratalog.queues.compaction): the merged object reads back as the sources did."""

from __future__ import annotations

import array
import dataclasses
import fcntl
import functools
import itertools
import os
import random
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from queuekit import one_object_per_round, small_queue_config
from stratalog.engine.metadata import Metadata
from stratalog.errors import StratalogError
from stratalog.native import native
from stratalog.objects.local import SPARES_DIR_NAME, TEMP_PREFIX, LocalDirStore
from stratalog.objects.uri import LOCAL_DIR_NAME
from stratalog.queues import QueueStore
from stratalog.queues import compaction as compaction_module
from stratalog.queues.compaction import (
    MergeResult,
    MergeSource,
    idle_merge_start,
    merge_objects,
    merge_piece,
    plan_merge,
    tier_merge_start,
)
from stratalog.queues.format import (
    I64,
    PAGE_BYTES,
    U32,
    CorruptBulkError,
    build_object,
    check_pages,
    decode_footer,
    decode_index,
    decode_run,
    page_crcs,
)
from stratalog.queues.merge_worker import (
    MergeAnswer,
    MergeCancelledError,
    MergeJob,
    MergeWorkerError,
    run_merge_job,
)
from stratalog.queues.objects import QUEUE_PREFIX
from stratalog.queues.pending import PendingPuts
from waiting import WAIT_S, wait_until


def _objects(rng: random.Random, rounds: int, streams_per_round: list[int]) -> tuple[list[bytes], list[list[bytes]]]:
    """Run objects of ``rounds`` uploads; each upload adds streams and random messages to some of them."""
    objects: list[bytes] = []
    model: list[list[bytes]] = []
    prev_ends = np.zeros(0, U32)
    for r in range(rounds):
        first = len(model)
        model.extend([] for _ in range(streams_per_round[r]))
        names = [(i, f"q{i}") for i in range(first, len(model))]
        present = sorted(rng.sample(range(len(model)), k=max(1, len(model) // 2)))
        counts = [rng.randint(1, 5) for _ in present]
        messages = []
        for stream, count in zip(present, counts, strict=True):
            for _ in range(count):
                m = rng.randbytes(rng.randint(0, 40))
                model[stream].append(m)
                messages.append(m)
        data = b"".join(messages)
        msg_ends = np.cumsum([len(m) for m in messages]).astype(I64)
        raw, prev_ends, _ = build_object(prev_ends, len(model), first, names, np.array(present, I64),
                                         np.array(counts, I64), msg_ends, memoryview(data))
        objects.append(bytes(raw))
    return objects, model


def _source(key: str, raw: bytes) -> MergeSource:
    return MergeSource.open(key, lambda a, b: raw[a:b], len(raw))


def _read_all(raw: bytes, streams: int, prev: np.ndarray) -> list[list[bytes]]:
    footer = decode_footer(raw[-44:], len(raw))
    _, ends, positions, pages = decode_index(raw[footer.names_position:len(raw) - 44], footer)
    check_pages(raw[:footer.names_position], 0, pages, "merged")
    out = []
    for s in range(streams):
        if s >= len(ends):
            out.append([])
            continue
        before = int(prev[s]) if s < len(prev) else 0
        after = int(ends[s])
        a, b = int(positions[s]), int(positions[s + 1])
        out.append(decode_run(raw[a:b], after - before, "merged", s) if after > before else [])
    return out


@pytest.mark.parametrize("slice_bytes", [1, 64, 1 << 20])
def test_merge_joins_each_streams_runs(slice_bytes: int) -> None:
    rng = random.Random(slice_bytes)
    objects, model = _objects(rng, 5, [7, 3, 0, 5, 2])
    # Merge objects 1..4 (the first stays): prev_ends is object 0's ends.
    first = _source("o0", objects[0])
    sources = [_source(f"o{i}", objects[i]) for i in range(1, 5)]
    result = MergeResult()
    merged = b"".join(merge_objects(sources, first.ends, slice_bytes, result))
    assert result.size_bytes == len(merged)
    footer = decode_footer(merged[-44:], len(merged))
    names, ends, positions, pages = decode_index(merged[footer.names_position:len(merged) - 44], footer)
    assert np.array_equal(pages, page_crcs(merged[:footer.names_position])) and np.array_equal(result.pages, pages)
    assert footer.first_stream == 7 and footer.stream_count == len(model)
    assert names == [(i, f"q{i}") for i in range(7, len(model))]
    assert ends.tolist() == [len(m) for m in model]
    assert np.array_equal(result.ends, ends) and np.array_equal(result.positions, positions)
    assert footer.message_count == sum(s.message_count for s in sources)
    in_first = _read_all(objects[0], len(model), np.zeros(0, U32))
    rest = _read_all(merged, len(model), first.ends)
    for s in range(len(model)):
        assert in_first[s] + rest[s] == model[s]
    assert result.runs_written == sum(1 for s in range(len(model)) if rest[s])



@pytest.mark.parametrize("slice_bytes", [1, 3000, 5000, 1 << 20])
def test_merged_page_crcs_cover_every_page_whatever_the_slices(slice_bytes: int) -> None:
    # Runs of ~1.3 KiB over 40 streams: the merged runs span many pages, and slices cut them anywhere.
    objects = [build_object(np.zeros(0, U32), 40, 0, [(i, f"q{i}") for i in range(40)], np.arange(40, dtype=I64),
                            np.full(40, 30, I64), np.arange(1, 1201, dtype=I64) * 45, memoryview(bytes(54000)))[0]]
    prev = MergeSource.open("o0", lambda a, b: bytes(objects[0][a:b]), len(objects[0])).ends
    objects.append(build_object(prev, 40, 40, [], np.arange(40, dtype=I64), np.full(40, 20, I64),
                                np.arange(1, 801, dtype=I64) * 45, memoryview(bytes(range(256)) * 141))[0])
    sources = [MergeSource.open(f"o{i}", lambda a, b, raw=bytes(raw): raw[a:b], len(raw))
               for i, raw in enumerate(objects)]
    result = MergeResult()
    merged = b"".join(merge_objects(sources, np.zeros(0, U32), slice_bytes, result))
    runs_bytes = int(result.positions[-1])
    assert runs_bytes > 20 * PAGE_BYTES
    assert np.array_equal(result.pages, page_crcs(merged[:runs_bytes]))
    pages = sum(len(s.pages) for s in sources)
    # Each slice reads the pages its runs lie in: a page two slices share is read (and checked) by both.
    assert result.pages_checked == pages if slice_bytes > len(merged) else result.pages_checked >= pages

@pytest.mark.parametrize("piece_bytes", [300, 1000, 1 << 20])
def test_a_merge_cut_into_pieces_reads_back_as_one(piece_bytes: int) -> None:
    rng = random.Random(piece_bytes)
    objects, model = _objects(rng, 4, [9, 4, 6, 3])
    first = _source("o0", objects[0])
    sources = [_source(f"o{i}", objects[i]) for i in range(1, 4)]
    piece_bytes_max = piece_bytes + 8 * len(model) + 48 + len(b"".join(s.names_raw for s in sources))
    plan = plan_merge(sources, first.ends, piece_bytes_max)
    pieces = []
    for p in range(len(plan.pieces)):
        result = MergeResult()
        raw = b"".join(merge_piece(plan, p, 64, result))
        assert result.size_bytes == len(raw) <= piece_bytes_max
        pieces.append((raw, result))
    # The pieces cover the streams in order, each a run object of every stream.
    assert plan.pieces[0][0] == 0 and plan.pieces[-1][1] == len(model)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(plan.pieces))
    assert len(plan.pieces) == 1 if piece_bytes == 1 << 20 else len(plan.pieces) > 1
    prev = first.ends
    got = _read_all(objects[0], len(model), np.zeros(0, U32))
    messages = 0
    for p, (raw, result) in enumerate(pieces):
        footer = decode_footer(raw[-44:], len(raw))
        names, ends, positions, pages = decode_index(raw[footer.names_position:len(raw) - 44], footer)
        assert footer.stream_count == len(model)
        assert footer.first_stream == (9 if p == 0 else len(model))
        assert names == ([(i, f"q{i}") for i in range(9, len(model))] if p == 0 else [])
        assert np.array_equal(result.ends, ends) and np.array_equal(result.positions, positions)
        assert np.array_equal(pages, page_crcs(raw[:footer.names_position])) and np.array_equal(result.pages, pages)
        lo, hi = plan.pieces[p]
        runs = _read_all(raw, len(model), prev)
        for s in range(len(model)):
            assert not runs[s] or lo <= s < hi
            got[s] += runs[s]
        messages += footer.message_count
        prev = ends
    assert got == model
    assert prev.tolist() == [len(m) for m in model]
    assert messages == sum(s.message_count for s in sources)


def test_merge_from_the_first_object() -> None:
    objects, model = _objects(random.Random(3), 3, [4, 4, 4])
    result = MergeResult()
    merged = b"".join(merge_objects([_source(f"o{i}", o) for i, o in enumerate(objects)], np.zeros(0, U32), 1 << 20,
                                    result))
    assert _read_all(merged, len(model), np.zeros(0, U32)) == model


def test_a_damaged_source_run_stops_the_merge() -> None:
    objects, _ = _objects(random.Random(4), 2, [6, 2])
    damaged = bytearray(objects[1])
    footer = decode_footer(bytes(damaged[-44:]), len(damaged))
    damaged[footer.names_position // 2] ^= 0x10  # inside some run's bytes
    sources = [_source("o0", objects[0]), _source("o1", bytes(damaged))]
    with pytest.raises(CorruptBulkError, match="object o1"):
        b"".join(merge_objects(sources, np.zeros(0, U32), 1 << 20, MergeResult()))


def test_sources_must_follow_on() -> None:
    objects, _ = _objects(random.Random(5), 3, [3, 3, 3])
    sources = [_source("o0", objects[0]), _source("o2", objects[2])]
    with pytest.raises(CorruptBulkError, match="does not follow on"):
        b"".join(merge_objects(sources, np.zeros(0, U32), 1 << 20, MergeResult()))


# The store: merges happen while queues are written and read, survive a reopen, and a failed merge loses nothing.


def _fill(qs: QueueStore, model: dict[str, list[bytes]], rng: random.Random, rounds: int, queues: int) -> None:
    """``rounds`` rounds of puts to half of ``queues`` queues, each flushed and uploaded: one object per round
    when the store does not upload at idle (upload_idle_s long) nor by size (a round within
    upload_bytes_threshold)."""
    for r in range(rounds):
        for q in rng.sample(range(queues), k=queues // 2):
            name = f"q{q}"
            message = f"{q}/{r}/".encode() + rng.randbytes(rng.randint(0, 300))
            model.setdefault(name, []).append(message)
            qs.put(name, message)
        qs.flush()
        qs.uploader.upload()    # everything flushed goes to an object now
        assert qs.stats()["log_cache_records"] == 0


def _check(qs: QueueStore, model: dict[str, list[bytes]], rng: random.Random) -> None:
    for name, messages in model.items():
        assert qs.get(name, 0, len(messages) + 5) == messages
        at = rng.randrange(len(messages))
        assert qs.get(name, at, 3) == messages[at:at + 3]


def _files(path: Path) -> list[str]:
    return sorted(p.name for p in (path / LOCAL_DIR_NAME / QUEUE_PREFIX).glob("*.slq"))


def test_the_store_merges_objects_and_reads_the_same(tmp_path: Path) -> None:
    rng = random.Random(11)
    model: dict[str, list[bytes]] = {}
    # The tiers alone (a merge at rest would take several units at once: fewer merges).
    config = small_queue_config(compact_fanout=2, upload_idle_s=3600.0, compact_idle_bytes_max=0)
    with QueueStore.open(tmp_path, config=config) as qs:
        _fill(qs, model, rng, 12, 300)
        # Settled: nothing left to upload or merge, nothing waiting to be deleted, and the deletes done (a
        # retired object leaves the list before its file goes).
        wait_until(lambda: qs.stats()["compactions"] >= 6 and not qs.compactor.retiring
                   and not qs.log_cache.view.records and qs.compactor.plan(qs.log_cache.view.objects) is None
                   and len(_files(tmp_path)) == len(qs.log_cache.view.objects),
                   lambda: f"the merges to settle: {qs.stats()}, {_files(tmp_path)}")
        stats = qs.stats()
        # 12 uploads of one tier, merged two by two, then the merged ones two by two: at most one object per tier.
        assert stats["objects"] <= 4, stats
        assert stats["compactions_at_rest"] == 0, "the tiers' merges are not merges at rest"
        assert qs.compaction_error is None
        _check(qs, model, rng)
        assert len(_files(tmp_path)) == stats["objects"]
        assert any("-" in name for name in _files(tmp_path))
    with QueueStore.open(tmp_path, config=config) as qs:
        assert qs.recovery.objects == stats["objects"]
        _check(qs, model, rng)
        _fill(qs, model, rng, 3, 300)
        _check(qs, model, rng)


@pytest.mark.parametrize("in_worker", [True, False], ids=["worker", "thread"])
def test_merged_away_files_are_written_over_by_later_uploads_and_merges(tmp_path: Path, in_worker: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(12)
    model: dict[str, list[bytes]] = {}
    pooled: list[int] = []
    recycle = LocalDirStore.recycle

    def counted(store: LocalDirStore, key: str, spare_bytes_max: int) -> None:
        before = len(os.listdir(store.root / SPARES_DIR_NAME)) if (store.root / SPARES_DIR_NAME).exists() else 0
        recycle(store, key, spare_bytes_max)
        pooled.append(len(os.listdir(store.root / SPARES_DIR_NAME)) - before)

    monkeypatch.setattr(LocalDirStore, "recycle", counted)
    config = small_queue_config(compact_fanout=2, upload_idle_s=3600.0, compact_idle_bytes_max=0,
                                compact_in_worker=in_worker, spare_bytes_max=1 << 20)
    with QueueStore.open(tmp_path, config=config) as qs:
        # The store counts as written to until the test says otherwise: on a loaded machine the merges may
        # come more than compact_idle_s after the last put, and would then delete rather than keep spares.
        writer = qs.writer
        qs.compactor.clock = lambda: writer.last_write
        _fill(qs, model, rng, 12, 300)
        wait_until(lambda: qs.stats()["compactions"] >= 6 and not qs.compactor.retiring
                   and not qs.log_cache.view.records, lambda: f"six merges, settled: {qs.stats()}")
        assert qs.compaction_error is None
        # Merged-away files went to the spares (within their bound), and uploads or merges (in the worker
        # process, or here) took some of them (a put takes a spare the moment it finds one).
        spares = os.listdir(tmp_path / LOCAL_DIR_NAME / SPARES_DIR_NAME)
        assert sum(pooled) > len(spares), (pooled, spares)
        assert 0 <= qs.stats()["spare_bytes"] <= config.spare_bytes_max
        _check(qs, model, rng)
        # No puts for compact_idle_s: the spares go (they only serve writes).
        qs.compactor.clock = lambda: time.monotonic() + config.compact_idle_s
        wait_until(lambda: qs.stats()["spare_bytes"] == 0, lambda: f"the spares to go: {qs.stats()}")
        _fill(qs, model, rng, 4, 300)
    assert os.listdir(tmp_path / LOCAL_DIR_NAME / SPARES_DIR_NAME) == []     # and none outlive a close
    with QueueStore.open(tmp_path, config=config) as qs:
        _check(qs, model, rng)


def test_merged_away_objects_go_once_no_get_is_in_flight_and_not_before(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = threading.Event(), threading.Event()
    real_waiting = PendingPuts.waiting

    def held_waiting(pending: PendingPuts) -> bool:
        # A get asks this once it has begun (it counts as in flight) and before it takes its view.
        if threading.current_thread().name == "held-get":
            entered.set()
            release.wait(WAIT_S)   # the test lets it go (this bound only if the test fails first)
        return real_waiting(pending)

    monkeypatch.setattr(PendingPuts, "waiting", held_waiting)
    rng = random.Random(14)
    model: dict[str, list[bytes]] = {}
    # A grace period far longer than the test: only "no get in flight" can let the objects go early.
    config = small_queue_config(compact_fanout=2, upload_idle_s=3600.0, compact_idle_bytes_max=0, compact_retire_s=600)
    with QueueStore.open(tmp_path, config=config) as qs:
        reader = threading.Thread(target=qs.get, args=("held", 0, 1), name="held-get")
        reader.start()
        assert entered.wait(WAIT_S)
        _fill(qs, model, rng, 4, 100)
        wait_until(lambda: qs.compactions >= 1 and qs.compactor.retiring > 0,
                   lambda: f"a merge with objects to retire: {qs.stats()}")
        looks = qs.compactor.looks
        wait_until(lambda: qs.compactor.looks >= looks + 2, "two more looks of the compactor")
        assert qs.compactor.retiring, "merged-away objects went while a get that may hold them was in flight"
        release.set()
        reader.join(WAIT_S)
        # (The compactor takes them off the list, then deletes their files: wait for both.)
        wait_until(lambda: not qs.compactor.retiring and len(_files(tmp_path)) == len(qs.log_cache.view.objects),
                   lambda: f"the merged-away objects to go: {qs.compactor.retiring} retiring, {_files(tmp_path)}")
        assert len(_files(tmp_path)) == len(qs.log_cache.view.objects)
        _check(qs, model, rng)


def test_with_no_room_for_spares_merged_away_files_are_deleted(tmp_path: Path) -> None:
    rng = random.Random(13)
    model: dict[str, list[bytes]] = {}
    config = small_queue_config(compact_fanout=2, upload_idle_s=3600.0, compact_idle_bytes_max=0, spare_bytes_max=0)
    with QueueStore.open(tmp_path, config=config) as qs:
        _fill(qs, model, rng, 6, 300)
        wait_until(lambda: qs.stats()["compactions"] >= 3 and not qs.compactor.retiring
                   and not qs.log_cache.view.records, lambda: f"three merges, settled: {qs.stats()}")
        assert qs.stats()["spare_bytes"] == 0
        _check(qs, model, rng)


def test_merges_cut_into_pieces_read_the_same_and_survive_a_reopen(tmp_path: Path) -> None:
    rng = random.Random(15)
    model: dict[str, list[bytes]] = {}
    # Pieces smaller than two rounds' uploads: every merge makes two or more pieces, and the next merge
    # takes those pieces as one unit of its tier.
    # Merges in a thread (uploads wait for each), so the objects, and the pieces, are the same every run;
    # merges in the worker write the same bytes (the worker tests above).
    config = small_queue_config(compact_fanout=2, upload_idle_s=3600.0, upload_bytes_threshold=16 << 10,
                                compact_object_bytes_max=48 << 10, compact_in_worker=False)
    with QueueStore.open(tmp_path, config=config) as qs:
        _fill(qs, model, rng, 8, 400)
        wait_until(lambda: qs.stats()["compactions"] >= 3 and not qs.compactor.retiring
                   and not qs.log_cache.view.records and qs.compactor.plan(qs.log_cache.view.objects) is None,
                   lambda: f"the merges to settle: {qs.stats()}")
        assert qs.compaction_error is None
        objects = qs.log_cache.view.objects
        places = [o.key.split("/")[-1].split("-")[0] for o in objects]
        assert len(set(places)) < len(places), "some merge made several pieces"
        assert all(o.size_bytes <= 48 << 10 for o in objects if "-" in o.key), [(o.key, o.size_bytes) for o in objects]
        _check(qs, model, rng)
        stats = qs.stats()
    with QueueStore.open(tmp_path, config=config) as qs:
        assert qs.recovery.objects == stats["objects"]
        _check(qs, model, rng)
        _fill(qs, model, rng, 2, 400)
        _check(qs, model, rng)


def test_a_merge_at_rest_takes_the_newest_units_within_its_bounds() -> None:
    mib, gib = 1 << 20, 1 << 30
    # Where a 100 M-message send to a million queues ends: one merged unit of 3.9 GB, two of 0.9 GB, three
    # uploads. The five newest are merged; the oldest too only if the bound allows 6.2 GB.
    sizes = [3900 * mib, 900 * mib, 900 * mib, 240 * mib, 230 * mib, 70 * mib]
    assert idle_merge_start(sizes, 4, 4 * gib) == 1
    assert idle_merge_start(sizes, 4, 16 * gib) == 0
    assert idle_merge_start(sizes, 4, 0) is None
    # A trickle of small uploads after a big object: the small ones are merged, the big one is left alone.
    assert idle_merge_start([3 * gib, mib, mib], 4, 4 * gib) == 1
    assert idle_merge_start([3 * gib, mib], 4, 4 * gib) is None
    assert idle_merge_start([3 * gib, 5 * gib], 4, 16 * gib) == 0
    assert idle_merge_start([mib], 4, gib) is None
    assert idle_merge_start([], 4, gib) is None


def test_the_tiers_merge_their_lowest_tier_first_and_the_oldest_within_it() -> None:
    mib, gib = 1 << 20, 1 << 30
    up = 256 * mib      # tier 0 below 512 MiB, tier 1 below 2 GiB, tier 2 below 8 GiB (fanout 4)
    # Where a fast send stood when its tier-1 merge started: four tier-1 units, then uploads arriving.
    sizes = [1135 * mib, 880 * mib, 880 * mib, 880 * mib, 225 * mib, 226 * mib, 226 * mib, 226 * mib, 221 * mib]
    assert tier_merge_start(sizes, up, 4, 16 * gib) == 4
    assert tier_merge_start(sizes[:8], up, 4, 16 * gib) == 4
    assert tier_merge_start(sizes[:7], up, 4, 16 * gib) == 0    # three uploads: the tier-1 units go
    # Groups must be consecutive and of one tier; within the bound.
    assert tier_merge_start([225 * mib, 900 * mib, 225 * mib, 225 * mib, 225 * mib], up, 4, 16 * gib) is None
    assert tier_merge_start([3 * gib] * 4, up, 4, 8 * gib) is None
    assert tier_merge_start([3 * gib] * 4, up, 4, 16 * gib) == 0
    assert tier_merge_start([3 * gib] * 4 + [mib] * 4, up, 4, 16 * gib) == 4
    assert tier_merge_start([mib] * 3, up, 4, gib) is None
    assert tier_merge_start([], up, 4, gib) is None


def _round_message(q: int, r: int) -> bytes:
    return f"{q}/{r}/".encode() * 4


@pytest.mark.parametrize("idle", ["merges", "bytes_max=0", "not-at-rest-yet", "readers-busy"])
def test_a_store_at_rest_merges_its_newest_objects(tmp_path: Path, idle: str) -> None:
    one_object_per_round(tmp_path, [range(500)] * 3, _round_message)
    model = {f"q{q}": [_round_message(q, r) for r in range(3)] for q in range(500)}
    # Three uploads of one tier: with compact_fanout 4 the tiers would not merge them yet.
    overrides: dict[str, object] = {
        "merges": {"compact_idle_s": 0.2},
        "bytes_max=0": {"compact_idle_s": 0.0, "compact_idle_bytes_max": 0},   # at rest from the first look
        "not-at-rest-yet": {"compact_idle_s": 3600.0},
        "readers-busy": {"compact_idle_s": 0.3},
    }[idle]
    with QueueStore.open(tmp_path, config=small_queue_config(compact_fanout=4, **overrides)) as qs:
        assert len(qs.log_cache.view.objects) == 3
        if idle == "readers-busy":
            # A get every 50 ms through two whole looks of the compactor: never at rest, so nothing merges;
            # once the gets stop, the merge comes.
            looks = qs.compactor.looks
            while qs.compactor.looks < looks + 2:
                assert qs.get("q7", 0, 3) == model["q7"]
                time.sleep(0.05)    # paced: the gets must come more often than compact_idle_s, not flat out
            assert qs.stats()["compactions"] == 0 and len(qs.log_cache.view.objects) == 3
        if idle in ("merges", "readers-busy"):
            wait_until(lambda: qs.stats()["compactions"] == 1 and len(qs.log_cache.view.objects) == 1,
                       lambda: f"the merge at rest: {qs.stats()}")
            assert qs.stats()["compactions_at_rest"] == 1
        else:
            # Two whole looks of the compactor: it has looked at the store as it is now, and merged nothing.
            looks = qs.compactor.looks
            wait_until(lambda: qs.compactor.looks >= looks + 2, "two more looks of the compactor")
            assert qs.stats()["compactions"] == 0 and len(qs.log_cache.view.objects) == 3
        for name, messages in model.items():
            assert qs.get(name, 0, 10) == messages
            assert qs.get(name, 1, 1) == messages[1:2]
    with pytest.raises(ValueError, match="compact_idle"):
        small_queue_config(compact_idle_s=-1.0).validate()


def test_merge_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="compact_merge_bytes_max"):
        small_queue_config(compact_merge_bytes_max=1024).validate()
    with pytest.raises(ValueError, match="compact_object_bytes_max"):
        small_queue_config(compact_object_bytes_max=1024).validate()
    objects, _ = _objects(random.Random(6), 2, [50, 1])
    with pytest.raises(ValueError, match="cannot hold the index"):
        plan_merge([_source("o0", objects[0]), _source("o1", objects[1])], np.zeros(0, U32), 100)


def test_a_merge_waits_for_a_due_upload_to_go_first(tmp_path: Path) -> None:
    """Uploads and merges take turns: with an upload due, the compactor starts no merge until one upload
    is done (it used to take the upload lock again at once and keep the uploader out)."""
    config = small_queue_config(compact_fanout=2, upload_idle_s=3600.0, upload_interval_s=3600.0,
                                upload_bytes_threshold=64 << 10)
    with QueueStore.open(tmp_path, config=config) as qs:
        qs.put("q", b"m")
        qs.flush()
        assert not qs.uploader.due()
        qs.compactor.let_uploads_go_first()   # nothing due: no wait
        returned = threading.Event()
        with qs.uploader.lock:        # the uploader blocks on it, as behind a merge
            qs.put_many(["q"] * 100, [bytes(1000)] * 100)
            qs.flush()
            assert qs.uploader.due()  # the log cache is past upload_bytes_threshold
            waiter = threading.Thread(target=lambda: (qs.compactor.let_uploads_go_first(), returned.set()))
            waiter.start()
            assert not returned.wait(0.3), "a merge must not start while an upload is due"
        assert returned.wait(WAIT_S), "once the upload is done the merge goes"
        waiter.join()
        assert qs.stats()["objects"] >= 1 and qs.get("q", 0, 2) == [b"m", bytes(1000)]


def test_gets_during_merges_see_every_message(tmp_path: Path) -> None:
    rng = random.Random(12)
    model: dict[str, list[bytes]] = {}
    stop = threading.Event()
    errors: list[BaseException] = []
    with QueueStore.open(tmp_path, config=small_queue_config(compact_fanout=2, upload_idle_s=3600.0)) as qs:
        _fill(qs, model, rng, 2, 200)
        snapshot = {name: list(messages) for name, messages in model.items()}

        def reader() -> None:
            r = random.Random(1)
            try:
                while not stop.is_set():
                    name = r.choice(sorted(snapshot))
                    got = qs.get(name, 0, len(snapshot[name]))
                    assert got == snapshot[name], name
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        _fill(qs, model, rng, 10, 200)
        # The readers go on until the merges the rounds bring have run (on a busy machine they lag).
        wait_until(lambda: qs.stats()["compactions"] >= 3, lambda: f"three merges: {qs.stats()}")
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors[0]


def test_a_merge_that_fails_to_commit_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(13)
    model: dict[str, list[bytes]] = {}
    config = small_queue_config(compact_fanout=2, upload_idle_s=3600.0, upload_attempts_max=1)

    def refuse(*args: object) -> int:
        raise MetadataCommitError("the disk is full")

    monkeypatch.setattr(Metadata, "replace_objects", refuse)
    with QueueStore.open(tmp_path, config=config) as qs:
        _fill(qs, model, rng, 4, 100)
        wait_until(lambda: qs.compaction_error is not None, lambda: f"the merge to fail: {qs.stats()}")
        assert qs.stats()["compactions"] == 0
        # The merged object was written but never committed: an orphan, next to the four uploads.
        assert len(_files(tmp_path)) == 5
        _check(qs, model, rng)
        _fill(qs, model, rng, 1, 100)  # writing goes on
        _check(qs, model, rng)
    monkeypatch.undo()
    with QueueStore.open(tmp_path, config=config) as qs:
        assert qs.recovery.orphan_objects_deleted == 1
        _check(qs, model, rng)


class MetadataCommitError(StratalogError):
    pass


def test_a_merge_stops_at_a_damaged_run_and_reads_report_it(tmp_path: Path) -> None:
    rng = random.Random(14)
    model: dict[str, list[bytes]] = {}
    config = small_queue_config(compact_fanout=3, upload_idle_s=3600.0)
    with QueueStore.open(tmp_path, config=config) as qs:
        _fill(qs, model, rng, 2, 100)
        first = tmp_path / LOCAL_DIR_NAME / QUEUE_PREFIX / _files(tmp_path)[0]
        raw = bytearray(first.read_bytes())
        raw[100] ^= 0x01  # in page 0: the runs of the first queues
        first.write_bytes(raw)
        _fill(qs, model, rng, 1, 100)
        wait_until(lambda: qs.compaction_error is not None, lambda: f"the merge to fail: {qs.stats()}")
        assert isinstance(qs.compaction_error, CorruptBulkError)
        assert qs.stats()["compactions"] == 0
        failed = set()
        for name, messages in model.items():
            try:
                assert qs.get(name, 0, len(messages)) == messages
            except CorruptBulkError:
                failed.add(name)
        # Exactly the queues with a run in the damaged page fail; every other read is whole.
        positions = qs.log_cache.view.index.positions[:, 0].astype(int)
        in_page = {name for name, s in qs.writer.ids.items()
                   if positions[s] < positions[s + 1] and positions[s] < PAGE_BYTES}
        assert failed == in_page and 1 <= len(failed) < len(model)


def _stored_sources(tmp_path: Path, rounds: int, streams: list[int]) -> tuple[LocalDirStore, list[tuple[str, int]]]:
    objects, _ = _objects(random.Random(7), rounds, streams)
    store = LocalDirStore(tmp_path / "objects")
    keys = []
    for i, raw in enumerate(objects):
        key = f"{QUEUE_PREFIX}src-{i}"
        store.put(key, raw)
        keys.append((key, len(raw)))
    return store, keys


@pytest.mark.parametrize("piece_bytes_max", [1 << 30, 12_000])
def test_a_merge_in_the_worker_process_writes_the_same_bytes_as_one_in_a_thread(tmp_path: Path,
                                                                               piece_bytes_max: int) -> None:
    store, keys = _stored_sources(tmp_path, 4, [300, 200, 0, 100])
    sources = [MergeSource.open(key, functools.partial(store.get, key), size) for key, size in keys]
    plan = plan_merge(sources, np.zeros(0, U32), piece_bytes_max)
    expected = []
    for p in range(len(plan.pieces)):
        result = MergeResult()
        expected.append((b"".join(bytes(part) for part in merge_piece(plan, p, 1000, result)), result))
    piece_keys = tuple(f"{QUEUE_PREFIX}merged-{p}" for p in range(len(plan.pieces)))
    job = MergeJob(str(store.root), tuple(keys), np.zeros(0, U32), piece_keys, piece_bytes_max, 1000, 4096)

    answer = run_merge_job(job, lambda: False)
    results = answer.results
    assert 10 << 20 < answer.peak_rss_bytes < 1 << 30     # an interpreter with NumPy and Arrow, and the merge

    assert len(results) == len(plan.pieces)
    assert (len(plan.pieces) == 1) == (piece_bytes_max > 1 << 20)
    for key, (raw, want), got in zip(piece_keys, expected, results, strict=True):
        assert isinstance(got, MergeResult)
        assert store.get(key) == raw
        assert got.size_bytes == want.size_bytes == len(raw)
        assert np.array_equal(got.ends, want.ends) and np.array_equal(got.positions, want.positions)
        assert np.array_equal(got.pages, want.pages) and got.pages_checked == want.pages_checked > 0


def _not_read(start: int, end: int) -> bytes:
    raise AssertionError("a source that reads into the merge's buffer is not read otherwise")


@pytest.mark.parametrize("slice_bytes", [1, 3000, 1 << 20])
def test_sources_read_into_one_buffer_merge_as_through_read(slice_bytes: int) -> None:
    objects, _ = _objects(random.Random(slice_bytes), 4, [9, 4, 0, 6])
    targets: list[bytearray] = []

    def into(raw: bytes) -> Callable[[memoryview, int], int]:
        def read_into(view: memoryview, start: int) -> int:
            assert isinstance(view.obj, bytearray)
            targets.append(view.obj)
            got = raw[start:start + len(view)]
            view[:len(got)] = got
            return len(got)
        return read_into

    through_read = [_source(f"o{i}", raw) for i, raw in enumerate(objects)]
    into_buffer = [dataclasses.replace(src, read=_not_read, read_into=into(raw))
                   for src, raw in zip(through_read, objects, strict=True)]
    want, got = MergeResult(), MergeResult()
    expected = b"".join(merge_objects(through_read, np.zeros(0, U32), slice_bytes, want))
    assert b"".join(merge_objects(into_buffer, np.zeros(0, U32), slice_bytes, got)) == expected
    assert got.pages_checked == want.pages_checked > 0 and np.array_equal(got.pages, want.pages)
    assert len(targets) >= len(objects)
    for before, after in itertools.pairwise(targets):
        assert after is before or len(after) > len(before), "the slices reuse one buffer (a new one only to grow)"


def test_a_source_read_into_short_stops_the_merge() -> None:
    objects, _ = _objects(random.Random(8), 2, [5, 3])
    short = objects[1][:len(objects[1]) // 3]

    def read_into(view: memoryview, start: int) -> int:
        got = short[start:start + len(view)]
        view[:len(got)] = got
        return len(got)

    sources = [_source("o0", objects[0]), dataclasses.replace(_source("o1", objects[1]), read_into=read_into)]
    with pytest.raises(CorruptBulkError, match="object o1 is shorter than its index says"):
        b"".join(merge_objects(sources, np.zeros(0, U32), 1 << 20, MergeResult()))


def test_a_worker_merge_after_an_object_of_many_queues(tmp_path: Path) -> None:
    # The job carries every queue's end before the merged objects: here 40,000 of them, 160 KB, more than
    # a pipe holds.
    store, keys = _stored_sources(tmp_path, 3, [40_000, 10, 10])
    before = MergeSource.open(keys[0][0], functools.partial(store.get, keys[0][0]), keys[0][1]).ends
    sources = [MergeSource.open(key, functools.partial(store.get, key), size) for key, size in keys[1:]]
    result = MergeResult()
    raw = b"".join(bytes(p) for p in merge_objects(sources, before, 1 << 20, result))
    job = MergeJob(str(store.root), tuple(keys[1:]), before, (f"{QUEUE_PREFIX}merged",), 1 << 30, 1 << 20, 4096)

    [got] = run_merge_job(job, lambda: False).results

    assert isinstance(got, MergeResult) and got.size_bytes == len(raw)
    assert store.get(f"{QUEUE_PREFIX}merged") == raw


def test_the_worker_reports_a_damaged_source_page_as_corrupt_and_writes_nothing(tmp_path: Path) -> None:
    store, keys = _stored_sources(tmp_path, 3, [300, 200, 100])
    path = store.root / keys[1][0]
    raw = bytearray(path.read_bytes())
    raw[PAGE_BYTES + 7] ^= 0x40
    path.write_bytes(bytes(raw))
    job = MergeJob(str(store.root), tuple(keys), np.zeros(0, U32), (f"{QUEUE_PREFIX}merged",), 1 << 30, 1 << 20, 4096)

    with pytest.raises(CorruptBulkError, match=r"src-1: page 1 .*failed its CRC"):
        run_merge_job(job, lambda: False)
    assert not list(store.list(f"{QUEUE_PREFIX}merged"))


def test_a_worker_whose_sources_are_gone_fails_with_the_reason(tmp_path: Path) -> None:
    store, keys = _stored_sources(tmp_path, 2, [50, 50])
    job = MergeJob(str(store.root), ((f"{QUEUE_PREFIX}missing", 4096), *keys), np.zeros(0, U32),
                   (f"{QUEUE_PREFIX}merged",), 1 << 30, 1 << 20, 4096)
    with pytest.raises(MergeWorkerError, match="missing"):
        run_merge_job(job, lambda: False)


def test_a_cancelled_worker_merge_is_stopped(tmp_path: Path) -> None:
    # The first source is a FIFO nobody writes: the worker waits on it as on a disk that does not answer.
    store, keys = _stored_sources(tmp_path, 2, [50, 50])
    os.mkfifo(store.root / f"{QUEUE_PREFIX}stuck")
    job = MergeJob(str(store.root), ((f"{QUEUE_PREFIX}stuck", 8192), *keys), np.zeros(0, U32),
                   (f"{QUEUE_PREFIX}merged",), 1 << 30, 1 << 20, 4096)
    asked = []

    def cancelled() -> bool:
        asked.append(time.monotonic())
        return len(asked) >= 3

    started = time.monotonic()
    with pytest.raises(MergeCancelledError):
        run_merge_job(job, cancelled)
    assert len(asked) == 3 and time.monotonic() - started < 5
    assert not list(store.list(f"{QUEUE_PREFIX}merged"))


def test_the_worker_dies_with_the_store_that_started_it(tmp_path: Path) -> None:
    # A store killed with -9 mid-merge: its worker must not go on writing objects. The worker here waits
    # for its job on a pipe whose writing end this test holds, so only the parent's death can end it.
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "args = [sys.executable, '-m', 'stratalog.queues.merge_worker', str(os.getpid())]\n"
        "child = subprocess.Popen(args, stdin=int(sys.argv[1]))\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.read()  # holds still until killed (or, should this test die first, until stdin closes)\n")
    job_read, job_write = os.pipe()
    with subprocess.Popen([sys.executable, str(script), str(job_read)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, pass_fds=(job_read,)) as parent:
        os.close(job_read)
        try:
            assert parent.stdout is not None
            worker = int(parent.stdout.readline())
            # The first byte of a job: once the worker has taken it from the pipe it has set up its death with
            # its parent (that comes first) and waits for the rest.
            os.write(job_write, b"\x80")
            wait_until(lambda: _bytes_in_pipe(job_write) == 0, "the worker to read the start of its job")
            assert _alive(worker)
            parent.kill()
            parent.wait()
            wait_until(lambda: not _alive(worker), "the worker to die with its parent")
        finally:
            os.close(job_write)
            parent.kill()


def _bytes_in_pipe(fd: int) -> int:
    """Bytes written to the pipe of ``fd`` (either end) and not yet read."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_closing_the_store_stops_its_worker_merge_and_loses_nothing(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from stratalog.queues import compactor as compactor_module
    from stratalog.queues import merge_worker as merge_worker_module

    started = threading.Event()
    outcomes: list[str] = []
    finished_pieces: list[Path] = []

    def merge_until_closed(job: MergeJob, cancelled: Callable[[], bool]) -> MergeAnswer:
        # Hold the merge until the store closes, then run the real worker with the store's own flag: it
        # must be killed at its first poll and the merge given up.
        finished_pieces.append(tmp_path / LOCAL_DIR_NAME / job.piece_keys[0])
        finished_pieces[0].write_bytes(b"a piece the worker finished: in place, committed nowhere")
        started.set()
        try:
            wait_until(cancelled, "the store to close", poll_s=0.01)
            return run_merge_job(job, cancelled)
        except MergeCancelledError:
            outcomes.append("cancelled")
            raise
        except BaseException as exc:     # named in the failure, if the worker ended some other way
            outcomes.append(repr(exc))
            raise

    monkeypatch.setattr(compactor_module, "run_merge_job", merge_until_closed)
    # Poll at once: a worker with a merge this small can finish within the default poll (0.2 s), and a merge
    # that finishes during the close is committed (safe, but not the cancellation this test is about).
    monkeypatch.setattr(merge_worker_module, "POLL_S", 0.001)
    rng = random.Random(5)
    model: dict[str, list[bytes]] = {}
    qs = QueueStore.open(tmp_path, config=small_queue_config(compact_fanout=2, upload_idle_s=3600.0))
    _fill(qs, model, rng, 2, 100)
    assert started.wait(WAIT_S), "two uploads make a merge"
    # What a worker killed mid-piece leaves (it may be a spare of gigabytes): the close removes it.
    cut_off = tmp_path / LOCAL_DIR_NAME / QUEUE_PREFIX / f"{TEMP_PREFIX}cut-off-piece"
    cut_off.write_bytes(b"half a merged piece")
    began = time.monotonic()
    qs.close()
    assert time.monotonic() - began < 5 and outcomes == ["cancelled"]
    assert qs.compaction_error is None and qs.compactions == 0
    assert not cut_off.exists()
    assert not finished_pieces[0].exists(), "a cancelled merge's pieces go at the close, not at the next open"

    monkeypatch.undo()
    with QueueStore.open(tmp_path, config=small_queue_config(compact_fanout=0)) as reopened:
        assert reopened.stats()["objects"] == 2
        _check(reopened, model, rng)


def test_no_piece_of_more_than_one_queue_exceeds_the_bound_by_a_byte() -> None:
    # The page CRCs round up: a bound met on average is exceeded by a few bytes at some sizes.
    objects, _ = _objects(random.Random(21), 3, [400, 50, 50])
    sources = [_source(f"o{i}", raw) for i, raw in enumerate(objects)]
    fixed = 8 * 500 + 48 + len(b"".join(s.names_raw for s in sources))
    tried = 0
    for piece_bytes_max in range(fixed + 4 * PAGE_BYTES, fixed + 12 * PAGE_BYTES, 97):
        plan = plan_merge(sources, np.zeros(0, U32), piece_bytes_max)
        for p, (lo, hi) in enumerate(plan.pieces):
            size = len(b"".join(merge_piece(plan, p, 1 << 20, MergeResult())))
            assert size <= piece_bytes_max or hi - lo == 1, (piece_bytes_max, p, size)
            tried += 1
    assert tried > 300


def _merged_both_ways(sources: list[MergeSource], prev: np.ndarray, slice_bytes: int) -> list[tuple[bytes, tuple]]:
    """The merge of ``sources`` by the compiled join (_native.merge_runs) and by its twin (Arrow takes)."""
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    out = []
    for join in (native.merge_runs, None):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(compaction_module, "_merge_runs", join)
            result = MergeResult()
            merged = b"".join(merge_objects(sources, prev, slice_bytes, result))
            out.append((merged, (result.size_bytes, result.ends.tolist(), result.positions.tolist(),
                                 result.pages.tolist(), result.runs_written, result.pages_checked)))
    return out


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 5), st.sampled_from([1, 64, 3000, 1 << 20]))
def test_the_compiled_join_merges_as_its_twin(seed: int, rounds: int, slice_bytes: int) -> None:
    rng = random.Random(seed)
    objects, _ = _objects(rng, rounds, [rng.randint(0, 8) or 1 for _ in range(rounds)])
    first = rng.randrange(rounds - 1)
    prev = _source("p", objects[first - 1]).ends if first else np.zeros(0, U32)
    sources = [_source(f"o{i}", objects[i]) for i in range(first, rounds)]

    mine, twin = _merged_both_ways(sources, prev, slice_bytes)

    assert mine == twin


def _run(ends: list[int], data: bytes) -> bytes:
    return b"".join(e.to_bytes(4, "little") for e in ends) + data


def test_the_compiled_join_joins_each_streams_runs_in_source_order() -> None:
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    # Two sources, two streams: source 0 has (a, bc) for stream 0, nothing for 1; source 1 has (d) and (ef).
    runs = [_run([1, 3], b"abc"), _run([1], b"d"), _run([2], b"ef")]
    sources = b"".join(runs)
    starts = np.array([[0, 11, 11], [11, 16, 22]], np.int64)
    counts = np.array([[2, 0], [1, 1]], np.int64)

    out = bytearray(22)

    assert native.merge_runs(sources, starts, counts, out) is True
    assert out == _run([1, 3, 4], b"abcd") + _run([2], b"ef")


def test_the_compiled_join_leaves_a_run_whose_last_end_is_not_its_length_to_the_caller() -> None:
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    assert native.merge_runs(_run([1, 2], b"abc"), np.array([[0, 11]], np.int64), np.array([[2]], np.int64),
                             bytearray(11)) is None


def test_the_compiled_join_fills_exactly_the_room_it_is_given() -> None:
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    with pytest.raises(ValueError, match="merge_runs: the runs take 11 bytes, out holds 10"):
        native.merge_runs(_run([1, 3], b"abc"), np.array([[0, 11]], np.int64), np.array([[2]], np.int64),
                          bytearray(10))


@pytest.mark.parametrize(("starts", "counts"), [
    ([[0, 12]], [[2]]),        # past the sources' bytes
    ([[3, 2]], [[0]]),         # a run that ends before it starts
    ([[0, 11]], [[3]]),        # more ends than the run holds
    ([[0, 11]], [[-1]]),
    ([[0, 11]], [[1], [1]]),   # counts for two sources, starts for one
])
def test_the_compiled_join_refuses_runs_that_do_not_fit(starts: list[list[int]], counts: list[list[int]]) -> None:
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    with pytest.raises(ValueError, match="merge_runs"):
        native.merge_runs(_run([1, 3], b"abc"), np.array(starts, np.int64), np.array(counts, np.int64),
                          bytearray(11))
