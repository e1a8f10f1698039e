"""One test per corruption mode of the recovery decision table (docs/formats/wal.md, "Recovery").

Images are built by hand with the format's encoders, damaged with byte surgery, then recovered.
"""

from __future__ import annotations

import pytest

from stratalog.chaos import fuzz_wal
from stratalog.errors import CorruptHeaderError
from stratalog.io.faulty import MemDevice
from stratalog.wal import WriteAheadLog
from stratalog.wal.format import (
    HEADER_SLOT_BYTES,
    RECORD_HEADER_BYTES,
    ShutdownType,
    WALHeader,
    encode_header,
)
from waiting import WAIT_S
from walkit import (
    CAPACITY_BYTES,
    RING_BYTES,
    blank_image,
    block_end,
    physical,
    put_block,
    put_pad,
    recover_image,
    reopen,
)

BODIES_A = [b"alpha" * 10, b"beta" * 20, b"gamma" * 30]
BODIES_B = [b"delta" * 40, b"epsilon"]
BODIES_C = [b"zeta" * 100]


def three_blocks(image: bytearray) -> tuple[list[int], list[int], list[int]]:
    a = put_block(image, 0, BODIES_A)
    b_start = block_end(0, BODIES_A)
    b = put_block(image, b_start, BODIES_B)
    c = put_block(image, block_end(b_start, BODIES_B), BODIES_C)
    return a, b, c


def offsets_and_data(image: bytearray) -> list[tuple[int, bytes]]:
    return [(r.offset, r.data) for r in recover_image(image)]


def test_clean_image_recovers_every_record() -> None:
    image = blank_image()
    a, b, c = three_blocks(image)
    assert offsets_and_data(image) == list(zip([*a, *b, *c], [*BODIES_A, *BODIES_B, *BODIES_C], strict=True))


def test_bad_record_magic_skips_to_the_next_block() -> None:
    image = blank_image()
    a, b, c = three_blocks(image)
    image[physical(a[1])] ^= 0xFF  # record 2's magic; record 3 shares its 4 KiB page and is lost too
    got = offsets_and_data(image)
    assert got == [(a[0], BODIES_A[0]), *zip([*b, *c], [*BODIES_B, *BODIES_C], strict=True)]


def test_bad_header_crc_skips_the_record() -> None:
    image = blank_image()
    a, b, c = three_blocks(image)
    image[physical(b[0]) + 20] ^= 0x01  # the stored header CRC itself
    got = offsets_and_data(image)
    assert (b[0], BODIES_B[0]) not in got
    assert got[:3] == list(zip(a, BODIES_A, strict=True))
    assert got[-1] == (c[0], BODIES_C[0])


def test_bad_body_crc_skips_only_that_record() -> None:
    image = blank_image()
    a, b, c = three_blocks(image)
    image[physical(a[1]) + RECORD_HEADER_BYTES + 7] ^= 0x40  # a bit in record 2's body
    got = offsets_and_data(image)
    # The header is intact (its own CRC holds), so the scan steps over the body and keeps record 3.
    assert got == list(zip([a[0], a[2], *b, *c], [BODIES_A[0], BODIES_A[2], *BODIES_B, *BODIES_C],
                           strict=True))


def test_a_torn_record_after_the_last_valid_one_is_erased_before_its_offsets_are_reused() -> None:
    """A crash leaves a record whose header landed and whose body did not. The next writer starts at the
    page after the last valid record, inside that record's span: unless its header is erased first, the
    scan after a second crash trusts it, jumps over the new records and loses acknowledged data."""
    image = blank_image()
    bodies = [b"r1" * 100, b"r2" * 100, b"torn" * 2000]  # the third spans two more pages
    offsets = put_block(image, 0, bodies)
    image[physical(offsets[2]) + RECORD_HEADER_BYTES + 5] ^= 0x01
    records, wal = reopen(image)
    assert [r.offset for r in records] == offsets[:2]
    assert wal.recovery_stats.stale_bytes_erased >= len(bodies[2])
    appended = [wal.append(b"new%d" % i * 50) for i in range(5)]
    for res in appended:
        res.future.result(timeout=WAIT_S)
    again = recover_image(wal.device.durable_image())  # type: ignore[attr-defined]
    wal.close()
    assert [r.offset for r in again] == [*offsets[:2], *(res.offset for res in appended)]


def test_truncated_tail_ends_the_log_cleanly() -> None:
    image = blank_image()
    a, b, c = three_blocks(image)
    body_start = physical(c[0]) + RECORD_HEADER_BYTES
    image[body_start + 100:body_start + len(BODIES_C[0])] = bytes(len(BODIES_C[0]) - 100)  # torn write
    assert offsets_and_data(image) == list(zip(a + b, BODIES_A + BODIES_B, strict=True))


def test_stale_record_from_an_earlier_lap_is_never_returned() -> None:
    # Lap 0 filled the ring; lap 1 trimmed everything of lap 0 and wrote one block at its start.
    image = blank_image()
    lap0 = put_block(image, 0, [b"old" * 30] * 20)
    put_block(image, 8192, [b"old-too" * 10] * 5)
    trim = RING_BYTES - 4096
    put_pad(image, trim)
    image[physical(trim):physical(trim) + RECORD_HEADER_BYTES] = bytes(RECORD_HEADER_BYTES)
    put_block(image, trim, [b"trim-record"])
    put_pad(image, block_end(trim, [b"trim-record"]))
    new = put_block(image, RING_BYTES, [b"new"])  # physically over lap 0's first block
    image[:2 * HEADER_SLOT_BYTES] = blank_image(trim_offset=trim, sequence=2)[:2 * HEADER_SLOT_BYTES]
    got = offsets_and_data(image)
    assert got == [(new[0], b"new")]
    assert all(off >= RING_BYTES for off, _ in got), f"a lap-0 record came back: {lap0[0]}"


def test_zeroed_block_is_a_hole_and_later_blocks_survive() -> None:
    image = blank_image()
    a, b, c = three_blocks(image)
    start = physical(b[0])
    image[start:start + 4096] = bytes(4096)
    assert offsets_and_data(image) == list(zip(a + c, BODIES_A + BODIES_C, strict=True))


def test_hole_inside_the_window_is_skipped() -> None:
    image = blank_image(window_bytes_max=32 << 10)
    first = put_block(image, 0, [b"before-hole"])
    after = put_block(image, 24 << 10, [b"after-hole"])  # 20 KiB of zeros in between: inside the window
    assert offsets_and_data(image) == [(first[0], b"before-hole"), (after[0], b"after-hole")]


def test_gap_beyond_the_window_ends_the_scan() -> None:
    image = blank_image(window_bytes_max=16 << 10)
    first = put_block(image, 0, [b"before-gap"])
    put_block(image, 40 << 10, [b"beyond-window"])  # the writer never runs this far ahead
    assert offsets_and_data(image) == [(first[0], b"before-gap")]


def test_records_at_or_below_the_trim_are_not_returned() -> None:
    image = blank_image()
    _, b, c = three_blocks(image)
    image[:2 * HEADER_SLOT_BYTES] = blank_image(trim_offset=b[0], sequence=2)[:2 * HEADER_SLOT_BYTES]
    assert offsets_and_data(image) == [(b[1], BODIES_B[1]), (c[0], BODIES_C[0])]


def test_padding_record_leads_to_the_next_lap() -> None:
    image = blank_image(window_bytes_max=8 << 10)
    start = RING_BYTES - 3 * 4096
    image[:2 * HEADER_SLOT_BYTES] = blank_image(trim_offset=start, window_bytes_max=8 << 10,
                                                sequence=2)[:2 * HEADER_SLOT_BYTES]
    put_block(image, start, [b"trimmed"])
    mid = put_block(image, start + 4096, [b"end-of-lap"])
    lap_start = put_pad(image, start + 8192)
    nxt = put_block(image, lap_start, [b"next-lap"])
    assert offsets_and_data(image) == [(mid[0], b"end-of-lap"), (nxt[0], b"next-lap")]


def test_newest_header_slot_with_bad_crc_falls_back_to_the_other() -> None:
    image = blank_image(sequence=1)  # slot 1, trim none
    newer = encode_header(WALHeader(2, CAPACITY_BYTES, 4096, 64 << 10, ShutdownType.UNCLEAN))
    image[0:HEADER_SLOT_BYTES] = newer  # slot 0 holds sequence 2
    put_block(image, 0, [b"kept"])
    image[30] ^= 0x01  # slot 0's trim field: its CRC no longer matches
    assert offsets_and_data(image) == [(0, b"kept")]


def test_bad_magic_in_both_header_slots_is_refused() -> None:
    image = blank_image()
    image[0] ^= 0xFF
    image[HEADER_SLOT_BYTES] ^= 0xFF
    put_block(image, 0, [b"data"])
    with pytest.raises(CorruptHeaderError, match="refusing to format"):
        WriteAheadLog.open(MemDevice(len(image), image=image))


def test_fuzz_finding_a_smaller_config_window_keeps_records_past_the_holes() -> None:
    # Found by `stratalog chaos fuzz` (wal_recovery): a header window of 6.9 MB, records after 24 KiB of
    # holes, a config window of 16 KiB. Recovery found the records (with the header's window), then wrote
    # the config's window in the header: the next recovery stopped at the holes and lost those records and
    # the one appended in between, acknowledged. The header now keeps the larger window; the target checks
    # that the next recovery returns the records recovered, then the one appended.
    data = bytes.fromhex(
        "03000000ff696969696969696969696900000000000000000000002b216b428089e2cc676f6c64656e534c5750ca0f00"
        "001e00000000006969696969696969696969696969696969696969696969696969696969696969696969696900400021"
        "010000000a0000000100000000000000000000000000000000ffff000000000000000000000000000000000000000000"
        "640000000007000000000000000000000000ffff00ff0000000000000000000000000000000000000000000064000000"
        "0007000000000000000000000000ff00000000ffffffffffffffffffffffffffffffffffffffffffffffe00000000000"
        "00ffff0000ffff00ff0000000000000000000000ffffff004000000000")
    fuzz_wal.check_recovery(data)


def test_fuzz_finding_a_header_window_below_a_block_is_not_a_header() -> None:
    # Found by `stratalog chaos fuzz` (wal_recovery): a header with trim 0 and a window of 0. Recovery
    # scanned nothing, the writer resumed at 4 KiB, and the next recovery (with a 16 KiB window) followed
    # a pad at the start of the ring past the appended, acknowledged record. No writer's window is below
    # a block: such a header slot is invalid, and a device with no other is refused.
    data = bytes.fromhex(
        "03010000000000000eff5206")
    with pytest.raises(CorruptHeaderError):
        WriteAheadLog.open(MemDevice(fuzz_wal.CAPACITY_BYTES, image=fuzz_wal.build_device(data)[0]), create=False,
                           config=fuzz_wal.CONFIG)
    fuzz_wal.check_recovery(data)
