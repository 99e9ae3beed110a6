"""Content-addressed artifact stores: a blob's name is its sha256, `ab/cd/<sha256>`.

Two implementations behind one interface (`ArtifactStore`), chosen by settings (`open_store`):

- `LocalArtifactStore`: a folder, the embedded default (`COLDBENCH_ARTIFACT_DIR`);
- `S3ArtifactStore`: an S3-compatible bucket (`COLDBENCH_ARTIFACT_URL=s3://bucket/prefix`), so
  API replicas and Celery workers on several machines share one store.

Both hash and count an upload while it is spooled to a temporary file; only a complete body
whose digest matches the one the client declared is published under its digest, so a reader
never sees a partial or unverified blob. A store that is full refuses with `StoreFull` (a clear
507) and keeps nothing of the upload. `verify` re-reads a blob and compares digest and size.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import hmac
import os
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from coldbench.api.errors import Invalid, StoreFull, TooLarge
from coldbench.evidence.contract.boundary import TextRefused, Utf8Lines
from coldbench.evidence.contract.canonical import sha256_file, sha256_hex

if TYPE_CHECKING:
    from coldbench.api.settings import Settings

SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
_CHUNK_BYTES = 1 << 20
# An upload is held in memory until this much is pending, then written to its temporary file.
SPILL_BYTES = 256 << 10


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    bytes: int
    storage_path: str  # relative to the store's root (or prefix)


class _Spool:
    """An upload on its way to a temporary file: hashed and counted as it arrives (refused past
    max_bytes), kept in memory until `SPILL_BYTES` are pending, written to the file by `spill`.

    `add` is all the event loop does per chunk; `spill` (creating the file on its first call)
    and publishing run in a worker thread: creating a file in a folder where other uploads are
    renamed and fsynced at the same time can wait on the disk, and the event loop must not. A
    body smaller than `SPILL_BYTES` (an
    agent's records and provenance, typically) reaches the disk in one write, in the same
    thread call that fsyncs and publishes it, and one whose digest does not match never does.
    """

    def __init__(self, tmp_dir: Path, max_bytes: int) -> None:
        self.digest = hashlib.sha256()
        self.size = 0
        self.max_bytes = max_bytes
        self.tmp_dir = tmp_dir
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.path: Path | None = None
        self.handle: BinaryIO | None = None

    def add(self, chunk: bytes) -> bool:
        """Take a chunk; True when enough is pending to `spill`."""
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise TooLarge(f"artifact exceeds the limit of {self.max_bytes} bytes")
        self.digest.update(chunk)
        self.pending.append(chunk)
        self.pending_bytes += len(chunk)
        return self.pending_bytes >= SPILL_BYTES

    def spill(self) -> None:
        """Write what is pending to the temporary file (blocking: not on the event loop)."""
        try:
            if self.handle is None:
                self.tmp_dir.mkdir(parents=True, exist_ok=True)
                fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="upload-")
                self.path = Path(name)
                self.handle = os.fdopen(fd, "wb")
            self.handle.writelines(self.pending)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull("the artifact store is full; nothing stored") from None
            raise
        self.pending.clear()
        self.pending_bytes = 0

    def discard(self) -> None:
        self.pending.clear()
        if self.handle is not None:
            self.handle.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def storage_path(sha256: str) -> str:
    if not SHA256_PATTERN.fullmatch(sha256):
        raise Invalid(f"not a sha256 hex digest: {sha256!r}")
    return f"{sha256[:2]}/{sha256[2:4]}/{sha256}"


class ArtifactStore(ABC):
    """Write-once blobs by sha256. Subclasses publish a verified spool file and read blobs."""

    def __init__(self, spool_dir: Path, *, min_free_bytes: int = 0) -> None:
        self.spool_dir = Path(spool_dir)
        self.min_free_bytes = min_free_bytes

    def storage_path(self, sha256: str) -> str:
        return storage_path(sha256)

    # -- what each store implements --

    @abstractmethod
    def exists(self, sha256: str) -> bool: ...

    @abstractmethod
    def read_bytes(self, sha256: str) -> bytes: ...

    @abstractmethod
    def _publish(self, spool: _Spool, sha256: str) -> None:
        """Make the complete, verified spool file the blob `sha256` (consumes the spool)."""

    def _check_space(self, size: int) -> None:  # noqa: B027 - optional: stores with a quota
        """StoreFull when storing `size` more bytes would leave less than min_free_bytes."""

    # -- shared: spooling, digest check, verification --

    @staticmethod
    def _seal(spool: _Spool, expected_sha256: str | None) -> str:
        """Check the digest, write what is pending, fsync and close the file (blocking); the
        digest."""
        actual = spool.digest.hexdigest()
        if expected_sha256 is not None and not hmac.compare_digest(actual, expected_sha256):
            raise Invalid(
                f"X-Content-SHA256 {expected_sha256} does not match the body's sha256 "
                f"{actual}; nothing stored"
            )
        spool.spill()
        assert spool.handle is not None
        spool.handle.flush()
        os.fsync(spool.handle.fileno())
        spool.handle.close()
        return actual

    def _commit(self, spool: _Spool, expected_sha256: str | None) -> StoredBlob:
        """Seal the spool file and publish it (blocking)."""
        try:
            actual = self._seal(spool, expected_sha256)
            if self.verify(actual, spool.size) is not None:
                # Missing, or altered in the store since it was written: these bytes, whose
                # digest was just checked, are the blob (a later upload repairs it).
                self._check_space(spool.size)
                self._publish(spool, actual)
        finally:
            spool.discard()  # a no-op once published
        return StoredBlob(actual, spool.size, self.storage_path(actual))

    async def put_stream(
        self,
        chunks: AsyncIterator[bytes],
        *,
        expected_sha256: str,
        max_bytes: int,
        text: Utf8Lines | None = None,
    ) -> StoredBlob:
        """Store a request body; TooLarge, Invalid (digest mismatch, or text that `text`
        refuses: a JSON file that is not UTF-8, naming its line) or StoreFull store nothing.
        The file work (creating, writing, fsync, publishing to a folder or a remote store)
        runs in worker threads, never on the event loop."""
        spool = await self._receive(chunks, max_bytes, text)
        return await asyncio.to_thread(self._commit, spool, expected_sha256)

    @contextlib.asynccontextmanager
    async def spooled(
        self, chunks: AsyncIterator[bytes], *, expected_sha256: str, max_bytes: int
    ) -> AsyncIterator[Path]:
        """A request body checked before anything is stored (a reproduction's zip): hashed
        and counted as it streams to a temporary file, refused as `put_stream` refuses, its
        path yielded and the file removed on exit. Nothing is published: the caller stores
        what it accepts."""
        spool = await self._receive(chunks, max_bytes, None)
        try:
            await asyncio.to_thread(self._seal, spool, expected_sha256)
            assert spool.path is not None
            yield spool.path
        finally:
            await asyncio.to_thread(spool.discard)

    async def _receive(
        self, chunks: AsyncIterator[bytes], max_bytes: int, text: Utf8Lines | None
    ) -> _Spool:
        """The body in a spool, hashed and counted as it arrives (nothing kept if refused)."""
        spool = _Spool(self.spool_dir, max_bytes)
        try:
            async for chunk in chunks:
                if text is not None:
                    text.feed(chunk)
                if spool.add(chunk):
                    await asyncio.to_thread(spool.spill)
            if text is not None:
                text.close()
        except TextRefused as refused:
            await asyncio.to_thread(spool.discard)
            raise Invalid(
                f"{refused.field} {refused.problem}; nothing stored", field=refused.field
            ) from None
        except BaseException:
            await asyncio.to_thread(spool.discard)
            raise
        return spool

    def put_chunks(
        self, chunks: Iterable[bytes], *, expected_sha256: str | None = None, max_bytes: int
    ) -> StoredBlob:
        spool = _Spool(self.spool_dir, max_bytes)
        try:
            for chunk in chunks:
                if spool.add(chunk):
                    spool.spill()
        except BaseException:
            spool.discard()
            raise
        return self._commit(spool, expected_sha256)

    def put_bytes(self, data: bytes) -> StoredBlob:
        return self.put_chunks([data], expected_sha256=sha256_hex(data), max_bytes=len(data))

    def sweep_temporary(self, *, older_than_s: float) -> list[str]:
        """Remove spool files not written to for `older_than_s` (an upload cut by a killed
        server leaves one; an upload in flight keeps writing to its own); returns the names
        removed. Blobs are never touched: a spool file is published only when whole."""
        if not self.spool_dir.is_dir():
            return []
        cutoff = time.time() - older_than_s
        removed = []
        for entry in sorted(self.spool_dir.iterdir()):
            try:
                if entry.is_file() and entry.stat().st_mtime < cutoff:
                    entry.unlink()
                    removed.append(entry.name)
            except FileNotFoundError:
                continue  # published or swept by another process meanwhile
        return removed

    def verify(self, sha256: str, size: int) -> str | None:
        """None when the stored blob still has this digest and size, else what is wrong."""
        if not self.exists(sha256):
            return "missing from the store"
        data = self.read_bytes(sha256)
        actual = sha256_hex(data)
        if not hmac.compare_digest(actual, sha256) or len(data) != size:
            return f"altered in the store (now sha256 {actual}, {len(data)} bytes)"
        return None


class LocalArtifactStore(ArtifactStore):
    """A folder: `<root>/ab/cd/<sha256>`, spooled under `<root>/tmp` (same filesystem, so
    publishing is a rename)."""

    def __init__(self, root: Path, *, min_free_bytes: int = 0) -> None:
        super().__init__(Path(root) / "tmp", min_free_bytes=min_free_bytes)
        self.root = Path(root)
        self.tmp_dir = self.spool_dir

    def path(self, sha256: str) -> Path:
        return self.root / self.storage_path(sha256)

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def read_bytes(self, sha256: str) -> bytes:
        return self.path(sha256).read_bytes()

    def verify(self, sha256: str, size: int) -> str | None:
        path = self.path(sha256)
        if not path.is_file():
            return "missing from the store"
        actual, actual_size = sha256_file(path)  # in chunks: blobs may be large
        if not hmac.compare_digest(actual, sha256) or actual_size != size:
            return f"altered in the store (now sha256 {actual}, {actual_size} bytes)"
        return None

    def _check_space(self, size: int) -> None:
        # The spool file under root/tmp holds the `size` bytes on this filesystem already, and
        # publishing it is a rename that takes no more room: what is free now is what stays
        # free. Subtracting `size` again counted each upload twice (a 38 MB upload was refused
        # with 63 MB free).
        free = shutil.disk_usage(self.root).free
        if free < self.min_free_bytes:
            raise StoreFull(
                f"the artifact store is full: storing {size} bytes leaves {free} free, less "
                f"than the {self.min_free_bytes} bytes kept free; nothing stored"
            )

    def _publish(self, spool: _Spool, sha256: str) -> None:
        target = self.path(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        assert spool.path is not None  # written and closed by _commit
        os.replace(spool.path, target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class S3ArtifactStore(ArtifactStore):
    """An S3-compatible bucket: `s3://bucket/prefix/ab/cd/<sha256>`. Uploads are spooled to a
    local temporary folder, verified, then put whole; a blob already there is not put again."""

    def __init__(
        self,
        url: str,
        *,
        spool_dir: Path,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        client: Any = None,
    ) -> None:
        super().__init__(spool_dir)
        self.bucket, self.prefix = parse_s3_url(url)
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.client(
                "s3",
                endpoint_url=endpoint_url or None,
                region_name=region or None,
                aws_access_key_id=access_key_id or None,
                aws_secret_access_key=secret_access_key or None,
                config=Config(retries={"max_attempts": 5, "mode": "standard"}),
            )
        self.client = client

    def key(self, sha256: str) -> str:
        return f"{self.prefix}{self.storage_path(sha256)}"

    def exists(self, sha256: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(sha256))
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def read_bytes(self, sha256: str) -> bytes:
        response = self.client.get_object(Bucket=self.bucket, Key=self.key(sha256))
        return bytes(response["Body"].read())

    def _publish(self, spool: _Spool, sha256: str) -> None:
        from botocore.exceptions import ClientError

        try:
            assert spool.path is not None  # written and closed by _commit
            with open(spool.path, "rb") as body:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self.key(sha256),
                    Body=body,
                    ContentLength=spool.size,
                    ContentType="application/octet-stream",
                )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("QuotaExceeded", "EntityTooLarge", "InsufficientStorage"):
                raise StoreFull(
                    f"the artifact store refused the blob ({code}); nothing stored"
                ) from None
            raise


def is_unavailable(error: BaseException) -> bool:
    """Whether `error` says the store could not be reached, had no room or failed on its side
    (worth trying again later: room is freed, another worker's store has some), rather than
    anything about what it holds."""
    if isinstance(error, OSError | StoreFull):
        return True
    if not type(error).__module__.startswith("botocore"):
        return False
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = error.response.get("Error", {}).get("Code", "")
        return int(status) >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout")
    return isinstance(error, BotoCoreError)


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix/")."""
    match = re.fullmatch(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?", url)
    if match is None:
        raise ValueError(f"artifact URL {url!r} is not s3://bucket[/prefix]")
    prefix = (match.group(2) or "").strip("/")
    return match.group(1), f"{prefix}/" if prefix else ""


def open_store(settings: Settings) -> ArtifactStore:
    """The store the settings name: the S3 bucket of artifact_url, else the local folder."""
    if settings.artifact_url:
        return S3ArtifactStore(
            settings.artifact_url,
            spool_dir=settings.state_dir / "spool",
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            access_key_id=settings.s3_access_key_id,
            secret_access_key=settings.s3_secret_access_key.get_secret_value(),
        )
    return LocalArtifactStore(
        settings.artifact_dir, min_free_bytes=settings.artifact_min_free_bytes
    )
