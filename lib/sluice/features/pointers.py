"""Payloads too large for a message: stored in the stack's bucket, sent as a pointer.

A pointer is a message body of this shape (docs/protocol.md, "Stored payloads")::

    {"id": "scene-42",                                  optional: the payload key, as for any payload
     "sluicePayload": {"uri": "s3://<bucket>/<key>",    the object holding the payload
                       "sha256": "<64 hex digits>",     SHA-256 of the object's bytes
                       "size": 614400}}                 the object's size in bytes

``sluice enqueue`` stores a body over the threshold under ``payloads/<sha256>``, so the key is a
function of the content: enqueueing the same payload again writes the same object (and starts its
expiry again), never a second one. A producer without Sluice may store the object under any key of
the stack's bucket and send the pointer itself.

The launcher checks a pointer where it validates a message, before any claim: well formed, in the
stack's bucket, the object there, of that size and that SHA-256 (S3's stored full-object checksum
when it has one, else the object read and hashed, at most ``size`` bytes). Anything else is bad
input (``InvalidPayload``): dead-lettered with the reason, like any other. A throttled or failing S3
is a ``TransientError``: the message goes back to the queue for a later tick. The workflow's input
is the pointer itself; the workflow reads the object (docs/deploy.md, "Stored payloads").
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from sluice.core.errors import InvalidPayload, NotFound
from sluice.core.model import Payload
from sluice.core.validation import parse_object

POINTER_FIELD = "sluicePayload"
KEY_PREFIX = "payloads/"
SQS_MAX_BYTES = 262_144  # a message, body plus attributes; also the Step Functions input limit
# What a message needs besides its body: the ``sluice-key`` attribute at its 1,024-byte maximum with
# its name and type, and the attributes Sluice adds when it sends a parked message back.
MESSAGE_RESERVE = 2_048
DEFAULT_THRESHOLD = SQS_MAX_BYTES - MESSAGE_RESERVE  # 260,096 bytes
MAX_STORED_BYTES = 5 * 1024**3  # PutObject's limit for one request
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class PayloadObjects(Protocol):
    """The stack's payload bucket. Raises only ``sluice.core.errors``: ``NotFound`` for a missing object,
    ``TransientError`` for throttling and S3 faults, ``ConfigurationError`` for setup problems."""

    @property
    def bucket(self) -> str: ...

    def put(self, key: str, body: bytes, *, sha256: str) -> None:
        """Store ``body`` under ``key``, encrypted, with S3 keeping its SHA-256 checksum."""
        ...

    def head(self, key: str) -> StoredObject:
        """Size and, when S3 stored one, the full-object SHA-256 of ``key``."""
        ...

    def digest(self, key: str, *, limit: int) -> StoredObject:
        """Read ``key`` and hash it: at most ``limit`` + 1 bytes are read (enough to see it is longer)."""
        ...


@dataclass(frozen=True, slots=True)
class StoredObject:
    size: int
    sha256: str | None  # hex; None when S3 keeps no full-object SHA-256 for it


@dataclass(frozen=True, slots=True)
class Pointer:
    bucket: str
    key: str
    sha256: str
    size: int

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def body(self, payload_key: str | None = None) -> str:
        """The message body that carries this pointer (``id``: the payload key, when given)."""
        obj: dict[str, Any] = {"id": payload_key} if payload_key else {}
        obj[POINTER_FIELD] = {"uri": self.uri, "sha256": self.sha256, "size": self.size}
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def object_key(sha256: str) -> str:
    return f"{KEY_PREFIX}{sha256}"


def store(objects: PayloadObjects, body: bytes) -> Pointer:
    """Put ``body`` in the bucket under a key made of its SHA-256; return its pointer."""
    digest = hashlib.sha256(body).hexdigest()
    key = object_key(digest)
    objects.put(key, body, sha256=digest)
    return Pointer(objects.bucket, key, digest, len(body))


def pointer_of(obj: dict[str, Any]) -> Pointer | None:
    """The pointer a parsed body carries, None for a plain payload; ``InvalidPayload`` when it is
    not a pointer as docs/protocol.md describes it."""
    if POINTER_FIELD not in obj:
        return None
    spec = obj[POINTER_FIELD]
    other = sorted(set(obj) - {POINTER_FIELD, "id"})
    if other:
        _malformed(f"a pointer carries no other field than 'id', found {', '.join(map(repr, other[:3]))}")
    if "id" in obj and not (isinstance(obj["id"], str) and obj["id"]):
        _malformed("'id' must be a non-empty string")
    if not isinstance(spec, dict):
        _malformed(f"{POINTER_FIELD!r} must be an object with uri, sha256 and size")
    missing = [f for f in ("uri", "sha256", "size") if f not in spec]
    if missing:
        _malformed(f"{POINTER_FIELD!r} lacks {', '.join(missing)}")
    extra = sorted(set(spec) - {"uri", "sha256", "size"})
    if extra:
        _malformed(f"{POINTER_FIELD!r} has unknown field(s) {', '.join(map(repr, extra[:3]))}")
    uri, sha256, size = spec["uri"], spec["sha256"], spec["size"]
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        _malformed("uri must be a string s3://<bucket>/<key>")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket) or not key:
        _malformed(f"uri {_shown(uri)} is not s3://<bucket>/<key>")
    if len(key.encode("utf-8", "surrogatepass")) > 1_024:
        _malformed("the object key is longer than S3's 1,024 bytes")
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        _malformed("sha256 must be 64 lowercase hexadecimal digits")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_STORED_BYTES:
        _malformed(f"size must be a whole number of bytes from 0 to {MAX_STORED_BYTES:,}")
    return Pointer(bucket, key, sha256, size)


def check_pointer(payload: Payload, objects: PayloadObjects | None) -> Pointer | None:
    """Check the pointer ``payload`` carries, if any, against the object it names.

    Returns the pointer (None for a plain payload). Raises ``InvalidPayload`` (with the payload's
    key, so the refusal is recorded) for a malformed pointer, a pointer outside the stack's bucket,
    a missing object, or an object whose size or SHA-256 differ; ``TransientError`` when S3
    throttles or fails, leaving the message for a later tick.
    """
    # A plain payload never spells the field: not literally, and not with a \\u escape either.
    if POINTER_FIELD not in payload.body and "\\u" not in payload.body:
        return None
    try:
        pointer = pointer_of(parse_object(payload.body))
        if pointer is not None:
            _check_object(pointer, objects)
    except InvalidPayload as exc:
        exc.key = payload.key
        raise
    return pointer


def _check_object(pointer: Pointer, objects: PayloadObjects | None) -> None:
    if objects is None:
        raise InvalidPayload(
            f"a pointer to a stored payload ({_shown(pointer.uri)}), but this stack has no payload "
            "bucket (SLUICE_PAYLOAD_BUCKET)"
        )
    if pointer.bucket != objects.bucket:
        raise InvalidPayload(
            f"pointer names bucket {pointer.bucket!r}; this stack reads stored payloads from "
            f"{objects.bucket!r} only"
        )
    where = _shown(pointer.uri)
    try:
        stored = objects.head(pointer.key)
    except NotFound:
        raise InvalidPayload(
            f"stored payload {where} does not exist (never stored, deleted, or expired)"
        ) from None
    if stored.size != pointer.size:
        raise InvalidPayload(
            f"stored payload {where} is {stored.size:,} bytes; the pointer says {pointer.size:,}"
        )
    if stored.sha256 is None:  # stored without a SHA-256 checksum: read it and hash it
        try:
            stored = objects.digest(pointer.key, limit=pointer.size)
        except NotFound:
            raise InvalidPayload(f"stored payload {where} does not exist (deleted while checked)") from None
        if stored.size != pointer.size:
            raise InvalidPayload(
                f"stored payload {where} is {stored.size:,} bytes or more; the pointer says {pointer.size:,}"
            )
    if stored.sha256 != pointer.sha256:
        raise InvalidPayload(
            f"stored payload {where} has SHA-256 {stored.sha256}; the pointer says {pointer.sha256} "
            "(the object was changed after the pointer was made)"
        )


def _malformed(why: str) -> NoReturn:
    raise InvalidPayload(f"malformed pointer ({POINTER_FIELD}): {why}")


def _shown(text: str) -> str:
    return text if len(text) <= 200 else f"{text[:197]}..."
