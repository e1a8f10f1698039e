"""A harness killed with -9 (a test run stopped by its CI's timeout, an operator's kill) leaves no server
behind: PostgreSQL and SeaweedFS ask Linux to kill them when the thread that started them dies."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from waiting import wait_until

#: Starts one server, prints its process id and its directory, then waits to be killed.
HARNESS = {
    "postgres": (
        "import sys\n"
        "from stratalog.chaos.postgres import running_postgres\n"
        "with running_postgres() as pg:\n"
        "    print(pg.process.pid, pg.root, flush=True)\n"
        "    sys.stdin.read()\n"
    ),
    "seaweedfs": (
        "import sys\n"
        "from pathlib import Path\n"
        "from stratalog.chaos.cluster_process import seaweed_server\n"
        "with seaweed_server(Path(sys.argv[1])) as weed:\n"
        "    print(weed.process.pid, sys.argv[1], flush=True)\n"
        "    sys.stdin.read()\n"
    ),
}


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by whoever inherited it counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("server", sorted(HARNESS))
def test_a_server_dies_with_the_harness_that_started_it(server: str, tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", HARNESS[server], str(tmp_path / "weed")],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as harness:
        assert harness.stdout is not None
        pid_text, _, directory = harness.stdout.readline().strip().partition(" ")
        try:
            assert pid_text, f"the harness did not start {server}"
            pid = int(pid_text)
            assert not gone(pid)
            harness.kill()
            harness.wait()
            wait_until(lambda: gone(pid), f"{server} (pid {pid}) to die with its harness")
        finally:
            harness.kill()
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
