"""The engine kill -9 harness: run a writer on a StreamStore, SIGKILL it at a random moment, reopen, check.

Each round starts ``stratalog.chaos.engine_child`` on the same data directory with a fresh run id,
waits a random time after it says it is ready, kills it with SIGKILL, reads everything it printed,
then opens the store here (which recovers it), reads every stream from its start to its end, checks
what came back against what the children acknowledged, and closes the store:

- every acknowledged record at or above the stream's start comes back, written by the run that
  acknowledged it (acknowledged lost = 0);
- every record a check or a child's open saw comes back in later checks, unless trimmed since
  (recovered lost = 0): recovery commits what it replays, so it is as durable as an acknowledged record;
- offsets are dense from the stream's start to its end: no offset missing (gaps = 0), none returned
  twice (duplicates = 0) or out of order;
- every record is byte for byte what some run of this harness wrote at its stream and offset
  (corrupt = 0; :func:`~stratalog.chaos.engine_child.record_run` checks a record on its own);
- the stream's start is the last completed trim, or a later trim the child started and was killed
  inside (trim mismatches = 0), and nothing below the last completed trim comes back;
- every object under ``data/`` is known to metadata after the open (orphans left = 0) and every object
  metadata refers to exists (objects missing = 0);
- the next child's open sees each stream exactly as the check closed it (reopen disagreements = 0).

A share of the rounds (``recovery_kill_share``) leaves its crash unchecked: the next child then finds a
crashed store, and is killed a random moment after it starts opening it, which is mostly mid-recovery.
The check after that round covers both children. The store, the WAL and the objects carry over from
round to round, so the ring wraps and trims and objects come and go over a run.

SIGKILL ends the process, not the machine: what the child wrote stays in the page cache, so this tests
the order of the engine's steps, not its fsyncs (the fault-injecting device tests drop unsynced
writes). Temp files that an interrupted local put leaves are counted after each open but fail nothing:
they are no objects, and no reader sees them; they only take space.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import ClassVar, NamedTuple

from stratalog.chaos.child import start_child
from stratalog.chaos.engine_child import (
    CHAOS_STORE_CONFIG,
    TAG_OPENING,
    TAG_READY,
    ChildReport,
    parse_child_output,
    record_run,
    stream_name,
    stream_tag,
)
from stratalog.chaos.harness import ChaosHarnessError, MustBeZeroFigures, run_rounds
from stratalog.engine.metadata import UnknownStreamError
from stratalog.engine.store import DATA_PREFIX, OffsetOutOfRangeError, RecoveryReport, Stream, StreamStore
from stratalog.objects.local import TEMP_PREFIX, LocalDirStore
from stratalog.records import Record

#: The parent opens the store as the child does, but runs no retention pass: it only reads, and a pass
#: deleting objects while it lists them would make the orphan count race.
CHECK_STORE_CONFIG = dataclasses.replace(CHAOS_STORE_CONFIG, retention_interval_s=3600.0)


class Phase(StrEnum):
    """When the round's child is killed."""

    RUNNING = "running"        # a random time after it said it was ready
    RECOVERING = "recovering"  # a random time after it started opening a crashed store


@dataclass(frozen=True, slots=True)
class EngineChaosConfig:
    iterations: int = 300
    seed: int = 0
    streams: int = 8
    #: Appending threads in the child; each owns every ``threads``-th stream.
    threads: int = 3
    #: Object store URI for child and parent; None is the local directory under the data directory.
    #: It must hold nothing else: every open deletes the objects under data/ that metadata does not know.
    object_store: str | None = None
    #: A running child is killed this long after it says it is ready, uniformly from the seeded RNG. At
    #: an upload every 50 ms, the window spans several upload cycles, trims and flushes.
    kill_after_s_min: float = 0.02
    kill_after_s_max: float = 0.40
    #: The chance that a round is left unchecked, so the next child recovers a crashed store and is
    #: killed mid-recovery.
    recovery_kill_share: float = 0.15
    #: Starting Python and opening the store take well under a second; far more means the child is stuck.
    child_ready_timeout_s: float = 60.0

    def validate(self) -> None:
        if not 0 <= self.kill_after_s_min <= self.kill_after_s_max:
            raise ValueError("need 0 <= kill_after_s_min <= kill_after_s_max")
        if not 0 <= self.recovery_kill_share < 1:
            raise ValueError("recovery_kill_share must be within [0, 1)")
        if self.streams < 1 or self.threads < 1:
            raise ValueError("need at least one stream and one appending thread")


#: A recovering child is killed within this many times the parent's last open time after it starts
#: opening: the parent's open does the same work on a store crashed the same way.
RECOVERY_WINDOW_FACTOR = 1.5
#: ... but never sooner than this, so the very first recovery kill has a window to land in.
RECOVERY_WINDOW_S_MIN = 0.010
#: Figures that mean a broken promise unless they read 0, in table order.
MUST_BE_ZERO: tuple[str, ...] = (
    "acknowledged_lost", "recovered_lost", "duplicates", "out_of_order", "gaps", "corrupt",
    "below_trim_returned", "trim_mismatches", "orphan_objects_left", "objects_missing", "read_errors",
    "offset_mismatches", "reopen_disagreements", "streams_lost", "child_failures", "open_failures",
)
#: Error messages kept for the report, at most.
ERRORS_KEPT_MAX = 5


# Figures -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """Counts of one round's check; every name in MUST_BE_ZERO is a field here."""

    records_live: int = 0
    records_checked: int = 0
    acknowledged_verified: int = 0
    objects_after_open: int = 0
    temp_files_after_open: int = 0
    acknowledged_lost: int = 0
    recovered_lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    gaps: int = 0
    corrupt: int = 0
    below_trim_returned: int = 0
    trim_mismatches: int = 0
    orphan_objects_left: int = 0
    objects_missing: int = 0
    read_errors: int = 0
    offset_mismatches: int = 0
    reopen_disagreements: int = 0
    streams_lost: int = 0
    child_failures: int = 0
    open_failures: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        if len(self.errors) < ERRORS_KEPT_MAX:
            self.errors.append(message)


@dataclass(frozen=True, slots=True)
class IterationFigures:
    """One kill, and the check after it (when the round was checked)."""

    index: int
    run_id: int
    phase: Phase
    killed_after_s: float
    child_ready: bool
    checked: bool
    batches_acknowledged: int
    records_acknowledged: int
    trims_completed: int
    flushes_completed: int
    child_batches_replayed: int
    child_orphan_objects_deleted: int
    #: The parent's open: its RecoveryReport, and the time the whole open took.
    recovery: RecoveryReport
    open_s: float
    tally: Tally

    @property
    def failures(self) -> int:
        return sum(getattr(self.tally, name) for name in MUST_BE_ZERO)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {name: getattr(self, name) for name in self.__dataclass_fields__
                                  if name not in ("recovery", "tally")}
        out["recovery"] = dataclasses.asdict(self.recovery)
        out.update(dataclasses.asdict(self.tally))
        out["failures"] = self.failures
        return out


@dataclass(frozen=True, slots=True)
class EngineChaosFigures(MustBeZeroFigures):
    """Totals over a harness run; every count named in MUST_BE_ZERO must be 0."""

    iterations: int
    iterations_checked: int
    iterations_with_acks: int
    iterations_killed_in_recovery: int
    batches_acknowledged: int
    records_acknowledged: int
    acknowledged_verified: int
    records_checked: int
    trims_completed: int
    flushes_completed: int
    batches_replayed: int
    batches_already_in_objects: int
    batches_not_contiguous: int
    orphan_objects_deleted: int
    iterations_replaying: int
    iterations_with_batches_in_objects: int
    iterations_deleting_orphans: int
    objects_after_open_max: int
    temp_files_after_open: int
    recovery_ms_mean: float
    recovery_ms_max: float
    open_ms_mean: float
    acknowledged_lost: int
    recovered_lost: int
    duplicates: int
    out_of_order: int
    gaps: int
    corrupt: int
    below_trim_returned: int
    trim_mismatches: int
    orphan_objects_left: int
    objects_missing: int
    read_errors: int
    offset_mismatches: int
    reopen_disagreements: int
    streams_lost: int
    child_failures: int
    open_failures: int
    errors: tuple[str, ...]
    elapsed_s: float

    must_be_zero: ClassVar[tuple[str, ...]] = MUST_BE_ZERO


def summarize(iterations: list[IterationFigures], elapsed_s: float) -> EngineChaosFigures:
    checked = [it for it in iterations if it.checked]
    recovery_s = [it.recovery.seconds for it in checked] or [0.0]
    open_s = [it.open_s for it in checked] or [0.0]
    orphans = [it.recovery.orphan_objects_deleted + it.child_orphan_objects_deleted for it in iterations]
    totals = {name: sum(getattr(it.tally, name) for it in iterations) for name in MUST_BE_ZERO}
    return EngineChaosFigures(
        iterations=len(iterations),
        iterations_checked=len(checked),
        iterations_with_acks=sum(it.records_acknowledged > 0 for it in iterations),
        iterations_killed_in_recovery=sum(it.phase is Phase.RECOVERING and not it.child_ready for it in iterations),
        batches_acknowledged=sum(it.batches_acknowledged for it in iterations),
        records_acknowledged=sum(it.records_acknowledged for it in iterations),
        acknowledged_verified=sum(it.tally.acknowledged_verified for it in iterations),
        records_checked=sum(it.tally.records_checked for it in iterations),
        trims_completed=sum(it.trims_completed for it in iterations),
        flushes_completed=sum(it.flushes_completed for it in iterations),
        batches_replayed=sum(it.recovery.batches_replayed + it.child_batches_replayed for it in iterations),
        batches_already_in_objects=sum(it.recovery.batches_already_in_objects for it in iterations),
        batches_not_contiguous=sum(it.recovery.batches_not_contiguous for it in iterations),
        orphan_objects_deleted=sum(orphans),
        iterations_replaying=sum(it.recovery.batches_replayed > 0 for it in iterations),
        iterations_with_batches_in_objects=sum(it.recovery.batches_already_in_objects > 0 for it in iterations),
        iterations_deleting_orphans=sum(n > 0 for n in orphans),
        objects_after_open_max=max((it.tally.objects_after_open for it in iterations), default=0),
        temp_files_after_open=max((it.tally.temp_files_after_open for it in iterations), default=0),
        recovery_ms_mean=1000 * sum(recovery_s) / len(recovery_s),
        recovery_ms_max=1000 * max(recovery_s),
        open_ms_mean=1000 * sum(open_s) / len(open_s),
        errors=tuple(e for it in iterations for e in it.tally.errors)[:ERRORS_KEPT_MAX],
        elapsed_s=elapsed_s,
        **totals,
    )


# Running one child ---------------------------------------------------------------------------------


class _Kill(NamedTuple):
    report: ChildReport
    killed_after_s: float
    #: The tail of the child's stderr when it exited before the kill (the store failed under it).
    failure: str | None


def _run_child(data_dir: Path, config: EngineChaosConfig, run_id: int, phase: Phase, kill_after_s: float) -> _Kill:
    """Start the writer, SIGKILL it ``kill_after_s`` after the moment ``phase`` names; return what it said."""
    args = ["--dir", str(data_dir), "--run-id", str(run_id), "--streams", str(config.streams),
            "--threads", str(config.threads)]
    if config.object_store is not None:
        args += ["--object-store", config.object_store]
    failure: str | None = None
    with start_child("stratalog.chaos.engine_child", args, name="engine", beside=data_dir,
                     awaited_tags=[TAG_OPENING, TAG_READY]) as child:
        moment = TAG_READY if phase is Phase.RUNNING else TAG_OPENING
        if not child.wait_for(moment, config.child_ready_timeout_s):
            awaited = "that it was ready" if phase is Phase.RUNNING else "that it was opening the store"
            raise ChaosHarnessError(child.failure(
                f"did not say {awaited} within {config.child_ready_timeout_s} s"))
        killed_after_s = child.kill_after(kill_after_s)
        if not child.killed:
            if not parse_child_output(child.output).opening:
                raise ChaosHarnessError(child.failure("stopped before opening the store"))
            failure = child.failure("exited by itself")
    return _Kill(parse_child_output(child.output), killed_after_s, failure)


# What the parent knows -----------------------------------------------------------------------------


class _Span(NamedTuple):
    """Offsets ``[start, end)`` of one stream, all written by run ``run_id``."""

    start: int
    end: int
    run_id: int


def _add_span(spans: list[_Span], start: int, end: int, run_id: int) -> None:
    if spans and spans[-1].run_id == run_id and spans[-1].end == start:
        spans[-1] = _Span(spans[-1].start, end, run_id)
    else:
        spans.append(_Span(start, end, run_id))


def _spans_by_offset(spans: list[_Span], low: int) -> dict[int, int]:
    """``offset -> run id`` for every offset of ``spans`` at or above ``low``."""
    return {offset: span.run_id for span in spans for offset in range(max(span.start, low), span.end)}


@dataclass(slots=True)
class _StreamLedger:
    """What the parent knows must be in one stream, carried from round to round."""

    index: int
    tag: int
    known: bool = False                  # a child or a check saw it exist
    floor: int = 0                       # its start after the last completed trim (or as the last check saw)
    unfinished_trims: set[int] = field(default_factory=set)  # started, not seen to return, since that check
    acked: list[_Span] = field(default_factory=list)        # acknowledged since the last check
    seen: list[_Span] = field(default_factory=list)         # the sound records the last check read
    kept_end: int = 0                    # records below were seen by a check or by a child's open
    closed: tuple[int, int] | None = None  # (start, end) as the last check closed the store, if nothing ran since


@dataclass(slots=True)
class _Ledger:
    streams: list[_StreamLedger]
    runs: set[int] = field(default_factory=set)


def _absorb(ledger: _Ledger, run_id: int, report: ChildReport, tally: Tally) -> None:
    """Take in what a killed child said: how its open found the streams, its acks and its trims."""
    for index, (start, end) in report.opened.items():
        s = ledger.streams[index]
        if s.closed is not None and s.closed != (start, end):
            tally.reopen_disagreements += 1
            tally.error(f"stream {index}: the check closed it at {s.closed}, the next open found {(start, end)}")
        s.known = True
        s.kept_end = max(s.kept_end, end)
    if report.opening:
        for s in ledger.streams:
            s.closed = None  # the child opened the store: it may have recovered, uploaded and trimmed
    for index, base, count in report.acks:
        _add_span(ledger.streams[index].acked, base, base + count, run_id)
    done = set(report.trims_done)
    for index, offset in report.trims_started:
        if (index, offset) not in done:
            ledger.streams[index].unfinished_trims.add(offset)
    for index, offset in report.trims_done:
        s = ledger.streams[index]
        s.floor = max(s.floor, offset)
    tally.offset_mismatches += len(report.offset_mismatches)
    for index, expected, got in report.offset_mismatches[:ERRORS_KEPT_MAX]:
        tally.error(f"stream {index}: a batch made for offset {expected} was given offset {got}")


# Checking one reopened store ---------------------------------------------------------------------------

#: Values per fetch while a check reads a stream.
FETCH_BYTES_MAX = 1 << 20


def read_records(stream: Stream, start: int, end: int) -> Iterator[Record]:
    """Every record the store returns for ``[start, end)``, fetch after fetch."""
    position = start
    while position < end:
        records = stream.fetch(position, end, max_bytes=FETCH_BYTES_MAX)
        if not records:
            return
        yield from records
        # Always forward, even should the store return offsets below the one asked for.
        position = max(position + 1, records[-1].offset + 1)


def _check_stream(store: StreamStore, s: _StreamLedger, runs: set[int], tally: Tally) -> None:
    name = stream_name(s.index)
    try:
        stream = store.open_stream(name)
    except UnknownStreamError:
        if s.known:
            tally.streams_lost += 1
            tally.error(f"stream {name} is gone")
            _count_lost(s, s.floor, {}, tally)
        return
    start, end = stream.start_offset, stream.end_offset
    allowed = {s.floor} | {offset for offset in s.unfinished_trims if offset > s.floor}
    effective_start = start if start in allowed else s.floor
    if start not in allowed:
        tally.trim_mismatches += 1
        tally.error(f"stream {name} starts at {start}; trims allow only {sorted(allowed)}")
    sound: dict[int, int] = {}  # offset -> run id of every sound record at or above the floor
    returned: set[int] = set()
    previous = -1
    try:
        for record in read_records(stream, start, end):
            offset = record.offset
            if offset in returned:
                tally.duplicates += 1
                continue
            returned.add(offset)
            if offset < previous:
                tally.out_of_order += 1
            previous = max(previous, offset)
            if offset < s.floor:
                tally.below_trim_returned += 1
                continue
            run_id = record_run(s.tag, record)
            if not start <= offset < end or run_id is None or run_id not in runs:
                tally.corrupt += 1
                continue
            sound[offset] = run_id
    except Exception as e:
        tally.read_errors += 1
        tally.error(f"reading stream {name} failed: {e!r}")
    tally.gaps += (end - start) - sum(start <= offset < end for offset in returned)
    if 0 < s.floor <= start:
        _probe_below_trim(stream, s.floor, tally)
    _count_lost(s, effective_start, sound, tally)
    tally.records_live += end - start
    tally.records_checked += len(sound)
    # Move on to what this check found: counted losses are not counted again.
    s.known = True
    s.floor = effective_start
    s.unfinished_trims.clear()
    s.acked = []
    s.seen = []
    for offset in sorted(sound):
        _add_span(s.seen, offset, offset + 1, sound[offset])
    s.kept_end = end
    s.closed = (start, end)


def _probe_below_trim(stream: Stream, floor: int, tally: Tally) -> None:
    """A fetch just below the last completed trim must refuse, not return trimmed records."""
    try:
        below = stream.fetch(floor - 1, floor)
    except OffsetOutOfRangeError:
        return
    except Exception as e:
        tally.read_errors += 1
        tally.error(f"fetching below the trim of stream {stream.name} failed: {e!r}")
        return
    tally.below_trim_returned += sum(record.offset < floor for record in below)


def _count_lost(s: _StreamLedger, effective_start: int, sound: dict[int, int], tally: Tally) -> None:
    """Compare what must be in the stream from ``effective_start`` on with the sound records read."""
    acked = _spans_by_offset(s.acked, effective_start)
    seen = _spans_by_offset(s.seen, effective_start)
    required_end = max([s.kept_end, *(span.end for span in s.acked)])
    for offset in range(effective_start, required_end):
        got = sound.get(offset)
        acked_run = acked.get(offset)
        seen_run = seen.get(offset)
        if acked_run is not None:
            if got != acked_run:
                tally.acknowledged_lost += 1
                continue
            tally.acknowledged_verified += 1
        if seen_run is not None and got != seen_run:
            tally.recovered_lost += 1  # a check read another record here: a later open lost that one
        elif got is None and acked_run is None and offset < s.kept_end:
            tally.recovered_lost += 1  # a child's open reported it, and now it is gone


def _check_objects(store: StreamStore, tally: Tally) -> None:
    # Metadata first, then the listing: an object deleted in between then reads as missing only if
    # metadata still refers to it, which is a real fault.
    objects = store.metadata.objects()
    known = {o.key for o in objects}
    referenced = {o.key for o in objects if o.unreferenced_ms is None}
    listed = {info.key for info in store.object_store.list(DATA_PREFIX)}
    orphans = sorted(listed - known)
    missing = sorted(referenced - listed)
    tally.objects_after_open = len(listed)
    tally.orphan_objects_left += len(orphans)
    tally.objects_missing += len(missing)
    if orphans:
        tally.error(f"{len(orphans)} object(s) under {DATA_PREFIX} unknown to metadata after open: {orphans[:3]}")
    if missing:
        tally.error(f"{len(missing)} object(s) metadata refers to do not exist: {missing[:3]}")
    local = getattr(store.object_store, "inner", store.object_store)   # under its call counting
    if isinstance(local, LocalDirStore):
        root = local.root / DATA_PREFIX
        tally.temp_files_after_open = sum(1 for p in root.glob(f"{TEMP_PREFIX}*"))


def open_store(data_dir: Path, config: EngineChaosConfig) -> StreamStore:
    """Open (and so recover) the store for a check."""
    return StreamStore.open(data_dir, config.object_store, CHECK_STORE_CONFIG)


def _check_store(data_dir: Path, config: EngineChaosConfig, ledger: _Ledger,
                 tally: Tally) -> tuple[RecoveryReport, float] | None:
    """Open the store, check every stream and the objects, close it; None when the open failed."""
    started = time.perf_counter()
    try:
        store = open_store(data_dir, config)
    except Exception:
        tally.open_failures += 1
        tally.error(f"opening the store after the kill failed:\n{traceback.format_exc()}")
        return None
    open_s = time.perf_counter() - started
    try:
        for s in ledger.streams:
            _check_stream(store, s, ledger.runs, tally)
        _check_objects(store, tally)
    finally:
        store.close()
    return store.recovery, open_s


# The loop ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    """State carried from round to round besides the ledger."""

    unchecked: bool = False
    recovery_window_s: float = RECOVERY_WINDOW_S_MIN
    stopped: bool = False  # the store could not be opened: nothing further can be checked


def _iteration(index: int, data_dir: Path, config: EngineChaosConfig, rng: random.Random, ledger: _Ledger,
               run: _Run) -> IterationFigures:
    # Every round draws the same numbers whatever happened before, so a seed names one schedule.
    run_id = rng.getrandbits(64)
    draw = rng.random()
    leave_unchecked = rng.random() < config.recovery_kill_share
    phase = Phase.RECOVERING if run.unchecked else Phase.RUNNING
    if phase is Phase.RUNNING:
        kill_after_s = config.kill_after_s_min + draw * (config.kill_after_s_max - config.kill_after_s_min)
    else:
        kill_after_s = draw * run.recovery_window_s
    check = phase is Phase.RECOVERING or not leave_unchecked or index == config.iterations - 1
    ledger.runs.add(run_id)
    kill = _run_child(data_dir, config, run_id, phase, kill_after_s)
    report = kill.report
    tally = Tally()
    if kill.failure is not None:
        tally.child_failures += 1
        tally.error(kill.failure)
    _absorb(ledger, run_id, report, tally)
    recovery, open_s = RecoveryReport(), 0.0
    if check:
        checked = _check_store(data_dir, config, ledger, tally)
        if checked is None:
            run.stopped = True
        else:
            recovery, open_s = checked
            run.recovery_window_s = max(RECOVERY_WINDOW_S_MIN, RECOVERY_WINDOW_FACTOR * open_s)
    run.unchecked = not check
    child_recovery = report.recovery
    return IterationFigures(
        index=index,
        run_id=run_id,
        phase=phase,
        killed_after_s=kill.killed_after_s,
        child_ready=report.ready,
        checked=check,
        batches_acknowledged=len(report.acks),
        records_acknowledged=report.records_acknowledged,
        trims_completed=len(report.trims_done),
        flushes_completed=report.flushes_done,
        child_batches_replayed=child_recovery.batches_replayed if child_recovery else 0,
        child_orphan_objects_deleted=child_recovery.orphan_objects_deleted if child_recovery else 0,
        recovery=recovery,
        open_s=open_s,
        tally=tally,
    )


def run_engine_chaos(
    data_dir: str | os.PathLike[str],
    config: EngineChaosConfig,
    on_iteration: Callable[[IterationFigures], None] | None = None,
) -> EngineChaosFigures:
    """Run ``config.iterations`` kill/reopen/check rounds on a new store in ``data_dir``.

    The directory must not exist or be empty (and so must the object store): the checks rely on knowing
    every run that wrote to the store. It is left in place (delete it, or keep it to inspect after a
    failure). ``on_iteration`` sees each round's figures. A round whose open fails ends the run: the
    store can then be checked no further.
    """
    path = Path(data_dir)
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} is not empty: the chaos harness needs a new store to know every writer")
    config.validate()
    path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    ledger = _Ledger([_StreamLedger(index, stream_tag(stream_name(index))) for index in range(config.streams)])
    run = _Run()
    iterations, elapsed_s = run_rounds(
        config.iterations, lambda index: _iteration(index, path, config, rng, ledger, run), on_iteration,
        stop=lambda: run.stopped)
    return summarize(iterations, elapsed_s)
