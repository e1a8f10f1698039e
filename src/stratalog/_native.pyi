# The compiled core (src/native/): what it offers, for type checkers. Each function's Python twin is
# named beside it; stratalog.native says whether the module loaded.

def walk_records(data: bytes | bytearray | memoryview, position: int, count: int) -> int:
    """stratalog.kafka.record_check.walk_records."""
def index_kafka_records(data: bytes | bytearray | memoryview, position: int, count: int, base_timestamp_ms: int,
                        append_timestamp_ms: int | None) -> bytes:
    """stratalog.kafka.record_index.index_kafka_records."""
def index_native_records(data: bytes | bytearray | memoryview, position: int, end: int, count: int) -> bytes:
    """stratalog.engine.record_index.index_native_records."""
