"""Crash harnesses: a child process writes, the parent kills it at a random moment and checks what survived.

``stratalog.chaos.wal`` runs the write-ahead log under ``kill -9``; ``stratalog.chaos.wal_child`` is the
writer it starts. Nothing is imported here, so starting a child loads only what the child needs.
"""
