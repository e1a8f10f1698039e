"""stratalog: a durable, fast store for millions of append-only streams."""

__version__ = "0.1.0"
