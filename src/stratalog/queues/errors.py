"""The queue store's errors, and the check every queue or consumer group name goes through."""

from __future__ import annotations

from stratalog.errors import OutOfSpaceError, StratalogError
from stratalog.queues.config import QUEUE_NAME_CHARS_MAX


class QueueError(StratalogError):
    """A queue operation was refused."""


class InvalidQueueNameError(QueueError, ValueError):
    """A queue (or group) name is not a str of 1 to QUEUE_NAME_CHARS_MAX characters encodable as UTF-8."""


class MessageTooLargeError(QueueError, ValueError):
    """A message is larger than ``message_bytes_max``."""


class PutBackpressureError(QueueError):
    """Puts outran the writer and the uploads for ``put_wait_s_max``."""


class QueueStoreFullError(QueueError, OutOfSpaceError):
    """Puts are refused: the disk under the store is below its free-space headroom, or object storage is
    out of room. Gets go on; puts resume by themselves once space is back (retry)."""


class TooManyQueuesError(QueueError):
    """A put would create more queues than ``QueueConfig.queues_max``."""


def too_many_queues(queues: int, new: int, queues_max: int) -> TooManyQueuesError:
    return TooManyQueuesError(
        f"making {new} new queue{'s' if new != 1 else ''} beside the {queues} that exist would pass "
        f"queues_max={queues_max}: put to queues that exist, or reopen the store with a larger "
        "QueueConfig.queues_max (each queue holds about 200 bytes of memory)")


def check_name(name: object, what: str = "queue") -> str:
    if type(name) is not str or not 0 < len(name) <= QUEUE_NAME_CHARS_MAX:
        raise InvalidQueueNameError(f"a {what} name must be a str of 1 to {QUEUE_NAME_CHARS_MAX} characters, "
                                    f"got {name!r:.80}")
    if not name.isascii():
        try:
            name.encode()
        except UnicodeEncodeError as e:
            raise InvalidQueueNameError(f"{what} name {name!r:.80} is not valid Unicode (lone surrogate)") from e
    return name
