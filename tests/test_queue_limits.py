"""The queue count's bound (QueueConfig.queues_max): a clear error that names it, and nothing half done."""

from __future__ import annotations

from pathlib import Path

import pytest

from queuekit import small_queue_config
from stratalog.engine.store import StoreFailedError
from stratalog.queues import QueueStore, TooManyQueuesError
from stratalog.queues.config import QUEUES_FORMAT_MAX


def test_a_put_many_that_would_pass_queues_max_is_refused_whole(tmp_path: Path) -> None:
    with QueueStore.open(tmp_path, config=small_queue_config(queues_max=3)) as qs:
        qs.put_many(["a", "b"], [b"1", b"2"])
        qs.flush()      # the writer has made "a" and "b": put_many counts the queues it knows
        with pytest.raises(TooManyQueuesError, match="queues_max=3"):
            qs.put_many(["a", "c", "d", "c"], [b"3", b"4", b"5", b"6"])
        qs.put_many(["a", "c", "c"], [b"3", b"4", b"5"])      # to the last queue there is room for
        qs.flush()
        assert [qs.get(q, 0, 10) for q in "abcd"] == [[b"1", b"3"], [b"2"], [b"4", b"5"], []]
        assert qs.stats()["queues"] == 3


def test_single_puts_past_queues_max_stop_the_store_with_an_error_that_says_so(tmp_path: Path) -> None:
    """A single put's queue is made by the writer, after put returned: the store stops rather than drop it
    and later acknowledge the puts after it. What was flushed before stays."""
    path = tmp_path / "s"
    qs = QueueStore.open(path, config=small_queue_config(queues_max=2))
    qs.put("a", b"1")
    qs.put("b", b"2")
    qs.flush()
    qs.put("c", b"3")
    with pytest.raises((TooManyQueuesError, StoreFailedError)) as raised:
        qs.flush()
    error = raised.value if isinstance(raised.value, TooManyQueuesError) else raised.value.__cause__
    assert isinstance(error, TooManyQueuesError) and "queues_max=2" in str(error)
    with pytest.raises(StoreFailedError, match="queues_max=2"):
        qs.put("a", b"4")
    qs.close()
    with QueueStore.open(path, config=small_queue_config(queues_max=3)) as reopened:
        assert [reopened.get(q, 0, 10) for q in "abc"] == [[b"1"], [b"2"], []]


@pytest.mark.parametrize("queues_max", [0, QUEUES_FORMAT_MAX + 1])
def test_queues_max_must_fit_the_formats_ids(tmp_path: Path, queues_max: int) -> None:
    with pytest.raises(ValueError, match="queues_max"):
        QueueStore.open(tmp_path, config=small_queue_config(queues_max=queues_max))
