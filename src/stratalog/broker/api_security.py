"""The security APIs: SaslHandshake, SaslAuthenticate, CreateAcls, DescribeAcls, DeleteAcls,
DescribeUserScramCredentials, AlterUserScramCredentials.

A SASL login is SaslHandshake (the mechanism) then one SaslAuthenticate per token of the exchange
(``sasl.py``). A failed login is answered SASL_AUTHENTICATION_FAILED with one message whatever failed,
after ``authentication_failure_delay_ms`` (a guesser waits for each try), and its connection closes.
The ACL APIs answer SECURITY_DISABLED while the authorizer is off, as Kafka's do.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import (
    Acl,
    AclFilter,
    InvalidAclError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from stratalog.broker.apis import Api
from stratalog.broker.credentials import CredentialError, ScramMechanism, check_user_name, credential_from_salted
from stratalog.broker.sasl import FAILED_MESSAGE, AuthenticationFailedError, start_exchange
from stratalog.broker.session import Session
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker")


async def sasl_handshake(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    offered = list(broker.config.sasl_mechanisms)
    if not session.listener.protocol.sasl or session.authenticated or session.sasl is not None:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": offered}
    mechanism = request.body.mechanism
    if mechanism not in offered:
        return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": offered}
    session.sasl = start_exchange(mechanism, broker.credentials, broker.sasl_secret)
    return {"error_code": ErrorCode.none, "mechanisms": offered}


async def sasl_authenticate(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    exchange = session.sasl
    if exchange is None or session.authenticated:
        session.close_after_response = True
        return {"error_code": ErrorCode.illegal_sasl_state, "error_message": "SaslHandshake first, once",
                "auth_bytes": b""}
    try:
        # Off the loop: PLAIN hashes the password (PBKDF2), and both read the credential table.
        token = await asyncio.to_thread(exchange.step, bytes(request.body.auth_bytes))
    except AuthenticationFailedError as e:
        log.warning("authentication failed: connection from %s on %s, %s (%s)", session.host,
                    session.listener.name, exchange.mechanism, e.reason)
        session.close_after_response = True
        await asyncio.sleep(broker.config.authentication_failure_delay_ms / 1000)
        return {"error_code": ErrorCode.sasl_authentication_failed, "error_message": FAILED_MESSAGE,
                "auth_bytes": b""}
    if exchange.principal is not None:
        session.principal = exchange.principal
        session.authenticated = True
        log.info("connection from %s on %s authenticated as %s (%s)", session.host, session.listener.name,
                 session.principal, exchange.mechanism)
    return {"error_code": ErrorCode.none, "error_message": None, "auth_bytes": token, "session_lifetime": 0}


# ACLs ---------------------------------------------------------------------------------------------------

def _not_authorized(session: Session, what: str) -> str:
    return f"{session.principal} is not authorized to {what} (it needs an ACL on the cluster)"


def _security_disabled(broker: Broker) -> str | None:
    if broker.authorizer.enabled:
        return None
    return "no authorizer is configured: start the broker with ACLs on ([authorizer] enabled = true, or --acls)"


def _filter(fields: Any) -> AclFilter:
    """The filter of DescribeAcls, or one of DeleteAcls's filters: both name their fields alike."""
    try:
        return AclFilter(
            resource_type=ResourceType(fields.resource_type_filter),
            resource_name=fields.resource_name_filter,
            # v0 knew only literal names
            pattern_type=PatternType(getattr(fields, "pattern_type_filter", PatternType.LITERAL)),
            principal=fields.principal_filter, host=fields.host_filter,
            operation=Operation(fields.operation), permission=Permission(fields.permission_type)).check()
    except ValueError as e:
        raise InvalidAclError(str(e)) from None


async def describe_acls(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    disabled = _security_disabled(broker)
    if disabled:
        return {"throttle_time": 0, "error_code": ErrorCode.security_disabled, "error_message": disabled,
                "resources": []}
    if not session.may_cluster(Operation.DESCRIBE):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": _not_authorized(session, "describe ACLs"), "resources": []}
    try:
        selected = _filter(request.body)
    except InvalidAclError as e:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "error_message": str(e), "resources": []}
    resources: dict[tuple[ResourceType, str, PatternType], list[dict[str, Any]]] = {}
    for acl in broker.authorizer.acls(selected):
        resources.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
            {"principal": acl.principal, "host": acl.host, "operation": int(acl.operation),
             "permission_type": int(acl.permission)})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "resources": [
        {"resource_type": int(t), "resource_name": n, "pattern_type": int(p), "acls": acls}
        for (t, n, p), acls in resources.items()]}


async def create_acls(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    creations = request.body.creations
    disabled = _security_disabled(broker)
    if disabled or not session.may_cluster(Operation.ALTER):
        error = ErrorCode.security_disabled if disabled else ErrorCode.cluster_authorization_failed
        message = disabled or _not_authorized(session, "create ACLs")
        return {"throttle_time": 0, "results": [{"error_code": error, "error_message": message} for _ in creations]}
    results: list[dict[str, Any]] = []
    valid: list[Acl] = []
    for c in creations:
        try:
            acl = Acl(ResourceType(c.resource_type), c.resource_name,
                      PatternType(getattr(c, "resource_pattern_type", PatternType.LITERAL)), c.principal, c.host,
                      Operation(c.operation), Permission(c.permission_type)).check()
        except (InvalidAclError, ValueError) as e:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": str(e)})
            continue
        valid.append(acl)
        results.append({"error_code": ErrorCode.none, "error_message": None})
    try:
        await asyncio.to_thread(broker.authorizer.add, valid)
    except InvalidAclError as e:
        for r in results:
            if r["error_code"] == ErrorCode.none:
                r.update(error_code=ErrorCode.invalid_request, error_message=str(e))
    return {"throttle_time": 0, "results": results}


async def delete_acls(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    filters = request.body.filters
    disabled = _security_disabled(broker)
    if disabled or not session.may_cluster(Operation.ALTER):
        error = ErrorCode.security_disabled if disabled else ErrorCode.cluster_authorization_failed
        message = disabled or _not_authorized(session, "delete ACLs")
        return {"throttle_time": 0, "filter_results": [
            {"error_code": error, "error_message": message, "matching_acls": []} for _ in filters]}
    results: list[dict[str, Any]] = []
    for f in filters:
        try:
            selected = _filter(f)
        except InvalidAclError as e:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": str(e), "matching_acls": []})
            continue
        removed = await asyncio.to_thread(broker.authorizer.remove, selected)
        results.append({"error_code": ErrorCode.none, "error_message": None, "matching_acls": [
            {"error_code": ErrorCode.none, "error_message": None, "resource_type": int(a.resource_type),
             "resource_name": a.resource_name, "pattern_type": int(a.pattern_type), "principal": a.principal,
             "host": a.host, "operation": int(a.operation), "permission_type": int(a.permission)}
            for a in removed]})
    return {"throttle_time": 0, "filter_results": results}


# SCRAM credentials through the admin API ----------------------------------------------------------------

async def describe_user_scram_credentials(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    if not session.may_cluster(Operation.DESCRIBE):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "error_message": None,
                "results": []}
    users = await asyncio.to_thread(broker.credentials.users)
    wanted = [u.name for u in request.body.users] if request.body.users else sorted(users)
    results = []
    for name in dict.fromkeys(wanted):
        if name in users:
            results.append({"user": name, "error_code": ErrorCode.none, "error_message": None, "credential_infos": [
                {"mechanism": m.number, "iterations": i} for m, i in users[name]]})
        else:
            results.append({"user": name, "error_code": ErrorCode.resource_not_found,
                            "error_message": f"no SCRAM credential for user {name!r}", "credential_infos": []})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "results": results}


async def alter_user_scram_credentials(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    names = [d.name for d in body.deletions] + [u.name for u in body.upsertions]
    if not session.may_cluster(Operation.ALTER):
        return {"throttle_time": 0, "results": [
            {"user": n, "error_code": ErrorCode.cluster_authorization_failed, "error_message": None}
                            for n in dict.fromkeys(names)]}
    errors: dict[str, tuple[ErrorCode, str]] = {}
    seen: set[tuple[str, int]] = set()
    for entry in (*body.deletions, *body.upsertions):
        key = (entry.name, entry.mechanism)
        if key in seen:
            errors[entry.name] = (ErrorCode.duplicate_resource, "a user's mechanism is named twice in one request")
        seen.add(key)
        if ScramMechanism.numbered(entry.mechanism) is None:
            errors.setdefault(entry.name, (ErrorCode.unsupported_sasl_mechanism,
                                           f"unknown SCRAM mechanism {entry.mechanism}"))

    def apply() -> None:
        for d in body.deletions:
            mechanism = ScramMechanism.numbered(d.mechanism)
            if d.name in errors or mechanism is None:
                continue
            if not broker.credentials.remove(d.name, mechanism):
                errors[d.name] = (ErrorCode.resource_not_found, f"user {d.name!r} has no {mechanism.sasl_name}")
        for u in body.upsertions:
            mechanism = ScramMechanism.numbered(u.mechanism)
            if u.name in errors or mechanism is None:
                continue
            try:
                broker.credentials.put(check_user_name(u.name), credential_from_salted(
                    mechanism, bytes(u.salt), u.iterations, bytes(u.salted_password)))
            except CredentialError as e:
                errors[u.name] = (ErrorCode.unacceptable_credential, str(e))

    await asyncio.to_thread(apply)
    return {"throttle_time": 0, "results": [{"user": n, "error_code": errors.get(n, (ErrorCode.none, None))[0],
                         "error_message": errors.get(n, (ErrorCode.none, None))[1]} for n in dict.fromkeys(names)]}


APIS = (
    Api(ApiKey.SASL_HANDSHAKE, "SaslHandshake", 1, 1, sasl_handshake, ordered=True),
    Api(ApiKey.SASL_AUTHENTICATE, "SaslAuthenticate", 0, 2, sasl_authenticate, ordered=True),
    Api(ApiKey.DESCRIBE_ACLS, "DescribeAcls", 0, 3, describe_acls),
    Api(ApiKey.CREATE_ACLS, "CreateAcls", 0, 3, create_acls, ordered=True),
    Api(ApiKey.DELETE_ACLS, "DeleteAcls", 0, 3, delete_acls, ordered=True),
    Api(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, "DescribeUserScramCredentials", 0, 0,
        describe_user_scram_credentials),
    Api(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, "AlterUserScramCredentials", 0, 0, alter_user_scram_credentials,
        ordered=True),
)
