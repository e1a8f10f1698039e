"""Waiting on an event a test cannot be told of directly: poll a condition until it holds."""

from __future__ import annotations

import time
from collections.abc import Callable

#: How long a test waits for something that should happen in well under a second on a quiet machine.
WAIT_S = 60.0
#: Between polls: short against what is awaited, long enough not to load a busy machine.
POLL_S = 0.02


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    """Return once ``condition()`` is true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_S)
