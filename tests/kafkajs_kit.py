"""KafkaJS (npm's kafkajs, pinned by tests/kafkajs/package-lock.json) for the tests that run its node scripts
against a broker: test_kafkajs_admin.py (admin.js) and test_kafkajs_transactions.py (transactions.js).

The node packages are installed with ``npm ci`` from the lock into the pytest cache, once, and reused while
the lock is unchanged (as appvenv.py makes the apps' environments): a file lock lets one test run install
while another waits, and a marker written last tells a finished install from one a killed run left half
made. Each script prints what it saw as one JSON document on stdout (what it saw up to a failure, and the
failure, when it fails); ``run_script`` returns that document, or fails the test with the script's output
and the broker's log.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from brokerkit import BrokerProcess

PACKAGE = Path(__file__).parent / "kafkajs"
#: npm ci fetches one small package (kafkajs has no dependencies): generous for a slow registry.
INSTALL_TIMEOUT_S = 600
#: Written once npm ci has finished: an install without it is made again.
COMPLETE = "stratalog-kafkajs-install-complete"
#: How much of a failed script's stdout and stderr, and of the broker's log, a failure shows: the ends,
#: where the failure is.
SHOWN_CHARS_MAX = 10_000
BROKER_SHOWN_CHARS_MAX = 5_000


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not on PATH: KafkaJS's tests need Node.js 18+ with npm (Debian: apt-get install "
                    f"nodejs npm)", pytrace=False)
    return found


def node_modules(cache_root: Path) -> Path:
    """The node_modules of kafkajs installed from tests/kafkajs's lock under ``cache_root``, installed first
    if need be."""
    lock_text = (PACKAGE / "package-lock.json").read_bytes() + (PACKAGE / "package.json").read_bytes()
    prefix = cache_root / f"kafkajs-{hashlib.sha256(lock_text).hexdigest()[:12]}"
    with (cache_root / "kafkajs.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)    # released when the file closes, also if this process dies
        if not (prefix / COMPLETE).exists():
            shutil.rmtree(prefix, ignore_errors=True)
            _install(prefix)
    return prefix / "node_modules"


def _install(prefix: Path) -> None:
    prefix.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(PACKAGE / name, prefix / name)
    step = [tool("npm"), "ci", "--prefix", str(prefix), "--ignore-scripts", "--no-audit", "--no-fund"]
    done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    assert done.returncode == 0, (f"{' '.join(step)} exited {done.returncode} (is the npm registry reachable?):\n"
                                  f"{done.stdout}\n{done.stderr}")
    (prefix / COMPLETE).write_text("")


def installed(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kafkajs's node_modules, in the pytest cache (a temporary directory under -p no:cacheprovider)."""
    tool("node")
    cache: pytest.Cache | None = getattr(pytestconfig, "cache", None)  # None under -p no:cacheprovider
    root = cache.mkdir("kafkajs") if cache is not None else tmp_path_factory.mktemp("kafkajs")
    return node_modules(root)


def run_script(modules: Path, name: str, broker: BrokerProcess, *args: str, timeout_s: float) -> dict[str, Any]:
    """What tests/kafkajs/``name`` printed, run with ``modules`` against ``broker`` (its bootstrap servers
    first, then ``args``); a test failure showing its output and the broker's if it exits non-zero."""
    env = dict(os.environ, NODE_PATH=str(modules))
    done = subprocess.run([tool("node"), str(PACKAGE / name), broker.bootstrap, *args], env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    shown = (f"stdout:\n{done.stdout[-SHOWN_CHARS_MAX:]}\nstderr:\n{done.stderr[-SHOWN_CHARS_MAX:]}\nbroker:\n"
             f"{''.join(broker.output)[-BROKER_SHOWN_CHARS_MAX:]}")
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{shown}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result

