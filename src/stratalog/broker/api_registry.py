"""The APIs the broker serves, gathered from their modules: what ApiVersions advertises is exactly this."""

from __future__ import annotations

from stratalog.broker import (
    api_admin,
    api_cluster,
    api_epochs,
    api_fetch,
    api_groups,
    api_log,
    api_quotas,
    api_security,
    api_staged,
    api_txn,
    api_txn_admin,
    api_txn_ranges,
)
from stratalog.broker.apis import Api


def all_apis() -> list[Api]:
    """Every API of every handler module."""
    return [api for module in (api_cluster, api_log, api_fetch, api_epochs, api_admin, api_groups, api_security,
                               api_quotas, api_staged, api_txn, api_txn_admin, api_txn_ranges)
            for api in module.APIS]
