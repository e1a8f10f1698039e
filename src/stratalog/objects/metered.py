"""An object store that counts its calls: requests, errors and time by operation, for ``/metrics``.

It wraps any ObjectStore and changes nothing of what the calls do. Its counters belong to no registry
until a broker that serves metrics registers them (``collectors``); counting costs a lock and a clock read
per call, against the milliseconds an object store call takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram
from prometheus_client.registry import Collector

from stratalog.objects.store import ObjectInfo, ObjectStore

T = TypeVar("T")

#: From a local directory's sub-millisecond calls to an S3 store's slow seconds.
OBJECT_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class MeteredStore:
    """``inner`` with each call counted (``operation``: put, get, size, list, delete, rename)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self._requests = Counter("stratalog_object_requests", "Object store calls, by operation",
                                 ["operation"], registry=None)
        self._errors = Counter("stratalog_object_errors", "Object store calls that failed, by operation (each "
                               "try of a retried step counts)", ["operation"], registry=None)
        self._seconds = Histogram("stratalog_object_request_seconds", "Time of an object store call, by "
                                  "operation (a list: until its last page)", ["operation"],
                                  buckets=OBJECT_SECONDS_BUCKETS, registry=None)

    def collectors(self) -> list[Collector]:
        return [self._requests, self._errors, self._seconds]

    def _timed(self, operation: str, call: Callable[[], T]) -> T:
        self._requests.labels(operation).inc()
        started = time.perf_counter()
        try:
            return call()
        except Exception:
            self._errors.labels(operation).inc()
            raise
        finally:
            self._seconds.labels(operation).observe(time.perf_counter() - started)

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self._timed("put", lambda: self.inner.put(key, data))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._timed("get", lambda: self.inner.get(key, start, end))

    def size(self, key: str) -> int:
        return self._timed("size", lambda: self.inner.size(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._requests.labels("list").inc()
        started = time.perf_counter()
        try:
            yield from self.inner.list(prefix)
        except Exception:
            self._errors.labels("list").inc()
            raise
        finally:
            self._seconds.labels("list").observe(time.perf_counter() - started)

    def delete(self, key: str) -> None:
        self._timed("delete", lambda: self.inner.delete(key))

    def rename(self, src: str, dst: str) -> None:
        self._timed("rename", lambda: self.inner.rename(src, dst))

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        """What a particular store offers beyond the protocol (a local store's root, an S3 store's
        bucket), passed through uncounted."""
        return getattr(self.inner, name)
