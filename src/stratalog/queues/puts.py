"""What put and put_many take, checked and made into the forms the writer uses: names as one Arrow
string array, messages as one Arrow binary array."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from stratalog.queues.config import QUEUE_NAME_CHARS_MAX
from stratalog.queues.errors import InvalidQueueNameError, check_name
from stratalog.queues.names import name_array

#: A NumPy message buffer is 2-D: one message per row, all of the row's width.
MESSAGE_ROWS_NDIM = 2


def plain_name(name: object) -> bool:
    """A name that needs no further check: a str of 1 to QUEUE_NAME_CHARS_MAX ASCII characters (for any
    other, check_name says what is wrong, or that it is fine)."""
    return type(name) is str and 0 < len(name) <= QUEUE_NAME_CHARS_MAX and name.isascii()


def as_bytes(message: object) -> bytes:
    """A message given as a bytearray or memoryview, as bytes (a copy: the caller may reuse its buffer as
    soon as put returns); TypeError for anything else."""
    if isinstance(message, bytearray | memoryview):
        return bytes(message)
    raise TypeError(f"a message must be bytes, got {type(message).__name__}")


def names_as_arrow(names: Sequence[str] | Any) -> Any:
    """put_many's names as one Arrow string array; InvalidQueueNameError if any is not a str."""
    if isinstance(names, str | bytes):
        raise InvalidQueueNameError(f"queue_names must be a sequence of names, not one name: {names!r:.80}")
    try:
        array = name_array(names)
    except (pa.ArrowException, TypeError, ValueError, UnicodeEncodeError):
        array = None
    if array is None or array.type != pa.string():
        # Bytes, numbers, lone surrogates...: check_name says which and what is wrong with it.
        for name in names.to_pylist() if isinstance(names, pa.Array | pa.ChunkedArray) else names:
            check_name(name)
        raise InvalidQueueNameError(f"queue names must be str, got {array.type if array is not None else names!r:.80}")
    return array


def messages_as_arrow(messages: Sequence[bytes] | Any) -> Any:
    """Messages as one Arrow binary array (no copy for Arrow input)."""
    if isinstance(messages, pa.ChunkedArray):
        messages = messages.combine_chunks()
    if isinstance(messages, pa.Array):
        if pa.types.is_large_binary(messages.type) or pa.types.is_fixed_size_binary(messages.type) \
                or pa.types.is_binary_view(messages.type):
            return messages.cast(pa.binary())
        if not pa.types.is_binary(messages.type):
            raise TypeError(f"messages must be a binary Arrow array, got {messages.type}")
        return messages
    if isinstance(messages, np.ndarray):
        if messages.dtype != np.uint8 or messages.ndim != MESSAGE_ROWS_NDIM:
            raise TypeError("a NumPy message buffer must be a 2-D uint8 array, one message per row")
        rows, width = messages.shape
        offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
        # A copy: the caller may reuse its buffer as soon as put_many returns.
        return pa.BinaryArray.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets),
                                                              pa.py_buffer(messages.tobytes())])
    items = list(messages)
    for m in items:
        if type(m) is not bytes:
            raise TypeError(f"a message must be bytes, got {type(m).__name__}")
    return pa.array(items, type=pa.binary())
