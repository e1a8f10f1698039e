"""Records of the store's own encoding laid out in bulk: what a Spark write stages, row by row in one call.

The caller decides where each record goes (``dest``: its first byte in ``out``) and where its key and
value come from (positions in the ``keys`` and ``values`` buffers, as an Arrow binary column holds them);
this writes each record's head (docs/formats/object.md: record_bytes, timestamp, key and value lengths,
no headers) and copies its key and value after it. Nothing else in ``out`` is touched, so the caller can
leave room for batch headers between runs of records.

``encode_records`` is the reference of the compiled ``stratalog._native.encode_records``: the same bytes,
and the same ValueError for a row whose key or value lies outside its buffer or whose record does not fit
where it is placed, before anything of that row is written.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from stratalog.engine.batch import RECORD_HEAD
from stratalog.native import native

_FIXED_BYTES = RECORD_HEAD.size - 4
_INT32_MAX = (1 << 31) - 1
_UINT32_MAX = (1 << 32) - 1


def encode_records(out: bytearray | memoryview, keys: bytes | memoryview | pa.Buffer,
                   values: bytes | memoryview | pa.Buffer,
                   dest: np.ndarray, key_start: np.ndarray, key_bytes: np.ndarray,
                   value_start: np.ndarray, value_bytes: np.ndarray, timestamp_ms: np.ndarray) -> None:
    """Write record ``i`` at ``out[dest[i]:]``: its key ``keys[key_start[i]:][:key_bytes[i]]`` (-1 bytes:
    null), its value likewise from ``values``, its timestamp. The six columns hold one int64 per row."""
    columns = (dest, key_start, key_bytes, value_start, value_bytes, timestamp_ms)
    if any(column.dtype != np.int64 for column in columns):
        raise TypeError("the columns must hold int64 values")
    rows = len(dest)
    keys, values = memoryview(keys).cast("B"), memoryview(values).cast("B")
    if any(len(column) != rows for column in (key_start, key_bytes, value_start, value_bytes, timestamp_ms)):
        raise ValueError("the columns must have one value per row each")
    pack = RECORD_HEAD.pack_into
    for i in range(rows):
        at, k_start, k_bytes = int(dest[i]), int(key_start[i]), int(key_bytes[i])
        v_start, v_bytes = int(value_start[i]), int(value_bytes[i])
        kept = max(k_bytes, 0)
        if (not -1 <= k_bytes <= _INT32_MAX or not 0 <= v_bytes <= _INT32_MAX or not 0 <= k_start <= len(keys) - kept
                or not 0 <= v_start <= len(values) - v_bytes):
            raise ValueError(f"row {i}: its key or value lies outside the data given")
        record_bytes = _FIXED_BYTES + kept + v_bytes
        if record_bytes > _UINT32_MAX or not 0 <= at <= len(out) - (4 + record_bytes):
            raise ValueError(f"row {i}: its record does not fit the output where it is placed")
        pack(out, at, record_bytes, int(timestamp_ms[i]), k_bytes, v_bytes, 0)
        at += RECORD_HEAD.size
        out[at:at + kept] = keys[k_start:k_start + kept]
        out[at + kept:at + kept + v_bytes] = values[v_start:v_start + v_bytes]


#: The compiled layout where the core is built, else its twin.
lay_out_records = native.encode_records if native is not None else encode_records
