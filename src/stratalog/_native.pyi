# The compiled core (src/native/): what it offers, for type checkers. Each function's Python twin is
# named beside it; stratalog.native says whether the module loaded.

import mmap
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

def walk_records(data: bytes | bytearray | memoryview, position: int, count: int) -> int:
    """stratalog.kafka.record_check.walk_records."""
def index_kafka_records(data: bytes | bytearray | memoryview, position: int, count: int, last_offset_delta: int,
                        base_timestamp_ms: int, append_timestamp_ms: int | None) -> bytes:
    """stratalog.kafka.record_index.index_kafka_records."""
def index_native_records(data: bytes | bytearray | memoryview, position: int, end: int, count: int) -> bytes:
    """stratalog.engine.record_index.index_native_records."""
def encode_records(out: bytearray | memoryview, keys: bytes | memoryview | pa.Buffer,
                   values: bytes | memoryview | pa.Buffer, dest: np.ndarray, key_start: np.ndarray,
                   key_bytes: np.ndarray, value_start: np.ndarray, value_bytes: np.ndarray,
                   timestamp_ms: np.ndarray) -> None:
    """stratalog.engine.record_layout.encode_records."""

class BlockWriter:
    """stratalog.io.block_io.ThreadedBlockIO is its twin."""

    def __init__(self, fd: int, threads: int, sync_each: bool) -> None: ...
    def submit(self, buffer: mmap.mmap | bytes | bytearray | memoryview, length: int, position: int,
               token: object) -> None: ...
    def reap(self) -> list[tuple[object, int]]: ...
    def wait(self) -> bool: ...
    def set_backstop(self, seconds: float) -> None: ...
    def syncs(self) -> int: ...
    def fileno(self) -> int: ...
    def stop(self) -> None: ...

def lookup_names(offsets: np.ndarray, data: bytes | memoryview | pa.Buffer, slots: np.ndarray, extents: np.ndarray,
                 stored: np.ndarray, probes_max: int, found: np.ndarray) -> None:
    """stratalog.queues.names.lookup_numpy."""
def sort_record(ids: np.ndarray, lo: int, chunks: tuple[tuple[np.ndarray, bytes | memoryview | pa.Buffer], ...],
                next_offsets: np.ndarray, messages_max: int) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes]:
    """stratalog.queues.record_sort.sort_record_numpy."""
def lay_out_runs(chunks: tuple[tuple[np.ndarray, bytes | memoryview | pa.Buffer], ...], order: np.ndarray,
                 run_first: np.ndarray, a: int, b: int, out: pa.Buffer | bytearray) -> None:
    """The slices of stratalog.queues.format._laid_parts."""
def merge_runs(sources: bytes | memoryview, starts: np.ndarray, counts: np.ndarray,
               out: pa.Buffer | bytearray) -> bool | None:
    """The Arrow takes of stratalog.queues.compaction._merge_slice."""
def read_tail(out: list[bytes], stream_id: int, pos: int, stop: int, record_min: int, starts: np.ndarray,
              run_record: np.ndarray, run_first: np.ndarray, run_base: np.ndarray, run_end: np.ndarray,
              datas: tuple[bytes | memoryview | None, ...], message_ats: tuple[memoryview | None, ...]) -> int:
    """stratalog.queues.index.TailIndex.read_python."""
def place_record(buf: mmap.mmap | bytearray | memoryview, pos: int, parts: Sequence[bytes | bytearray | memoryview],
                 offset: int) -> int:
    """stratalog.wal.format.place_record_python."""
