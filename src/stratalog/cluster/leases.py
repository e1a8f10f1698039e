"""Brokers' leases and who holds what, in PostgreSQL: the cluster's one source of truth, no consensus of
its own.

Every broker *joins* with an id; each join is a new *incarnation* (its epoch goes up by one), and holds
a lease that it renews well before it runs out. Time is the database's (``clock_timestamp()``), so the
brokers' clocks need not agree. A broker whose renewal finds its lease gone (it paused longer than the
lease, or the database was out of reach that long) is *fenced*: it must stop serving and join again.

Each partition, each group's coordination and each transactional id's is held by one broker
incarnation, with a *leader epoch* that goes up at every change of holder (Kafka's leader epoch). Any
broker may *reconcile*: read the live brokers and the holders, plan (assignment.py) and apply the moves,
in one transaction. Every change here, and every metadata commit a broker makes for a stream it leads
(``check_holds``), runs under the same transaction-scoped writer lock as the stream store's metadata
(metadata_backends.py), so a check and the commit it guards cannot be split by a takeover: a broker that
lost a partition can no longer commit anything for it, even if it still runs.

Tables (PostgreSQL; created if missing)::

    cluster_brokers  broker_id, epoch, host, port, lease_expires_ms, left_clean, listeners (JSON)
    cluster_leaders  kind, name, broker_id, broker_epoch, leader_epoch, handing_to_id, handing_to_epoch
    cluster_logs     broker_id, epoch, state, claimed_by_id, claimed_by_epoch
    cluster_leader_epochs  (leader_epochs.py) where each leader epoch of a partition began

**Failover.** Each incarnation writes its own write-ahead log (in object storage, so it outlives the
machine) and has a row in ``cluster_logs``. When an incarnation's lease runs out without a clean leave,
its partitions are *not ready*: no reconcile hands them to anyone until a live broker has claimed its log
(:meth:`Cluster.claim_dead_log`), replayed it and committed what it held under :meth:`recovery_fence`
(which lets the claimant commit for exactly the dead incarnation's partitions), and marked it recovered
(:meth:`finish_recovery`). A claimant that dies in turn loses its claim with its lease.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from stratalog.cluster import leader_epochs
from stratalog.cluster.assignment import Holder, Kind, Move, MoveType, Resource, plan
from stratalog.engine.metadata import Fence
from stratalog.engine.metadata_backends import Backend, PostgresBackend, writing
from stratalog.errors import StratalogError

SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_brokers (
    broker_id INTEGER PRIMARY KEY,
    epoch INTEGER NOT NULL,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    lease_expires_ms INTEGER NOT NULL,
    left_clean INTEGER NOT NULL DEFAULT 0
);
ALTER TABLE cluster_brokers ADD COLUMN IF NOT EXISTS listeners TEXT NOT NULL DEFAULT '[]';
CREATE TABLE IF NOT EXISTS cluster_leaders (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    broker_id INTEGER,
    broker_epoch INTEGER,
    leader_epoch INTEGER NOT NULL,
    handing_to_id INTEGER,
    handing_to_epoch INTEGER,
    PRIMARY KEY (kind, name)
);
CREATE TABLE IF NOT EXISTS cluster_logs (
    broker_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    state TEXT NOT NULL,
    claimed_by_id INTEGER,
    claimed_by_epoch INTEGER,
    PRIMARY KEY (broker_id, epoch)
);
""" + leader_epochs.SCHEMA
#: States of an incarnation's write-ahead log (cluster_logs.state).
LOG_OPEN = "open"              # its broker writes it, or died with it: records may be in it alone
LOG_CLEAN = "clean"            # its broker left after committing everything: nothing to replay
LOG_RECOVERED = "recovered"    # another broker replayed it and committed what it held
#: The database's clock in milliseconds: leases are measured on one clock, whatever the brokers' say.
NOW_MS = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"


class ClusterError(StratalogError):
    """Base of the cluster's errors."""


class BrokerIdTakenError(ClusterError):
    """Another live broker holds this broker id's lease."""


class LeaseLostError(ClusterError):
    """This broker's lease ran out (or a newer incarnation joined with its id): it is fenced and must
    stop serving, then join again."""


class NotHolderError(ClusterError):
    """This broker does not hold (all of) the resources a change was for: another broker leads them now."""


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    epoch: int
    #: Where clients reach it: its first listener's advertised address.
    host: str
    port: int
    #: (security protocol, host, port) of each of its listeners, as clients are told them.
    listeners: tuple[tuple[str, str, int], ...] = ()

    def endpoint(self, protocol: str) -> tuple[str, int]:
        """Where a client of a listener of ``protocol`` reaches this broker: its own listener of that
        protocol (a client on a TLS listener stays on TLS), else its first one."""
        for name, host, port in self.listeners:
            if name == protocol:
                return host, port
        return self.host, self.port


@dataclass(frozen=True, slots=True)
class Hold:
    """Who holds a resource, at which leader epoch, and whom it is being handed to (if anyone)."""

    resource: Resource
    holder: Holder | None
    leader_epoch: int
    handing_to: Holder | None


class Cluster:
    """One broker's view of the cluster tables: its own lease, and the holders of every resource.
    Thread-safe: one connection behind a lock."""

    def __init__(self, database_uri: str, broker_id: int, lease_ms: int) -> None:
        if broker_id < 0:
            raise ValueError("broker ids are >= 0")
        if lease_ms <= 0:
            raise ValueError("lease_ms must be positive")
        self._db: Backend = PostgresBackend(database_uri, SCHEMA)
        self._lock = threading.Lock()
        self.broker_id = broker_id
        self.lease_ms = lease_ms
        self.epoch = 0          # 0: not joined

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[Backend]:
        with self._lock, writing(self._db):
            yield self._db

    # This broker's lease --------------------------------------------------------------------------

    def join(self, host: str, port: int, listeners: Sequence[tuple[str, str, int]] = ()) -> int:
        """Register as a new incarnation of this broker id and take a lease; returns the epoch. ``host`` and
        ``port``: where clients reach it by default; ``listeners``: (security protocol, host, port) of each
        listener, for clients connected to one of that protocol."""
        with self._tx() as db:
            row = db.execute(f"SELECT epoch, host, port, lease_expires_ms > {NOW_MS} FROM cluster_brokers "
                             "WHERE broker_id = ?", (self.broker_id,)).fetchone()
            if row is not None and row[3]:
                raise BrokerIdTakenError(f"broker id {self.broker_id} is live at {row[1]}:{row[2]}; stop that "
                                         "broker or give this one another id")
            epoch = 1 if row is None else int(row[0]) + 1
            db.execute("INSERT INTO cluster_brokers (broker_id, epoch, host, port, lease_expires_ms, left_clean, "
                       f"listeners) VALUES (?, ?, ?, ?, {NOW_MS} + ?, 0, ?) "
                       "ON CONFLICT (broker_id) DO UPDATE SET epoch = excluded.epoch, host = excluded.host, "
                       "port = excluded.port, lease_expires_ms = excluded.lease_expires_ms, left_clean = 0, "
                       "listeners = excluded.listeners",
                       (self.broker_id, epoch, host, port, self.lease_ms, json.dumps([list(x) for x in listeners])))
            db.execute("INSERT INTO cluster_logs VALUES (?, ?, ?, NULL, NULL)", (self.broker_id, epoch, LOG_OPEN))
        self.epoch = epoch
        return epoch

    def renew(self) -> None:
        """Extend the lease by ``lease_ms`` from now; LeaseLostError if it had run out already.

        One statement, outside the writer lock: a renewal must not wait behind other brokers' commits
        (one cut off mid-transaction holds that lock until the server ends its session). It needs no
        lock: it cannot bring back a lease that ran out, and a takeover only acts on leases that did."""
        with self._lock:
            renewed = self._db.execute(
                f"UPDATE cluster_brokers SET lease_expires_ms = {NOW_MS} + ? WHERE broker_id = ? AND epoch = ? "
                f"AND lease_expires_ms > {NOW_MS}", (self.lease_ms, self.broker_id, self.epoch)).rowcount
        if renewed != 1:
            raise LeaseLostError(f"broker {self.broker_id} (epoch {self.epoch}) lost its lease: it must stop "
                                 "serving and join again")

    def leave(self, clean: bool) -> None:
        """End the lease now, so others take over at once. ``clean``: everything this broker acknowledged
        is in objects and committed (its write-ahead log needs no replay)."""
        with self._tx() as db:
            db.execute("UPDATE cluster_brokers SET lease_expires_ms = 0, left_clean = ? WHERE broker_id = ? "
                       "AND epoch = ?", (int(clean), self.broker_id, self.epoch))
            if clean:
                db.execute("UPDATE cluster_logs SET state = ? WHERE broker_id = ? AND epoch = ?",
                           (LOG_CLEAN, self.broker_id, self.epoch))

    def live(self) -> dict[int, BrokerInfo]:
        with self._lock:
            rows = self._db.execute(f"SELECT broker_id, epoch, host, port, listeners FROM cluster_brokers "
                                    f"WHERE lease_expires_ms > {NOW_MS} ORDER BY broker_id").fetchall()
        return {int(r[0]): BrokerInfo(int(r[0]), int(r[1]), r[2], int(r[3]),
                                      tuple((str(n), str(h), int(p)) for n, h, p in json.loads(r[4])))
                for r in rows}

    # Holders ----------------------------------------------------------------------------------------

    def holds(self, kind: Kind | None = None) -> dict[Resource, Hold]:
        with self._lock:
            return _holds(self._db, kind)

    def reconcile(self, resources: Iterable[Resource], not_ready: Collection[Resource] = ()) -> list[Move]:
        """Plan and apply, in one transaction, the moves that make ``resources`` served and balanced
        across the live brokers (see assignment.py). Takeovers take effect at once (the leader epoch goes
        up); handoffs are recorded for their holder to carry out (:meth:`release`)."""
        resources = list(resources)
        with self._tx() as db:
            live = {int(r[0]): int(r[1]) for r in db.execute(
                f"SELECT broker_id, epoch FROM cluster_brokers WHERE lease_expires_ms > {NOW_MS}").fetchall()}
            holds = _holds(db, None)
            holders = {r: h.holder for r, h in holds.items() if h.holder is not None}
            handing = {r: h.handing_to for r, h in holds.items() if h.handing_to is not None}
            unreplayed = {(int(r[0]), int(r[1])) for r in db.execute(
                "SELECT broker_id, epoch FROM cluster_logs WHERE state = ?", (LOG_OPEN,)).fetchall()}
            waiting = {r for r, h in holders.items() if r.kind is Kind.PARTITION
                       and (h.broker_id, h.broker_epoch) in unreplayed and live.get(h.broker_id) != h.broker_epoch}
            moves = plan(resources, holders, live, waiting.union(not_ready), handing)
            for move in moves:
                if move.type is MoveType.TAKEOVER:
                    db.execute("INSERT INTO cluster_leaders VALUES (?, ?, ?, ?, 1, NULL, NULL) "
                               "ON CONFLICT (kind, name) DO UPDATE SET broker_id = excluded.broker_id, "
                               "broker_epoch = excluded.broker_epoch, "
                               "leader_epoch = cluster_leaders.leader_epoch + 1, "
                               "handing_to_id = NULL, handing_to_epoch = NULL",
                               (move.resource.kind.value, move.resource.name, move.to.broker_id,
                                move.to.broker_epoch))
                else:
                    db.execute("UPDATE cluster_leaders SET handing_to_id = ?, handing_to_epoch = ? "
                               "WHERE kind = ? AND name = ?",
                               (move.to.broker_id, move.to.broker_epoch, move.resource.kind.value,
                                move.resource.name))
        return moves

    def release(self, resource: Resource) -> Hold:
        """Hand a resource this broker holds to the broker it is being handed to (call once everything
        this broker acknowledged for it is committed). NotHolderError if it no longer holds it or no
        handoff is recorded."""
        with self._tx() as db:
            self._check_lease(db)
            changed = db.execute(
                "UPDATE cluster_leaders SET broker_id = handing_to_id, broker_epoch = handing_to_epoch, "
                "leader_epoch = leader_epoch + 1, handing_to_id = NULL, handing_to_epoch = NULL "
                "WHERE kind = ? AND name = ? AND broker_id = ? AND broker_epoch = ? AND handing_to_id IS NOT NULL",
                (resource.kind.value, resource.name, self.broker_id, self.epoch)).rowcount
            if changed != 1:
                raise NotHolderError(f"broker {self.broker_id} has no handoff of {resource.kind.value} "
                                     f"{resource.name!r} to make")
            return _holds(db, resource.kind, resource.name)[resource]

    def forget(self, resource: Resource) -> bool:
        """Delete a resource this broker holds that nobody needs any more (a transactional id its coordinator
        forgot): whether it went. Asked for again later, it is given a holder anew."""
        with self._tx() as db:
            self._check_lease(db)
            return db.execute("DELETE FROM cluster_leaders WHERE kind = ? AND name = ? AND broker_id = ? "
                              "AND broker_epoch = ?",
                              (resource.kind.value, resource.name, self.broker_id, self.epoch)).rowcount == 1

    # Failover ---------------------------------------------------------------------------------------

    def claim_dead_log(self) -> Holder | None:
        """Claim the write-ahead log of one incarnation that died without a clean leave and that no other
        live broker has claimed (the oldest first); None when there is none. The claimant replays it,
        commits what it holds under :meth:`recovery_fence`, then calls :meth:`finish_recovery`. A log this
        incarnation claimed already is returned again: its replay failed (the object store or the database
        out of reach), and no other broker may take it over while this one lives."""
        with self._tx() as db:
            self._check_lease(db)
            row = db.execute(
                "SELECT l.broker_id, l.epoch FROM cluster_logs l "
                "LEFT JOIN cluster_brokers b ON b.broker_id = l.broker_id "
                "LEFT JOIN cluster_brokers c ON c.broker_id = l.claimed_by_id "
                f"WHERE l.state = ? AND NOT (b.epoch = l.epoch AND b.lease_expires_ms > {NOW_MS}) "
                "AND (l.claimed_by_id IS NULL OR (l.claimed_by_id = ? AND l.claimed_by_epoch = ?) "
                f"OR NOT (c.epoch = l.claimed_by_epoch AND c.lease_expires_ms > {NOW_MS})) "
                "ORDER BY l.broker_id, l.epoch LIMIT 1", (LOG_OPEN, self.broker_id, self.epoch)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE cluster_logs SET claimed_by_id = ?, claimed_by_epoch = ? WHERE broker_id = ? "
                       "AND epoch = ?", (self.broker_id, self.epoch, row[0], row[1]))
            return Holder(int(row[0]), int(row[1]))

    def recovery_fence(self, dead: Holder) -> Fence:
        """The stream store's fence while replaying ``dead``'s log: a change commits only while this
        broker's lease is live, it holds the claim on that log, and every stream changed is a partition
        the dead incarnation held."""

        def check(db: Backend, stream_ids: Sequence[int]) -> None:
            self._check_lease(db)
            claimed = db.execute("SELECT 1 FROM cluster_logs WHERE broker_id = ? AND epoch = ? AND state = ? "
                                 "AND claimed_by_id = ? AND claimed_by_epoch = ?",
                                 (dead.broker_id, dead.broker_epoch, LOG_OPEN, self.broker_id, self.epoch)).fetchone()
            if claimed is None:
                raise NotHolderError(f"broker {self.broker_id} (epoch {self.epoch}) no longer holds the claim on "
                                     f"the log of broker {dead.broker_id} (epoch {dead.broker_epoch})")
            names = _stream_names(db, stream_ids)
            held = 0
            for i in range(0, len(names), 500):
                chunk = names[i:i + 500]
                held += int(db.execute(
                    "SELECT COUNT(*) FROM cluster_leaders WHERE kind = ? AND broker_id = ? AND broker_epoch = ? "
                    f"AND name IN ({','.join('?' * len(chunk))})",
                    (Kind.PARTITION.value, dead.broker_id, dead.broker_epoch, *chunk)).fetchone()[0])
            if held != len(names):
                raise NotHolderError(f"the log of broker {dead.broker_id} (epoch {dead.broker_epoch}) holds "
                                     "records of partitions that incarnation did not hold")

        return check

    def finish_recovery(self, dead: Holder) -> None:
        """Mark ``dead``'s log replayed (its partitions become ready to take over); NotHolderError if this
        broker no longer holds the claim."""
        with self._tx() as db:
            self._check_lease(db)
            done = db.execute("UPDATE cluster_logs SET state = ? WHERE broker_id = ? AND epoch = ? AND state = ? "
                              "AND claimed_by_id = ? AND claimed_by_epoch = ?",
                              (LOG_RECOVERED, dead.broker_id, dead.broker_epoch, LOG_OPEN, self.broker_id,
                               self.epoch)).rowcount
        if done != 1:
            raise NotHolderError(f"broker {self.broker_id} does not hold the claim on the log of broker "
                                 f"{dead.broker_id} (epoch {dead.broker_epoch})")

    def finished_logs(self) -> set[tuple[int, int]]:
        """(broker id, epoch) of every incarnation whose log nobody needs any more: it left clean, or its
        log was replayed. Objects still under such a log are garbage (a broker cut off from the database
        may go on putting to its log for a while after another replayed it)."""
        with self._lock:
            rows = self._db.execute("SELECT broker_id, epoch FROM cluster_logs WHERE state IN (?, ?)",
                                    (LOG_CLEAN, LOG_RECOVERED)).fetchall()
        return {(int(r[0]), int(r[1])) for r in rows}

    # Fencing ----------------------------------------------------------------------------------------

    def check_holds(self, db: Backend, kind: Kind, names: Sequence[str]) -> None:
        """Inside another writer transaction on the same database: raise if this incarnation does not
        hold every one of ``names`` under a live lease (LeaseLostError, NotHolderError). The writer lock
        that transaction holds keeps a takeover out until it ends."""
        self._check_lease(db)
        unique = sorted(set(names))
        held = 0
        for i in range(0, len(unique), 500):
            chunk = unique[i:i + 500]
            held += int(db.execute(
                f"SELECT COUNT(*) FROM cluster_leaders WHERE kind = ? AND broker_id = ? AND broker_epoch = ? "
                f"AND name IN ({','.join('?' * len(chunk))})",
                (kind.value, self.broker_id, self.epoch, *chunk)).fetchone()[0])
        if held != len(unique):
            raise NotHolderError(f"broker {self.broker_id} (epoch {self.epoch}) no longer holds all of "
                                 f"{len(unique)} {kind.value}s it is committing for")

    def group_fence(self, db: Backend, group_id: str) -> None:
        """Inside a transaction of the broker's own tables on the same database (committed offsets): raise
        unless this incarnation coordinates ``group_id`` under a live lease. The holder's row is locked
        (FOR SHARE) until that transaction ends, so a takeover or handoff of the group waits for the
        commit it guards, without the stream store's writer lock that offset commits do not take."""
        self._coordinator_fence(db, Kind.GROUP, group_id)

    def txn_fence(self, db: Backend, transactional_id: str) -> None:
        """As :meth:`group_fence`, for the coordinator of a transactional id (its state's table, and the
        offsets its transactions commit)."""
        self._coordinator_fence(db, Kind.TRANSACTION, transactional_id)

    def _coordinator_fence(self, db: Backend, kind: Kind, name: str) -> None:
        self._check_lease(db)
        row = db.execute("SELECT 1 FROM cluster_leaders WHERE kind = ? AND name = ? AND broker_id = ? "
                         "AND broker_epoch = ? FOR SHARE",
                         (kind.value, name, self.broker_id, self.epoch)).fetchone()
        if row is None:
            raise NotHolderError(f"broker {self.broker_id} (epoch {self.epoch}) no longer coordinates "
                                 f"{kind.value} {name!r}")

    def _check_lease(self, db: Backend) -> None:
        row = db.execute(f"SELECT 1 FROM cluster_brokers WHERE broker_id = ? AND epoch = ? "
                         f"AND lease_expires_ms > {NOW_MS}", (self.broker_id, self.epoch)).fetchone()
        if row is None:
            raise LeaseLostError(f"broker {self.broker_id} (epoch {self.epoch}) has no live lease")

    def streams_held(self, db: Backend, stream_ids: Sequence[int]) -> set[int]:
        """Inside another transaction on the same database: those of ``stream_ids`` whose partitions this
        incarnation holds under a live lease (none once its lease ran out). A producer snapshot keeps to
        them (broker/producer_recovery.py): a broker that lost a partition while it was paused must not
        replace the rows the partition's new leader rebuilds its producers from."""
        try:
            self._check_lease(db)
        except LeaseLostError:
            return set()
        ids = sorted(set(stream_ids))
        held: set[int] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            held.update(int(r[0]) for r in db.execute(
                "SELECT s.stream_id FROM streams s JOIN cluster_leaders l ON l.name = s.name WHERE l.kind = ? "
                f"AND l.broker_id = ? AND l.broker_epoch = ? AND s.stream_id IN ({','.join('?' * len(chunk))})",
                (Kind.PARTITION.value, self.broker_id, self.epoch, *chunk)).fetchall())
        return held

    def stream_fence(self, db: Backend, stream_ids: Sequence[int]) -> None:
        """The stream store's fence (``StreamStore.open(..., fence=cluster.stream_fence)``): a change of
        streams' data commits only while this broker holds their partitions (streams ``<topic>/<p>``)."""
        self.check_holds(db, Kind.PARTITION, _stream_names(db, stream_ids))

    @contextmanager
    def fenced(self, kind: Kind, names: Sequence[str]) -> Iterator[Backend]:
        """A writer transaction that commits only if this broker holds ``names`` throughout it."""
        with self._tx() as db:
            self.check_holds(db, kind, names)
            yield db


def _stream_names(db: Backend, stream_ids: Sequence[int]) -> list[str]:
    """The names of streams (partitions are streams ``<topic>/<p>``); NotHolderError for a stream with no
    name or none at all."""
    names: list[str] = []
    ids = sorted(set(stream_ids))
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        names += [r[0] for r in db.execute(
            f"SELECT name FROM streams WHERE stream_id IN ({','.join('?' * len(chunk))})", chunk).fetchall()]
    if len(names) != len(ids) or any(name is None for name in names):
        raise NotHolderError(f"streams {ids[:5]} are not all named partitions of this cluster")
    return sorted(names)


def _holds(db: Backend, kind: Kind | None, name: str | None = None) -> dict[Resource, Hold]:
    sql = ("SELECT kind, name, broker_id, broker_epoch, leader_epoch, handing_to_id, handing_to_epoch "
           "FROM cluster_leaders")
    params: tuple[str, ...] = ()
    if kind is not None:
        sql += " WHERE kind = ?"
        params = (kind.value,)
        if name is not None:
            sql += " AND name = ?"
            params += (name,)
    holds = {}
    for k, n, broker_id, broker_epoch, leader_epoch, to_id, to_epoch in db.execute(sql, params).fetchall():
        resource = Resource(Kind(k), n)
        holder = None if broker_id is None else Holder(int(broker_id), int(broker_epoch))
        handing_to = None if to_id is None else Holder(int(to_id), int(to_epoch))
        holds[resource] = Hold(resource, holder, int(leader_epoch), handing_to)
    return holds
