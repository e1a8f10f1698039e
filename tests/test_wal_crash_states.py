"""Power cuts through the fault-injecting device: at least 10,000 crash states from fixed seeds.

Each scenario runs a WAL on a MemDevice for a few sessions. Along the way it takes crash images (synced
data plus any subset of unsynced writes, torn at 512 B or 4 KiB, sometimes with flipped bits), recovers
each one on a fresh device and checks the contract: no acknowledged record lost, no corrupt record
returned, nothing at or below the trim returned. Between sessions a crash image becomes the new disk.
"""

from __future__ import annotations

import random
from concurrent.futures import Future
from dataclasses import dataclass

from stratalog.errors import OverCapacityError, WALFailedError
from stratalog.io.faulty import FaultPlan, MemDevice, flip_bit
from stratalog.wal import RecoveredRecord, WriteAheadLog
from stratalog.wal.format import HEADERS_BYTES
from walkit import CAPACITY_BYTES, acknowledged, new_wal, payload, reopen, small_config

CRASH_STATES_MIN = 10_000
SCENARIOS = 160
SESSIONS_PER_SCENARIO = 3
STEPS_PER_SESSION = 8
#: Bytes appended while syncs are stalled stay below buffered_bytes_max so append never blocks.
STALLED_BURST_BYTES_MAX = 40 << 10


@dataclass
class Tally:
    crash_states: int = 0
    acknowledged_checked: int = 0
    acknowledged_lost: int = 0
    corrupt_returned: int = 0
    below_trim_returned: int = 0
    images_with_flipped_bits: int = 0
    injected_io_errors: int = 0


Results = list[tuple[int, bytes, Future[int]]]


class Scenario:
    """One seeded run: a WAL, what was appended, what must survive."""

    def __init__(self, seed: int, tally: Tally) -> None:
        self.rng = random.Random(seed)
        self.tally = tally
        self.must_survive: dict[int, bytes] = {}  # earlier sessions' records: recovered, hence durable
        self.known: dict[int, bytes] = {}         # every record ever appended, by offset
        self.trim = -1
        self.trim_attempted = -1

    def run(self) -> None:
        wal, device = new_wal(io_threads=self.rng.randint(1, 4), block_linger_s=self.rng.choice([0, 2e-4]))
        for _session in range(SESSIONS_PER_SCENARIO):
            results: Results = []
            self.session(wal, device, results)
            # A real crash: the image becomes the disk of the next session.
            self.absorb_acknowledged(results)
            image = device.crash_image(self.rng)
            wal.close()
            records, wal = self.check(image, keep_open=True)
            device = wal.device  # type: ignore[assignment]
            self.must_survive = {r.offset: r.data for r in records}
        wal.close()

    def session(self, wal: WriteAheadLog, device: MemDevice, results: Results) -> None:
        if self.rng.random() < 0.2:
            kind = self.rng.choice(["write", "sync"])
            nth = self.rng.randint(2, 30)
            device.faults = FaultPlan(fail_writes={device.writes + nth} if kind == "write" else set(),
                                      fail_syncs={device.syncs + nth} if kind == "sync" else set())
            self.tally.injected_io_errors += 1
        try:
            for _ in range(STEPS_PER_SESSION):
                self.step(wal, device, results)
        except WALFailedError:
            self.crash_images(device, results, self.rng.randint(2, 6))
        device.faults = FaultPlan()

    def step(self, wal: WriteAheadLog, device: MemDevice, results: Results) -> None:
        action = self.rng.random()
        if action < 0.3:
            device.stall_syncs()
            try:
                self.append_burst(wal, results, STALLED_BURST_BYTES_MAX, stalled=True)
                self.crash_images(device, results, self.rng.randint(3, 8))
            finally:
                device.release_syncs()
        elif action < 0.45:
            self.trim_somewhere(wal, results)
        else:
            self.append_burst(wal, results, 12 << 10)
            if self.rng.random() < 0.5 and results:
                results[-1][2].exception(timeout=10)
        self.crash_images(device, results, self.rng.randint(1, 4))

    def append_burst(self, wal: WriteAheadLog, results: Results, bytes_max: int,
                     stalled: bool = False) -> None:
        total = 0
        while total < bytes_max - 3100:
            data = payload(self.rng)
            try:
                res = wal.append(data)
            except OverCapacityError:
                if stalled:
                    return  # nothing completes while syncs are held: room cannot be made now
                self.make_room(wal, results)
                continue
            results.append((res.offset, data, res.future))
            self.known[res.offset] = data
            total += len(data) + 24
            if self.rng.random() < 0.15:
                break

    def make_room(self, wal: WriteAheadLog, results: Results) -> None:
        """The ring is full: wait for what is written, then trim most of it."""
        if results:
            results[-1][2].exception(timeout=10)
        acked = sorted(o for o in [*acknowledged(results), *self.must_survive] if o > self.trim)
        self.trim_to(wal, acked[len(acked) * 3 // 4])

    def trim_somewhere(self, wal: WriteAheadLog, results: Results) -> None:
        acked = sorted(o for o in acknowledged(results) if o > self.trim)
        if not acked:
            return
        self.trim_to(wal, acked[self.rng.randrange(len(acked))])

    def trim_to(self, wal: WriteAheadLog, target: int) -> None:
        # A trim that fails midway may or may not have reached the disk: records up to its target may
        # then be gone, and the lost-record check allows that.
        self.trim_attempted = target
        wal.trim(target)
        self.trim = target

    def absorb_acknowledged(self, results: Results) -> None:
        self.must_survive.update(acknowledged(results))

    def crash_images(self, device: MemDevice, results: Results, count: int) -> None:
        for _ in range(count):
            # What was acknowledged is read before the image: it must all be in it.
            acked = dict(self.must_survive)
            acked.update(acknowledged(results))
            flips = self.rng.choice([0, 0, 0, 1, 3])
            image = device.crash_image(self.rng, flip_bits=flips)
            self.tally.images_with_flipped_bits += flips > 0
            self.check(image, acked=acked)

    def check(self, image: bytearray, acked: dict[int, bytes] | None = None,
              keep_open: bool = False) -> tuple[list[object], WriteAheadLog]:
        acked = dict(self.must_survive) if acked is None else acked
        records, wal = reopen(image, io_threads=2)
        tally = self.tally
        tally.crash_states += 1
        returned = set()
        for rec in records:
            returned.add(rec.offset)
            if rec.offset <= self.trim:
                tally.below_trim_returned += 1
            if self.known.get(rec.offset) != rec.data:
                tally.corrupt_returned += 1
        for offset in acked:
            if offset > self.trim_attempted:
                tally.acknowledged_checked += 1
                tally.acknowledged_lost += offset not in returned
        if not keep_open:
            wal.close()
        return records, wal  # type: ignore[return-value]


def test_ten_thousand_crash_states_lose_nothing_acknowledged() -> None:
    tally = Tally()
    for seed in range(SCENARIOS):
        Scenario(seed, tally).run()
    print(tally)
    assert tally.crash_states >= CRASH_STATES_MIN
    assert tally.acknowledged_checked > 100_000, "the scenarios acknowledged too little to mean much"
    assert tally.images_with_flipped_bits > 500
    assert tally.injected_io_errors > 10
    assert tally.acknowledged_lost == 0
    assert tally.corrupt_returned == 0
    assert tally.below_trim_returned == 0


def test_bit_flip_in_durable_data_loses_at_most_its_block_and_returns_nothing_corrupt() -> None:
    rng = random.Random(2024)
    lost_outside_block = corrupt = 0
    for _ in range(300):
        wal, device = new_wal()
        written = {}
        blocks: dict[int, tuple[int, int]] = {}  # a block's future -> its extent [start, end)
        block_of = {}
        appended = []
        for _ in range(rng.randint(5, 60)):
            data = payload(rng)
            appended.append((wal.append(data), data))
        wal.close()
        for res, data in appended:
            written[res.offset] = data
            block_of[res.offset] = id(res.future)
            start = blocks.get(id(res.future), (res.offset, 0))[0]
            blocks[id(res.future)] = (start, res.future.result())
        image = device.durable_image()
        flipped = rng.randrange(HEADERS_BYTES, CAPACITY_BYTES)
        flip_bit(image, flipped, rng.randrange(8))
        returned = {rec.offset: rec.data for rec in _recover(image)}
        corrupt += sum(written.get(offset) != body for offset, body in returned.items())
        logical = flipped - HEADERS_BYTES
        for offset in written:
            start, end = blocks[block_of[offset]]
            if offset not in returned and not start <= logical < end:
                lost_outside_block += 1
    assert corrupt == 0
    assert lost_outside_block == 0


def _recover(image: bytearray) -> list[RecoveredRecord]:
    device = MemDevice(len(image), image=image)
    wal = WriteAheadLog.open(device, config=small_config())
    records = list(wal.recover())
    wal.close()
    return records
