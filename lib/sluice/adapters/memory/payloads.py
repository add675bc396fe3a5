"""The payload bucket in memory (``sluice.features.pointers.PayloadObjects``), for tests; not in the Lambda zip."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from sluice.core.errors import NotFound
from sluice.features.pointers import StoredObject


@dataclass
class MemoryPayloadObjects:
    bucket: str = "sluice-test-payloads"
    objects: dict[str, bytes] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)  # key → the SHA-256 kept with a put
    reads: int = 0  # objects read and hashed (no stored checksum)

    def put(self, key: str, body: bytes, *, sha256: str) -> None:
        self.objects[key] = body
        self.checksums[key] = hashlib.sha256(body).hexdigest()

    def replace(self, key: str, body: bytes) -> None:
        """Overwrite an object as a writer without a checksum would: S3 then keeps no SHA-256."""
        self.objects[key] = body
        self.checksums.pop(key, None)

    def head(self, key: str) -> StoredObject:
        if key not in self.objects:
            raise NotFound(f"HeadObject s3://{self.bucket}/{key}: 404")
        return StoredObject(len(self.objects[key]), self.checksums.get(key))

    def digest(self, key: str, *, limit: int) -> StoredObject:
        if key not in self.objects:
            raise NotFound(f"GetObject s3://{self.bucket}/{key}: NoSuchKey")
        self.reads += 1
        read = self.objects[key][: limit + 1]
        return StoredObject(len(read), hashlib.sha256(read).hexdigest())
