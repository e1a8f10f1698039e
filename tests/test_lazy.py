"""The engine's, the WAL's and the queues' packages import their names when first asked for
(stratalog/lazy.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import stratalog.engine
import stratalog.queues
import stratalog.wal


def _modules_after(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", f"import sys; {code}; print(' '.join(sys.modules))"],
                          capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_a_format_module_alone_brings_neither_store_nor_log() -> None:
    loaded = _modules_after("import stratalog.engine.batch")
    assert "stratalog.engine.batch" in loaded
    assert not loaded & {"stratalog.engine.store", "stratalog.wal.log", "stratalog.wal.object_wal"}


def test_a_name_of_the_package_is_imported_when_asked_for() -> None:
    assert "stratalog.engine.store" in _modules_after("from stratalog.engine import StreamStore")


def test_a_format_module_of_the_queues_alone_brings_neither_store_nor_engine() -> None:
    loaded = _modules_after("from stratalog.queues import format")
    assert "stratalog.queues.format" in loaded
    assert not loaded & {"stratalog.queues.store", "stratalog.queues.recovery", "stratalog.engine.store"}
    assert "stratalog.queues.store" in _modules_after("from stratalog.queues import QueueStore")


@pytest.mark.parametrize("package", [stratalog.engine, stratalog.wal, stratalog.queues])
def test_every_name_exported_is_there_and_no_other(package: object) -> None:
    for name in package.__all__:   # type: ignore[attr-defined]
        value = getattr(package, name)
        assert isinstance(value, int) or value.__name__ == name, name   # the bounds are numbers
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        package.Nope   # type: ignore[attr-defined]  # noqa: B018
