"""Whether, and with what credentials, this machine reads a broker's object storage.

A broker advertises its store without credentials (``s3://bucket/prefix?endpoint=...&region=...``): each
reader brings its own, from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in its environment, or from the data
source's options ``s3.accessKey``, ``s3.secretKey`` (and ``s3.endpoint``, ``s3.region`` to reach the same
store by another route). ``unreadable`` tries the store once, as a read will, and says why it cannot.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from stratalog.engine.manifest import ManifestError, read_manifest
from stratalog.objects.uri import redact
from stratalog.spark.options import option
from stratalog.spark.reader import open_store

#: Data source options -> the S3 URI's query parameters they set.
S3_OPTIONS = {"s3.accessKey": "access_key", "s3.secretKey": "secret_key", "s3.endpoint": "endpoint",
              "s3.region": "region"}
NEEDS = ("give its credentials as options s3.accessKey and s3.secretKey (or AWS_ACCESS_KEY_ID and "
         "AWS_SECRET_ACCESS_KEY in the driver's and the executors' environment)")


def with_s3_options(uri: str, options: dict[str, str]) -> str:
    """``uri`` with the s3.* options given set in its query (an S3 URI; any other is returned as it is)."""
    given = {param: value for name, param in S3_OPTIONS.items() if (value := option(options, name)) is not None}
    parts = urlsplit(uri)
    if not given or parts.scheme.lower() != "s3":
        return uri
    query = {k: v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in given}
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode({**query, **given}), ""))


def unreadable(uri: str) -> str | None:
    """None when this machine reads the store at ``uri``; else why not (credentials hidden)."""
    if uri.startswith("file://"):
        path = Path(unquote(urlsplit(uri).path))
        return None if path.is_dir() else f"{path} is not a directory on this machine"
    if not uri.lower().startswith("s3://"):
        return None
    try:
        store = open_store(uri)
    except (ImportError, ValueError) as e:
        return redact(str(e))
    try:
        read_manifest(store)
    except ManifestError:
        return None   # read, and nothing uploaded yet
    except Exception as e:   # no credentials, refused, no route: botocore's and the store's errors alike
        return redact(f"{type(e).__name__}: {e}")
    finally:
        store.close()
    return None
