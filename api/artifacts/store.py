"""Content-addressed artifact store on the filesystem: `<root>/ab/cd/<sha256>`.

Bytes go to a temporary file while they are hashed and counted; only a complete file whose
digest matches the one the client declared is fsynced and renamed into place, so a reader never
sees a partial or unverified blob.
"""

from __future__ import annotations

import hmac
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

from api.errors import Invalid, TooLarge
from evidence.canonical import sha256_file, sha256_hex

SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    bytes: int
    storage_path: str  # relative to the store root


class _Hashing:
    """A temporary file that hashes and counts what is written, refusing past max_bytes."""

    def __init__(self, tmp_dir: Path, max_bytes: int) -> None:
        import hashlib

        self.digest = hashlib.sha256()
        self.size = 0
        self.max_bytes = max_bytes
        fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="upload-")
        self.path = Path(name)
        self.handle = os.fdopen(fd, "wb")

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise TooLarge(f"artifact exceeds the limit of {self.max_bytes} bytes")
        self.digest.update(chunk)
        self.handle.write(chunk)

    def discard(self) -> None:
        self.handle.close()
        self.path.unlink(missing_ok=True)


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tmp_dir = self.root / "tmp"

    def storage_path(self, sha256: str) -> str:
        if not SHA256_PATTERN.fullmatch(sha256):
            raise Invalid(f"not a sha256 hex digest: {sha256!r}")
        return f"{sha256[:2]}/{sha256[2:4]}/{sha256}"

    def path(self, sha256: str) -> Path:
        return self.root / self.storage_path(sha256)

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def _open_upload(self, max_bytes: int) -> _Hashing:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        return _Hashing(self.tmp_dir, max_bytes)

    def _commit(self, upload: _Hashing, expected_sha256: str | None) -> StoredBlob:
        actual = upload.digest.hexdigest()
        if expected_sha256 is not None and not hmac.compare_digest(actual, expected_sha256):
            upload.discard()
            raise Invalid(
                f"X-Content-SHA256 {expected_sha256} does not match the body's sha256 {actual}; "
                "nothing stored"
            )
        upload.handle.flush()
        os.fsync(upload.handle.fileno())
        upload.handle.close()
        target = self.path(actual)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(upload.path, target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return StoredBlob(actual, upload.size, self.storage_path(actual))

    async def put_stream(
        self, chunks: AsyncIterator[bytes], *, expected_sha256: str, max_bytes: int
    ) -> StoredBlob:
        """Store a request body; TooLarge or Invalid (digest mismatch) store nothing."""
        upload = self._open_upload(max_bytes)
        try:
            async for chunk in chunks:
                upload.write(chunk)
        except BaseException:
            upload.discard()
            raise
        return self._commit(upload, expected_sha256)

    def put_chunks(
        self, chunks: Iterable[bytes], *, expected_sha256: str | None = None, max_bytes: int
    ) -> StoredBlob:
        upload = self._open_upload(max_bytes)
        try:
            for chunk in chunks:
                upload.write(chunk)
        except BaseException:
            upload.discard()
            raise
        return self._commit(upload, expected_sha256)

    def put_bytes(self, data: bytes) -> StoredBlob:
        return self.put_chunks([data], expected_sha256=sha256_hex(data), max_bytes=len(data))

    def sweep_temporary(self, *, older_than_s: float) -> list[str]:
        """Remove upload temporaries not written to for `older_than_s` (an upload cut by a
        killed server leaves one; an upload in flight keeps writing to its own); returns the
        names removed. Blobs are never touched: they are renamed out of tmp/ only when whole."""
        if not self.tmp_dir.is_dir():
            return []
        cutoff = time.time() - older_than_s
        removed = []
        for entry in sorted(self.tmp_dir.iterdir()):
            try:
                if entry.is_file() and entry.stat().st_mtime < cutoff:
                    entry.unlink()
                    removed.append(entry.name)
            except FileNotFoundError:
                continue  # committed or swept by another process meanwhile
        return removed

    def read_bytes(self, sha256: str) -> bytes:
        return self.path(sha256).read_bytes()

    def verify(self, sha256: str, size: int) -> str | None:
        """None when the stored blob still has this digest and size, else what is wrong."""
        path = self.path(sha256)
        if not path.is_file():
            return "missing from the store"
        actual, actual_size = sha256_file(path)
        if not hmac.compare_digest(actual, sha256) or actual_size != size:
            return f"altered in the store (now sha256 {actual}, {actual_size} bytes)"
        return None
