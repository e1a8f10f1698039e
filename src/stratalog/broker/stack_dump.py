"""What a running broker is doing, on request: ``kill -USR1 <pid>`` prints the stack of every thread and of
every asyncio task to stderr, as a JVM prints its threads on SIGQUIT. For a broker that seems stuck: a
task waiting on a worker thread shows where it waits, and the thread shows what holds it up.

The dump starts with :data:`DUMP_START` and ends with :data:`DUMP_END` lines, so a harness that reads the
broker's output knows when it has all of it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import traceback
from typing import TextIO

DUMP_START = "--- stacks of stratalog broker (pid {pid})"
DUMP_END = "--- end of stacks"
#: Frames shown per asyncio task (the innermost): a task's stack is its chain of awaits.
TASK_FRAMES_MAX = 20


def dump_stacks(out: TextIO | None = None) -> None:
    """Write every thread's stack, then every asyncio task's (when called on a running loop), to ``out``
    (stderr by default)."""
    out = out or sys.stderr
    print(DUMP_START.format(pid=os.getpid()), file=out)
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sorted(sys._current_frames().items()):
        print(f"thread {names.get(ident, '?')} ({ident}):", file=out)
        out.writelines(traceback.format_stack(frame))
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:   # no running loop in this thread
        tasks = set()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"task {task.get_name()} ({task.get_coro()!r}):", file=out)
        for frame in task.get_stack(limit=TASK_FRAMES_MAX):
            out.writelines(traceback.format_stack(frame, limit=1))
    print(DUMP_END, file=out, flush=True)
