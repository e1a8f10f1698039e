"""One step against object storage or the metadata database, tried again while it fails: the backoff
both stores and both write-ahead logs use."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from stratalog.errors import StratalogError

_T = TypeVar("_T")


def with_retries(what: str, step: Callable[[], _T], *, attempts: int, backoff_s: float, log: logging.Logger,
                 retry_s_min: float = 0.0, backoff_s_max: float = float("inf"),
                 retry_on: tuple[type[BaseException], ...] = (StratalogError,),
                 never_on: tuple[type[BaseException], ...] = ()) -> _T:
    """``step()``, tried again on ``retry_on`` (but not ``never_on``) until it has been tried ``attempts``
    times and for ``retry_s_min`` seconds; the wait between tries doubles from ``backoff_s`` up to
    ``backoff_s_max``. The last error is raised."""
    delay, started = backoff_s, time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return step()
        except never_on:
            raise
        except retry_on as e:
            if attempt >= attempts and time.monotonic() - started >= retry_s_min:
                raise
            log.warning("%s failed (attempt %d): %s", what, attempt, str(e))
            time.sleep(delay)
            delay = min(delay * 2, backoff_s_max)
