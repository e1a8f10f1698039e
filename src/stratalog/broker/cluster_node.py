"""One broker of several (``stratalog serve --cluster``): its lease, what it leads, and the work that keeps
the cluster served (docs/cluster.md).

PostgreSQL decides (stratalog.cluster.leases); this module follows what it says:

- **Lease.** The broker joins as a new incarnation and a thread of its own renews the lease every
  ``renew_interval_ms``. A renewal that finds the lease gone means another broker may already serve this
  one's partitions: the process exits at once with :data:`EXIT_LEASE_LOST`, and whatever supervises it
  starts a new incarnation. Commits it still had under way are refused by the database (fenced), and
  its acknowledged records are in its object log, which another broker replays. While renewals fail
  (the database out of reach) it acknowledges writes only as long as its lease is confirmed on its own
  clock (cluster/lease_clock.py), which ends before the database can end the lease, so a replay never
  misses an acknowledged record; once the lease has surely run out it exits the same way.
- **Reconcile** (a task on the event loop, its database calls in worker threads, every
  ``reconcile_interval_ms``): replay the logs of dead incarnations, re-read the topics, reconcile the
  holders of every partition and of every group that has a coordinator, then follow the result:

  - it holds a partition it does not serve yet: it reloads the stream from its committed end and the
    partition's idempotent producers (their snapshot, then the batches after it), records that its leader
    epoch begins at that end (cluster/leader_epochs.py), then serves it;
  - it holds a partition being handed over: it stops taking produce for it, waits for its queued
    appends, flushes the store, snapshots the partition's producers and releases it;
  - another broker holds a partition it serves: it stops serving it (it can only have lost it by its own
    release; the fence refuses its commits in any other case);
  - it holds a group being handed over, or another broker holds a group it knows: it forgets the group's
    members (NOT_COORDINATOR: they join at the new coordinator), and releases the group if asked.

The broker and its handlers ask it through ``ClusterOwnership`` (broker/cluster_ownership.py), which reads
:meth:`ClusterNode.stream` (the stream of a partition this broker serves, or None), :meth:`coordinates`,
:meth:`leader`, :meth:`coordinator` and :attr:`live`. Everything here but the renewal thread runs on the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from stratalog.broker.config import ClusterConfig
from stratalog.broker.leader_epochs import History
from stratalog.broker.producer_recovery import replay
from stratalog.broker.producers import ProducerStates
from stratalog.broker.topics import parse_stream_name, stream_name
from stratalog.broker.txn_partitions import PartitionTxns
from stratalog.cluster.assignment import Holder, Kind, Resource
from stratalog.cluster.failover import replay_dead_log, sweep_finished_logs
from stratalog.cluster.leader_epochs import forget_stream, record_epoch_start
from stratalog.cluster.lease_clock import LeaseClock, LeaseState
from stratalog.cluster.leases import BrokerIdTakenError, BrokerInfo, Cluster, Hold, LeaseLostError, NotHolderError
from stratalog.engine import Stream
from stratalog.wal.config import ObjectWALConfig

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: What brokers coordinate (rather than lead): a group's members and offsets, a transactional id's state.
COORDINATED = (Kind.GROUP, Kind.TRANSACTION)

log = logging.getLogger("stratalog.cluster")

#: The exit status of a broker whose lease ran out: fenced, it must not serve; restart it (a new
#: incarnation). EX_TEMPFAIL: a supervisor should try again.
EXIT_LEASE_LOST = 75
#: How long a join waits, in leases, for the lease of a previous incarnation of its id to run out.
JOIN_WAIT_LEASES = 2
#: The exit status of a broker whose store stopped after a write or put that failed for good. EX_IOERR.
EXIT_STORE_FAILED = 74


class ClusterNode:
    """This broker's membership. ``join`` before the stream store opens (its log is named after the
    incarnation), ``start`` once the broker is open, ``stop`` then ``leave`` at the end."""

    def __init__(self, config: ClusterConfig, database_uri: str, listeners: Sequence[tuple[str, str, int]]) -> None:
        """``listeners``: (security protocol, advertised host, port) of each listener, the first where clients
        reach this broker by default."""
        self.config = config
        self.broker_id = config.broker_id
        self._listeners = tuple(listeners)
        self._database_uri = database_uri
        #: Reconciles, holds, releases, replays: the loop's worker threads take turns on its connection.
        self.cluster = Cluster(database_uri, config.broker_id, config.lease_ms)
        #: Renewals only, on a connection of their own, so a long reconcile never delays one.
        self._renewer = Cluster(database_uri, config.broker_id, config.lease_ms)
        #: What this broker may count on of its lease, on its own clock: acknowledgements wait for it.
        self.lease = LeaseClock(config.lease_ms, config.lease_margin_ms)
        self._renewing = threading.Event()
        self._renew_thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        #: When this broker last swept the logs nobody needs (monotonic; 0: at its first reconcile).
        self._swept_at = 0.0
        self._poked: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broker: Broker | None = None
        #: What the last reconcile read: the live brokers, and who holds what.
        self.live: dict[int, BrokerInfo] = {}
        self.holds: dict[Resource, Hold] = {}
        #: Partitions this broker serves: stream name -> its stream, reloaded when it was gained.
        self._served: dict[str, Stream] = {}
        #: The leader epochs of each partition served, with where each began (OffsetForLeaderEpoch).
        self._epochs: dict[str, History] = {}
        #: For /metrics: partitions this broker came to lead, and dead brokers' logs it replayed.
        self.partitions_gained = 0
        self.logs_replayed = 0

    @property
    def epoch(self) -> int:
        return self.cluster.epoch

    @property
    def me(self) -> Holder:
        return Holder(self.broker_id, self.cluster.epoch)

    # The lease ------------------------------------------------------------------------------------

    def join(self) -> int:
        """Join as a new incarnation and start renewing; returns the epoch."""
        deadline = time.monotonic() + JOIN_WAIT_LEASES * self.config.lease_ms / 1000
        while True:
            sent_s = self.lease.sent()
            try:
                _, host, port = self._listeners[0]
                epoch = self.cluster.join(host, port, self._listeners)
                break
            except BrokerIdTakenError as e:
                # Restarted right after a crash: the previous incarnation's lease runs out within a lease.
                # Still taken after that, the id is another live broker's: the error says so.
                if time.monotonic() > deadline:
                    raise
                log.warning("%s; waiting for it to run out (a previous incarnation's lease ends within %d ms)",
                            e, self.config.lease_ms)
                time.sleep(self.config.renew_interval_ms / 1000)
        self.lease.renewed(sent_s)
        self._renewer.epoch = epoch
        self._renew_thread = threading.Thread(target=self._renew_forever, name="stratalog-lease", daemon=True)
        self._renew_thread.start()
        self.live = self.cluster.live()
        log.info("broker %d joined the cluster (incarnation %d) as %s", self.broker_id, epoch,
                 ", ".join(f"{name}://{host}:{port}" for name, host, port in self._listeners))
        return epoch

    def _renew_forever(self) -> None:
        interval_s = self.config.renew_interval_ms / 1000
        while not self._renewing.wait(interval_s):
            sent_s = self.lease.sent()
            try:
                self._renewer.renew()
                self.lease.renewed(sent_s)
            except LeaseLostError as e:
                self._fenced(str(e))
            except Exception as e:  # the database out of reach: the lease may still stand
                state = self.lease.state()
                if state is LeaseState.SURELY_EXPIRED:
                    self._fenced(f"no renewal got through for longer than the lease ({e})")
                log.warning("lease renewal failed (%s; acknowledging %s), retrying: %s", state.value,
                            "nothing" if state is not LeaseState.CONFIRMED else "still", e)

    def may_acknowledge(self) -> bool:
        """Whether a write made durable by now may be acknowledged: the lease is confirmed on this
        broker's clock (cluster/lease_clock.py), so no other broker can have replayed its log yet."""
        return self.lease.confirmed()

    def _fenced(self, why: str) -> None:
        # Exits at once: another broker may already lead this one's partitions, so nothing may be served
        # or acknowledged from here on. What was acknowledged is in the object log, replayed by others.
        self._exit(f"is fenced and stops: {why}{self._since_renewed()}", EXIT_LEASE_LOST)

    def _since_renewed(self) -> str:
        """How long the lease went unrenewed, said when longer than the lease: a renewal is sent every
        ``renew_interval_ms``, so a gap that long means this process or its machine stood still (a pause, a
        stop signal, a host pausing its virtual machine) or the database answered that late."""
        since_s = self.lease.since_renewed_s()
        if since_s is None or since_s * 1000 <= self.config.lease_ms:
            return ""
        return (f" (the last renewal that went through was sent {since_s:.1f} s ago by this broker's clock, "
                f"longer than the {self.config.lease_ms} ms lease: this process or its machine stood still, or the "
                "database answered late, for that long)")

    def _exit(self, what: str, status: int) -> NoReturn:
        """Say why this broker stops (log and stderr), then end the process at once with ``status``."""
        message = (f"stratalog broker {self.broker_id} (incarnation {self.cluster.epoch}) {what}; restart it to "
                   "join again")
        log.critical(message)
        print(message, file=sys.stderr, flush=True)
        os._exit(status)

    def leave(self, clean: bool) -> None:
        """Stop renewing and end the lease, so the others take over at once; ``clean``: everything this
        broker acknowledged is committed (its log needs no replay)."""
        self._renewing.set()
        if self._renew_thread is not None:
            self._renew_thread.join()
        try:
            self.cluster.leave(clean)
        except Exception as e:  # the lease runs out by itself; a replay finds nothing
            log.warning("leaving the cluster failed (the lease will run out): %s", e)
        self.cluster.close()
        self._renewer.close()

    # Following the database -----------------------------------------------------------------------

    def start(self, broker: Broker) -> None:
        self._broker = broker
        # Its producers' snapshots keep to the partitions it still holds: one it lost while paused past its
        # lease keeps the rows its new leader wrote (producer_recovery.py).
        broker.producer_snapshots.held = self.cluster.streams_held
        self._loop = asyncio.get_running_loop()
        self._poked = asyncio.Event()
        self._task = self._loop.create_task(self._reconcile_forever())

    async def stop(self) -> None:
        """Stop reconciling (the broker is stopping). The partitions served stay known, so the last
        snapshot of their producers is taken before the broker leaves."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def poke(self) -> None:
        """Reconcile soon (a topic was made): callable from any thread."""
        if self._loop is not None and self._poked is not None:
            self._loop.call_soon_threadsafe(self._poked.set)

    async def _reconcile_forever(self) -> None:
        assert self._poked is not None
        while True:
            self._stop_if_the_store_failed()
            try:
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except LeaseLostError as e:
                self._fenced(str(e))
            except Exception:
                log.exception("reconcile failed; retrying at the next interval")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), self.config.reconcile_interval_ms / 1000)
            self._poked.clear()

    def _stop_if_the_store_failed(self) -> None:
        """A broker whose store stopped (its write-ahead log could not be written, a put failing for good)
        can serve nothing more: it leaves at once, so another broker replays its log (everything durable
        in it) and takes its partitions, and exits for its supervisor to start it again."""
        broker = self._broker
        failure = None if broker is None else broker.store.failure
        if failure is None:
            return
        with contextlib.suppress(Exception):   # else its lease runs out, with the same outcome later
            self._renewing.set()
            self.cluster.leave(clean=False)
        self._exit(f"stops: its store failed ({failure})", EXIT_STORE_FAILED)

    async def reconcile_once(self) -> None:
        broker = self._broker
        assert broker is not None
        while await asyncio.to_thread(self._replay_one):
            pass
        await asyncio.to_thread(broker.topics.refresh)
        await asyncio.to_thread(broker.finish_deletes)
        before = await asyncio.to_thread(self.cluster.holds)
        resources = [Resource(Kind.PARTITION, stream_name(t.name, p))
                     for t in broker.topics.all() for p in range(t.partitions)]
        resources += [r for r in before if r.kind in COORDINATED]
        await asyncio.to_thread(self.cluster.reconcile, resources)
        self.holds = await asyncio.to_thread(self.cluster.holds)
        self.live = await asyncio.to_thread(self.cluster.live)
        await self._follow(broker, set(resources))
        await self._sweep_if_due(broker)

    async def _sweep_if_due(self, broker: Broker) -> None:
        """Delete what is left under finished logs, every ``log_sweep_interval_ms``. A failed sweep holds
        up nothing: the next one deletes the same objects."""
        if time.monotonic() - self._swept_at < self.config.log_sweep_interval_ms / 1000:
            return
        self._swept_at = time.monotonic()
        try:
            await asyncio.to_thread(sweep_finished_logs, self.cluster, broker.store.object_store)
        except Exception as e:
            log.warning("sweeping finished logs failed (the next sweep tries again): %s", e)

    def _replay_one(self) -> bool:
        broker = self._broker
        assert broker is not None
        replayed = replay_dead_log(self.cluster, broker.store.object_store, self._database_uri,
                                   Path(broker.data_dir) / "replays", broker.config.store, ObjectWALConfig())
        if replayed is not None:
            self.logs_replayed += 1
            log.warning("broker %d replayed the log of broker %d (incarnation %d): %d batches in %.2f s",
                        self.broker_id, replayed.dead.broker_id, replayed.dead.broker_epoch,
                        replayed.report.batches_replayed, replayed.seconds)
        return replayed is not None

    async def _follow(self, broker: Broker, resources: set[Resource]) -> None:
        held: set[str] = set()
        for resource, hold in sorted(self.holds.items()):
            if resource.kind is Kind.PARTITION and resource not in resources:
                continue   # a deleted topic's partition: its row outlives it
            try:
                await self._follow_one(broker, resource, hold, held)
            except (LeaseLostError, asyncio.CancelledError):
                raise
            except Exception:
                # One partition that cannot be gained or handed over now holds up none of the others.
                log.exception("broker %d could not follow %s %s; retrying at the next reconcile", self.broker_id,
                              resource.kind.value, resource.name)
                if resource.kind is Kind.PARTITION:
                    held.add(resource.name)
        for name in [n for n in self._served if n not in held]:
            log.warning("broker %d no longer leads %s", self.broker_id, name)
            self._drop(broker, name)

    async def _follow_one(self, broker: Broker, resource: Resource, hold: Hold, held: set[str]) -> None:
        """Do what the database says of one resource (see the module's doc)."""
        mine = hold.holder == self.me
        if resource.kind in COORDINATED:
            unload = broker.groups.unload if resource.kind is Kind.GROUP else broker.transactions.unload
            if mine and hold.handing_to is not None:
                unload(resource.name)
                with contextlib.suppress(NotHolderError):
                    await asyncio.to_thread(self.cluster.release, resource)
            elif not mine:
                unload(resource.name)
            elif resource.kind is Kind.TRANSACTION:
                # Loaded now, not at its producer's next request: its timeout runs here from the start.
                await broker.transactions.held(resource.name)
            return
        if not mine:
            return
        held.add(resource.name)
        if hold.handing_to is not None:
            await self._hand_off(broker, resource)
        elif resource.name not in self._served:
            await self._gain(broker, resource, hold)

    async def _gain(self, broker: Broker, resource: Resource, hold: Hold) -> None:
        """Serve a partition this broker was given: its stream from the committed end, its producers."""
        started = time.monotonic()
        stream = await asyncio.to_thread(broker.store.reload_stream, resource.name)
        reloaded = time.monotonic()
        states = ProducerStates(broker.config.producers_max)
        txns = PartitionTxns()
        replayed = await asyncio.to_thread(self._load_producers, broker, states, txns, stream)
        broker.producers.forget_partition(stream.stream_id)
        for producer_id, partition, epoch, batches in states.entries():
            broker.producers.restore(producer_id, partition, epoch, batches)
        broker.partition_txns.restore(stream.stream_id, txns.open_of(stream.stream_id),
                                      txns.ranges_of(stream.stream_id))
        broker.settled_ends[stream.stream_id] = stream.end_offset   # nothing of it in flight here yet
        self._epochs[resource.name] = await asyncio.to_thread(self._record_epoch, resource.name, stream)
        self._served[resource.name] = stream
        self.partitions_gained += 1
        log.info("broker %d leads %s (leader epoch %d) from offset %d; stream reloaded in %.3f s, %d producer "
                 "batches replayed in %.3f s", self.broker_id, resource.name, hold.leader_epoch, stream.end_offset,
                 reloaded - started, replayed, time.monotonic() - reloaded)

    def _record_epoch(self, name: str, stream: Stream) -> History:
        """Record that this broker's leader epoch of the partition begins where its log ends now (nothing
        is appended to it before it is served), while it holds it; the partition's history."""
        with self.cluster.fenced(Kind.PARTITION, [name]) as db:
            return record_epoch_start(db, Kind.PARTITION.value, name, self.broker_id, self.epoch,
                                      stream.stream_id, stream.end_offset)

    def forget_epochs(self, stream_id: int) -> None:
        """A deleted partition's stream: its leader epochs' rows go too (from any thread)."""
        with self.cluster.fenced(Kind.PARTITION, []) as db:
            forget_stream(db, stream_id)

    @staticmethod
    def _load_producers(broker: Broker, states: ProducerStates, txns: PartitionTxns, stream: Stream) -> int:
        """A gained partition's producers and transactions: its last snapshot's rows, then its batches after
        them (the abort markers among them have their ranges made durable); how many batches."""
        end = broker.producer_snapshots.load_partition(states, txns, stream.stream_id)
        found = replay(states, txns, stream, end)
        broker.producer_snapshots.add_aborted(stream.stream_id, found.aborted)
        return found.batches

    async def _hand_off(self, broker: Broker, resource: Resource) -> None:
        """Hand a partition over once everything acknowledged for it is committed."""
        stream = self._served.pop(resource.name, None)   # from here on, produce answers NOT_LEADER
        # Told to pass on a partition it was given but never gained (it has not loaded its producers): it
        # hands it over as it found it, leaving the last holder's snapshot rows to the next one. Saving its
        # own (none) would wipe them, and the next leader would refuse every producer's next batch as out
        # of order and forget the partition's open transactions.
        served_here = stream is not None
        if stream is None:
            stream = await asyncio.to_thread(broker.store.reload_stream, resource.name)
        # Appends of this partition queued for room before the line above must reach the engine first;
        # none can join them now. Appends queued after this moment (other partitions') do not hold it up.
        try:
            await asyncio.wait_for(broker.appender.drained(), self.config.handoff_wait_ms_max / 1000)
        except TimeoutError:
            if served_here:
                self._served[resource.name] = stream
            log.warning("handoff of %s put off: appends queued before it still wait for room", resource.name)
            return
        await asyncio.to_thread(broker.store.flush)
        if served_here:
            entries = [e for e in broker.producers.entries() if e[1] == stream.stream_id]
            open_txns = [t for t in broker.partition_txns.entries() if t[0] == stream.stream_id]
            end = broker.partition_txns.snapshot_bound(stream.stream_id, min(
                stream.end_offset, broker.settled_ends.get(stream.stream_id, stream.end_offset)))
            await asyncio.to_thread(broker.producer_snapshots.save, entries, {stream.stream_id: end}, open_txns,
                                    partitions_only=True)
        try:
            hold = await asyncio.to_thread(self.cluster.release, resource)
        except NotHolderError as e:
            log.warning("handoff of %s not made: %s", resource.name, e)
            return   # still held (the target went away): served again from the next reconcile
        self._drop(broker, resource.name)
        log.info("broker %d handed %s to broker %s at offset %d", self.broker_id, resource.name,
                 hold.holder.broker_id if hold.holder else "?", stream.end_offset)

    def _drop(self, broker: Broker, name: str) -> None:
        stream = self._served.pop(name, None)
        self._epochs.pop(name, None)
        parsed = parse_stream_name(name)
        if parsed is not None:
            broker.forget_partition(*parsed)
        if stream is not None:
            broker.producers.forget_partition(stream.stream_id)
            broker.partition_txns.forget(stream.stream_id)

    # What the handlers ask ------------------------------------------------------------------------

    def stream(self, name: str) -> Stream | None:
        """The stream of a partition this broker serves now, or None."""
        return self._served.get(name)

    def served(self) -> list[Stream]:
        return list(self._served.values())

    def epochs(self, name: str) -> History | None:
        """The leader epochs of a partition this broker serves, oldest first, or None."""
        return self._epochs.get(name) if name in self._served else None

    def leader(self, name: str) -> tuple[int, int] | None:
        """The live leader of a partition and its leader epoch, or None while it has none."""
        hold = self.holds.get(Resource(Kind.PARTITION, name))
        if hold is None or hold.holder is None:
            return None
        info = self.live.get(hold.holder.broker_id)
        if info is None or info.epoch != hold.holder.broker_epoch:
            return None
        return hold.holder.broker_id, hold.leader_epoch

    def coordinates(self, key: str, kind: Kind = Kind.GROUP) -> bool:
        hold = self.holds.get(Resource(kind, key))
        return hold is not None and hold.holder == self.me

    async def coordinator(self, key: str, kind: Kind = Kind.GROUP) -> BrokerInfo | None:
        """The live broker that coordinates a group (or a transactional id); one with none (new, or its
        coordinator died) is given one now, through a reconcile of every one of its kind. None if none
        could be given."""
        resource = Resource(kind, key)
        found = self._live_holder(resource)
        if found is not None:
            return found
        same_kind = {r for r in self.holds if r.kind is kind} | {resource}
        await asyncio.to_thread(self.cluster.reconcile, sorted(same_kind))
        self.holds = await asyncio.to_thread(self.cluster.holds)
        self.live = await asyncio.to_thread(self.cluster.live)
        return self._live_holder(resource)

    def stats(self) -> dict[str, int]:
        """This broker's view of the cluster, for /metrics (from any thread: it reads what the last
        reconcile published)."""
        holds = self.holds
        partitions = [r for r in holds if r.kind is Kind.PARTITION]
        return {"cluster_lease_confirmed": int(self.lease.confirmed()), "cluster_live_brokers": len(self.live),
                "cluster_partitions_led": len(self._served),
                "cluster_partitions_without_leader": sum(1 for r in partitions if self._live_holder(r) is None),
                "cluster_partitions_gained": self.partitions_gained, "cluster_logs_replayed": self.logs_replayed}

    def _live_holder(self, resource: Resource) -> BrokerInfo | None:
        hold = self.holds.get(resource)
        if hold is None or hold.holder is None:
            return None
        info = self.live.get(hold.holder.broker_id)
        return info if info is not None and info.epoch == hold.holder.broker_epoch else None
