"""The stack's payload bucket (``sluice.features.pointers.PayloadObjects``) on S3.

Objects are put with ``ChecksumAlgorithm=SHA256``: S3 checks the bytes on arrival and keeps the
checksum, which ``HeadObject`` with ``ChecksumMode=ENABLED`` returns, so the launcher checks a pointer
without reading the object. An object S3 keeps no full-object SHA-256 for (put without it, or a
multipart upload's composite checksum) is read and hashed instead, at most the size the pointer gives
plus one byte.

Errors: a missing object or bucket is ``NotFound``; throttling (``SlowDown``) and 5xx are
``TransientError``; access denied and any other refusal are ``ConfigurationError``. The launcher's
role has ``s3:ListBucket`` on the bucket, so S3 answers a missing key with 404 rather than 403.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from botocore.exceptions import ClientError, IncompleteReadError

from sluice.adapters.errors import error_code, translated
from sluice.core.errors import ConfigurationError, NotFound, TransientError
from sluice.features.pointers import StoredObject

MISSING = frozenset({"404", "NoSuchKey", "NoSuchBucket", "NotFound"})
CHUNK = 1024 * 1024


class S3PayloadObjects:
    def __init__(self, client: Any, bucket: str) -> None:
        """``client``: a boto3 S3 client, or a function that makes one at the first call, so that a
        launcher that never meets a pointer or a large output never pays for it at a cold start."""
        self._client = client
        self._bucket = bucket

    @property
    def client(self) -> Any:
        if callable(self._client):
            self._client = self._client()
        return self._client

    @property
    def bucket(self) -> str:
        return self._bucket

    def put(self, key: str, body: bytes, *, sha256: str) -> None:
        with self._translated("PutObject", key):
            response = self.client.put_object(
                Bucket=self._bucket,
                Key=key,
                Body=body,
                ChecksumAlgorithm="SHA256",
                ServerSideEncryption="AES256",
                ContentType="application/json",
            )
        stored = _hex(response.get("ChecksumSHA256"))
        if stored is not None and stored != sha256:
            raise TransientError(
                f"PutObject s3://{self._bucket}/{key}: S3 computed SHA-256 {stored}, expected {sha256}",
                operation="PutObject",
                code="ChecksumMismatch",
            )

    def head(self, key: str) -> StoredObject:
        with self._translated("HeadObject", key):
            response = self.client.head_object(Bucket=self._bucket, Key=key, ChecksumMode="ENABLED")
        checksum = None if response.get("ChecksumType") == "COMPOSITE" else response.get("ChecksumSHA256")
        return StoredObject(int(response["ContentLength"]), _hex(checksum))

    def digest(self, key: str, *, limit: int) -> StoredObject:
        request: dict[str, Any] = {"Bucket": self._bucket, "Key": key}
        if limit > 0:
            request["Range"] = f"bytes=0-{limit}"  # one byte past the size: enough to see it is longer
        hasher, size = hashlib.sha256(), 0
        with self._translated("GetObject", key):
            stream = self.client.get_object(**request)["Body"]
            try:
                while size <= limit and (chunk := stream.read(min(CHUNK, limit + 1 - size))):
                    hasher.update(chunk)
                    size += len(chunk)
            finally:
                stream.close()
        return StoredObject(size, hasher.hexdigest())

    @contextmanager
    def _translated(self, operation: str, key: str) -> Iterator[None]:
        where = f"s3://{self._bucket}/{key}"
        try:
            with translated(operation):
                try:
                    yield
                except ClientError as exc:
                    if error_code(exc) in MISSING:
                        raise NotFound(error_code(exc)) from exc
                    raise
                except IncompleteReadError as exc:  # the body ended early: a network fault
                    raise TransientError(str(exc), operation=operation, code="IncompleteRead") from exc
        except NotFound as exc:  # a 404 of S3's: the object or bucket is missing
            raise NotFound(f"{operation} {where}: {exc}") from exc.__cause__
        except TransientError as exc:
            raise TransientError(f"{where}: {exc}", operation=operation, code=exc.code) from exc.__cause__
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"{where}: {exc} (the role needs s3:GetObject and s3:ListBucket on the payload bucket, "
                "a producer s3:PutObject)"
            ) from exc.__cause__


def _hex(checksum: str | None) -> str | None:
    """S3's base64 SHA-256 as hex; None when absent or not a whole-object digest (``abc...=-3``)."""
    if not checksum or "-" in checksum:
        return None
    try:
        raw = base64.b64decode(checksum, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None
