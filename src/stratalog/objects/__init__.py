"""Object storage: one small protocol (put, ranged get, list, delete) and its implementations."""
