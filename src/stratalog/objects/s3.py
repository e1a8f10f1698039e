"""An object store on any S3 API (AWS S3, SeaweedFS, MinIO, ...) through boto3.

Needs the ``s3`` extra (``pip install 'stratalog[s3]'``). Objects up to ``multipart_threshold_bytes`` go up
in one PutObject; larger ones as a multipart upload, aborted on any failure so no parts are left behind
(:meth:`S3Store.abort_incomplete_uploads` cleans the ones a crash leaves). Every botocore error becomes an
:class:`~stratalog.objects.store.ObjectStoreError` naming the bucket and key, and saying what to do.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from stratalog.objects.local import check_key, check_range
from stratalog.objects.store import ObjectInfo, ObjectNotFoundError, ObjectStoreError, ObjectStoreFullError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, CopySourceTypeDef

MiB = 1 << 20
#: S3's smallest part (all but the last) and largest part, and most parts in one upload.
PART_BYTES_MIN = 5 * MiB
PART_BYTES_MAX = 5 << 30
PARTS_MAX = 10_000
#: S3's largest single PutObject, and largest object.
PUT_BYTES_MAX = 5 << 30
OBJECT_BYTES_MAX = 5 << 40
#: S3's largest single CopyObject; larger objects are copied as parts (UploadPartCopy) of at least
#: COPY_PART_BYTES (few parts: each is a server-side copy, so large parts cost no memory here).
COPY_BYTES_MAX = 5 << 30
COPY_PART_BYTES = 512 * MiB
#: S3's most keys in one ListObjectsV2 page.
LIST_PAGE_KEYS_MAX = 1000
DEFAULT_REGION = "us-east-1"

#: Error codes meaning "no such object" (HeadObject has no body, so its code is the bare HTTP status).
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_AUTH_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "403",
})

#: The most tries of one request: past this an endpoint that fails is down, not flaky.
ATTEMPTS_MAX = 20
#: S3's bound on a key's length, in UTF-8 bytes.
KEY_BYTES_MAX = 1024


@dataclass(frozen=True, slots=True)
class S3Config:
    """Every bound of the S3 client, with the reason for its default."""

    #: A healthy endpoint accepts a connection in milliseconds; 5 s rides out one lost SYN.
    connect_timeout_s: float = 5.0
    #: Longest silence while waiting for bytes (not a whole-request limit). A loaded server may take
    #: seconds to start answering a large ranged get or to commit a large put.
    read_timeout_s: float = 60.0
    #: Tries per request, the first included. botocore's "standard" mode retries throttling, 5xx and
    #: connection errors with jittered exponential backoff (capped at 20 s between tries).
    attempts_max: int = 5
    retry_mode: Literal["standard", "adaptive", "legacy"] = "standard"
    #: HTTP connections kept open; one per thread that calls the store at once (uploader + block cache).
    pool_connections_max: int = 16
    #: Objects larger than this go up as a multipart upload; smaller ones in one PutObject, which is one
    #: round trip and leaves nothing behind when it fails.
    multipart_threshold_bytes: int = 16 * MiB
    #: Size of each part (grown if an object would need more than 10,000 parts).
    multipart_part_bytes: int = 8 * MiB
    #: Keys per ListObjectsV2 page (S3 answers at most 1000).
    list_page_keys_max: int = LIST_PAGE_KEYS_MAX
    #: Keys one ``list`` call holds in memory to sort them (some S3 API servers, SeaweedFS among them,
    #: page through nested keys in directory-walk order, not key order). List a narrower prefix above it.
    list_keys_max: int = 1_000_000
    #: Path-style URLs (http://endpoint/bucket/key) work with every S3 API server; virtual-host style
    #: (http://bucket.endpoint/key) needs DNS for each bucket. None: path style when an endpoint is given.
    path_style: bool | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first bound that makes no sense."""
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("connect_timeout_s and read_timeout_s must be > 0")
        if not 1 <= self.attempts_max <= ATTEMPTS_MAX:
            raise ValueError(f"attempts_max must be within 1..{ATTEMPTS_MAX}")
        if self.pool_connections_max < 1:
            raise ValueError("pool_connections_max must be >= 1")
        if not PART_BYTES_MIN <= self.multipart_part_bytes <= PART_BYTES_MAX:
            raise ValueError(f"multipart_part_bytes must be within {PART_BYTES_MIN}..{PART_BYTES_MAX} "
                             "(S3's part size limits)")
        if not 0 <= self.multipart_threshold_bytes <= PUT_BYTES_MAX:
            raise ValueError(f"multipart_threshold_bytes must be within 0..{PUT_BYTES_MAX} (S3's largest "
                             "single put)")
        if not 1 <= self.list_page_keys_max <= LIST_PAGE_KEYS_MAX:
            raise ValueError(f"list_page_keys_max must be within 1..{LIST_PAGE_KEYS_MAX}")
        if self.list_keys_max < 1:
            raise ValueError("list_keys_max must be >= 1")


def part_bytes_for(size_bytes: int, part_bytes: int) -> int:
    """The part size for an object: ``part_bytes``, grown so the object fits in 10,000 parts."""
    if size_bytes > OBJECT_BYTES_MAX:
        raise ValueError(f"an object of {size_bytes} bytes is larger than S3 allows ({OBJECT_BYTES_MAX} bytes)")
    return max(part_bytes, -(-size_bytes // PARTS_MAX))


_shared_session: boto3.session.Session | None = None
_shared_session_lock = threading.Lock()


def _new_client(endpoint_url: str | None, access_key: str | None, secret_key: str | None,
                config: Config) -> S3Client:
    """An S3 client; with explicit keys, from one shared session (a fresh one parses botocore's service
    model again: ~70 ms per client instead of ~4 ms)."""
    global _shared_session  # noqa: PLW0603 (one lazily built session for the process)
    if access_key is None:
        # A session caches the credentials it first finds; a fresh one sees the environment as it is now.
        return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
    with _shared_session_lock:  # sessions are not thread-safe; the clients they make are
        if _shared_session is None:
            _shared_session = boto3.session.Session()
        return _shared_session.client("s3", endpoint_url=endpoint_url, aws_access_key_id=access_key,
                                      aws_secret_access_key=secret_key, config=config)


def _content_md5(data: bytes | memoryview) -> str:
    # The server checks the body against it and refuses a damaged one (BadDigest); every S3 API has it,
    # unlike the newer trailing checksums.
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


class S3Store:
    """An :class:`~stratalog.objects.store.ObjectStore` on an S3 bucket, keys under ``prefix``.

    Credentials: ``access_key`` and ``secret_key`` when given, else boto3's usual chain
    (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, then ``~/.aws``, then instance roles).
    A non-empty ``prefix`` gets a trailing '/' so keys sit in their own "directory" of the bucket.
    The store is safe to share between threads (boto3 clients are).
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str = DEFAULT_REGION, access_key: str | None = None,
                 secret_key: str | None = None, config: S3Config | None = None) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"S3 bucket name must be non-empty and contain no '/', got {bucket!r}")
        if (access_key is None) != (secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither (to use AWS_ACCESS_KEY_ID / "
                             "AWS_SECRET_ACCESS_KEY)")
        self.config = config or S3Config()
        self.config.validate()
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else f"{prefix}/"
        path_style = self.config.path_style if self.config.path_style is not None else endpoint_url is not None
        botocore_config = Config(
            region_name=region,
            signature_version="s3v4",
            connect_timeout=self.config.connect_timeout_s,
            read_timeout=self.config.read_timeout_s,
            retries={"total_max_attempts": self.config.attempts_max, "mode": self.config.retry_mode},
            max_pool_connections=self.config.pool_connections_max,
            s3={"addressing_style": "path" if path_style else "virtual"},
            # Content-MD5 guards every body we send (see _content_md5), and every stored block carries its
            # own CRC32C; the trailing checksums botocore adds by default are refused by some S3 APIs.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._client: S3Client = _new_client(endpoint_url, access_key, secret_key, botocore_config)
        self.endpoint_url: str = self._client.meta.endpoint_url

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, prefix={self.prefix!r}, endpoint_url={self.endpoint_url!r})"

    @property
    def client(self) -> S3Client:
        """The boto3 client, for maintenance tools and tests."""
        return self._client

    # ObjectStore protocol ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        full_key = self._full_key(key)
        view = memoryview(data).cast("B")
        if len(view) > self.config.multipart_threshold_bytes:
            self._put_multipart(full_key, view)
            return
        body = data if isinstance(data, bytes) else bytes(view)
        try:
            self._client.put_object(Bucket=self.bucket, Key=full_key, Body=body, ContentMD5=_content_md5(body))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "put", full_key) from exc

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        full_key = self._full_key(key)
        if end is not None and end == start:
            self._head(full_key)  # nothing to read, but a missing object must still say so
            return b""
        try:
            if start == 0 and end is None:
                # No Range header: a ranged get of an empty object is refused (416).
                response = self._client.get_object(Bucket=self.bucket, Key=full_key)
            else:
                last = "" if end is None else str(end - 1)
                response = self._client.get_object(Bucket=self.bucket, Key=full_key, Range=f"bytes={start}-{last}")
            # StreamingBody.read checks the length against Content-Length and raises if it is short.
            return response["Body"].read()
        except ClientError as exc:
            if _error_code(exc) == "InvalidRange":
                return b""  # the range starts at or past the object's end: like a slice, nothing
            raise self._error(exc, "get", full_key) from exc
        except BotoCoreError as exc:
            raise self._error(exc, "get", full_key) from exc

    def size(self, key: str) -> int:
        return self._head(self._full_key(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order (sorted here, see ``list_keys_max``)."""
        full_prefix = self.prefix + prefix
        found: list[ObjectInfo] = []
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=full_prefix,
                                   PaginationConfig={"PageSize": self.config.list_page_keys_max})
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(item["Key"][len(self.prefix):], item["Size"]))
                if len(found) > self.config.list_keys_max:
                    raise ObjectStoreError(
                        f"more than {self.config.list_keys_max} objects under s3://{self.bucket}/{full_prefix}: "
                        "list a narrower prefix, or raise S3Config.list_keys_max"
                    )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "list", full_prefix) from exc
        found.sort(key=lambda info: info.key)
        return iter(found)

    def delete(self, key: str) -> None:
        full_key = self._full_key(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=full_key)
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                return  # S3 answers 204 for an absent key; some S3 APIs answer 404
            raise self._error(exc, "delete", full_key) from exc
        except BotoCoreError as exc:
            raise self._error(exc, "delete", full_key) from exc

    def rename(self, src: str, dst: str) -> None:
        """A server-side copy (CopyObject, or UploadPartCopy parts past ``COPY_BYTES_MAX``), then a delete of
        ``src``: no byte passes through this process. S3 has no atomic rename, so a failure between the
        copy and the delete leaves both keys; ``dst`` is never partial (a copy lands whole or not at all)."""
        src_full, dst_full = self._full_key(src), self._full_key(dst)
        if src_full == dst_full:
            self._head(src_full)
            return
        size_bytes = self._head(src_full)
        source: CopySourceTypeDef = {"Bucket": self.bucket, "Key": src_full}
        if size_bytes <= COPY_BYTES_MAX:
            try:
                self._client.copy_object(Bucket=self.bucket, Key=dst_full, CopySource=source)
            except (ClientError, BotoCoreError) as exc:
                raise self._error(exc, f"copy of s3://{self.bucket}/{src_full} to", dst_full) from exc
        else:
            self._copy_multipart(source, dst_full, size_bytes)
        self.delete(src)

    def close(self) -> None:
        """Close the client's pooled HTTP connections."""
        self._client.close()

    # Maintenance ------------------------------------------------------------------------------------

    def abort_incomplete_uploads(self, prefix: str = "", *, started_before: datetime | None = None) -> int:
        """Abort the multipart uploads under ``prefix`` that a crash left open; return how many.

        Their parts are invisible but stored (and billed) until aborted. ``started_before`` spares
        uploads begun after it (and any whose start the server does not report), so a cleaner can run
        beside live writers; it must be timezone-aware. None aborts every one.
        """
        full_prefix = self.prefix + prefix
        aborted = 0
        paginator = self._client.get_paginator("list_multipart_uploads")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                for upload in page.get("Uploads", []):
                    initiated = upload.get("Initiated")
                    if started_before is not None and (initiated is None or initiated >= started_before):
                        continue  # maybe a live writer's: spare it
                    if self._abort_upload(upload["Key"], upload["UploadId"]) is None:
                        aborted += 1
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "list multipart uploads", full_prefix) from exc
        return aborted

    # Internals --------------------------------------------------------------------------------------

    def _full_key(self, key: str) -> str:
        full_key = self.prefix + check_key(key)
        if len(full_key.encode("utf-8", "surrogatepass")) > KEY_BYTES_MAX:
            raise ValueError(f"key {key!r} with the store's prefix {self.prefix!r} is longer than S3's "
                             f"{KEY_BYTES_MAX} bytes")
        return full_key

    def _head(self, full_key: str) -> int:
        try:
            return self._client.head_object(Bucket=self.bucket, Key=full_key)["ContentLength"]
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "size", full_key) from exc

    def _put_multipart(self, full_key: str, view: memoryview) -> None:
        part_bytes = part_bytes_for(len(view), self.config.multipart_part_bytes)

        def upload(upload_id: str, number: int, start: int) -> str:
            body = bytes(view[start:start + part_bytes])
            return self._client.upload_part(Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumber=number,
                                            Body=body, ContentMD5=_content_md5(body))["ETag"]

        self._multipart(full_key, "multipart put", range(0, len(view), part_bytes), upload)

    def _copy_multipart(self, source: CopySourceTypeDef, full_key: str, size_bytes: int) -> None:
        """Copy an object too large for one CopyObject, as parts copied by the server."""
        part_bytes = part_bytes_for(size_bytes, max(self.config.multipart_part_bytes, COPY_PART_BYTES))

        def copy(upload_id: str, number: int, start: int) -> str:
            last = min(start + part_bytes, size_bytes) - 1
            return self._client.upload_part_copy(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumber=number, CopySource=source,
                CopySourceRange=f"bytes={start}-{last}",
            )["CopyPartResult"]["ETag"]

        self._multipart(full_key, "multipart copy to", range(0, size_bytes, part_bytes), copy)

    def _multipart(self, full_key: str, what: str, starts: range, send_part: Callable[[str, int, int], str]) -> None:
        """One multipart upload: ``send_part(upload_id, number, start)`` for each part start, returning
        the part's ETag; then complete it. On any error the upload is aborted (its parts deleted)."""
        try:
            upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=full_key)["UploadId"]
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, f"start {what}", full_key) from exc
        try:
            parts: list[CompletedPartTypeDef] = [
                {"ETag": send_part(upload_id, number, start), "PartNumber": number}
                for number, start in enumerate(starts, start=1)
            ]
            self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=full_key, UploadId=upload_id, MultipartUpload={"Parts": parts},
            )
        except BaseException as exc:
            abort_error = self._abort_upload(full_key, upload_id)
            if not isinstance(exc, (ClientError, BotoCoreError)):
                raise
            error = self._error(exc, what, full_key)
            if abort_error is not None:
                error = ObjectStoreError(
                    f"{error}; aborting upload {upload_id} failed too ({abort_error}): "
                    "S3Store.abort_incomplete_uploads() removes its parts"
                )
            raise error from exc

    def _abort_upload(self, full_key: str, upload_id: str) -> Exception | None:
        """Abort one multipart upload; return the error if that failed (None when aborted or gone)."""
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)
        except ClientError as exc:
            if _error_code(exc) == "NoSuchUpload":
                return None  # already completed or aborted
            return exc
        except BotoCoreError as exc:
            return exc
        return None

    def _error(self, exc: ClientError | BotoCoreError, action: str, full_key: str) -> ObjectStoreError:
        """The typed error for a botocore failure, naming the object and saying what to do."""
        where = f"s3://{self.bucket}/{full_key} at {self.endpoint_url}"
        if isinstance(exc, BotoCoreError):
            return ObjectStoreError(f"{action} {where}: {self._transport_advice(exc)}")
        code = _error_code(exc)
        if code in _NOT_FOUND_CODES:
            return ObjectNotFoundError(f"no object s3://{self.bucket}/{full_key} at {self.endpoint_url}")
        return _client_error(exc, code, f"{action} {where}", self.bucket)

    def _transport_advice(self, exc: BotoCoreError) -> str:
        """What went wrong below S3 (credentials, network, timeouts), and what to do about it."""
        if isinstance(exc, NoCredentialsError):
            return ("no S3 credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or pass "
                    "access_key / secret_key")
        if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
            return (f"cannot connect after {self.config.attempts_max} attempts ({exc}); check the endpoint "
                    "URL and that the server is up")
        if isinstance(exc, ReadTimeoutError):
            return (f"no answer within {self.config.read_timeout_s} s after {self.config.attempts_max} "
                    "attempts; the server is overloaded or down, retry later")
        return f"failed: {exc}; retry, and check the network and the server if it persists"


def _client_error(exc: ClientError, code: str, what: str, bucket: str) -> ObjectStoreError:
    """The typed error for a server's refusal (``what``: the action and the object), saying what to do."""
    if code == "NoSuchBucket":
        return ObjectStoreError(f"{what}: bucket {bucket!r} does not exist; create it, or "
                                "fix the bucket name in the store URI")
    message = exc.response.get("Error", {}).get("Message", "")
    if code in _AUTH_CODES:
        return ObjectStoreError(f"{what}: access denied ({code}: {message}); check the "
                                "credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or access_key / "
                                "secret_key) and that they may use this bucket")
    if code in ("BadDigest", "InvalidDigest"):
        return ObjectStoreError(f"{what}: the body was damaged on its way to the server and "
                                "was refused; retry")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in _FULL_CODES or status == HTTP_INSUFFICIENT_STORAGE:
        return ObjectStoreFullError(f"{what}: the store is out of room ({code}: {message}, HTTP "
                                    f"{status}); raise the bucket's quota or free space on its servers")
    return ObjectStoreError(f"{what} failed: {code} {message} (HTTP {status}); retry, and "
                            "check the server's health if it persists")


#: What S3 servers answer a put with when they have no room for it: a bucket over its quota (Ceph RGW,
#: SeaweedFS), MinIO's disks full; and HTTP 507 Insufficient Storage, whatever the code.
_FULL_CODES = frozenset({"QuotaExceeded", "XMinioStorageFull", "InsufficientStorage", "StorageFull"})
HTTP_INSUFFICIENT_STORAGE = 507


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
