"""The Kafka-wire-compatible broker: consumer groups, committed offsets, request handling."""
