"""What the transaction APIs answer when the coordinator cannot act (broker/transactions.py): the database
out of reach, COORDINATOR_NOT_AVAILABLE; the id no longer this broker's (a cluster's fence found it moved),
NOT_COORDINATOR; both retried by clients, which find the coordinator again. Nothing changes meanwhile."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.cluster.leases import NotHolderError
from stratalog.engine.metadata_backends import Backend, MetadataUnavailableError


def _moved(_db: Backend, txn_id: str) -> None:
    raise NotHolderError(f"broker 1 no longer coordinates transaction {txn_id!r}")


def _unreachable(_db: Backend, _txn_id: str) -> None:
    raise MetadataUnavailableError("cannot reach the metadata database")


@pytest.mark.parametrize(("fence", "expected"), [(_moved, ErrorCode.not_coordinator),
                                                 (_unreachable, ErrorCode.coordinator_not_available)],
                         ids=["moved", "unreachable"])
def test_a_change_the_coordinator_cannot_make_is_a_retriable_error(
        loop: asyncio.AbstractEventLoop, tmp_path: Path, fence: object, expected: ErrorCode) -> None:
    async def run() -> None:
        broker = Broker.open(tmp_path / "data", BrokerConfig())
        try:
            broker.create_topic("t", 1, {})
            txns = broker.transactions
            error, pid, epoch = await txns.init_producer_id("tx", 60_000, -1, -1)
            assert error == ErrorCode.none
            txns._table.fence = fence   # type: ignore[assignment]
            assert await txns.init_producer_id("tx", 60_000, pid, epoch) == (expected, -1, -1)
            assert await txns.add_partitions("tx", pid, epoch, [("t", 0)]) == expected
            txns._table.fence = None
            assert await txns.add_partitions("tx", pid, epoch, [("t", 0)]) == ErrorCode.none
            txns._table.fence = fence   # type: ignore[assignment]
            assert await txns.end_txn("tx", pid, epoch, True) == expected
            txns._table.fence = None
            ongoing = txns.get("tx")
            assert ongoing is not None and (ongoing.producer_epoch, ongoing.state.value) == (epoch, "Ongoing"), \
                "nothing changed"
            assert await txns.end_txn("tx", pid, epoch, True) == ErrorCode.none
        finally:
            await broker.close()

    loop.run_until_complete(run())
