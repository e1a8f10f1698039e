"""The seeded record builders of recordgen.py reach the edges the damaged-batch tests rely on: without them
those tests would search less than the strategies they replaced."""

from __future__ import annotations

from recordgen import (
    HEADERS_MAX,
    KAFKA_TIMESTAMP_MAX,
    KEY_BYTES_MAX,
    NATIVE_TIMESTAMP_MAX,
    RECORDS_MAX,
    VALUE_BYTES_MAX,
    seeded_native_records,
    seeded_records,
)

SEEDS = range(400)


def test_kafka_records_reach_every_edge_and_stay_in_bounds() -> None:
    batches = [seeded_records(seed) for seed in SEEDS]
    sizes = {len(batch) for batch in batches}
    assert {1, RECORDS_MAX} <= sizes and len(sizes) > 6 and max(sizes) == RECORDS_MAX
    records = [record for batch in batches for record in batch]
    keys = [key for key, _, _, _ in records]
    values = [value for _, value, _, _ in records]
    for fields, largest in ((keys, KEY_BYTES_MAX), (values, VALUE_BYTES_MAX)):
        assert None in fields and b"" in fields
        lengths = {len(f) for f in fields if f is not None}
        assert largest in lengths and max(lengths) == largest and len(lengths) > 10
    header_counts = {len(headers) for _, _, headers, _ in records}
    assert header_counts == set(range(HEADERS_MAX + 1))
    header_keys = [key for _, _, headers, _ in records for key, _ in headers]
    assert any(ord(max(key)) > 0xFF for key in header_keys if key) and "" in header_keys
    timestamps = {ts for _, _, _, ts in records}
    assert {0, KAFKA_TIMESTAMP_MAX} <= timestamps and min(timestamps) == 0 and max(timestamps) == KAFKA_TIMESTAMP_MAX


def test_engine_records_reach_every_edge_and_stay_in_bounds() -> None:
    records = [record for seed in SEEDS for record in seeded_native_records(seed)]
    assert None in {r.key for r in records} and b"" in {r.value for r in records}
    assert max(len(r.value) for r in records) == VALUE_BYTES_MAX
    timestamps = {r.timestamp_ms for r in records}
    assert {-NATIVE_TIMESTAMP_MAX, NATIVE_TIMESTAMP_MAX} <= timestamps
    assert min(timestamps) == -NATIVE_TIMESTAMP_MAX and max(timestamps) == NATIVE_TIMESTAMP_MAX


def test_a_seed_builds_the_same_records_every_time() -> None:
    assert seeded_records(7) == seeded_records(7) != seeded_records(8)
    assert seeded_native_records(7) == seeded_native_records(7)
