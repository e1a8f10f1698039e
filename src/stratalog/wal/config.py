"""Every bound of the write-ahead log, named, with the reason for its default."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from stratalog.wal.format import ALIGN_BYTES, RECORD_HEADER_BYTES

#: The most I/O threads a WAL may have (the compiled writer's bound too: src/native/writer.c).
IO_THREADS_MAX = 64
#: The most puts or gets an object WAL keeps in flight: each holds a connection and an object's bytes.
IN_FLIGHT_MAX = 256
#: The most tries of one put or get: past this a store that fails is down, not flaky.
ATTEMPTS_MAX = 20
#: Longest pause between tries, and longest wait before a failed put may be tried again.
PUT_BACKOFF_S_LIMIT = 10.0
PUT_RETRY_S_LIMIT = 600.0


class FsyncPolicy(StrEnum):
    """When an append is acknowledged.

    ``always``: once its bytes are on stable storage (O_DSYNC write, or write + fdatasync). The default
    and the only policy that keeps the durability contract. ``interval``: once written; a background
    sync runs every ``fsync_interval_s``. ``never``: once written, never synced. The last two exist for
    benchmarks, and every figure they produce says so.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class WALConfig:
    #: A block is sealed once it holds this many bytes. 256 KiB as in AutoMQ's Delta WAL article: cloud
    #: disks split larger writes into 256 KiB pieces anyway, and it keeps a block's buffer small.
    block_bytes_soft_max: int = 256 << 10
    #: ... or once its first record has waited this long. 1/3000 s matches 3000 IOPS (EBS gp3's free quota).
    block_linger_s: float = 1 / 3000
    #: Seal a block at its first record when an I/O thread is free and nothing waits for one: an idle
    #: device gains nothing from the linger, which would only add to latency (256 B at 50/s: p50 0.90 ->
    #: 0.50 ms in paired runs). Records still gather while every thread is busy, and a block left open
    #: then is sealed as soon as a write completes (group commit).
    seal_when_idle: bool = True
    #: Blocks written at once, each by its own I/O thread; more sealed blocks wait in the I/O engine's queue,
    #: within window_bytes_max. 4, as in the benchmark of AutoMQ's Delta WAL article.
    io_threads: int = 4
    #: Write blocks with the compiled writer's threads, which never wait for the GIL (io/block_io.py), where
    #: the device is a file and the compiled core is built. False takes Python I/O threads, the writer's
    #: twin (as a device without a file always does): to compare the two, or to rule the writer out.
    compiled_io: bool = True
    #: Bytes between the oldest unfinished block and the end of the newest block being written. Recovery
    #: scans this far past the last valid record to find records written after a hole.
    window_bytes_max: int = 16 << 20
    #: Largest record body accepted. Bounded so a block always fits the ring many times over.
    record_bytes_max: int = 8 << 20
    #: Bytes of blocks sealed and not yet acknowledged (waiting for an I/O thread or the window, or being
    #: written). When full, append waits up to ``append_wait_s_max`` for room, then raises
    #: OverCapacityError; a block larger than this goes alone. 4 MiB: enough blocks for the I/O threads to
    #: keep the device busy, few enough that flat-out appends do not queue behind tens of MiB (flat-out p99
    #: 10-43 -> 2-7 ms) and the device reads the same few MiB of memory over and over, which a virtual
    #: disk whose host copies each write finds in the CPU's caches (256 KiB and 1 MiB records, `bench wal`
    #: alternating with 64 MiB: 0.73-0.97x and 0.81-0.92x of plain O_DIRECT writes against 0.72-0.75x
    #: and 0.70-0.71x). The stream store asks for more (engine/config.py says why).
    buffered_bytes_max: int = 4 << 20
    append_wait_s_max: float = 30.0
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_s: float = 0.01
    #: Bytes read per I/O during recovery: large, so recovery runs at the disk's sequential rate.
    recovery_read_bytes: int = 4 << 20

    def validate(self, ring_bytes: int | None = None) -> None:
        """Raise ValueError naming the first bound that makes no sense."""
        if self.block_bytes_soft_max < ALIGN_BYTES or self.block_bytes_soft_max % ALIGN_BYTES:
            raise ValueError(f"block_bytes_soft_max must be a positive multiple of {ALIGN_BYTES}")
        if self.block_linger_s < 0:
            raise ValueError("block_linger_s must be >= 0")
        if not 1 <= self.io_threads <= IO_THREADS_MAX:
            raise ValueError(f"io_threads must be within 1..{IO_THREADS_MAX}")
        if not 1 <= self.record_bytes_max <= (1 << 31):
            raise ValueError("record_bytes_max must be within 1..2 GiB")
        if self.window_bytes_max < self.block_bytes_max:
            raise ValueError(
                f"window_bytes_max ({self.window_bytes_max}) must hold the largest block "
                f"({self.block_bytes_max}): raise it or lower record_bytes_max"
            )
        if self.buffered_bytes_max < self.block_bytes_soft_max:
            raise ValueError("buffered_bytes_max must hold a block (block_bytes_soft_max)")
        if self.recovery_read_bytes < ALIGN_BYTES or self.recovery_read_bytes % ALIGN_BYTES:
            raise ValueError(f"recovery_read_bytes must be a positive multiple of {ALIGN_BYTES}")
        if ring_bytes is not None and ring_bytes < 4 * (self.block_bytes_max + ALIGN_BYTES):
            raise ValueError(
                f"the ring ({ring_bytes} bytes) must hold at least four of the largest blocks "
                f"({self.block_bytes_max} bytes): grow capacity_bytes or lower record_bytes_max"
            )

    @property
    def block_bytes_max(self) -> int:
        """Largest block the writer can produce: one record of the largest size, aligned."""
        biggest_record = RECORD_HEADER_BYTES + self.record_bytes_max
        return max(self.block_bytes_soft_max, (biggest_record + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES)


@dataclass(frozen=True, slots=True)
class ObjectWALConfig:
    """Every bound of the object WAL (:mod:`stratalog.wal.object_wal`), with the reason for its default."""

    #: Records gather this long after the first one before their object is put. A put to S3 takes tens of
    #: milliseconds, so 5 ms adds little to an acknowledgement, and it bounds the puts one owner makes (and
    #: pays for) to about 200 a second however many small records arrive.
    linger_s: float = 0.005
    #: ... or until the object holds this many record bytes. 4 MiB: under the S3 store's multipart
    #: threshold (16 MiB), so an object is always one PutObject, and at 100 MiB/s still 25 puts a second.
    object_bytes_soft_max: int = 4 << 20
    #: Batches put or being put and not yet acknowledged (so also the most puts under way at once).
    #: Acknowledgement waits for the slowest of them; with puts of ~40 ms and a 5 ms linger, 8 keep one
    #: owner's log moving without queueing. Recovery relies on it: at most this many minus one objects
    #: can lie past one missing after a crash.
    puts_in_flight_max: int = 8
    #: Tries per object put (the first included) before the log stops, with ``put_backoff_s`` before the
    #: second and doubling after. The S3 client retries throttling and 5xx itself; these cover the rest
    #: (a local store's transient error), bounded because every later acknowledgement waits on them.
    put_attempts_max: int = 3
    put_backoff_s: float = 0.05
    #: ... and for at least this long, however many tries that takes (the wait between tries grows to
    #: ``put_backoff_s_max``): a restart of the object store takes seconds, and should cost a pause in
    #: acknowledgements, not a stopped log (a broker of a cluster that stops, and its log replayed).
    put_retry_s_min: float = 30.0
    put_backoff_s_max: float = 1.0
    #: Tries per get or list during recovery and per delete, with the same backoff.
    read_attempts_max: int = 3
    #: Largest record body accepted: the device WAL's default, so either WAL takes the engine's batches.
    record_bytes_max: int = 8 << 20
    #: Bytes appended but not yet acknowledged. When full, append waits up to ``append_wait_s_max`` for
    #: puts to finish, then raises OverCapacityError.
    buffered_bytes_max: int = 64 << 20
    append_wait_s_max: float = 30.0
    #: Objects read ahead during recovery, each by its own thread: recovery runs at the store's parallel
    #: rate, not one round trip per object.
    recovery_gets_in_flight_max: int = 8

    def validate(self) -> None:
        """Raise ValueError naming the first bound that makes no sense."""
        if not 0 <= self.linger_s <= 1.0:
            raise ValueError("linger_s must be within 0..1 s")
        if self.object_bytes_soft_max < 1:
            raise ValueError("object_bytes_soft_max must be >= 1")
        if not 1 <= self.puts_in_flight_max <= IN_FLIGHT_MAX:
            raise ValueError(f"puts_in_flight_max must be within 1..{IN_FLIGHT_MAX}")
        if not 1 <= self.put_attempts_max <= ATTEMPTS_MAX or not 1 <= self.read_attempts_max <= ATTEMPTS_MAX:
            raise ValueError(f"put_attempts_max and read_attempts_max must be within 1..{ATTEMPTS_MAX}")
        if not 0 <= self.put_backoff_s <= self.put_backoff_s_max <= PUT_BACKOFF_S_LIMIT:
            raise ValueError(f"put_backoff_s and put_backoff_s_max must be within 0..{PUT_BACKOFF_S_LIMIT:g} s, in "
                             "that order")
        if not 0 <= self.put_retry_s_min <= PUT_RETRY_S_LIMIT:
            raise ValueError(f"put_retry_s_min must be within 0..{PUT_RETRY_S_LIMIT:g} s")
        if not 1 <= self.record_bytes_max <= (1 << 31):
            raise ValueError("record_bytes_max must be within 1..2 GiB")
        if self.buffered_bytes_max < self.record_bytes_max + RECORD_HEADER_BYTES:
            raise ValueError("buffered_bytes_max must hold the largest record")
        if self.append_wait_s_max < 0:
            raise ValueError("append_wait_s_max must be >= 0")
        if not 1 <= self.recovery_gets_in_flight_max <= IN_FLIGHT_MAX:
            raise ValueError(f"recovery_gets_in_flight_max must be within 1..{IN_FLIGHT_MAX}")
