"""Every bound of the stream store, named, with the reason for its default."""

from __future__ import annotations

from dataclasses import dataclass, field

from stratalog.free_space import Headroom
from stratalog.wal.config import WALConfig


@dataclass(frozen=True, slots=True)
class CleanerBounds:
    """What one pass of log compaction (engine/cleaner.py) may use."""

    #: Keys in the key map, each about 120 bytes in memory (a 16-byte digest and an offset in a dict):
    #: 250,000 is about 30 MiB. A stream with more distinct keys in its uncleaned part is cleaned in
    #: several passes, each up to where the map filled.
    key_map_entries_max: int = 250_000
    #: Input rewritten into one new object before it is committed: what a pass holds in memory at once.
    rewrite_bytes_max: int = 64 << 20
    #: Bytes read per second (None: as fast as object storage answers), so a pass leaves the produce and
    #: fetch paths their share of the machine.
    read_bytes_per_s_max: int | None = 32 << 20
    #: Decode and rewrite records in a process of its own (engine/cleaner_process.py), niced, rather than
    #: in the store's: a pass's Python decoding then takes no interpreter time from the broker's event
    #: loop, whose produce p99 it raised to 2.3x idle in `bench compaction` when it ran in a thread.
    own_process: bool = True


@dataclass(frozen=True, slots=True)
class StoreConfig:
    #: The WAL ring. Only data not yet uploaded lives there, so it need not be large (AutoMQ: 2 GiB).
    wal_capacity_bytes: int = 512 << 20
    #: The WAL's own settings, but for a write buffer of 64 MiB where the WAL's default is 4 MiB: a broker's
    #: produce comes in bursts, and an append that finds the buffer full is handed to the appender's worker
    #: thread (it never waits on the event loop). With 4 MiB, 1 KiB produce ran at 0.84-0.90x in `bench
    #: kafka` (alternating builds, twice); 100 B produce and latency alike.
    wal: WALConfig = field(default_factory=lambda: WALConfig(record_bytes_max=8 << 20, buffered_bytes_max=64 << 20))
    #: Appended data not yet in objects, held in memory for tail reads. When full, appends wait.
    log_cache_bytes_max: int = 256 << 20
    #: Upload once this much is waiting (a quarter of the cache: uploads overlap with new appends) ...
    upload_bytes_threshold: int = 64 << 20
    #: ... or once the oldest waiting data is this old, so a quiet store still reaches object storage.
    upload_interval_s: float = 5.0
    #: A stream with at least this much data in one upload gets an object of its own (AutoMQ's stream
    #: objects): big streams then read without touching other streams' bytes.
    stream_object_bytes_min: int = 16 << 20
    #: Cold data blocks kept in memory, and readahead depth for sequential readers.
    block_cache_bytes_max: int = 128 << 20
    readahead_blocks_max: int = 8
    #: Streams whose next blocks' metadata rows are kept for cold readers (a reader asks the metadata once
    #: per ``range_rows_per_query`` blocks, not once per block); the stream whose rows were fetched longest
    #: ago goes first.
    range_rows_streams_max: int = 4096
    range_rows_per_query: int = 32
    block_cache_io_threads: int = 4
    #: Bytes per second that cold reads (from objects) may return, all readers together; None: no limit.
    #: A catch-up reader takes CPU the producers need (on 2 vCPUs their p99 doubled at 200 MiB/s and
    #: rose 4-9x unlimited: BENCHMARKS.md); a limit trades catch-up speed for produce latency.
    cold_read_bytes_per_s_max: int | None = None
    #: How long an append waits for room (log cache or WAL) before raising BackpressureError.
    append_wait_s_max: float = 30.0
    #: Uploads retry a failed object-store or metadata step this many times, backing off, and for
    #: ``upload_retry_s_min`` at least (the wait growing to ``upload_backoff_s_max``), before the store
    #: stops accepting appends (the data stays in the WAL and is retried at the next open). 30 s: a
    #: restart of the object store or of PostgreSQL takes seconds, and must not stop the store.
    upload_attempts_max: int = 5
    upload_backoff_s: float = 0.2
    upload_retry_s_min: float = 30.0
    upload_backoff_s_max: float = 2.0
    #: Appends are refused (StoreFullError; a broker answers KAFKA_STORAGE_ERROR) while the filesystem of the
    #: data directory, or of a local object store, has less free than the larger of these two, so that what
    #: the store must still write once it stops taking appends has room: the uploads of what it holds (an
    #: upload makes objects of upload_bytes_threshold, 64 MiB, at a time; the log cache holds up to four),
    #: the metadata's journal, the producers' snapshots. Reads go on meanwhile, and appends resume by
    #: themselves once space is back. 0 and 0: refuse only when a write finds the disk full.
    free_bytes_min: int = 256 << 20
    free_percent_min: float = 1.0
    #: Free space is looked at this often (by the uploader thread) ...
    free_space_check_interval_s: float = 1.0
    #: ... and at a refused append, when the last look is older than this: a freed disk takes appends again
    #: at once, and a storm of refused appends costs a statvfs now and then, not one each.
    free_space_recheck_interval_s: float = 0.1
    #: Objects nothing refers to are deleted this long after, so readers holding them finish first.
    object_grace_s: float = 60.0
    #: How often retention and object deletion run in the background.
    retention_interval_s: float = 30.0
    #: A full manifest snapshot every this many commits; deltas in between.
    manifest_snapshot_every: int = 64
    #: What a pass of log compaction may use: memory for its key map and its rewrite, read bandwidth.
    cleaner: CleanerBounds = field(default_factory=CleanerBounds)

    def validate(self) -> None:
        if self.upload_bytes_threshold > self.log_cache_bytes_max:
            raise ValueError("upload_bytes_threshold must not exceed log_cache_bytes_max")
        if self.log_cache_bytes_max < self.wal.record_bytes_max:
            raise ValueError("log_cache_bytes_max must hold the largest batch (wal.record_bytes_max)")
        if self.range_rows_streams_max < 0 or self.range_rows_per_query < 1:
            raise ValueError("range_rows_streams_max must be >= 0 and range_rows_per_query >= 1")
        if self.cold_read_bytes_per_s_max is not None and self.cold_read_bytes_per_s_max <= 0:
            raise ValueError("cold_read_bytes_per_s_max must be positive (or None for no limit)")
        if self.upload_attempts_max < 1:
            raise ValueError("upload_attempts_max must be >= 1")
        if self.upload_retry_s_min < 0 or not 0 <= self.upload_backoff_s <= self.upload_backoff_s_max:
            raise ValueError("upload_retry_s_min must be >= 0, and 0 <= upload_backoff_s <= upload_backoff_s_max")
        bounds = self.cleaner
        if bounds.key_map_entries_max < 1 or bounds.rewrite_bytes_max < 1:
            raise ValueError("cleaner.key_map_entries_max and cleaner.rewrite_bytes_max must be >= 1")
        if bounds.read_bytes_per_s_max is not None and bounds.read_bytes_per_s_max <= 0:
            raise ValueError("cleaner.read_bytes_per_s_max must be positive (or None for no limit)")
        self.headroom.validate("")
        self.wal.validate(self.wal_capacity_bytes - 8192)

    @property
    def headroom(self) -> Headroom:
        return Headroom(self.free_bytes_min, self.free_percent_min, self.free_space_check_interval_s,
                        self.free_space_recheck_interval_s)
