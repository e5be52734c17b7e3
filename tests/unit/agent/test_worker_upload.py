"""A kernel whose session names an upload: fetched and unpacked while preparing, faults included."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import tarfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from corral.agent.kernel_worker import MANAGER_REFUSED_CAUSE, KernelWorker, WorkerSettings
from corral.agent.uploads import UPLOAD_FAILURE_CAUSE
from corral.domain.status import KernelStatus

from ._fakes import (
    KID,
    FakeRuntime,
    FakeShipper,
    FakeSleep,
    Watch,
    assigned,
    launch_of,
    rejected,
    unavailable,
)

DIGEST = "ab" * 32
SETTINGS = WorkerSettings(retry_delay_s=0.25, log_interval_s=3600.0)


def _archive(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
async def workers() -> AsyncIterator[list[asyncio.Task[None]]]:
    """Worker tasks a test started; cancelled at the end."""
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _start(
    tmp_path: Path, shipper: FakeShipper, watch: Watch, tasks: list[asyncio.Task[None]]
) -> KernelWorker:
    kernel = assigned()
    launch = dataclasses.replace(launch_of(kernel, tmp_path / "kernel"), upload=DIGEST)
    worker = KernelWorker(
        kernel,
        launch,
        FakeRuntime(watch=watch),
        shipper,
        settings=SETTINGS,
        clock=lambda: datetime(2030, 1, 1, tzinfo=UTC),
        sleep=FakeSleep(park=(SETTINGS.log_interval_s,), watch=watch),
    )
    tasks.append(asyncio.create_task(worker.run()))
    return worker


async def test_an_upload_is_unpacked_before_the_kernel_is_prepared(
    tmp_path: Path, workers: list[asyncio.Task[None]]
) -> None:
    """A manager away on the first fetch costs a retry; the tree is then in upload_dir."""
    watch = Watch()
    shipper = FakeShipper(watch)
    shipper.uploads[KID] = _archive({"train.py": b"print(1)\n"})
    shipper.upload_errors.append(unavailable())
    worker = _start(tmp_path, shipper, watch, workers)
    await watch.until(lambda: KernelStatus.PREPARED in shipper.statuses)
    assert (worker.launch.upload_dir / "train.py").read_bytes() == b"print(1)\n"
    assert worker.launch.start_dir == worker.launch.upload_dir
    assert [kind for kind, _ in shipper.events].count("fetch_upload") == 1  # after the failure


async def test_an_upload_the_manager_refuses_fails_the_kernel_at_once(
    tmp_path: Path, workers: list[asyncio.Task[None]]
) -> None:
    """A 404 for the upload is not retried: the kernel fails with manager_refused."""
    watch = Watch()
    shipper = FakeShipper(watch)
    shipper.upload_errors.append(rejected(404, detail="kernel names no upload"))
    _start(tmp_path, shipper, watch, workers)
    await watch.until(lambda: KernelStatus.ERROR in shipper.statuses)
    assert shipper.reports[-1].failure_cause == MANAGER_REFUSED_CAUSE


async def test_a_broken_upload_fails_the_kernel_with_upload_failure(
    tmp_path: Path, workers: list[asyncio.Task[None]]
) -> None:
    """An archive that cannot be unpacked fails the kernel for good, saying why."""
    watch = Watch()
    shipper = FakeShipper(watch)
    shipper.uploads[KID] = b"\x1f\x8b broken"
    _start(tmp_path, shipper, watch, workers)
    await watch.until(lambda: KernelStatus.ERROR in shipper.statuses)
    failed = shipper.reports[-1]
    assert failed.failure_cause == UPLOAD_FAILURE_CAUSE
    assert "cannot unpack the upload" in (failed.message or "")
