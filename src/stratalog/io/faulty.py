"""An in-memory device that injects the faults real disks have, driven by one seed.

It keeps two images: what the process sees (every completed write) and what is on stable storage (only
writes followed by a successful sync). :meth:`MemDevice.crash_image` plays a power cut: any subset of the
unsynced writes survives, each whole, dropped, or torn at 512 B sectors or 4 KiB pages. Reads, writes and
syncs can fail with EIO on chosen calls, and syncs can be stalled to hold writes in flight.
"""

from __future__ import annotations

import errno
import mmap
import random
import threading
from dataclasses import dataclass, field

from stratalog.io.device import DIRECT_ALIGN_BYTES

SECTOR_BYTES = 512
PAGE_BYTES = 4096
#: At a crash, each unsynced write is lost whole (below the first bound), lands whole (below the second), or
#: lands in part: sector by sector or page by page (half and half), each piece with even odds.
CRASH_LOST_WHOLE, CRASH_LANDED_WHOLE, HALF = 0.3, 0.6, 0.5


@dataclass
class FaultPlan:
    """Which calls fail. Call numbers count from 1 per kind of call, over the device's life."""

    fail_writes: set[int] = field(default_factory=set)
    fail_syncs: set[int] = field(default_factory=set)
    fail_reads: set[int] = field(default_factory=set)
    #: A failed write still lands this many leading bytes (a partial write before the error).
    failed_write_lands_bytes: int = 0


class MemDevice:
    """A fault-injecting in-memory :class:`~stratalog.io.device.Device`."""

    def __init__(self, size_bytes: int, *, image: bytes | bytearray | None = None,
                 faults: FaultPlan | None = None, check_alignment: bool = True) -> None:
        if image is not None and len(image) != size_bytes:
            raise ValueError("image length must equal size_bytes")
        self._size_bytes = size_bytes
        self._durable = bytearray(image) if image is not None else bytearray(size_bytes)
        self._visible = bytearray(self._durable)
        self._unsynced: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()
        self._sync_gate = threading.Event()
        self._sync_gate.set()
        self.faults = faults or FaultPlan()
        self.check_alignment = check_alignment
        self.writes = 0
        self.syncs = 0
        self.reads = 0
        self.closed = False

    # Device protocol -------------------------------------------------------------------------------

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    @property
    def direct(self) -> bool:
        return True

    @property
    def durable_writes(self) -> bool:
        return False

    def pwrite(self, buf: bytes | bytearray | memoryview | mmap.mmap, position_bytes: int) -> None:
        data = bytes(buf)
        self._check_io(position_bytes, len(data))
        with self._lock:
            self.writes += 1
            if self.writes in self.faults.fail_writes:
                lands = data[: self.faults.failed_write_lands_bytes]
                self._apply_visible(position_bytes, lands)
                raise OSError(errno.EIO, f"injected write error (write #{self.writes})")
            self._apply_visible(position_bytes, data)

    def pread_into(self, buf: memoryview | mmap.mmap, position_bytes: int) -> int:
        view = memoryview(buf)
        self._check_io(position_bytes, view.nbytes)
        with self._lock:
            self.reads += 1
            if self.reads in self.faults.fail_reads:
                raise OSError(errno.EIO, f"injected read error (read #{self.reads})")
            end = min(position_bytes + view.nbytes, self._size_bytes)
            n = max(0, end - position_bytes)
            view[:n] = self._visible[position_bytes:end]
            return n

    def sync(self) -> None:
        self._sync_gate.wait()
        with self._lock:
            self.syncs += 1
            if self.syncs in self.faults.fail_syncs:
                # Like Linux after a failed fsync: the dirty data may be gone and will not be retried.
                raise OSError(errno.EIO, f"injected sync error (sync #{self.syncs})")
            for pos, data in self._unsynced:
                self._durable[pos:pos + len(data)] = data
            self._unsynced.clear()

    def close(self) -> None:
        self.closed = True

    # Fault control ---------------------------------------------------------------------------------

    def stall_syncs(self) -> None:
        """Make sync() block until :meth:`release_syncs`: writes pile up unsynced."""
        self._sync_gate.clear()

    def release_syncs(self) -> None:
        self._sync_gate.set()

    def unsynced_writes(self) -> int:
        with self._lock:
            return len(self._unsynced)

    def durable_image(self) -> bytearray:
        with self._lock:
            return bytearray(self._durable)

    def visible_image(self) -> bytearray:
        with self._lock:
            return bytearray(self._visible)

    def crash_image(self, rng: random.Random, flip_bits: int = 0) -> bytearray:
        """The bytes a power cut now would leave: synced data plus a random subset of unsynced writes.

        Each unsynced write is dropped, kept whole, or torn: a random subset of its 512 B sectors or
        of its 4 KiB pages lands. Writes land in a random order, so a later write may survive while an
        earlier one to the same place does not. ``flip_bits`` bits are then flipped at random inside
        what landed of the unsynced writes (a write garbled on its way to the medium).
        """
        with self._lock:
            image = bytearray(self._durable)
            pending = list(self._unsynced)
        rng.shuffle(pending)
        landed: list[tuple[int, int]] = []
        for pos, data in pending:
            fate = rng.random()
            if fate < CRASH_LOST_WHOLE:
                continue
            if fate < CRASH_LANDED_WHOLE:
                image[pos:pos + len(data)] = data
                landed.append((pos, len(data)))
                continue
            unit = SECTOR_BYTES if rng.random() < HALF else PAGE_BYTES
            for start in range(0, len(data), unit):
                if rng.random() < HALF:
                    end = min(start + unit, len(data))
                    image[pos + start:pos + end] = data[start:end]
                    landed.append((pos + start, end - start))
        for _ in range(flip_bits if landed else 0):
            pos, length = rng.choice(landed)
            flip_bit(image, pos + rng.randrange(length), rng.randrange(8))
        return image

    # Internals -------------------------------------------------------------------------------------

    def _apply_visible(self, pos: int, data: bytes) -> None:
        if not data:
            return
        self._visible[pos:pos + len(data)] = data
        self._unsynced.append((pos, data))

    def _check_io(self, position_bytes: int, length: int) -> None:
        if position_bytes < 0 or position_bytes + length > self._size_bytes:
            raise OSError(errno.EINVAL, f"I/O at {position_bytes}+{length} outside the device")
        if self.check_alignment and (position_bytes % DIRECT_ALIGN_BYTES or length % DIRECT_ALIGN_BYTES):
            raise OSError(errno.EINVAL, f"unaligned direct I/O at {position_bytes}+{length}")


def flip_bit(image: bytearray, position_bytes: int, bit: int) -> None:
    """Flip one bit of ``image`` in place (bit 0 is the least significant)."""
    image[position_bytes] ^= 1 << (bit & 7)
