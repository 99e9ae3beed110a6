"""Artifact stores: the local folder and an S3-compatible bucket (moto's S3 server as a
process) keep the same content addressing, digest checks and refusals."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from coldbench.api.artifacts.store import (
    SPILL_BYTES,
    ArtifactStore,
    LocalArtifactStore,
    S3ArtifactStore,
    _Spool,
    is_unavailable,
    open_store,
)
from coldbench.api.errors import Invalid, StoreFull, TooLarge
from coldbench.api.settings import Settings
from coldbench.evidence.contract.canonical import sha256_hex
from tests.api.conftest import S3Server


@pytest.fixture(params=["local", "s3"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ArtifactStore, Settings]]:
    if request.param == "local":
        settings = Settings(artifact_dir=tmp_path / "artifacts", state_dir=tmp_path / "state")
    else:
        s3: S3Server = request.getfixturevalue("s3_server")
        settings = Settings(
            artifact_url=f"s3://{s3.new_bucket()}/runs/a",
            state_dir=tmp_path / "state",
            s3_endpoint_url=s3.endpoint_url,
            s3_region="us-east-1",
            s3_access_key_id="test",
            s3_secret_access_key="test",
        )
    yield open_store(settings), settings


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _leftovers(store: ArtifactStore) -> list[Path]:
    return list(store.spool_dir.glob("*")) if store.spool_dir.exists() else []


def test_blobs_are_content_addressed_and_verified(store: tuple[ArtifactStore, Settings]) -> None:
    blobs, _ = store
    data = b'{"cell": 1}\n' * 1000
    digest = sha256_hex(data)
    stored = asyncio.run(
        blobs.put_stream(_chunks(data[:100], data[100:]), expected_sha256=digest, max_bytes=1 << 20)
    )
    assert (stored.sha256, stored.bytes) == (digest, len(data))
    assert stored.storage_path == f"{digest[:2]}/{digest[2:4]}/{digest}"
    assert blobs.exists(digest) and blobs.read_bytes(digest) == data
    assert blobs.verify(digest, len(data)) is None
    assert blobs.put_bytes(data) == stored  # the same bytes again: the same blob
    assert blobs.verify(sha256_hex(b"other"), 5) == "missing from the store"
    assert _leftovers(blobs) == []


def test_mismatch_and_oversize_store_nothing(store: tuple[ArtifactStore, Settings]) -> None:
    blobs, _ = store
    data = b"measured bytes"
    wrong = sha256_hex(b"something else")
    with pytest.raises(Invalid, match="does not match"):
        asyncio.run(blobs.put_stream(_chunks(data), expected_sha256=wrong, max_bytes=100))
    with pytest.raises(TooLarge):
        asyncio.run(
            blobs.put_stream(_chunks(data, data), expected_sha256=sha256_hex(data), max_bytes=20)
        )
    assert not blobs.exists(wrong) and not blobs.exists(sha256_hex(data))
    assert _leftovers(blobs) == []


def test_a_body_reaches_the_disk_only_in_worker_threads_and_past_spill_bytes(
    store: tuple[ArtifactStore, Settings],
) -> None:
    """A small body stays in memory until its digest is checked (a mismatch never touches the
    disk); a large one is written each SPILL_BYTES, never by the event loop's thread."""
    blobs, _ = store
    seen: list[int] = []  # spool files after each chunk
    spilled_on_loop: set[bool] = set()

    async def watched(*parts: bytes) -> AsyncIterator[bytes]:
        for part in parts:
            yield part
            seen.append(len(_leftovers(blobs)))

    real_spill = _Spool.spill

    def spill(self: _Spool) -> None:
        # asyncio.run runs the event loop on this (the main) thread
        spilled_on_loop.add(threading.main_thread().ident == threading.get_ident())
        real_spill(self)

    small = b"records\n" * 100
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Spool, "spill", spill)
        with pytest.raises(Invalid):
            asyncio.run(
                blobs.put_stream(
                    watched(small), expected_sha256=sha256_hex(b"x"), max_bytes=1 << 30
                )
            )
        assert seen == [0] and _leftovers(blobs) == []
        seen.clear()
        big = bytes(range(256)) * (3 * SPILL_BYTES // 256 + 7)
        parts = [big[i : i + SPILL_BYTES // 2] for i in range(0, len(big), SPILL_BYTES // 2)]
        stored = asyncio.run(
            blobs.put_stream(watched(*parts), expected_sha256=sha256_hex(big), max_bytes=1 << 30)
        )
    # Nothing on disk after the first half, one file from the second half on.
    assert seen == [0] + [1] * (len(parts) - 1)
    assert spilled_on_loop == {False}
    assert blobs.read_bytes(stored.sha256) == big and _leftovers(blobs) == []


def test_altered_blob_is_reported(store: tuple[ArtifactStore, Settings], tmp_path: Path) -> None:
    blobs, _ = store
    data = b"provenance"
    digest = blobs.put_bytes(data).sha256
    if isinstance(blobs, LocalArtifactStore):
        blobs.path(digest).write_bytes(b"tampered!!")
    else:
        assert isinstance(blobs, S3ArtifactStore)
        blobs.client.put_object(Bucket=blobs.bucket, Key=blobs.key(digest), Body=b"tampered!!")
    problem = blobs.verify(digest, len(data))
    assert problem is not None and problem.startswith("altered in the store")
    # A later upload of the right bytes repairs it; one of other bytes under the name is
    # refused and changes nothing.
    with pytest.raises(Invalid):
        blobs.put_chunks([b"tampered!!"], expected_sha256=digest, max_bytes=100)
    assert blobs.verify(digest, len(data)) is not None
    assert blobs.put_bytes(data).sha256 == digest
    assert blobs.verify(digest, len(data)) is None and blobs.read_bytes(digest) == data


def test_s3_objects_live_under_the_prefix(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    settings = Settings(
        artifact_url=f"s3://{bucket}/coldbench/",
        state_dir=tmp_path,
        s3_endpoint_url=s3_server.endpoint_url,
        s3_access_key_id="test",
        s3_secret_access_key="test",
        s3_region="us-east-1",
    )
    digest = open_store(settings).put_bytes(b"x").sha256
    keys = [
        item["Key"]
        for item in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    ]
    assert keys == [f"coldbench/{digest[:2]}/{digest[2:4]}/{digest}"]


def test_bad_artifact_urls_are_refused() -> None:
    with pytest.raises(ValueError, match="artifact_url"):
        Settings(artifact_url="http://bucket/prefix")
    with pytest.raises(ValueError, match="artifact_url"):
        Settings(artifact_url="s3://UPPER/x")


def test_a_full_local_store_refuses_with_a_clear_error_and_keeps_nothing(tmp_path: Path) -> None:
    # A floor of free space no disk has: the store counts as full.
    blobs = LocalArtifactStore(tmp_path / "artifacts", min_free_bytes=1 << 60)
    data = b"records"
    with pytest.raises(StoreFull, match="artifact store is full") as refused:
        asyncio.run(blobs.put_stream(_chunks(data), expected_sha256=sha256_hex(data), max_bytes=99))
    assert refused.value.status_code == 507 and "nothing stored" in refused.value.message
    assert not blobs.exists(sha256_hex(data)) and _leftovers(blobs) == []
    # The store's condition, not the blob's: a task that meets it is tried again later.
    assert is_unavailable(refused.value)
    assert not is_unavailable(Invalid("the sha256 of the body is not the one announced"))


def test_the_local_store_counts_an_upload_once_against_its_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 46, 6: the free-space check subtracted an upload's size from a free space that
    its spool file (on the same filesystem) had already taken: 507 with 63 MB free for a 38 MB
    upload. The filesystem here is a quota: its free space is what the files written under
    the store leave of a fixed capacity, so the check sees what a real disk would."""
    import shutil

    mib = 1 << 20
    capacity = 10 * mib
    root = tmp_path / "artifacts"

    def disk_usage(_path: object) -> Any:
        used = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        return shutil._ntuple_diskusage(capacity, used, capacity - used)  # type: ignore[attr-defined]

    monkeypatch.setattr("coldbench.api.artifacts.store.shutil.disk_usage", disk_usage)
    blobs = LocalArtifactStore(root, min_free_bytes=5 * mib)
    # 10 MiB free, 4 MiB stored: 6 MiB stay free, above the 5 MiB kept free.
    fits = b"a" * (4 * mib)
    stored = asyncio.run(
        blobs.put_stream(_chunks(fits), expected_sha256=sha256_hex(fits), max_bytes=capacity)
    )
    assert blobs.exists(stored.sha256) and _leftovers(blobs) == []
    # 6 MiB free, 2 MiB more: 4 MiB would stay free, below the 5 MiB kept free.
    too_much = b"b" * (2 * mib)
    with pytest.raises(StoreFull, match="leaves 4194304 free"):
        asyncio.run(
            blobs.put_stream(
                _chunks(too_much), expected_sha256=sha256_hex(too_much), max_bytes=capacity
            )
        )
    assert not blobs.exists(sha256_hex(too_much)) and _leftovers(blobs) == []
