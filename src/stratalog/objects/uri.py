"""Open an object store from a URI, the one string a user configures.

    (none)                                     LocalDirStore(data_dir / "objects"), the embedded default
    file:///abs/path                           LocalDirStore("/abs/path")
    s3://bucket[/prefix][?endpoint=URL&region=NAME&access_key=ID&secret_key=KEY]
                                               S3Store; without access_key / secret_key, the credentials
                                               come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore

#: Name of the embedded store's directory under the data directory.
LOCAL_DIR_NAME = "objects"
S3_QUERY_KEYS = frozenset({"endpoint", "region", "access_key", "secret_key"})
_FORMS = "use file:///absolute/path or s3://bucket/prefix?endpoint=URL&region=NAME"


def redact(uri: str) -> str:
    """The URI with its secret key hidden, for messages and logs."""
    without_userinfo = re.sub(r"//[^/?#]*@", "//***@", uri)
    return re.sub(r"(secret_key=)[^&#]*", r"\1***", without_userinfo)


#: The broker config that names its object storage as ``without_credentials`` gives it (DescribeConfigs on
#: the broker resource), so a Spark job given only the broker's address reads uploaded records from objects.
OBJECT_STORE_CONFIG = "stratalog.object.store.uri"


def without_credentials(uri: str | None, data_dir: Path) -> str:
    """The URI of the store ``open_object_store(uri, data_dir)`` opens, fit to show to other processes:
    absolute for a local directory, and without access_key / secret_key (each reader takes its own
    credentials from its environment)."""
    if uri is None:
        return (Path(data_dir).absolute() / LOCAL_DIR_NAME).as_uri()
    parts = urlsplit(uri)
    if parts.scheme.lower() != "s3":
        return uri
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in ("access_key", "secret_key")]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(kept), ""))


def open_object_store(uri: str | None, data_dir: Path) -> ObjectStore:
    """The store ``uri`` names (see the module doc); ValueError, naming the problem, for a bad URI."""
    if uri is None:
        return LocalDirStore(Path(data_dir) / LOCAL_DIR_NAME)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return _open_file(uri, parts.netloc, parts.path, parts.query)
    if scheme == "s3":
        return _open_s3(uri, parts.netloc, parts.path, parts.query, parts.fragment)
    shown = f"{parts.scheme!r}" if parts.scheme else "no scheme"
    raise ValueError(f"object store URI {redact(uri)!r} has {shown}; {_FORMS}")


def _open_file(uri: str, host: str, path: str, query: str) -> LocalDirStore:
    if host not in ("", "localhost"):
        raise ValueError(f"file URI {uri!r} names host {host!r}; a local store needs file:///absolute/path")
    if query:
        raise ValueError(f"file URI {uri!r} takes no query parameters")
    local = Path(unquote(path))
    if not path or not local.is_absolute():
        raise ValueError(f"file URI {uri!r} needs an absolute path: file:///absolute/path")
    return LocalDirStore(local)


def _open_s3(uri: str, host: str, path: str, query: str, fragment: str) -> ObjectStore:
    shown = redact(uri)
    if not host:
        raise ValueError(f"S3 URI {shown!r} names no bucket; use s3://bucket/prefix")
    if "@" in host or ":" in host:
        raise ValueError(f"S3 URI {shown!r}: the part after s3:// must be a bare bucket name; give "
                         "credentials as access_key / secret_key and the server as endpoint=URL")
    if fragment:
        raise ValueError(f"S3 URI {shown!r} has a '#' fragment, which means nothing here")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ValueError(f"S3 URI {shown!r} has a malformed query: {exc}") from exc
    params: dict[str, str] = {}
    for name, value in pairs:
        if name not in S3_QUERY_KEYS:
            raise ValueError(f"S3 URI {shown!r} has unknown parameter {name!r}; known: {sorted(S3_QUERY_KEYS)}")
        if name in params:
            raise ValueError(f"S3 URI {shown!r} gives {name!r} twice")
        params[name] = value
    # Imported here: boto3 is the optional 's3' extra, and a local store must work without it.
    try:
        from stratalog.objects.s3 import DEFAULT_REGION, S3Store
    except ImportError as exc:
        raise ImportError(f"S3 URI {shown!r} needs boto3: pip install 'stratalog[s3]' ({exc})") from exc

    return S3Store(
        host,
        unquote(path).lstrip("/"),
        endpoint_url=params.get("endpoint") or None,
        region=params.get("region") or DEFAULT_REGION,
        access_key=params.get("access_key"),
        secret_key=params.get("secret_key"),
    )
