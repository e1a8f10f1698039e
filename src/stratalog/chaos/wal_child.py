"""The writer that the WAL crash harness kills: ``python -m stratalog.chaos.wal_child --path P ...``.

It opens the log (making it on the first run), runs recovery to its end, says it is ready, then appends
records until it is killed. Every record's body follows from the run id and its sequence number alone, so
the parent can tell a correct record from a damaged one, and one run's records from another's. It trims
now and then, always to an offset already durable, so the ring wraps many times over a harness run.

What it tells the parent, one line each on stdout, written with a single ``write`` once the fact holds
(the parent drops a last line without its newline: the child was killed while writing it)::

    r <records recovered> <last recovered offset, or -1>      recovery done, appends start now
    a <first seq> <offset> <delta> <delta> ...                 these records are durable (acknowledged)
    t+ <offset>                                                about to call trim(offset)
    t <offset>                                                 trim(offset) returned: the trim is durable

The ``a`` line covers consecutive sequence numbers; each delta is an offset minus the one before it.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import random
import struct
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from stratalog.chaos.lines import LineWriter, complete_lines
from stratalog.chaos.mix import mix64
from stratalog.wal import AppendResult, WALConfig, WriteAheadLog
from stratalog.wal.format import HEADERS_BYTES, TRIM_NONE

# Record bodies ---------------------------------------------------------------------------------------

#: A body starts with its sequence number and the writer's run id (both u64, little-endian).
RECORD_PREFIX = struct.Struct("<QQ")
#: Filler after the prefix: 0 to 64 KiB - 1 bytes, sizes spread evenly over powers of two, so most records
#: are small (many per block) and some span a quarter of a block.
FILLER_BYTES_MAX = (64 << 10) - 1
#: Fillers are slices of one pseudo-random pool per run, starting at one of this many places.
FILLER_STARTS = 64 << 10
RECORD_BODY_BYTES_MAX = RECORD_PREFIX.size + FILLER_BYTES_MAX
#: The largest size class spans 2**16 bytes of filler.
_SIZE_CLASSES = 17

#: The log both the child and the checking parent open. record_bytes_max is the largest body rounded up
#: to a power of two: small enough that rings of a few MiB pass validation, large enough for every body.
CHAOS_WAL_CONFIG = WALConfig(record_bytes_max=128 << 10)


@functools.lru_cache(maxsize=64)
def _filler_pool(run_id: int) -> bytes:
    # 64 pools of 128 KiB: the parent checks records from the last few runs only.
    return random.Random(run_id).randbytes(FILLER_STARTS + FILLER_BYTES_MAX)


def record_body(run_id: int, seq: int) -> bytes:
    """The body the writer of run ``run_id`` appends as its record number ``seq``."""
    mixed = mix64(run_id ^ mix64(seq))
    size_class_bytes = 1 << (mixed % _SIZE_CLASSES)
    filler_bytes = (mixed >> 8) % size_class_bytes
    start = (mixed >> 32) % FILLER_STARTS
    return RECORD_PREFIX.pack(seq, run_id) + _filler_pool(run_id)[start:start + filler_bytes]


def record_identity(body: bytes) -> tuple[int, int] | None:
    """``(run_id, seq)`` of a body the writer made, or None when the body differs from what it would make."""
    if len(body) < RECORD_PREFIX.size:
        return None
    seq, run_id = RECORD_PREFIX.unpack_from(body, 0)
    if body != record_body(run_id, seq):
        return None
    return run_id, seq


# Line protocol ---------------------------------------------------------------------------------------

TAG_READY = "r"
TAG_ACK = "a"
TAG_TRIM_STARTED = "t+"
TAG_TRIM_DONE = "t"


def format_ack(first_seq: int, offsets: list[int]) -> str:
    deltas = [offsets[0], *(later - earlier for earlier, later in itertools.pairwise(offsets))]
    return f"{TAG_ACK} {first_seq} {' '.join(map(str, deltas))}\n"


@dataclass(slots=True)
class ChildReport:
    """What a killed child said: every complete line, decoded."""

    ready: bool = False
    records_recovered: int = 0
    last_recovered_offset: int = -1
    #: ``(seq, offset)`` of every acknowledged record, in acknowledgement order.
    acks: list[tuple[int, int]] = field(default_factory=list)
    trims_started: list[int] = field(default_factory=list)
    trims_done: list[int] = field(default_factory=list)


def parse_child_output(output: bytes) -> ChildReport:
    """Decode a child's stdout; a last line without its newline was cut by the kill and is dropped."""
    report = ChildReport()
    for text, tag, values in complete_lines(output):
        if tag == TAG_ACK:
            first_seq, offset, *deltas = values
            report.acks.append((first_seq, offset))
            for i, delta in enumerate(deltas, start=1):
                offset += delta
                report.acks.append((first_seq + i, offset))
        elif tag == TAG_TRIM_STARTED:
            report.trims_started.append(values[0])
        elif tag == TAG_TRIM_DONE:
            report.trims_done.append(values[0])
        elif tag == TAG_READY:
            report.ready = True
            report.records_recovered, report.last_recovered_offset = values
        else:
            raise ValueError(f"the WAL chaos child wrote an unknown line: {text!r}")
    return report


# The writer ------------------------------------------------------------------------------------------

#: How often (in appends) the writer checks whether its parent is gone or its time is up.
ORPHAN_CHECK_RECORDS = 256
#: An orphaned child stops by itself after this long; the parent kills it within a second normally.
CHILD_RUN_S_MAX = 600.0
#: Longest single wait for an acknowledgement before the writer re-checks for a WAL failure.
ACK_WAIT_S = 1.0


class _Writer:
    """Appends records forever; reports acknowledgements from the WAL's completion thread."""

    def __init__(self, wal: WriteAheadLog, run_id: int, lines: LineWriter, recovered: list[int]) -> None:
        ring_bytes = wal.capacity_bytes - HEADERS_BYTES
        # Trim once untrimmed records span half the ring, keeping the newest quarter ring: each
        # recovery then has megabytes of acknowledged records to check, and the ring never fills.
        self._live_bytes_max = ring_bytes // 2
        self._trim_keep_bytes = ring_bytes // 4
        # Appends run ahead of acknowledgements by at most this much, as a producer waiting on acks would.
        self._inflight_bytes_max = ring_bytes // 8
        self._wal = wal
        self._run_id = run_id
        self._lines = lines
        self._trim_offset = wal.trim_offset
        self._cond = threading.Condition()
        # Appended, not yet reported: (seq, offset). The main thread appends, the callback pops.
        self._unreported: deque[tuple[int, int]] = deque()
        # Offsets known durable, oldest first: recovered records (recovery synced them), then acks.
        self._trim_candidates: deque[int] = deque(recovered)
        self._durable_end = wal.durable_offset
        self._failure: BaseException | None = None

    def run(self) -> None:
        parent_pid = os.getppid()
        deadline = time.monotonic() + CHILD_RUN_S_MAX
        future: Future[int] | None = None
        seq = 0
        while True:
            result: AppendResult = self._wal.append(record_body(self._run_id, seq))
            self._unreported.append((seq, result.offset))
            if result.future is not future:
                future = result.future
                future.add_done_callback(self._on_durable)
            self._wait_for_acks(result.offset)
            self._maybe_trim(result.offset)
            seq += 1
            if seq % ORPHAN_CHECK_RECORDS == 0 and (
                os.getppid() != parent_pid or time.monotonic() > deadline
            ):
                return

    def _on_durable(self, future: Future[int]) -> None:
        # Runs on the WAL's completion thread, which acknowledges blocks in offset order.
        error = future.exception()
        with self._cond:
            if error is not None:
                self._failure = error
                self._cond.notify_all()
                return
            durable_end = future.result()
            # A record appended to this block after the callback started waits for the next ack line.
            first_seq = self._unreported[0][0] if self._unreported else -1
            offsets: list[int] = []
            while self._unreported and self._unreported[0][1] < durable_end:
                offsets.append(self._unreported.popleft()[1])
            if offsets:
                self._lines.write(format_ack(first_seq, offsets))
                self._trim_candidates.append(offsets[-1])
            self._durable_end = max(self._durable_end, durable_end)
            self._cond.notify_all()

    def _wait_for_acks(self, head_offset: int) -> None:
        with self._cond:
            while head_offset - self._durable_end > self._inflight_bytes_max:
                if self._failure is not None:
                    raise self._failure
                self._cond.wait(ACK_WAIT_S)

    def _maybe_trim(self, head_offset: int) -> None:
        if head_offset - max(self._trim_offset, 0) <= self._live_bytes_max:
            return
        target = TRIM_NONE
        with self._cond:
            while self._trim_candidates and self._trim_candidates[0] <= head_offset - self._trim_keep_bytes:
                target = self._trim_candidates.popleft()
        if target <= self._trim_offset:
            return
        self._lines.write(f"{TAG_TRIM_STARTED} {target}\n")
        self._wal.trim(target)
        self._lines.write(f"{TAG_TRIM_DONE} {target}\n")
        self._trim_offset = target


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stratalog.chaos.wal_child", description=__doc__)
    parser.add_argument("--path", required=True, help="the WAL file (made on the first run)")
    parser.add_argument("--capacity-bytes", type=int, required=True)
    parser.add_argument("--run-id", type=int, required=True, help="u64 that every record body carries")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    lines = LineWriter(sys.stdout.fileno())
    wal = WriteAheadLog.open(args.path, capacity_bytes=args.capacity_bytes, create=True,
                             config=CHAOS_WAL_CONFIG)
    recovered = [record.offset for record in wal.recover()]
    last_offset = recovered[-1] if recovered else -1
    lines.write(f"{TAG_READY} {len(recovered)} {last_offset}\n")
    try:
        _Writer(wal, args.run_id, lines, recovered).run()
    finally:
        wal.close()  # reached only when orphaned or failing: the parent normally kills the child first
    return 0


if __name__ == "__main__":
    sys.exit(main())
