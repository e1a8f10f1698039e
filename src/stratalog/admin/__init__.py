"""Kafka admin clients for operators: topics, consumer groups, ACLs, quotas, and a console producer and
consumer. Everything here speaks Kafka's protocol (librdkafka through confluent-kafka, and
``kafka.client`` for the quota APIs librdkafka does not offer), so it works against any Kafka broker as
well as against stratalog. The command line over it is ``stratalog topics|groups|produce|consume|acls|quotas``.
"""
