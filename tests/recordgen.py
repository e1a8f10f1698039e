"""Records for property tests of the record formats (Kafka's and the engine's own), two ways.

``RECORDS`` and ``NATIVE_RECORDS`` are hypothesis strategies: what the tests of valid batches draw, shrunk
to a smallest failing list when one fails.

``RECORDS_BY_SEED`` and ``NATIVE_RECORDS_BY_SEED`` draw only a seed, and build the records from it with
``random.Random``: for the tests of damaged batches, which run thousands of examples each and whose search
is in the damage (``bytekit.MUTATIONS``, shrunk as usual), not in the records under it. Hypothesis spent
about 9 ms building each list of records the strategies above describe and the seeded builders spend a
fraction of one; a failure prints the records built (and the seed), as it would print the drawn ones. The
builders lean towards the edges as hypothesis does: empty and largest fields, absent keys and values, one
record and the most records.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from stratalog.records import NewRecord

#: The most records in a batch, and the largest key, value, header value and header key of a record.
RECORDS_MAX = 12
KEY_BYTES_MAX = 40
VALUE_BYTES_MAX = 300
HEADER_VALUE_BYTES_MAX = 20
HEADER_KEY_CHARS_MAX = 8
HEADERS_MAX = 3
#: Kafka record timestamps drawn here (non-negative, as the tests' batches take them), and engine ones.
KAFKA_TIMESTAMP_MAX = 1 << 45
NATIVE_TIMESTAMP_MAX = 1 << 62

#: A record of Kafka's batch format as the encoder takes it: key, value, headers, timestamp.
KafkaRecord = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]

HEADER_KEYS = st.one_of(st.text(max_size=HEADER_KEY_CHARS_MAX),
                        st.binary(max_size=HEADER_KEY_CHARS_MAX).map(lambda b: b.decode("latin-1")))
HEADERS = st.lists(st.tuples(HEADER_KEYS, st.none() | st.binary(max_size=HEADER_VALUE_BYTES_MAX)),
                   max_size=HEADERS_MAX)
RECORDS = st.lists(st.tuples(
    st.none() | st.binary(max_size=KEY_BYTES_MAX),
    st.none() | st.binary(max_size=VALUE_BYTES_MAX),
    HEADERS,
    st.integers(0, KAFKA_TIMESTAMP_MAX)), min_size=1, max_size=RECORDS_MAX)
NATIVE_RECORDS = st.lists(st.builds(
    NewRecord, st.binary(max_size=VALUE_BYTES_MAX), st.none() | st.binary(max_size=KEY_BYTES_MAX),
    st.integers(-NATIVE_TIMESTAMP_MAX, NATIVE_TIMESTAMP_MAX), HEADERS.map(tuple)),
    min_size=1, max_size=RECORDS_MAX)


def _size(rng: random.Random, largest: int) -> int:
    """A length up to ``largest``: 0 or ``largest`` a quarter of the time each, else any."""
    pick = rng.random()
    if pick < 0.25:
        return 0
    if pick < 0.5:
        return largest
    return rng.randint(0, largest)


def _bytes(rng: random.Random, largest: int) -> bytes:
    return rng.randbytes(_size(rng, largest))


def _maybe_bytes(rng: random.Random, largest: int) -> bytes | None:
    return None if rng.random() < 0.25 else _bytes(rng, largest)


def _header_key(rng: random.Random) -> str:
    """Any characters (as st.text draws them, surrogates aside) or bytes read as Latin-1."""
    if rng.random() < 0.5:
        return _bytes(rng, HEADER_KEY_CHARS_MAX).decode("latin-1")
    return "".join(chr(rng.choice((rng.randint(0, 0xD7FF), rng.randint(0xE000, 0x10FFFF))))
                   for _ in range(_size(rng, HEADER_KEY_CHARS_MAX)))


def _headers(rng: random.Random) -> list[tuple[str, bytes | None]]:
    return [(_header_key(rng), _maybe_bytes(rng, HEADER_VALUE_BYTES_MAX)) for _ in range(_size(rng, HEADERS_MAX))]


def _timestamp(rng: random.Random, low: int, high: int) -> int:
    pick = rng.random()
    return low if pick < 0.1 else high if pick < 0.2 else rng.randint(low, high)


def seeded_records(seed: int) -> list[KafkaRecord]:
    """1 to RECORDS_MAX Kafka records built from ``seed`` (the shapes ``RECORDS`` draws)."""
    rng = random.Random(seed)
    return [(_maybe_bytes(rng, KEY_BYTES_MAX), _maybe_bytes(rng, VALUE_BYTES_MAX), _headers(rng),
             _timestamp(rng, 0, KAFKA_TIMESTAMP_MAX)) for _ in range(max(1, _size(rng, RECORDS_MAX)))]


def seeded_native_records(seed: int) -> list[NewRecord]:
    """1 to RECORDS_MAX engine records built from ``seed`` (the shapes ``NATIVE_RECORDS`` draws)."""
    rng = random.Random(seed)
    return [NewRecord(_bytes(rng, VALUE_BYTES_MAX), _maybe_bytes(rng, KEY_BYTES_MAX),
                      _timestamp(rng, -NATIVE_TIMESTAMP_MAX, NATIVE_TIMESTAMP_MAX), tuple(_headers(rng)))
            for _ in range(max(1, _size(rng, RECORDS_MAX)))]


SEEDS = st.integers(0, (1 << 64) - 1)
RECORDS_BY_SEED = SEEDS.map(seeded_records)
NATIVE_RECORDS_BY_SEED = SEEDS.map(seeded_native_records)
