"""The cleaner's child process, started by engine/cleaner_process.py as
``python -m stratalog.engine.cleaner_child FD``: it serves a pass's computing part over the socket FD.
A module of its own, so that the one run as the main module is not also imported by the package."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from stratalog.engine.cleaner_process import serve

if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
