"""A broker's stacks on SIGUSR1 (broker/stack_dump.py): every thread's and every asyncio task's."""

from __future__ import annotations

import asyncio
import io
import threading
from pathlib import Path

from stratalog.broker.stack_dump import DUMP_END, DUMP_START, dump_stacks
from stratalog.chaos.broker_process import running_broker


async def _waits_for_its_event(event: asyncio.Event) -> None:
    await event.wait()


def _blocked_worker(release: threading.Event) -> None:
    release.wait()


def test_the_dump_shows_where_each_thread_and_each_task_waits() -> None:
    release = threading.Event()
    worker = threading.Thread(target=_blocked_worker, args=(release,), name="held-up-worker")
    worker.start()
    out = io.StringIO()

    async def main() -> None:
        event = asyncio.Event()
        task = asyncio.create_task(_waits_for_its_event(event), name="the-waiting-task")
        await asyncio.sleep(0)   # the task runs up to its await
        dump_stacks(out)
        event.set()
        await task

    try:
        asyncio.run(main())
    finally:
        release.set()
        worker.join()
    said = out.getvalue()
    lines = said.splitlines()
    assert lines[0].startswith(DUMP_START.split("(")[0]) and lines[-1] == DUMP_END
    worker_at = said.index("thread held-up-worker")
    assert "_blocked_worker" in said[worker_at:]
    task_at = said.index("task the-waiting-task")
    assert "_waits_for_its_event" in said[task_at:]


def test_the_dump_outside_a_loop_shows_the_threads() -> None:
    out = io.StringIO()
    dump_stacks(out)
    said = out.getvalue()
    assert "thread MainThread" in said and "test_the_dump_outside_a_loop_shows_the_threads" in said
    assert "task " not in said and said.rstrip().endswith(DUMP_END)


def test_a_running_broker_prints_its_stacks_on_sigusr1_and_serves_on(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data") as broker:
        first = broker.stacks()
        assert "thread MainThread" in first and "task " in first and first.rstrip().endswith(DUMP_END)
        second = broker.stacks()   # a dump leaves the broker as it was: it dumps again, and still serves
        assert second.rstrip().endswith(DUMP_END)
        assert broker.process.poll() is None
