"""Fuzz targets: every parser of stratalog, each with the contract it must keep on arbitrary bytes.

A target is a function of one input (``bytes``). It feeds the input to a parser and checks what comes
back: the parser either returns a value that keeps its promises (offsets dense, records that pass their
CRCs, a round trip that gives back what went in) or raises one of the errors it documents (the target's
``contract``). Anything else is a finding: another exception, a :class:`ContractViolationError` (a value that
breaks a promise), a hang (the runner's per-input timeout) or an allocation far beyond the input
(``allocation_bytes_max``, checked by the child with tracemalloc; see ``fuzz_child``).

Parsers that check a CRC first would refuse almost every mutated input at the CRC, so several targets
read a *control byte* before the bytes to parse: one of its bits asks the target to *reseal* the input
(write the lengths and CRCs that make it pass those checks) before parsing, so the fuzzer reaches the
code behind them. Targets that promise a round trip take another bit to build values from the input,
encode them with the project's encoder and check that decoding gives them back.

The targets live in ``fuzz_kafka``, ``fuzz_aborted_ranges`` (both sides of the broker's own request for
aborted transactions), ``fuzz_wal``, ``fuzz_engine`` and ``fuzz_queues``, with their seed
corpora (real encodings: the golden bytes of the tests, values encoded by the project's own encoders,
Kafka requests written by kio). This module holds what they share and the registry.
"""

from __future__ import annotations

import importlib
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: A target's input is cut at this length unless the target says otherwise (libFuzzer's -max_len):
#: long enough for several records, batches or frames, short enough for thousands of runs a second.
INPUT_BYTES_MAX = 16 << 10
#: What any input may allocate through Python besides what its target's bound allows: interpreter
#: caches, exception objects and tracebacks, struct and NumPy scratch (measured: well under 1 MiB).
ALLOCATION_BYTES_BASE = 4 << 20
#: Each input byte may become this many bytes of Python objects (a one-byte record becomes a tuple,
#: an int or two and a bytes object: about 200 bytes; 64 B per input byte on average leaves room).
ALLOCATION_BYTES_PER_INPUT_BYTE = 256


class ContractViolationError(AssertionError):
    """A parser returned a value that breaks its contract (a corrupt record returned, a round trip that
    lost or changed a value). Never caught by a target: the runner reports it as a finding."""


class KnownIssueInput(Exception):  # noqa: N818 -- not an error of the parser: the target's own refusal
    """Raised by a target, before the parser runs, for an input known to crash the process in code this
    harness may not change (see the target's ``known_issues``): the run counts it and goes on."""


def check(condition: bool, message: str) -> None:
    """Raise ContractViolationError when ``condition`` is false (kept under ``python -O``, unlike assert)."""
    if not condition:
        raise ContractViolationError(message)


def default_allocation_bytes_max(input_bytes: int) -> int:
    return ALLOCATION_BYTES_BASE + ALLOCATION_BYTES_PER_INPUT_BYTE * input_bytes


@dataclass(frozen=True, slots=True)
class KnownIssue:
    """A finding whose fix belongs to a module this harness may not change yet: inputs that raise
    ``error`` with a message matching ``message`` are counted as known, not as findings. Each has a
    strict-xfail test in tests/test_fuzz.py, which fails (and asks for this entry to go) once fixed."""

    error: type[BaseException]
    message: str
    note: str

    def matches(self, error: BaseException) -> bool:
        return isinstance(error, self.error) and re.search(self.message, str(error)) is not None


@dataclass(frozen=True, slots=True)
class FuzzTarget:
    """One target: what it runs, the errors that keep its contract, and how to seed it."""

    name: str
    #: One line: which parser, what it checks.
    summary: str
    run: Callable[[bytes], None]
    #: The errors the parser documents; any other exception is a finding.
    contract: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]
    input_bytes_max: int = INPUT_BYTES_MAX
    #: The most an input of n bytes may allocate through Python while the target runs (peak).
    allocation_bytes_max: Callable[[int], int] = default_allocation_bytes_max
    known_issues: tuple[KnownIssue, ...] = ()
    #: Functions the child instruments besides stratalog's modules (made at run time: see fuzz_kafka).
    coverage_functions: Callable[[], tuple[Callable[..., Any], ...]] = tuple


class Reader:
    """Reads values from the front of a fuzz input; past its end every value is zero (or empty).

    Structured targets take their choices (counts, lengths, flags) from here, so a mutation of one
    byte changes one choice and the fuzzer's coverage feedback still applies."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def u8(self) -> int:
        if self._pos >= len(self._data):
            return 0
        self._pos += 1
        return self._data[self._pos - 1]

    def uint(self, size: int) -> int:
        """An unsigned little-endian integer of ``size`` bytes."""
        return int.from_bytes(self.take(size).ljust(size, b"\0"), "little")

    def below(self, limit: int) -> int:
        """A number in ``0 .. limit - 1`` (0 when limit is 0 or 1)."""
        if limit <= 1:
            return 0
        return self.uint(max(1, (limit.bit_length() + 7) // 8)) % limit

    def take(self, size: int) -> bytes:
        out = self._data[self._pos:self._pos + size]
        self._pos += len(out)
        return out

    def rest(self) -> bytes:
        return self.take(self.remaining)


def put(buf: bytearray, fmt: struct.Struct, position: int, *values: int) -> bool:
    """Pack ``values`` at ``position`` when they fit inside ``buf``; False (untouched) otherwise. The
    resealing helpers use it on inputs of any length."""
    if position < 0 or position + fmt.size > len(buf):
        return False
    fmt.pack_into(buf, position, *values)
    return True


#: Which module defines each target, in the order the CLI runs them. A fuzzing child imports the one
#: module its target needs: under atheris' instrumentation the imports are most of a short run's time
#: (about 9 s for all of them, Spark's and kio's included, against 2 s for one). tests/test_fuzz.py checks
#: this table against each module's ``TARGETS``.
TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "fuzz_kafka": ("kafka_request", "kafka_staged_commit", "kafka_frames", "kafka_batch", "kafka_record_check",
                   "native_record_walk", "native_array_counts", "native_produce_request", "native_record_index"),
    "fuzz_aborted_ranges": ("kafka_aborted_ranges", "spark_aborted_ranges"),
    "fuzz_wal": ("wal_object", "wal_recovery"),
    "fuzz_engine": ("engine_batch", "engine_object", "engine_manifest", "bulk_record"),
    "fuzz_queues": ("native_run_read", "queue_object", "queue_manifest", "queue_names"),
    "fuzz_selftest": ("selftest_exception", "selftest_allocation"),
}
#: The modules whose targets have a planted bug (a test shows the harness reports it), never run by default.
SELFTEST_MODULES = ("fuzz_selftest",)


def target_names() -> list[str]:
    """Every target's name, in the order the CLI runs them (self-test targets not among them), without
    importing any target module."""
    return [name for module, names in TARGET_MODULES.items() if module not in SELFTEST_MODULES for name in names]


def _module_targets(module: str) -> dict[str, FuzzTarget]:
    loaded = importlib.import_module(f"stratalog.chaos.{module}")
    return {t.name: t for t in loaded.TARGETS}


def registry() -> dict[str, FuzzTarget]:
    """Every target by name, in the order the CLI runs them (self-test targets not among them)."""
    return {name: target for module in TARGET_MODULES if module not in SELFTEST_MODULES
            for name, target in _module_targets(module).items()}


def selftest_registry() -> dict[str, FuzzTarget]:
    """Targets with a planted bug, so a test can show the harness reports what it must."""
    return {name: target for module in SELFTEST_MODULES for name, target in _module_targets(module).items()}


def find_target(name: str) -> FuzzTarget:
    """The target ``name``, importing only its own module."""
    for module, names in TARGET_MODULES.items():
        if name in names:
            return _module_targets(module)[name]
    every = [n for names in TARGET_MODULES.values() for n in names]
    raise KeyError(f"no fuzz target {name!r}; there are: {', '.join(every)}")
