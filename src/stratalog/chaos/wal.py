"""The WAL kill -9 harness: start a writer, SIGKILL it at a random moment, recover, check, repeat.

Each iteration starts ``stratalog.chaos.wal_child`` on the same log file with a fresh run id, waits a
random time after it says it is ready, kills it with SIGKILL, reads everything it printed, then opens
the log here, runs recovery and checks what came back against what the child acknowledged:

- every acknowledged record above the last completed trim comes back (acknowledged lost = 0);
- every record that came back is byte for byte what the writer made for its run and sequence number,
  at the offset it was acknowledged at (corrupt returned = 0);
- nothing at or below the last completed trim comes back (below-trim returned = 0);
- offsets strictly increase, and no record comes back twice;
- a record one recovery returned comes back in the next one too, unless trimmed since (recovery syncs
  what it found before the writer appends past it, so it is as durable as an acknowledged record);
- the child's own recovery, run just after this one, agrees on the count and the last offset.

A trim the child started but did not report finished may or may not have taken effect: both outcomes
are accepted, and the log's trim offset must be one of the two. The next iteration goes on with the same
file, so the ring wraps again and again over a run.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from stratalog.chaos.child import start_child
from stratalog.chaos.harness import ChaosHarnessError, run_rounds
from stratalog.chaos.wal_child import (
    CHAOS_WAL_CONFIG,
    TAG_READY,
    ChildReport,
    parse_child_output,
    record_identity,
)
from stratalog.wal import WriteAheadLog
from stratalog.wal.format import HEADERS_BYTES, TRIM_NONE


@dataclass(frozen=True, slots=True)
class WALChaosConfig:
    iterations: int = 200
    seed: int = 0
    #: 32 MiB: the child writes a few hundred MB/s to a local SSD, so the ring wraps within an iteration.
    capacity_bytes: int = 32 << 20
    #: The child is killed this long after it says it is ready, drawn uniformly from the seeded RNG.
    kill_after_s_min: float = 0.020
    kill_after_s_max: float = 0.300
    #: Starting Python, making (first run) and recovering the log take well under a second; far more
    #: than this means the child is stuck.
    child_ready_timeout_s: float = 60.0


@dataclass(frozen=True, slots=True)
class IterationFigures:
    """One kill and the recovery after it."""

    index: int
    run_id: int
    killed_after_s: float
    records_acknowledged: int
    records_recovered: int
    #: Acknowledged records (of this or earlier runs) that this recovery had to return, and did.
    acknowledged_verified: int
    acknowledged_lost: int
    recovered_lost: int
    corrupt_returned: int
    below_trim_returned: int
    out_of_order_returned: int
    duplicate_returned: int
    trim_mismatch: bool
    recovery_disagreement: bool
    trims_completed: int
    trim_offset: int
    end_offset: int
    recovery_s: float

    @property
    def failures(self) -> int:
        return (self.acknowledged_lost + self.recovered_lost + self.corrupt_returned
                + self.below_trim_returned + self.out_of_order_returned + self.duplicate_returned
                + int(self.trim_mismatch) + int(self.recovery_disagreement))


@dataclass(frozen=True, slots=True)
class WALChaosFigures:
    """Totals over a harness run; every count named ``*_lost``/``*_returned``/``*mismatch*`` must be 0."""

    iterations: int
    records_acknowledged: int
    records_recovered: int
    acknowledged_verified: int
    acknowledged_lost: int
    recovered_lost: int
    corrupt_returned: int
    below_trim_returned: int
    out_of_order_returned: int
    duplicate_returned: int
    trim_mismatches: int
    recovery_disagreements: int
    iterations_with_acks: int
    iterations_verifying_acks: int
    trims_completed: int
    ring_bytes: int
    ring_laps: float
    recovery_ms_mean: float
    recovery_ms_max: float
    elapsed_s: float

    @property
    def failures(self) -> int:
        return (self.acknowledged_lost + self.recovered_lost + self.corrupt_returned
                + self.below_trim_returned + self.out_of_order_returned + self.duplicate_returned
                + self.trim_mismatches + self.recovery_disagreements)

    @property
    def ok(self) -> bool:
        return self.failures == 0

    def as_dict(self) -> dict[str, int | float | bool]:
        return {**dataclasses.asdict(self), "failures": self.failures, "ok": self.ok}


def summarize(iterations: list[IterationFigures], ring_bytes: int, elapsed_s: float) -> WALChaosFigures:
    recovery_s = [it.recovery_s for it in iterations] or [0.0]
    return WALChaosFigures(
        iterations=len(iterations),
        records_acknowledged=sum(it.records_acknowledged for it in iterations),
        records_recovered=sum(it.records_recovered for it in iterations),
        acknowledged_verified=sum(it.acknowledged_verified for it in iterations),
        acknowledged_lost=sum(it.acknowledged_lost for it in iterations),
        recovered_lost=sum(it.recovered_lost for it in iterations),
        corrupt_returned=sum(it.corrupt_returned for it in iterations),
        below_trim_returned=sum(it.below_trim_returned for it in iterations),
        out_of_order_returned=sum(it.out_of_order_returned for it in iterations),
        duplicate_returned=sum(it.duplicate_returned for it in iterations),
        trim_mismatches=sum(it.trim_mismatch for it in iterations),
        recovery_disagreements=sum(it.recovery_disagreement for it in iterations),
        iterations_with_acks=sum(it.records_acknowledged > 0 for it in iterations),
        iterations_verifying_acks=sum(it.acknowledged_verified > 0 for it in iterations),
        trims_completed=sum(it.trims_completed for it in iterations),
        ring_bytes=ring_bytes,
        ring_laps=max((it.end_offset for it in iterations), default=0) / ring_bytes,
        recovery_ms_mean=1000 * sum(recovery_s) / len(recovery_s),
        recovery_ms_max=1000 * max(recovery_s),
        elapsed_s=elapsed_s,
    )


# Running one child ---------------------------------------------------------------------------------


class _Kill(NamedTuple):
    report: ChildReport
    killed_after_s: float


def _run_child(wal_path: Path, config: WALChaosConfig, run_id: int, kill_after_s: float) -> _Kill:
    """Start the writer, SIGKILL it ``kill_after_s`` after it is ready, and return what it printed."""
    args = ["--path", str(wal_path), "--capacity-bytes", str(config.capacity_bytes), "--run-id", str(run_id)]
    with start_child("stratalog.chaos.wal_child", args, name="WAL", beside=wal_path,
                     awaited_tags=[TAG_READY]) as child:
        # A child whose stdout ended is gone, whether or not it said it was ready first.
        if not child.wait_for(TAG_READY, config.child_ready_timeout_s) or child.eof:
            raise ChaosHarnessError(child.failure("stopped before saying it was ready"))
        killed_after_s = child.kill_after(kill_after_s)
        if not child.killed:
            raise ChaosHarnessError(child.failure("exited before it was killed"))
    return _Kill(parse_child_output(child.output), killed_after_s)


# Checking one recovery -----------------------------------------------------------------------------


class _Known(NamedTuple):
    """A record some recovery must return while it is above the trim."""

    run_id: int
    seq: int
    acknowledged: bool  # False: not acknowledged, but returned by an earlier recovery


@dataclass(slots=True)
class _Ledger:
    """What the parent knows must be in the log, carried from one iteration to the next."""

    trim_offset: int = TRIM_NONE
    live: dict[int, _Known] = field(default_factory=dict)  # offset -> record, every offset > trim_offset
    runs: set[int] = field(default_factory=set)
    previous_recovery: tuple[int, int] = (0, -1)  # (records, last offset) the child should recover too


@dataclass(slots=True)
class _Tally:
    verified: int = 0
    acknowledged_lost: int = 0
    recovered_lost: int = 0
    corrupt: int = 0
    below_trim: int = 0
    out_of_order: int = 0
    duplicate: int = 0


def _absorb_acks(ledger: _Ledger, run_id: int, report: ChildReport, tally: _Tally) -> None:
    for seq, offset in report.acks:
        earlier = ledger.live.get(offset)
        if earlier is not None:
            # The WAL handed out an offset that still held a live record: that record is gone.
            tally.acknowledged_lost += earlier.acknowledged
            tally.recovered_lost += not earlier.acknowledged
        ledger.live[offset] = _Known(run_id, seq, acknowledged=True)


def _trim_bounds(ledger: _Ledger, report: ChildReport) -> tuple[int, int | None]:
    """The last trim the child finished, and a later one it started but was killed inside (if any)."""
    done = max([ledger.trim_offset, *report.trims_done])
    started = report.trims_started[-1] if report.trims_started else TRIM_NONE
    return done, (started if started > done else None)


def _check_returned(ledger: _Ledger, records: list[tuple[int, bytes]], trim_offset: int,
                    tally: _Tally) -> dict[int, tuple[int, int]]:
    """Check each returned record; return ``offset -> (run_id, seq)`` of the sound ones above the trim."""
    sound: dict[int, tuple[int, int]] = {}
    seen: set[tuple[int, int]] = set()
    previous_offset = TRIM_NONE - 1
    for offset, body in records:
        if offset <= previous_offset:
            tally.out_of_order += 1
        previous_offset = max(previous_offset, offset)
        if offset <= trim_offset:
            tally.below_trim += 1
            continue
        identity = record_identity(body)
        known = ledger.live.get(offset)
        if identity is None or identity[0] not in ledger.runs or (
            known is not None and identity != (known.run_id, known.seq)
        ):
            tally.corrupt += 1
            continue
        if identity in seen:
            tally.duplicate += 1
            continue
        seen.add(identity)
        sound[offset] = identity
    return sound


def _check_recovery(ledger: _Ledger, run_id: int, report: ChildReport,
                    records: list[tuple[int, bytes]], wal_trim_offset: int) -> tuple[_Tally, bool]:
    """Check one recovery against the ledger, then move the ledger on to what this recovery found."""
    tally = _Tally()
    _absorb_acks(ledger, run_id, report, tally)
    trim_done, trim_unfinished = _trim_bounds(ledger, report)
    trim_mismatch = wal_trim_offset not in (trim_done, trim_unfinished)
    trim_offset = trim_done if trim_mismatch else wal_trim_offset
    sound = _check_returned(ledger, records, trim_offset, tally)
    for offset, known in ledger.live.items():
        if offset <= trim_offset:
            continue
        if sound.get(offset) == (known.run_id, known.seq):
            tally.verified += known.acknowledged
        elif known.acknowledged:
            tally.acknowledged_lost += 1
        else:
            tally.recovered_lost += 1
    acknowledged = {offset for offset, known in ledger.live.items() if known.acknowledged}
    ledger.live = {
        offset: _Known(*identity, acknowledged=offset in acknowledged) for offset, identity in sound.items()
    }
    ledger.trim_offset = trim_offset
    return tally, trim_mismatch


def _recover(wal_path: Path, config: WALChaosConfig) -> tuple[list[tuple[int, bytes]], int, float]:
    """Open the log, run recovery to its end; return the records, the trim offset and the time taken."""
    started = time.perf_counter()
    wal = WriteAheadLog.open(wal_path, capacity_bytes=config.capacity_bytes, create=False,
                             config=CHAOS_WAL_CONFIG)
    try:
        records = [(record.offset, record.data) for record in wal.recover()]
        recovery_s = time.perf_counter() - started
        return records, wal.trim_offset, recovery_s
    finally:
        wal.close()


# The loop ------------------------------------------------------------------------------------------


def _iteration(index: int, wal_path: Path, config: WALChaosConfig, rng: random.Random,
               ledger: _Ledger) -> IterationFigures:
    run_id = rng.getrandbits(64)
    ledger.runs.add(run_id)
    kill = _run_child(wal_path, config, run_id, rng.uniform(config.kill_after_s_min, config.kill_after_s_max))
    report = kill.report
    disagreement = (report.records_recovered, report.last_recovered_offset) != ledger.previous_recovery
    records, wal_trim_offset, recovery_s = _recover(wal_path, config)
    tally, trim_mismatch = _check_recovery(ledger, run_id, report, records, wal_trim_offset)
    ledger.previous_recovery = (len(records), records[-1][0] if records else -1)
    end_offset = max(report.acks[-1][1] if report.acks else 0, records[-1][0] if records else 0)
    return IterationFigures(
        index=index,
        run_id=run_id,
        killed_after_s=kill.killed_after_s,
        records_acknowledged=len(report.acks),
        records_recovered=len(records),
        acknowledged_verified=tally.verified,
        acknowledged_lost=tally.acknowledged_lost,
        recovered_lost=tally.recovered_lost,
        corrupt_returned=tally.corrupt,
        below_trim_returned=tally.below_trim,
        out_of_order_returned=tally.out_of_order,
        duplicate_returned=tally.duplicate,
        trim_mismatch=trim_mismatch,
        recovery_disagreement=disagreement,
        trims_completed=len(report.trims_done),
        trim_offset=ledger.trim_offset,
        end_offset=end_offset,
        recovery_s=recovery_s,
    )


def run_wal_chaos(
    wal_path: str | os.PathLike[str],
    config: WALChaosConfig,
    on_iteration: Callable[[IterationFigures], None] | None = None,
) -> WALChaosFigures:
    """Run ``config.iterations`` kill/recover/check rounds on a new log at ``wal_path``.

    The file must not exist: the checks rely on knowing every run that wrote to it. It is left in place
    (delete it, or keep it to inspect after a failure). ``on_iteration`` sees each round's figures.
    """
    path = Path(wal_path)
    if path.exists():
        raise FileExistsError(f"{path} exists: the chaos harness needs a new file to know every writer")
    ring_bytes = config.capacity_bytes - HEADERS_BYTES
    CHAOS_WAL_CONFIG.validate(ring_bytes)
    if not 0 <= config.kill_after_s_min <= config.kill_after_s_max:
        raise ValueError("need 0 <= kill_after_s_min <= kill_after_s_max")
    rng = random.Random(config.seed)
    ledger = _Ledger()
    iterations, elapsed_s = run_rounds(
        config.iterations, lambda index: _iteration(index, path, config, rng, ledger), on_iteration)
    return summarize(iterations, ring_bytes, elapsed_s)
