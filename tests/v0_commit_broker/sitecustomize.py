"""Loaded at the start of a `stratalog serve` whose PYTHONPATH names this directory: the broker serves
StratalogCommitStaged v0 only, as a broker from before per-partition answers did, for the driver's version
negotiation test (test_spark_commit_versions.py)."""

import dataclasses

from stratalog.broker import api_staged

api_staged.APIS[:] = [dataclasses.replace(api, max_version=0) if api.key == api_staged.API_KEY else api
                      for api in api_staged.APIS]
