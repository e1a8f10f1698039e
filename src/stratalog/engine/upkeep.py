"""Steps both stores (StreamStore, QueueStore) take around object storage: retries with backoff, and
the deletion of objects an interrupted upload left behind."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from stratalog.engine.metadata import Metadata
from stratalog.errors import StratalogError
from stratalog.objects.store import ObjectStore

_T = TypeVar("_T")


def with_retries(what: str, step: Callable[[], _T], *, attempts: int, backoff_s: float,
                 log: logging.Logger) -> _T:
    """Run ``step``; on a StratalogError try again up to ``attempts`` times in all, doubling the wait."""
    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return step()
        except StratalogError as e:
            if attempt == attempts:
                raise
            log.warning("%s failed (attempt %d of %d): %s", what, attempt, attempts, str(e))
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def delete_orphans(objects: ObjectStore, meta: Metadata, prefix: str) -> int:
    """Delete objects under ``prefix`` that no commit refers to, and the pieces of cut-off puts.

    Not part of the ObjectStore protocol: each store has its own kind of leftover (temp files in a
    directory, incomplete multipart uploads in S3). One store per data directory makes them ours.
    """
    for cleanup in ("remove_temp_files", "abort_incomplete_uploads"):
        method = getattr(objects, cleanup, None)
        if callable(method):
            method()
    known = {o.key for o in meta.objects()}
    orphans = [info.key for info in objects.list(prefix) if info.key not in known]
    for key in orphans:
        objects.delete(key)
    return len(orphans)
