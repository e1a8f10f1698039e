"""Steps both stores (StreamStore, QueueStore) take around object storage: retries with backoff
(stratalog.retrying), and the deletion of objects an interrupted upload left behind."""

from __future__ import annotations

from stratalog.engine.metadata import Metadata
from stratalog.objects.store import ObjectStore
from stratalog.retrying import with_retries

__all__ = ["delete_orphans", "with_retries"]


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
