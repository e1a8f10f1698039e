"""The broker's event loop completes the WAL's appends itself (BrokerConfig.wal_completion_backstop_ms):
the append's completion runs in the loop's thread, a loop blocked waiting for an append still sees it
complete (the WAL's reaper thread is the backstop), and with the backstop at 0 the reaper completes every
append, as without a loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.native import native


def completing_thread(tmp_path: Path, backstop_ms: int) -> int:
    """The thread that ran an append's completion, the loop free to run meanwhile."""
    async def scenario() -> int:
        broker = Broker.open(tmp_path / "data", BrokerConfig(wal_completion_backstop_ms=backstop_ms))
        try:
            broker.create_topic("t", 1, {})
            stream = broker.partition("t", 0)
            assert stream is not None
            ran_in: list[int] = []
            durable = stream.append([b"value"])
            durable.add_done_callback(lambda _f: ran_in.append(threading.get_ident()))
            assert await asyncio.wrap_future(durable) == 0
            return ran_in[0]
        finally:
            await broker.close()
    return asyncio.run(scenario())


def test_the_loop_completes_appends_in_its_own_thread(tmp_path: Path) -> None:
    if native is None:
        pytest.fail("the compiled core is not built: make test builds it")
    assert completing_thread(tmp_path, backstop_ms=5_000) == threading.get_ident()


def test_a_backstop_of_zero_leaves_completions_to_the_wal_thread(tmp_path: Path) -> None:
    assert completing_thread(tmp_path, backstop_ms=0) != threading.get_ident()


def test_a_blocked_loop_still_sees_its_append_complete(tmp_path: Path) -> None:
    async def scenario() -> int:
        broker = Broker.open(tmp_path / "data", BrokerConfig(wal_completion_backstop_ms=5))
        try:
            broker.create_topic("t", 1, {})
            stream = broker.partition("t", 0)
            assert stream is not None
            # The loop waits here, in its own thread, for an append only a completion can finish: the
            # reaper thread takes it once it has waited the backstop's 5 ms.
            return stream.append([b"value"]).result()
        finally:
            await broker.close()
    assert asyncio.run(scenario()) == 0


@pytest.mark.parametrize("backstop_ms", [-1, 60_001])
def test_the_backstop_is_bounded(backstop_ms: int) -> None:
    with pytest.raises(ValueError, match="wal_completion_backstop_ms"):
        BrokerConfig(wal_completion_backstop_ms=backstop_ms).validate()
