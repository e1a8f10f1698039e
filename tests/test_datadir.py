"""A data directory is one store's: a second open fails at once, from this process or another, and the
lock goes with the process that held it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from enginekit import small_store_config
from queuekit import small_queue_config
from stratalog.datadir import LOCK_FILE_NAME, StoreLockedError, lock_data_dir, prepare_data_dir, unlock_data_dir
from stratalog.engine import StreamStore
from stratalog.queues import QueueStore


def test_a_second_lock_is_refused_until_the_first_is_let_go(tmp_path: Path) -> None:
    fd = lock_data_dir(tmp_path)
    with pytest.raises(StoreLockedError, match="open in another process"):
        lock_data_dir(tmp_path)
    unlock_data_dir(fd)
    unlock_data_dir(lock_data_dir(tmp_path))
    assert (tmp_path / LOCK_FILE_NAME).exists()


def test_the_lock_goes_with_a_process_killed_holding_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from stratalog.datadir import lock_data_dir;"
         "lock_data_dir(Path(sys.argv[1])); print('locked', flush=True); sys.stdin.read()", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(StoreLockedError):
            lock_data_dir(tmp_path)
    finally:
        holder.kill()
        holder.communicate()
    unlock_data_dir(lock_data_dir(tmp_path))


def test_both_stores_refuse_a_directory_the_other_holds(tmp_path: Path) -> None:
    with StreamStore.open(tmp_path / "d", config=small_store_config()), pytest.raises(StoreLockedError):
        QueueStore.open(tmp_path / "d", config=small_queue_config())
    with QueueStore.open(tmp_path / "e", config=small_queue_config()), pytest.raises(StoreLockedError):
        StreamStore.open(tmp_path / "e", config=small_store_config())


def test_prepare_makes_the_directory_and_its_local_object_store(tmp_path: Path) -> None:
    path, objects = prepare_data_dir(tmp_path / "new" / "dir", None)
    assert path.is_dir()
    objects.put("k", b"v")
    assert objects.get("k") == b"v"
    objects.close()
