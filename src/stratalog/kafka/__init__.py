"""A Kafka-wire-compatible broker over the engine: protocol codecs and record batches (sans-I/O)."""
