"""The broker's own web console (``stratalog serve --console 127.0.0.1:8080``): read-only pages of the
broker, its topics and their recent messages, consumer groups with their lag, and the store, rendered on
the server from the broker's state (no Kafka client loop). ``views`` gathers the data, ``history`` keeps the
last minutes of rates and lag, ``plots`` draws them as SVG, ``app`` routes a request to a page, and
``http`` is the thin server around it.
"""
