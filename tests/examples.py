"""How many examples a property test of the compiled core runs: its own count, times the share in
STRATALOG_TEST_EXAMPLES_SHARE (1 unless set).

`make sanitize` sets a quarter: under AddressSanitizer, with Python's allocator off, each example runs 5 to 20
times slower, and the same tests run every example unsanitized in the rest of `make test`. What the
sanitizer adds is a memory error found on any input, and the fuzz targets it runs next (up to 100,000
inputs each, mutated from their seed corpora) reach far more inputs than more examples would."""

from __future__ import annotations

import os

#: The share of each test's examples this run makes (1: all of them).
SHARE = float(os.environ.get("STRATALOG_TEST_EXAMPLES_SHARE", "1"))
#: However small the share, a property test runs this many examples at least.
EXAMPLES_MIN = 25


def examples(count: int) -> int:
    """``count`` examples, scaled by this run's share (see the module's docstring)."""
    if not 0 < SHARE <= 1:
        raise ValueError(f"STRATALOG_TEST_EXAMPLES_SHARE must be in (0, 1], not {SHARE}")
    return max(min(count, EXAMPLES_MIN), round(count * SHARE))
