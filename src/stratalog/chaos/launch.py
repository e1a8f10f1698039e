"""Servers the harnesses start (PostgreSQL, SeaweedFS) die with them: a test run or a harness killed with
-9 leaves no server behind."""

from __future__ import annotations

import shutil
from collections.abc import Sequence


def dying_with_parent(argv: Sequence[str], user: str | None = None) -> list[str]:
    """``argv`` run so that Linux kills it (SIGKILL) when the thread that started it dies
    (PR_SET_PDEATHSIG), as ``user`` if given. setpriv (util-linux) execs the command itself, so a kill of
    the started process is a kill of the server, and sets the signal after its change of user (which
    clears it). Without setpriv, and no user to change to, ``argv`` runs as it is."""
    as_user = [f"--reuid={user}", f"--regid={user}", "--init-groups"] if user else []
    if user or shutil.which("setpriv"):
        return ["setpriv", *as_user, "--pdeathsig", "KILL", "--", *argv]
    return list(argv)
