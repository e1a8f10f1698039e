"""What the broker knows of one connection: the listener it came in on, who the peer is, and how far
its SASL login has gone. Handlers read it to answer for the right listener and to ask the authorizer."""

from __future__ import annotations

from dataclasses import dataclass

from stratalog.broker.acls import Authorizer, Operation, ResourceType
from stratalog.broker.listeners import Listener
from stratalog.broker.sasl import SaslExchange

#: The principal of a client that did not (or need not) authenticate, as Kafka names it.
ANONYMOUS = "User:ANONYMOUS"


@dataclass(slots=True)
class Session:
    listener: Listener
    #: The peer's address (the host ACLs match).
    host: str
    authorizer: Authorizer
    principal: str = ANONYMOUS
    #: False on a SASL listener until SaslAuthenticate succeeds: until then only ApiVersions,
    #: SaslHandshake and SaslAuthenticate are served.
    authenticated: bool = True
    #: The login under way, from SaslHandshake on (None: no handshake yet).
    sasl: SaslExchange | None = None
    #: Close the connection once this response is sent (a failed login, SASL out of order).
    close_after_response: bool = False

    @property
    def user(self) -> str:
        """The principal's name, as quotas know it (``alice`` for ``User:alice``)."""
        return self.principal.partition(":")[2] or self.principal

    def may(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return self.authorizer.allowed(self.principal, self.host, operation, resource_type, name)

    def may_topic(self, operation: Operation, topic: str) -> bool:
        return self.authorizer.allowed(self.principal, self.host, operation, ResourceType.TOPIC, topic)

    def may_group(self, operation: Operation, group: str) -> bool:
        return self.authorizer.allowed(self.principal, self.host, operation, ResourceType.GROUP, group)

    def may_some(self, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether some ACL lets this principal do ``operation`` on some resource of the type."""
        return self.authorizer.allowed_on_some(self.principal, self.host, operation, resource_type)

    def may_create_topic(self, name: str) -> bool:
        """Create on the cluster, or on the topic (Kafka's rule for CreateTopics and auto-creation)."""
        return self.may_cluster(Operation.CREATE) or self.may_topic(Operation.CREATE, name)

    def may_cluster(self, operation: Operation) -> bool:
        return self.authorizer.allowed(self.principal, self.host, operation, ResourceType.CLUSTER, "kafka-cluster")
