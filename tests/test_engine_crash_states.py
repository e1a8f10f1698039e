"""Power cuts of the stream engine through the fault-injecting WAL device, from fixed seeds.

Each scenario runs a StreamStore over a MemDevice WAL and an in-memory object store: several streams,
seeded appends of mixed sizes, flushes, trims, and uploads made frequent by small thresholds. At chosen
points it takes a crash state: the committed metadata (an SQLite backup), the objects, and a crash image
of the WAL (synced bytes plus any subset of the unsynced writes, torn at 512 B or 4 KiB, sometimes with
flipped bits). Most states are taken between steps with the store's upload lock held, so no upload is
half done; others from inside an upload: after an object's put and before its commit (an orphan), and
as the WAL trim's header is written after the commit (batches both in objects and in the WAL).

Each state is opened as a fresh store and checked: every acknowledged record at or above the stream's
start is readable with its bytes at its offset, offsets are dense from the start (no gap, no duplicate),
every record returned is one that was appended at that offset (nothing corrupt), the start lies between
the last completed and the last attempted trim, and no object is left that metadata does not know. The
last state of a session becomes the next session's store, so recovery also runs over recovered stores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import logging
import mmap
import random
import shutil
import sqlite3
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from enginekit import MemoryStore, abandon, small_store_config
from stratalog.engine.config import StoreConfig
from stratalog.engine.store import DATA_PREFIX, StoreFailedError, StreamStore
from stratalog.errors import StratalogError
from stratalog.io.faulty import FaultPlan, MemDevice, flip_bit
from stratalog.wal import WALConfig
from stratalog.wal.format import HEADERS_BYTES, RECORD_HEADER, RECORD_HEADER_BYTES
from waiting import WAIT_S

#: A 512 KiB ring with 16 KiB blocks: uploads trim it often and appends wrap it many times per scenario.
RING_BYTES = 512 << 10
WAL_CAPACITY_BYTES = HEADERS_BYTES + RING_BYTES
#: Largest batch the scenarios build stays below the WAL's record_bytes_max (32 KiB).
RECORDS_PER_BATCH_MAX = 6
RECORD_BYTES_MAX = 4000

SCENARIOS = 16
SESSIONS_PER_SCENARIO = 3
STEPS_PER_SESSION = 14
CRASH_STATES_MIN = 600
#: Chance that an upload's object put or WAL trim takes a crash state, and how many a session takes so.
IN_UPLOAD_CHANCE = 0.35
IN_UPLOAD_STATES_MAX = 8
#: Appends while syncs are held stay few: nothing can be uploaded then, so neither the log cache nor
#: the WAL ring may fill (an append would wait for room that cannot come).
STALLED_APPENDS_MAX = 8
#: No upload takes this long here; waiting longer for the upload lock means one hung.
LOCK_WAIT_S_MAX = 20.0


def crash_config() -> StoreConfig:
    """Small enough that a few dozen appends upload, trim the WAL and wrap its ring."""
    wal = WALConfig(block_bytes_soft_max=16 << 10, record_bytes_max=32 << 10, window_bytes_max=128 << 10,
                    buffered_bytes_max=256 << 10, block_linger_s=0.0002, io_threads=2,
                    recovery_read_bytes=64 << 10, append_wait_s_max=5.0)
    return small_store_config(wal_capacity_bytes=WAL_CAPACITY_BYTES, wal=wal, log_cache_bytes_max=256 << 10,
                              upload_bytes_threshold=48 << 10, stream_object_bytes_min=24 << 10,
                              append_wait_s_max=5.0)


class ProbedDevice(MemDevice):
    """A MemDevice that calls ``on_header_write`` after each write to the WAL's header slots (a WAL trim)."""

    def __init__(self, size_bytes: int, *, image: bytes | bytearray | None = None,
                 faults: FaultPlan | None = None) -> None:
        super().__init__(size_bytes, image=image, faults=faults)
        self.on_header_write: Callable[[], None] | None = None

    def pwrite(self, buf: bytes | bytearray | memoryview | mmap.mmap, position_bytes: int) -> None:
        super().pwrite(buf, position_bytes)
        hook = self.on_header_write
        if hook is not None and position_bytes < HEADERS_BYTES:
            hook()


class ProbedStore(MemoryStore):
    """A MemoryStore that calls ``on_data_put`` after each data object lands (before the engine commits it)."""

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        super().__init__()
        self.objects = dict(objects or {})
        self.on_data_put: Callable[[], None] | None = None

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        super().put(key, data)
        hook = self.on_data_put
        if hook is not None and key.startswith(DATA_PREFIX):
            hook()

    def copy_objects(self) -> dict[str, bytes]:
        with self._lock:
            return dict(self.objects)


@dataclass
class Tally:
    crash_states: int = 0
    states_between_steps: int = 0
    states_after_object_put: int = 0
    states_at_wal_trim: int = 0
    states_in_recovery: int = 0
    images_with_flipped_bits: int = 0
    images_with_unsynced_writes: int = 0
    acknowledged_checked: int = 0
    records_returned: int = 0
    acknowledged_lost: int = 0
    duplicates: int = 0
    gaps: int = 0
    corrupt_returned: int = 0
    start_out_of_bounds: int = 0
    orphans_left: int = 0
    ranges_without_object: int = 0
    orphans_deleted: int = 0
    batches_replayed: int = 0
    batches_already_in_objects: int = 0
    batches_not_contiguous: int = 0
    stream_trims: int = 0

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in vars(self).items())


@dataclass
class Append:
    stream_id: int
    base_offset: int
    values: list[bytes]
    future: Future[int]


@dataclass
class CrashState:
    where: str
    meta: bytes
    objects: dict[str, bytes]
    image: bytearray
    #: Acknowledged records, read before the image was taken: stream -> offset -> value.
    acked: dict[int, dict[int, bytes]]
    #: Per stream: the start its last completed trim set, and the highest start any trim attempted.
    trims: dict[int, tuple[int, int]]
    flipped_bits: int = 0


@dataclass
class Reopened:
    store: StreamStore
    device: ProbedDevice
    objects: ProbedStore
    data_dir: Path
    #: Every record readable after the open: stream -> offset -> value.
    records: dict[int, dict[int, bytes]] = field(default_factory=dict)


def committed_metadata(data_dir: Path) -> bytes:
    """The committed metadata, read through a connection of its own (SQLite's backup API)."""
    src = sqlite3.connect(data_dir / "meta.sqlite")
    dst = sqlite3.connect(":memory:")
    try:
        src.backup(dst)
        return dst.serialize()
    finally:
        src.close()
        dst.close()


def acknowledged(appends: list[Append]) -> dict[int, dict[int, bytes]]:
    """Records whose append future completed without error. Read this before taking the WAL image."""
    out: dict[int, dict[int, bytes]] = {}
    for a in list(appends):
        fut = a.future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            assert fut.result() == a.base_offset, f"acknowledged at offset {fut.result()}, not {a.base_offset}"
            per = out.setdefault(a.stream_id, {})
            for i, value in enumerate(a.values):
                per[a.base_offset + i] = value
    return out


class Dirs:
    """Fresh data directories under one root, removed as states are done with."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._ids = itertools.count()

    def new(self) -> Path:
        path = self._root / f"s{next(self._ids)}"
        path.mkdir()
        return path


def open_state(state: CrashState, dirs: Dirs, config: StoreConfig,
               recovery_crashes: tuple[random.Random, list[CrashState]] | None = None) -> Reopened:
    """Open a crash state as a fresh store. With ``recovery_crashes``, also take a crash state each time
    recovery puts an object or writes the WAL header (a second crash while recovering from the first)."""
    data_dir = dirs.new()
    (data_dir / "meta.sqlite").write_bytes(state.meta)
    device = ProbedDevice(WAL_CAPACITY_BYTES, image=state.image)
    objects = ProbedStore(state.objects)
    if recovery_crashes is not None:
        rng, states = recovery_crashes

        def capture(where: str) -> None:
            # Recovery runs alone (the uploader starts after it): nothing else moves while this copies.
            meta = committed_metadata(data_dir)
            states.append(CrashState(where, meta, objects.copy_objects(), device.crash_image(rng),
                                     state.acked, state.trims))

        device.on_header_write = lambda: capture("recovery: wal header")
        objects.on_data_put = lambda: capture("recovery: object put")
    try:
        store = StreamStore.open(data_dir, objects, config, wal_device=device)
    finally:
        device.on_header_write = None
        objects.on_data_put = None
    return Reopened(store, device, objects, data_dir)


def read_all(store: StreamStore, stream_id: int) -> tuple[int, list[tuple[int, bytes]]]:
    """A stream's start and every record from it to its end, fetched in pieces."""
    s = store.open_stream(stream_id)
    start, end = s.start_offset, s.end_offset
    out: list[tuple[int, bytes]] = []
    pos = start
    while pos < end:
        got = s.fetch(pos, max_bytes=64 << 10)
        if not got:
            break
        out.extend((r.offset, r.value) for r in got)
        pos = got[-1].offset + 1
    return start, out


def check_state(state: CrashState, known: dict[int, dict[int, bytes]], tally: Tally, dirs: Dirs,
                config: StoreConfig, keep_open: bool = False,
                recovery_crashes: tuple[random.Random, list[CrashState]] | None = None) -> Reopened | None:
    """Open a crash state as a fresh store and count every way it breaks the contract."""
    r = open_state(state, dirs, config, recovery_crashes)
    tally.crash_states += 1
    tally.images_with_flipped_bits += state.flipped_bits > 0
    rep = r.store.recovery
    tally.orphans_deleted += rep.orphan_objects_deleted
    tally.batches_replayed += rep.batches_replayed
    tally.batches_already_in_objects += rep.batches_already_in_objects
    tally.batches_not_contiguous += rep.batches_not_contiguous
    for stream_id, (trim_done, trim_attempted) in state.trims.items():
        start, records = read_all(r.store, stream_id)
        end = r.store.open_stream(stream_id).end_offset
        if not trim_done <= start <= max(trim_done, trim_attempted):
            tally.start_out_of_bounds += 1
        offsets = [off for off, _ in records]
        tally.duplicates += len(offsets) - len(set(offsets))
        if offsets != list(range(start, start + len(offsets))) or start + len(offsets) != end:
            tally.gaps += 1
        tally.records_returned += len(records)
        appended = known.get(stream_id, {})
        returned = dict(records)
        tally.corrupt_returned += sum(appended.get(off) != value for off, value in records)
        for off, value in state.acked.get(stream_id, {}).items():
            if off >= start:
                tally.acknowledged_checked += 1
                tally.acknowledged_lost += returned.get(off) != value
        r.records[stream_id] = returned
    known_keys = {o.key for o in r.store.metadata.objects()}
    stored = {info.key for info in r.objects.list(DATA_PREFIX)}
    tally.orphans_left += len(stored - known_keys)
    referenced = {row.key for sid in state.trims for row in r.store.metadata.ranges(sid, 0, limit=1 << 20)}
    tally.ranges_without_object += len(referenced - stored)
    if keep_open:
        return r
    close_reopened(r)
    return None


def close_reopened(r: Reopened) -> None:
    r.device.on_header_write = None
    r.objects.on_data_put = None
    abandon(r.store)
    shutil.rmtree(r.data_dir)


class Scenario:
    """One seeded run: a store, what was appended and acknowledged, and the crash states taken."""

    def __init__(self, seed: int, tally: Tally, dirs: Dirs, config: StoreConfig | None = None) -> None:
        self.rng = random.Random(seed)
        #: The upload hooks run on the uploader thread: their own generator keeps the driver's sequence fixed.
        self.hook_rng = random.Random(seed ^ 0x5EED)
        self.tally = tally
        self.dirs = dirs
        self.config = config or crash_config()
        self.known: dict[int, dict[int, bytes]] = {}   # every record appended, by stream and offset
        self.must_survive: dict[int, dict[int, bytes]] = {}  # what earlier sessions' recovery returned
        self.trims: dict[int, tuple[int, int]] = {}
        self.appends: list[Append] = []
        self.next_offset: dict[int, int] = {}
        self.pending: list[CrashState] = []
        self.pending_lock = threading.Lock()
        self.in_upload_states = 0

    # Running ----------------------------------------------------------------------------------------

    def run(self) -> None:
        data_dir = self.dirs.new()
        device = ProbedDevice(WAL_CAPACITY_BYTES)
        objects = ProbedStore()
        store = StreamStore.open(data_dir, objects, self.config, wal_device=device)
        live = Reopened(store, device, objects, data_dir)
        for _ in range(self.rng.randint(2, 4)):
            self.create_stream(store)
        for _session in range(SESSIONS_PER_SCENARIO):
            self.session(live)
            state = self.capture(live, "session end", hold_upload_lock=True)
            close_reopened(live)
            self.check_pending()
            in_recovery: list[CrashState] = []
            reopened = check_state(state, self.known, self.tally, self.dirs, self.config, keep_open=True,
                                   recovery_crashes=(self.rng, in_recovery))
            assert reopened is not None
            for crashed in in_recovery:
                self.tally.states_in_recovery += 1
                check_state(crashed, self.known, self.tally, self.dirs, self.config)
            live = reopened
            self.must_survive = {sid: dict(recs) for sid, recs in live.records.items()}
            self.appends = []
            for sid in self.trims:
                s = live.store.open_stream(sid)
                self.next_offset[sid] = s.end_offset
                self.trims[sid] = (s.start_offset, s.start_offset)
        close_reopened(live)

    def session(self, live: Reopened) -> None:
        self.in_upload_states = 0
        live.device.on_header_write = lambda: self.capture_in_upload(live, "wal trim")
        live.objects.on_data_put = lambda: self.capture_in_upload(live, "object put")
        try:
            for _ in range(STEPS_PER_SESSION):
                self.step(live)
                self.check_pending()
        finally:
            live.device.on_header_write = None
            live.objects.on_data_put = None
            live.device.release_syncs()

    def step(self, live: Reopened) -> None:
        rng = self.rng
        store = live.store
        action = rng.random()
        if action < 0.45:
            self.append_burst(store, rng.randint(1, 12))
        elif action < 0.6:
            self.stalled_burst(live)
        elif action < 0.7:
            store.flush()
        elif action < 0.82:
            self.trim_one(store)
        elif action < 0.86 and len(self.trims) < 6:
            self.create_stream(store)
        elif action < 0.9:
            store.delete_unreferenced()
        elif self.appends:
            self.appends[-1].future.exception(timeout=10)
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            self.capture(live, "between steps", hold_upload_lock=True)

    def create_stream(self, store: StreamStore) -> None:
        s = store.create_stream()
        self.trims[s.stream_id] = (0, 0)
        self.next_offset[s.stream_id] = 0

    def append_burst(self, store: StreamStore, appends: int) -> None:
        rng = self.rng
        ids = sorted(self.trims)
        for _ in range(appends):
            sid = rng.choice(ids)
            values = [rng.randbytes(rng.choice([rng.randint(0, 200), rng.randint(0, RECORD_BYTES_MAX)]))
                      for _ in range(rng.randint(1, RECORDS_PER_BATCH_MAX))]
            base = self.next_offset[sid]
            future = store.open_stream(sid).append(values)
            self.next_offset[sid] = base + len(values)
            per = self.known.setdefault(sid, {})
            for i, value in enumerate(values):
                per[base + i] = value
            self.appends.append(Append(sid, base, values, future))

    def stalled_burst(self, live: Reopened) -> None:
        """Appends whose writes cannot be synced: crash states then hold many unsynced WAL writes."""
        live.store.flush()  # an empty log cache and WAL ring: the burst below cannot run out of room
        live.device.stall_syncs()
        try:
            self.append_burst(live.store, self.rng.randint(1, STALLED_APPENDS_MAX))
            for _ in range(self.rng.randint(1, 4)):
                self.capture(live, "between steps", hold_upload_lock=True)
        finally:
            live.device.release_syncs()

    def trim_one(self, store: StreamStore) -> None:
        sid = self.rng.choice(sorted(self.trims))
        s = store.open_stream(sid)
        if s.end_offset <= s.start_offset:
            return
        target = self.rng.randint(s.start_offset, s.end_offset)
        done, attempted = self.trims[sid]
        self.trims[sid] = (done, max(attempted, target))
        s.trim(target)
        self.trims[sid] = (max(done, target), max(attempted, target))
        self.tally.stream_trims += 1

    # Crash states -----------------------------------------------------------------------------------

    def capture_in_upload(self, live: Reopened, where: str) -> None:
        """Called on the uploading thread (it holds the upload lock) after an object put or a WAL header write."""
        if self.in_upload_states >= IN_UPLOAD_STATES_MAX or self.hook_rng.random() >= IN_UPLOAD_CHANCE:
            return
        self.in_upload_states += 1
        state = self.capture(live, where, hold_upload_lock=False)
        with self.pending_lock:
            self.pending.append(state)

    def capture(self, live: Reopened, where: str, *, hold_upload_lock: bool) -> CrashState:
        store = live.store
        rng = self.rng if hold_upload_lock else self.hook_rng
        with contextlib.ExitStack() as held:
            if hold_upload_lock:
                assert store._core.upload_lock.acquire(timeout=LOCK_WAIT_S_MAX), "an upload hung"
                held.callback(store._core.upload_lock.release)
            # Trims and stream creation commit under the commit lock: hold it so metadata stands still.
            held.enter_context(store._core.commit_lock)
            acked = self.acknowledged_now()
            trims = dict(self.trims)
            meta = committed_metadata(store._dir)
            objects = live.objects.copy_objects()
            flips = rng.choice([0, 0, 0, 0, 1, 2])
            self.tally.images_with_unsynced_writes += live.device.unsynced_writes() > 0
            image = live.device.crash_image(rng, flip_bits=flips)
        state = CrashState(where, meta, objects, image, acked, trims, flips)
        if where == "between steps":
            self.tally.states_between_steps += 1
            with self.pending_lock:
                self.pending.append(state)
        elif where == "object put":
            self.tally.states_after_object_put += 1
        elif where == "wal trim":
            self.tally.states_at_wal_trim += 1
        return state

    def acknowledged_now(self) -> dict[int, dict[int, bytes]]:
        acked = {sid: dict(recs) for sid, recs in self.must_survive.items()}
        for sid, recs in acknowledged(self.appends).items():
            acked.setdefault(sid, {}).update(recs)
        return acked

    def check_pending(self) -> None:
        with self.pending_lock:
            states, self.pending = self.pending, []
        for state in states:
            check_state(state, self.known, self.tally, self.dirs, self.config)


def assert_contract_kept(tally: Tally) -> None:
    assert tally.acknowledged_lost == 0
    assert tally.duplicates == 0
    assert tally.gaps == 0
    assert tally.corrupt_returned == 0
    assert tally.start_out_of_bounds == 0
    assert tally.orphans_left == 0
    assert tally.ranges_without_object == 0


@pytest.mark.slow
def test_crash_states_of_the_engine_lose_nothing_acknowledged(tmp_path: Path) -> None:
    tally = Tally()
    dirs = Dirs(tmp_path)
    for seed in range(SCENARIOS):
        Scenario(seed, tally, dirs).run()
    print(f"engine crash states: {tally.line()}")
    assert tally.crash_states >= CRASH_STATES_MIN
    assert tally.acknowledged_checked > 100_000, "the scenarios acknowledged too little to mean much"
    assert tally.states_after_object_put > 20 and tally.states_at_wal_trim > 20
    assert tally.states_in_recovery > 50
    assert tally.images_with_flipped_bits > 50
    assert tally.orphans_deleted > 0, "no state left an orphan object: the cleanup is not exercised"
    assert tally.batches_already_in_objects > 0, "no state crashed between a commit and its WAL trim"
    assert tally.stream_trims > 20
    assert_contract_kept(tally)


# Faults while running ---------------------------------------------------------------------------------

EIO_SEEDS = 40
#: Appends tried after the fault is armed; the fault lands within its first few WAL writes or syncs.
APPENDS_AFTER_FAULT_MAX = 200


def start_scenario(seed: int, tally: Tally, dirs: Dirs, streams: int = 3,
                   config: StoreConfig | None = None) -> tuple[Scenario, Reopened]:
    scenario = Scenario(seed, tally, dirs, config)
    data_dir = dirs.new()
    device = ProbedDevice(WAL_CAPACITY_BYTES)
    objects = ProbedStore()
    store = StreamStore.open(data_dir, objects, scenario.config, wal_device=device)
    for _ in range(streams):
        scenario.create_stream(store)
    return scenario, Reopened(store, device, objects, data_dir)


def test_wal_eio_stops_the_store_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    tally = Tally()
    dirs = Dirs(tmp_path)
    seen = {"append_refused": 0, "futures_failed": 0, "acknowledged_after_arming": 0}
    for seed in range(EIO_SEEDS):
        scenario, live = start_scenario(seed, tally, dirs)
        rng, device, store = scenario.rng, live.device, live.store
        scenario.append_burst(store, rng.randint(5, 40))
        armed_at = len(scenario.appends)
        nth = rng.randint(1, 12)
        lands = rng.choice([0, 512, 4096])
        device.faults = (FaultPlan(fail_writes={device.writes + nth}, failed_write_lands_bytes=lands)
                         if seed % 2 else FaultPlan(fail_syncs={device.syncs + nth}))
        refused: StratalogError | None = None
        for _ in range(APPENDS_AFTER_FAULT_MAX):
            try:
                scenario.append_burst(store, 1)
                if rng.random() < 0.1:
                    store.flush()
            except StratalogError as e:
                refused = e
                break
        # Every future completes (none is left pending), in append order: once one fails, none after it
        # is acknowledged, and each failure says the append was not made durable.
        outcomes = [a.future.exception(timeout=10) for a in scenario.appends]
        failed = [i for i, e in enumerate(outcomes) if e is not None]
        # The EIO may hit a write or sync of appended blocks (their futures fail) or of a WAL trim's header
        # (nothing is pending then; the next append is refused).
        assert failed or refused is not None, f"seed {seed}: the store went on after the injected EIO"
        first_failed = failed[0] if failed else len(outcomes)
        assert all(e is not None for e in outcomes[first_failed:]), f"seed {seed}: acknowledged after a failure"
        assert all(isinstance(outcomes[i], StoreFailedError) for i in failed)
        seen["futures_failed"] += len(failed)
        seen["acknowledged_after_arming"] += sum(e is None for e in outcomes[armed_at:])
        # The store stopped: a new append is refused with the store's error, whichever part saw the EIO.
        assert refused is None or isinstance(refused, StoreFailedError), refused
        with pytest.raises(StoreFailedError):
            store.open_stream(sorted(scenario.trims)[0]).append([b"after the failure"])
        seen["append_refused"] += refused is not None
        state = scenario.capture(live, "after eio", hold_upload_lock=True)
        device.faults = FaultPlan()
        close_reopened(live)
        check_state(state, scenario.known, tally, dirs, scenario.config)
    print(f"engine WAL EIO: {seen} {tally.line()}")
    assert tally.crash_states == EIO_SEEDS
    assert seen["acknowledged_after_arming"] > 0, "no append was acknowledged between arming and the fault"
    assert tally.acknowledged_checked > 1000
    assert_contract_kept(tally)


def live_wal_extent(store: StreamStore, image: bytearray) -> tuple[int, int]:
    """Logical ``[start, end)`` of the live WAL records: from past the trimmed record to the durable end."""
    wal = store._core.wal
    trim = wal.trim_offset
    if trim < 0:
        return 0, wal.durable_offset
    _, body_bytes, offset, _, _ = RECORD_HEADER.unpack_from(image, HEADERS_BYTES + trim % RING_BYTES)
    assert offset == trim, "no record at the trim offset"
    return trim + RECORD_HEADER_BYTES + body_bytes, wal.durable_offset


def test_bit_flips_outside_the_live_wal_return_nothing_corrupt_and_lose_nothing(tmp_path: Path) -> None:
    """Flips in trimmed or stale parts of the ring (the trimmed record itself, earlier laps, space past the
    end) change nothing: the CRCs reject what they damage, and recovery needs none of it."""
    tally = Tally()
    dirs = Dirs(tmp_path)
    flipped = trimmed_headers_flipped = 0
    for seed in range(30):
        scenario, live = start_scenario(seed, tally, dirs)
        rng = scenario.rng
        for _ in range(rng.randint(2, 6)):
            scenario.append_burst(live.store, rng.randint(5, 30))
            live.store.flush()  # trims the WAL: the ring fills with trimmed records and wraps
        scenario.append_burst(live.store, rng.randint(1, 20))
        for a in scenario.appends:
            a.future.result(timeout=WAIT_S)
        with live.store._core.upload_lock:
            state = scenario.capture(live, "flips outside the live log", hold_upload_lock=False)
            # Everything was acknowledged, so the durable image holds it all.
            state.image = live.device.durable_image()
            start, end = live_wal_extent(live.store, state.image)
            trim = live.store._core.wal.trim_offset
        live_phys = {(start + i) % RING_BYTES for i in range(end - start)}
        assert len(live_phys) < RING_BYTES // 2, "the live log should leave most of the ring to flip"
        state.flipped_bits = 16
        if trim >= 0:
            # The record at the trim offset is read only to find where it ends: damage to its header
            # makes recovery skip to the next 4 KiB boundary, which must not cost a live record.
            flip_bit(state.image, HEADERS_BYTES + trim % RING_BYTES + rng.randrange(RECORD_HEADER_BYTES),
                     rng.randrange(8))
            trimmed_headers_flipped += 1
            state.flipped_bits -= 1
        for _ in range(state.flipped_bits):
            while (ring_pos := rng.randrange(RING_BYTES)) in live_phys:
                pass
            flip_bit(state.image, HEADERS_BYTES + ring_pos, rng.randrange(8))
        flipped += 16
        close_reopened(live)
        check_state(state, scenario.known, tally, dirs, scenario.config)
    print(f"engine WAL flips outside the live log: bits={flipped} trimmed_headers={trimmed_headers_flipped} "
          f"{tally.line()}")
    assert tally.acknowledged_checked > 1000 and trimmed_headers_flipped > 20
    assert_contract_kept(tally)


def test_flipped_bit_in_an_acknowledged_wal_batch_is_detected_and_never_returned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A flip in the body of an acknowledged, not yet uploaded batch: the WAL's CRC rejects the record,
    and the stream ends before it. Its later batches no longer continue the stream, so recovery skips
    them too (counted as not contiguous); other streams keep everything, and nothing damaged is returned.
    """
    tally = Tally()
    dirs = Dirs(tmp_path)
    for seed in range(20):
        # Uploads only when asked: the batches stay in the WAL and the log cache.
        config = dataclasses.replace(crash_config(), upload_bytes_threshold=256 << 10)
        scenario, live = start_scenario(seed, tally, dirs, config=config)
        rng = scenario.rng
        scenario.append_burst(live.store, rng.randint(10, 25))
        for a in scenario.appends:
            a.future.result(timeout=WAIT_S)
        with live.store._core.upload_lock:
            cached = [(sid, st.cache) for sid, st in live.store._core.streams.items() if st.cache]
            sid, cache = rng.choice(cached)
            victim = rng.choice(list(cache))
            later = sum(e.base_offset > victim.base_offset for e in cache)
            state = scenario.capture(live, "flip in an acknowledged batch", hold_upload_lock=False)
            state.image = live.device.durable_image()
        state.flipped_bits = 1
        body_at = HEADERS_BYTES + victim.wal_offset % RING_BYTES + RECORD_HEADER_BYTES
        flip_bit(state.image, body_at + rng.randrange(len(victim.data)), rng.randrange(8))
        # The contract for this stream: everything before the damaged batch, nothing from it on.
        state.acked[sid] = {off: v for off, v in state.acked[sid].items() if off < victim.base_offset}
        close_reopened(live)
        r = check_state(state, scenario.known, tally, dirs, scenario.config, keep_open=True)
        assert r is not None
        assert r.store.open_stream(sid).end_offset == victim.base_offset
        assert r.store._core.wal.recovery_stats.bad_body_records == 1, "the WAL's CRC must catch the flip"
        rep = r.store.recovery
        assert rep.batches_not_contiguous == later
        assert rep.wal_records_damaged == 1
        assert rep.records_not_contiguous == sum(e.count for e in cache if e.base_offset > victim.base_offset)
        # The loss is reported, naming the stream and where it now ends.
        errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert any("failed their CRC" in m for m in errors), errors
        if later:
            assert any(f"stream {sid} ends at offset {victim.base_offset}" in m for m in errors), errors
        caplog.clear()
        close_reopened(r)
    print(f"engine WAL flip in acknowledged batches: {tally.line()}")
    assert tally.acknowledged_checked > 500
    assert_contract_kept(tally)


@pytest.mark.parametrize("stopped", [False, True])
def test_a_closed_store_is_freed_at_once_whether_an_error_stopped_it_or_not(tmp_path: Path, stopped: bool) -> None:
    """The error that stopped a store (and its WAL) is kept without the frames that raised it: they hold
    the store, and the cycle kept its WAL device and log cache until a full garbage collection."""
    config = small_store_config()
    gc.disable()
    try:
        device = MemDevice(config.wal_capacity_bytes)
        store = StreamStore.open(tmp_path / "s", MemoryStore(), config, wal_device=device)
        stream = store.create_stream("a")
        stream.append([b"first"]).result()
        if stopped:
            device.faults = FaultPlan(fail_syncs={device.syncs + 1})
            with contextlib.suppress(StratalogError):
                for _ in range(APPENDS_AFTER_FAULT_MAX):
                    stream.append([b"more"]).result()
        with contextlib.suppress(StratalogError):
            store.close()
        gone = [weakref.ref(store), weakref.ref(device)]
        del store, device, stream
        assert [r() for r in gone] == [None, None], "a closed store is still referenced"
    finally:
        gc.enable()
