"""An environment of its own for each app of tests/apps/: a virtual environment made from the app's
requirements file (tests/apps/NAME.txt) with pip, once, and reused while the file is unchanged.

Why not the suite's own environment (pyproject.toml's test extra): each framework caps a package that
stratalog runs on. quixstreams (3.28.1, its newest release) holds confluent-kafka below 2.13, and stratalog's
admin commands call Producer.close, new in 2.13 (`stratalog produce` fails on 2.12); faust-streaming holds
click, the command line's library, below 8.4. Installed beside the suite, they would take those back for
every test.

The environments live under the suite's own (``sys.prefix``/apps: made and removed with .venv), named by
the requirements file and its digest; a lock lets one test run make an environment while another waits
for it, and a marker written last tells a finished environment from one a killed run left half made.
appkit.py runs each app with its environment's interpreter.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

APPS = Path(__file__).parent / "apps"
#: Making an environment downloads a few tens of MB on a fresh machine: generous for a slow mirror.
INSTALL_TIMEOUT_S = 900
#: Written once pip has finished: an environment without it is made again.
COMPLETE = "stratalog-app-env-complete"


def app_python(name: str) -> Path:
    """The interpreter of the environment of ``tests/apps/<name>.txt``, made first if need be."""
    requirements = APPS / f"{name}.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    root = Path(sys.prefix) / "apps"
    root.mkdir(exist_ok=True)
    env = root / f"{name}-{digest}"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)    # released when the file closes, also if this process dies
        if not (env / COMPLETE).exists():
            shutil.rmtree(env, ignore_errors=True)
            _make(env, requirements)
    return env / "bin" / "python"


def _make(env: Path, requirements: Path) -> None:
    """The environment without a pip of its own, filled by the suite's pip (``--python``), its modules left
    to be compiled as they are first imported: 6 s instead of 20 for faust's, most of which went to
    installing pip into it and compiling every module of every package."""
    python = env / "bin" / "python"
    for step in ([sys.executable, "-m", "venv", "--without-pip", str(env)],
                 [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile",
                  "--disable-pip-version-check", "-r", str(requirements)]):
        done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        assert done.returncode == 0, f"{' '.join(step)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    (env / COMPLETE).write_text(requirements.read_text())
