# The compiled core (src/native/): what it offers, for type checkers. Each function's Python twin is
# named beside it; stratalog.native says whether the module loaded.

def walk_records(data: bytes | bytearray | memoryview, position: int, count: int) -> int:
    """stratalog.kafka.record_check.walk_records."""
