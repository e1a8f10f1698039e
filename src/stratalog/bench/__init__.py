"""Benchmarks: each measures one component against a plain-syscall reference taken in the same run."""
