"""A record as the stores hand it out and take it in: the value types every layer shares.

They sit below the engine and the Kafka record-batch format, which both build them: the engine decodes
its own batches and, for a stored Kafka batch, the Kafka format's decoder makes the same ``Record``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


class Record(NamedTuple):
    """One record of a stream as fetch returns it. A named tuple: a fetch builds one per record, and it
    costs a third of a frozen dataclass to make."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record to append, with the optional parts: key, timestamp (default: now), headers."""

    value: bytes
    key: bytes | None = None
    timestamp_ms: int | None = None
    headers: Sequence[tuple[str, bytes | None]] = field(default_factory=tuple)
