"""The Kafka requests `stratalog bench abuse` sends, as bytes: well-formed ones encoded by hand (so the hostile
process needs no client library and spends its CPU on sockets, not encoding) and malformed ones, each
named after what is wrong with it.

Request header v1 (every request here is non-flexible): api_key i16, api_version i16, correlation_id i32,
client_id string (i16 length, then bytes). All integers big-endian, as Kafka's wire format is.
"""

from __future__ import annotations

import struct

from stratalog.kafka.api_keys import ApiKey

FRAME_SIZE = struct.Struct(">i")
HEADER_V1 = struct.Struct(">hhi")
CLIENT_ID = b"abuse"
#: Fetch v4: the oldest the broker serves, and the last without flexible (varint) encoding.
FETCH_VERSION = 4
#: Metadata v1: "every topic" is a null array (-1).
METADATA_VERSION = 1
INT32_MAX = 2**31 - 1
#: A size claim of 2 GiB - 1: the most a Kafka frame size can say.
CLAIM_BYTES = INT32_MAX


def frame(body: bytes) -> bytes:
    return FRAME_SIZE.pack(len(body)) + body


def _header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    return HEADER_V1.pack(api_key, api_version, correlation_id) + struct.pack(">h", len(CLIENT_ID)) + CLIENT_ID


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def api_versions_request(correlation_id: int) -> bytes:
    """ApiVersions v0: an empty body."""
    return frame(_header(ApiKey.API_VERSIONS, 0, correlation_id))


def metadata_all_request(correlation_id: int) -> bytes:
    """Metadata v1 for every topic (a null topic array)."""
    return frame(_header(ApiKey.METADATA, METADATA_VERSION, correlation_id) + FRAME_SIZE.pack(-1))


def fetch_request(correlation_id: int, topic: str, offsets: list[int], max_wait_ms: int, min_bytes: int,
                  max_bytes: int = INT32_MAX, partition_max_bytes: int = INT32_MAX) -> bytes:
    """Fetch v4 of partitions 0 .. len(offsets) - 1 of ``topic``, each from its offset in ``offsets``."""
    body = struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes, 0)
    body += FRAME_SIZE.pack(1) + _string(topic) + FRAME_SIZE.pack(len(offsets))
    body += b"".join(struct.pack(">iqi", partition, offset, partition_max_bytes)
                     for partition, offset in enumerate(offsets))
    return frame(_header(ApiKey.FETCH, FETCH_VERSION, correlation_id) + body)


# Malformed requests: each closes its connection at the broker. -------------------------------------------


def garbage_frames() -> dict[str, bytes]:
    """One frame per kind of garbage: the connection that sends it should be closed, nothing else."""
    return {
        "negative size": FRAME_SIZE.pack(-1) + b"\0" * 8,
        "shorter than a header": frame(b"\0\0\0"),
        "unknown API key": frame(HEADER_V1.pack(9999, 0, 1) + b"\0\0"),
        "unsupported version": frame(HEADER_V1.pack(ApiKey.FETCH, 99, 1) + b"\0\0"),
        # Not a body of 0xff bytes: Metadata v1 reads 0xffffffff as "every topic" and ignores the rest.
        "client_id past the frame": frame(HEADER_V1.pack(ApiKey.METADATA, METADATA_VERSION, 1) + b"\x7f\xffab"),
        # A topic array claiming 2^31 - 1 entries with none present: the decoder must fail, not allocate.
        "array claims 2^31 entries": frame(_header(ApiKey.METADATA, METADATA_VERSION, 1) + FRAME_SIZE.pack(INT32_MAX)),
    }


def oversize_claim() -> bytes:
    """A frame size of 2 GiB - 1 and the start of a header: refused before a byte of it is kept."""
    return FRAME_SIZE.pack(CLAIM_BYTES) + _header(ApiKey.METADATA, METADATA_VERSION, 1)


def slowloris_head(claim_bytes: int) -> bytes:
    """The start of a frame that claims ``claim_bytes``: its size and half a header. The rest never comes."""
    return FRAME_SIZE.pack(claim_bytes) + _header(ApiKey.METADATA, METADATA_VERSION, 1)[:4]
