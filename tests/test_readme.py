"""README.md's Python examples run as written: each block that needs no server (streams, queues, the
WAL), one after another in one empty directory, as a reader pasting them in turn would run them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
#: Blocks that talk to a broker or Spark: their examples run in the client and Spark tests instead.
NEEDS_A_SERVER = ("bootstrap_servers", "spark", "kafka://")


def local_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    return [b for b in blocks if not any(word in b for word in NEEDS_A_SERVER)]


def test_the_streams_queues_and_wal_examples_run_in_turn_in_one_directory(tmp_path: Path) -> None:
    blocks = local_blocks()
    assert len(blocks) == 3, "the streams, queues and WAL examples"
    for number, block in enumerate(blocks):
        done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, f"README block {number}:\n{block}\n{done.stderr}"
