"""stratalog: a durable, fast store for millions of append-only streams."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from stratalog.engine import StreamStore
    from stratalog.queues import QueueStore

__all__ = ["QueueStore", "StreamStore"]


def __getattr__(name: str) -> Any:
    # Lazy: `stratalog --help` and the chaos children import this package and need neither NumPy nor Arrow.
    if name == "QueueStore":
        from stratalog.queues import QueueStore

        return QueueStore
    if name == "StreamStore":
        from stratalog.engine import StreamStore

        return StreamStore
    raise AttributeError(f"module 'stratalog' has no attribute {name!r}")
