"""The bulk formats: golden bytes of the worked example in docs/formats/queues.md, round trips, and one
test per way a run object or bulk record can be damaged."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples import examples
from stratalog.chaos import fuzz_engine, fuzz_queues
from stratalog.native import native
from stratalog.queues import format as format_module
from stratalog.queues.format import (
    OBJECT_FOOTER_BYTES,
    PAGE_BYTES,
    CorruptBulkError,
    build_object,
    check_pages,
    decode_bulk,
    decode_footer,
    decode_index,
    decode_run,
    encode_bulk,
    frame_run,
    lay_out_object,
    page_crcs,
    page_span,
    run_messages,
)
from stratalog.wal.format import crc32c


def _example() -> bytearray:
    # Queues a (id 0) and b (id 1); a gets x, yz; b gets w; nothing uploaded before.
    data = memoryview(b"xyzw")
    raw, ends, positions = build_object(np.zeros(0, np.uint32), 2, 0, [(0, "a"), (1, "b")],
                                        np.array([0, 1]), np.array([2, 1]), np.array([1, 3, 4]), data)
    assert ends.tolist() == [2, 1] and positions.tolist() == [0, 11, 16]
    return raw


def test_run_object_golden_bytes() -> None:
    raw = _example()

    run_a = bytes.fromhex("01000000 03000000 78797a")
    run_b = bytes.fromhex("01000000 77")
    names = bytes.fromhex("00000000 0100") + b"a" + bytes.fromhex("01000000 0100") + b"b"
    index = bytes.fromhex("02000000 01000000 00000000 0b000000 10000000")
    assert raw[0:11] == run_a and raw[11:16] == run_b
    assert raw[16:30] == names
    assert raw[30:50] == index
    assert raw[50:54] == crc32c(run_a + run_b).to_bytes(4, "little")    # the one page of runs
    assert len(raw) == 54 + OBJECT_FOOTER_BYTES
    footer = decode_footer(bytes(raw[54:]), len(raw))
    assert (footer.names_position, footer.names_bytes, footer.first_stream, footer.stream_count,
            footer.message_count) == (16, 14, 0, 2, 3)
    assert raw[-12:-8] == bytes.fromhex("0200 0000")    # version 2, flags 0


def test_an_object_of_names_alone_has_no_runs() -> None:
    empty = np.zeros(0, np.int64)
    laid = lay_out_object(np.zeros(0, np.uint32), 2, 0, [(0, "a"), (1, "b")], empty, empty,
                          pa.array([], pa.binary()), empty)
    raw = b"".join(laid.parts)
    assert len(raw) == laid.size_bytes and laid.pages.tolist() == [] and laid.positions.tolist() == [0, 0, 0]
    footer = decode_footer(raw[-OBJECT_FOOTER_BYTES:], len(raw))
    names, ends, _, _ = decode_index(raw[footer.names_position:-OBJECT_FOOTER_BYTES], footer)
    assert names == [(0, "a"), (1, "b")] and ends.tolist() == [0, 0]


@given(st.lists(st.tuples(st.integers(0, 30), st.binary(max_size=700)), max_size=120),
       st.sampled_from([1, 100, PAGE_BYTES - 1, PAGE_BYTES, 3 * PAGE_BYTES + 5, 1 << 30]))
def test_an_object_laid_out_in_slices_is_the_object_laid_out_whole(puts: list[tuple[int, bytes]],
                                                                   slice_bytes: int) -> None:
    streams = sorted({q for q, _ in puts})
    counts = np.array([sum(1 for q, _ in puts if q == s) for s in streams], np.int64)
    # The messages in put order; the order takes them stream by stream, each stream's in put order.
    order = np.array(sorted(range(len(puts)), key=lambda i: puts[i][0]), np.int64)
    messages = pa.chunked_array([pa.array([m for _, m in puts[:50]], pa.binary()),
                                 pa.array([m for _, m in puts[50:]], pa.binary())])
    prev = np.arange(31, dtype=np.uint32)     # every stream had messages uploaded before
    names = [(31, "late")]

    def laid(size: int) -> tuple[bytes, list[int], list[int], list[int], int]:
        parts = lay_out_object(prev, 32, 31, names, np.array(streams, np.int64), counts, messages, order, size)
        raw = b"".join(parts.parts)
        assert parts.pages is not None and len(raw) == parts.size_bytes
        return raw, parts.ends.tolist(), parts.positions.tolist(), parts.pages.tolist(), len(parts.pages)

    whole = laid(1 << 30)
    assert laid(slice_bytes) == whole
    raw, ends, positions, pages, _ = whole
    # The runs as the index says: each stream's messages in put order, framed by their ends.
    for s, count in zip(streams, counts.tolist(), strict=True):
        run = raw[positions[s]:positions[s + 1]]
        assert run_messages(run, count, 0, count, "k", s) == [m for q, m in puts if q == s]
        assert ends[s] == s + count
    check_pages(raw[:positions[-1]], 0, np.array(pages, np.uint32), "k")


def test_run_object_round_trip() -> None:
    raw = bytes(_example())
    footer = decode_footer(raw[-OBJECT_FOOTER_BYTES:], len(raw))
    names, ends, positions, pages = decode_index(raw[footer.names_position:-OBJECT_FOOTER_BYTES], footer)
    assert names == [(0, "a"), (1, "b")]
    check_pages(raw[0:16], 0, pages, "k")
    assert decode_run(raw[positions[0]:positions[1]], int(ends[0]), "k", 0) == [b"x", b"yz"]
    assert decode_run(raw[positions[1]:positions[2]], int(ends[1]), "k", 1) == [b"w"]


def _run(messages: list[bytes]) -> bytes:
    ends = np.cumsum([len(m) for m in messages], dtype=np.uint32) if messages else np.zeros(0, np.uint32)
    return ends.astype("<u4").tobytes() + b"".join(messages)


# Messages of one size (cut by one struct call) with now and then one of another (the loop), and slices
# that start and stop anywhere: both ways must give the same messages.
_sizes = st.one_of(st.just(58), st.integers(0, 3), st.integers(0, 70))
_runs = st.lists(st.tuples(_sizes, st.integers(0, 255)).map(lambda s: bytes([s[1]]) * s[0]), max_size=300)


@given(_runs, st.data())
def test_run_messages_gives_the_messages_asked_for(messages: list[bytes], data: st.DataObject) -> None:
    first = data.draw(st.integers(0, len(messages)))
    stop = data.draw(st.integers(first, len(messages)))
    assert run_messages(_run(messages), len(messages), first, stop) == messages[first:stop]


@pytest.mark.parametrize("sizes", [[58] * 5000, [58] * 99 + [57], [57] + [58] * 99, [58] * 50 + [0] + [58] * 49,
                                   [0] * 20, [1 << 16] * 3 + [(1 << 16) + 1], [2, 1, 3, 2]])
def test_run_messages_of_one_size_and_nearly(sizes: list[int]) -> None:
    messages = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    raw = _run(messages)
    for first, stop in [(0, len(sizes)), (1, len(sizes)), (0, len(sizes) - 1), (len(sizes) // 2, len(sizes)),
                        (len(sizes) - 1, len(sizes)), (3, 3)]:
        assert run_messages(raw, len(sizes), first, stop) == messages[first:stop]


@pytest.mark.parametrize("at", [0, 5, 9, 12, 15])
def test_a_flipped_bit_in_a_run_fails_its_page_crc(at: int) -> None:
    raw = _example()
    footer = decode_footer(bytes(raw[-OBJECT_FOOTER_BYTES:]), len(raw))
    pages = decode_index(bytes(raw[footer.names_position:-OBJECT_FOOTER_BYTES]), footer)[3]
    raw[at] ^= 0x10
    with pytest.raises(CorruptBulkError, match=r"page 0 .* failed its CRC"):
        check_pages(bytes(raw[0:16]), 0, pages, "k")


def test_runs_are_checked_page_by_page() -> None:
    # Three pages of runs: a read of the pages around bytes 5000 .. 9000 checks pages 1 and 2 only.
    runs = bytes(range(256)) * 40
    crcs = page_crcs(runs)
    assert len(crcs) == 3 and int(crcs[2]) == crc32c(runs[2 * PAGE_BYTES:])
    lo, hi = page_span(5000, 9000, len(runs))
    assert (lo, hi) == (PAGE_BYTES, len(runs))
    check_pages(runs[lo:hi], lo, crcs, "k")
    damaged = bytearray(runs)
    damaged[100] ^= 1
    check_pages(bytes(damaged[lo:hi]), lo, crcs, "k")    # the damage is in page 0, not read
    with pytest.raises(CorruptBulkError, match="page 0"):
        check_pages(bytes(damaged), 0, crcs, "k")
    with pytest.raises(CorruptBulkError, match="not within its pages"):
        check_pages(runs[lo + 1:hi], lo + 1, crcs, "k")
    big = bytes(range(256)) * 16 * 10    # ten pages: checked in one vectorized pass
    damaged = bytearray(big)
    damaged[7 * PAGE_BYTES + 3] ^= 1
    with pytest.raises(CorruptBulkError, match="page 7"):
        check_pages(bytes(damaged), 0, page_crcs(big), "k")


@pytest.mark.parametrize("as_view", [False, True], ids=["bytes", "view"])
@pytest.mark.parametrize("damaged_page", [None, 1, 2])
def test_a_read_of_two_pages_checks_both(as_view: bool, damaged_page: int | None) -> None:
    # Pages 1 and 2 of three, read as a random get reads them (a view of its read buffer) or as bytes.
    runs = bytearray(bytes(range(256)) * 40)
    crcs = page_crcs(bytes(runs))
    if damaged_page is not None:
        runs[damaged_page * PAGE_BYTES + 17] ^= 4
    pages = memoryview(runs)[PAGE_BYTES:] if as_view else bytes(runs[PAGE_BYTES:])
    if damaged_page is None:
        check_pages(pages, PAGE_BYTES, crcs, "k")
    else:
        with pytest.raises(CorruptBulkError, match=f"page {damaged_page} "):
            check_pages(pages, PAGE_BYTES, crcs, "k")
    with pytest.raises(CorruptBulkError, match="not within its pages"):
        check_pages(bytes(2 * PAGE_BYTES), 2 * PAGE_BYTES, crcs, "k")    # past the last page


def test_messages_are_cut_from_a_view_of_a_run_as_from_its_bytes() -> None:
    for sizes in ([58] * 30, [3, 9, 1, 58, 2]):
        messages = [bytes([i]) * size for i, size in enumerate(sizes)]
        raw = b"pad" + _run(messages)
        view = memoryview(raw)[3:]
        for first, stop in [(0, len(sizes)), (2, 4), (len(sizes) - 1, len(sizes))]:
            frame_run(view, len(sizes), "k", 0)
            got = run_messages(view, len(sizes), first, stop)
            assert got == messages[first:stop] and all(type(m) is bytes for m in got)


def test_a_run_whose_message_ends_do_not_frame_it_is_refused() -> None:
    raw = _example()
    raw[4] = 2    # run a's last end says 2 bytes of data; it has 3
    with pytest.raises(CorruptBulkError, match="message ends"):
        decode_run(bytes(raw[0:11]), 2, "k", 0)
    with pytest.raises(CorruptBulkError, match="shorter"):
        decode_run(bytes(raw[0:6]), 2, "k", 0)
    # Cutting messages with the object's key checks the framing too (a random reader's one call per run).
    with pytest.raises(CorruptBulkError, match="message ends"):
        run_messages(memoryview(raw)[0:11], 2, 0, 1, "k", 0)
    with pytest.raises(CorruptBulkError, match="shorter"):
        run_messages(memoryview(raw)[0:6], 2, 1, 2, "k", 0)


def test_a_flipped_bit_in_the_index_or_footer_is_detected() -> None:
    raw = _example()
    raw[40] ^= 1     # in the index section
    footer = decode_footer(bytes(raw[-OBJECT_FOOTER_BYTES:]), len(raw))
    with pytest.raises(CorruptBulkError, match="index"):
        decode_index(bytes(raw[footer.names_position:-OBJECT_FOOTER_BYTES]), footer)
    raw = _example()
    raw[-10] ^= 1
    with pytest.raises(CorruptBulkError, match="footer"):
        decode_footer(bytes(raw[-OBJECT_FOOTER_BYTES:]), len(raw))
    with pytest.raises(CorruptBulkError, match="add up"):
        decode_footer(bytes(_example()[-OBJECT_FOOTER_BYTES:]), 1000)



def test_a_version_1_object_is_refused_with_its_version_named() -> None:
    raw = _example()
    footer = bytearray(raw[-OBJECT_FOOTER_BYTES:])
    footer[-12:-10] = (1).to_bytes(2, "little")
    footer[-4:] = crc32c(bytes(footer[:-4])).to_bytes(4, "little")
    with pytest.raises(CorruptBulkError, match="version 1; this stratalog reads version 2"):
        decode_footer(bytes(footer), len(raw))

def test_bulk_record_round_trip_and_bad_lengths() -> None:
    body = b"".join(encode_bulk(np.array([3, 9]), np.array([10, 0]), np.array([2, 1]), [(9, "new")], 10,
                                np.array([1, 3, 4]), b"xyzw"))
    rec = decode_bulk(body)
    assert rec.stream_ids.tolist() == [3, 9] and rec.base_offsets.tolist() == [10, 0]
    assert rec.counts.tolist() == [2, 1] and rec.names == [(9, "new")] and rec.stream_count == 10
    assert rec.ends.tolist() == [1, 3, 4] and bytes(rec.data) == b"xyzw"
    with pytest.raises(CorruptBulkError):
        decode_bulk(body[:-1])
    with pytest.raises(CorruptBulkError):
        decode_bulk(b"\0" * 4 + body[4:])


def test_run_messages_keeps_its_caches_bounded_whatever_the_sizes() -> None:
    from stratalog.queues import format as queue_format

    for size in range(1, 400):
        messages = [bytes([size % 251]) * size] * 700
        assert run_messages(_run(messages), 700, 0, 700) == messages
        fields = sum(n for _, n in queue_format._fixed_structs)
        assert fields == queue_format._fixed_fields[0] <= queue_format._FIXED_FIELDS_MAX
        assert len(queue_format._multiples_of) <= queue_format._MULTIPLES_SIZES_MAX


def test_fuzz_finding_a_bulk_record_name_that_is_not_utf8_is_corrupt() -> None:
    # Found by `stratalog chaos fuzz` (bulk_record): UnicodeDecodeError escaped the parser.
    data = bytes.fromhex(
        "00534c51420100000002000000030000ffff000000000000000000000000000000534c514201000000020000000300ff"
        "00530002000000030000000100000004000000060033fcff00000024000000000a000000000000000600330200000005"
        "00000006000000616202000000050000000600636400000000000a000000000000000000000061626364000000000061"
        "62000000000000000000")
    with pytest.raises(CorruptBulkError):
        fuzz_engine.check_bulk(data)


def test_fuzz_finding_a_bulk_record_whose_message_ends_fall_is_corrupt() -> None:
    # Found by `stratalog chaos fuzz` (bulk_record): the parser returned it.
    data = bytes.fromhex(
        "00534c514201000000020000000300000001000000040000000600000000000000000000000300000000000000050000"
        "0002000000010000000300000002007133020000000508000006000000616263646566")
    with pytest.raises(CorruptBulkError):
        fuzz_engine.check_bulk(data)


def test_fuzz_finding_a_run_object_name_that_is_not_utf8_is_corrupt() -> None:
    # Found by `stratalog chaos fuzz` (queue_object): UnicodeDecodeError escaped the parser.
    data = bytes.fromhex(
        "01030000000500000000007778797a00000000010061010000000100620200000001009d020000000000000001000000"
        "000000000d0000000d00000015000000a8b20042150000a8b20042150000000000000015000000000000000300000003"
        "000000000000002967de2302000000534c514fde2b26ee")
    with pytest.raises(CorruptBulkError):
        fuzz_queues.check_run_object(data)


def test_fuzz_finding_a_run_object_name_for_another_stream_is_corrupt() -> None:
    # Found by `stratalog chaos fuzz` (queue_object): the parser returned it.
    data = bytes.fromhex(
        "01030000000500000078797a6162040000007778797a0000000001006101000000010062000002000100630200200000"
        "0000000100002e000000000d0000000d00000015000000a8b20042150000000000000015000000000000000300000003"
        "000000000000002967de2302000000534c514fde2b26ee")
    with pytest.raises(CorruptBulkError):
        fuzz_queues.check_run_object(data)


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=300)), max_size=150),
       st.lists(st.integers(0, 150), max_size=4), st.sampled_from([1, 100, PAGE_BYTES, 3 * PAGE_BYTES + 5, 1 << 30]))
def test_the_compiled_layout_lays_out_the_twins_object(puts: list[tuple[int, bytes]], cuts: list[int],
                                                       slice_bytes: int) -> None:
    # The same object, part for part, from _native.lay_out_runs and from its twin (the Arrow takes), over
    # messages in several chunks (as the log cache's records give them), some sliced (offsets not from 0).
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    streams = sorted({q for q, _ in puts})
    counts = np.array([sum(1 for q, _ in puts if q == s) for s in streams], np.int64)
    order = np.array(sorted(range(len(puts)), key=lambda i: puts[i][0]), np.int64)
    bounds = [0, *sorted(c for c in cuts if c < len(puts)), len(puts)]
    chunks = [pa.array([b"before", *(m for _, m in puts[a:b])], pa.binary()).slice(1)
              for a, b in itertools.pairwise(bounds)]
    messages = pa.chunked_array(chunks, pa.binary())

    def parts(lay_out: object) -> list[bytes]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(format_module, "_lay_out_runs", lay_out)
            laid = lay_out_object(np.zeros(0, np.uint32), 41, 0, [(i, f"q{i}") for i in range(41)],
                                  np.array(streams, np.int64), counts, messages, order, slice_bytes)
            return [bytes(part) for part in laid.parts]

    assert parts(native.lay_out_runs) == parts(None)


@pytest.mark.parametrize(("case", "error"), [
    ("runs past run_first", "the runs a .. b do not lie within run_first and order"),
    ("run_first past order", "the runs a .. b do not lie within run_first and order"),
    ("falling run_first", "the runs a .. b do not lie within run_first and order"),
    ("index past the chunks", "a message index past the chunks"),
    ("negative index", "a message index past the chunks"),
    ("offsets past the bytes", "a message lies outside its chunk's bytes"),
    ("falling offsets", "a message lies outside its chunk's bytes"),
    ("out too small", "the runs take 11 bytes, out holds 10"),
])
def test_the_compiled_layout_refuses_runs_that_do_not_fit(case: str, error: str) -> None:
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    offsets, data = np.array([0, 1, 3], np.int32), b"abc"
    order, run_first, b = np.array([1, 0], np.int64), np.array([0, 1, 2], np.int64), 2
    if case == "runs past run_first":
        b = 3
    elif case == "run_first past order":
        run_first = np.array([0, 1, 3], np.int64)
    elif case == "falling run_first":
        run_first = np.array([0, 2, 1], np.int64)
    elif case == "index past the chunks":
        order = np.array([1, 2], np.int64)
    elif case == "negative index":
        order = np.array([-1, 0], np.int64)
    elif case == "offsets past the bytes":
        offsets = np.array([0, 1, 4], np.int32)
    elif case == "falling offsets":
        offsets = np.array([0, 2, 1], np.int32)
    out = bytearray(10 if case == "out too small" else 11)

    with pytest.raises(ValueError, match=f"lay_out_runs: {error}"):
        native.lay_out_runs(((offsets, data),), order, run_first, 0, b, out)


def test_the_compiled_layout_lays_out_each_run_as_its_ends_then_its_messages() -> None:
    if native is None:
        pytest.fail("the compiled core is not loaded: make test builds it")
    chunks = ((np.array([0, 1, 3], np.int32), b"abc"), (np.array([0, 0, 4], np.int32), b"defg"))
    order, run_first = np.array([3, 1, 0, 2], np.int64), np.array([0, 2, 2, 4], np.int64)

    out = bytearray(23)

    assert native.lay_out_runs(chunks, order, run_first, 0, 3, out) is None
    assert out == (4).to_bytes(4, "little") + (6).to_bytes(4, "little") + b"defgbc" \
        + (1).to_bytes(4, "little") + (1).to_bytes(4, "little") + b"a"
