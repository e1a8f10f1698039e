"""Crash harnesses: a child process writes, the parent kills it at a random moment and checks what survived.

``stratalog.chaos.wal`` runs the write-ahead log under ``kill -9``, ``stratalog.chaos.engine`` the stream
store; ``wal_child`` and ``engine_child`` are the writers they start. Both harnesses run their child
through ``child`` and their rounds through ``harness``; both children report through ``lines`` and
derive their records with ``mix``. Nothing is imported here, so starting a child loads only what the
child needs.
"""
