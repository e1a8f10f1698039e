"""A WAL record laid into its block: the compiled ``_native.place_record`` and its twin
``wal.format.place_record_python`` write the same bytes and refuse the same calls."""

from __future__ import annotations

import mmap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from stratalog.native import native_crc
from stratalog.wal.format import RECORD_HEADER_BYTES, encode_record, place_record_python

compiled = pytest.mark.skipif(native_crc is None, reason="the compiled core or its CRC32C is not loaded")

#: Bodies from this size on are copied with the GIL released.
GIL_FREE_BYTES_MIN = 64 << 10


def _both(size: int, pos: int, parts: list[bytes], offset: int) -> tuple[object, object]:
    """Each implementation on a buffer of ``size`` bytes of 0xEE: (its result, the buffer) or its error."""
    assert native_crc is not None
    got = []
    for place in (native_crc.place_record, place_record_python):
        buf = mmap.mmap(-1, size)
        buf.write(b"\xee" * size)
        try:
            end = place(buf, pos, [memoryview(p) for p in parts], offset)
            got.append((end, bytes(buf)))
        except ValueError as e:
            got.append((type(e), str(e)))
        finally:
            buf.close()
    return got[0], got[1]


@compiled
@settings(max_examples=examples(300), deadline=None)
@given(parts=st.lists(st.binary(max_size=300), max_size=5), big=st.integers(0, 2), slack=st.integers(-3, 40),
       pos=st.integers(-2, 70), offset=st.integers(-1, 2**63 - 1))
def test_the_compiled_placement_writes_what_its_twin_writes(parts: list[bytes], big: int, slack: int, pos: int,
                                                           offset: int) -> None:
    """Bodies of a few parts, some past the size copied without the GIL; buffers a little too small to
    roomy; positions and offsets in and out of range: the same record bytes and end, or the same error."""
    if big:
        parts = [*parts, bytes(range(256)) * (GIL_FREE_BYTES_MIN // 256 * big)]
    body = b"".join(parts)
    size = max(1, max(pos, 0) + RECORD_HEADER_BYTES + len(body) + slack)
    compiled_result, twin_result = _both(size, pos, parts, offset)
    assert compiled_result == twin_result
    if isinstance(twin_result[0], int):
        end, written = twin_result
        assert end == pos + RECORD_HEADER_BYTES + len(body)
        assert written[pos:end] == encode_record(offset, body)
        assert written[:pos] == b"\xee" * pos and written[end:] == b"\xee" * (size - end)


@compiled
def test_the_compiled_placement_refuses_what_its_twin_refuses() -> None:
    """A record that overruns its buffer, a position before it, a negative offset: ValueError, same words."""
    cases = [(100, 0, [b"x" * 77], 5), (100, 0, [b"x" * 76], 5), (100, -1, [b""], 0), (100, 101, [], 0),
             (100, 0, [b"y"], -7), (1 << 20, 1, [bytes(GIL_FREE_BYTES_MIN)] * 16, 9)]
    outcomes = [_both(*case) for case in cases]
    assert all(c == t for c, t in outcomes)
    assert [t[0] for _, t in outcomes] == [ValueError, 100, ValueError, ValueError, ValueError, ValueError]
    assert outcomes[0][1][1] == "place_record: a body of 77 bytes at 0 does not fit a buffer of 100"


@compiled
def test_the_compiled_placement_writes_only_into_writable_buffers() -> None:
    assert native_crc is not None
    for place in (native_crc.place_record, place_record_python):
        with pytest.raises(TypeError, match=r"^place_record: buf must be a writable buffer$"):
            place(bytes(100), 0, [memoryview(b"x")], 0)
