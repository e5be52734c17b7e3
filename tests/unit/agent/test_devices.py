"""DeviceAllocator's bookkeeping of cuda device indices, and GPU detection through nvidia-smi."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.agent.devices import DeviceAllocationError, DeviceAllocator, detect_gpus
from corral.domain.types import new_kernel_id


def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """Put an `nvidia-smi` running `script` first on PATH."""
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\n{script}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")


def test_allocates_lowest_free_indices_first() -> None:
    """Devices are handed out in ascending index order, skipping held ones."""
    allocator = DeviceAllocator(4)
    a, b = new_kernel_id(), new_kernel_id()
    assert allocator.allocate(a, 2000) == (0, 1)
    assert allocator.allocate(b, 1000) == (2,)
    assert allocator.free == (3,)


def test_zero_amount_takes_nothing() -> None:
    """A kernel asking for no device gets an empty tuple and holds nothing."""
    allocator = DeviceAllocator(2)
    kernel = new_kernel_id()
    assert allocator.allocate(kernel, 0) == ()
    assert allocator.held(kernel) == ()
    assert allocator.free == (0, 1)


def test_fractional_amount_is_refused_naming_the_slot() -> None:
    """A fractional device amount is an error that names the cuda.device slot."""
    allocator = DeviceAllocator(2)
    with pytest.raises(DeviceAllocationError, match=r"cuda\.device"):
        allocator.allocate(new_kernel_id(), 1500)
    assert allocator.free == (0, 1)


def test_not_enough_free_devices_is_a_clear_error() -> None:
    """Asking for more devices than are free fails, says how many are free, takes none."""
    allocator = DeviceAllocator(2)
    allocator.allocate(new_kernel_id(), 1000)
    with pytest.raises(DeviceAllocationError, match="only 1 of 2 are free"):
        allocator.allocate(new_kernel_id(), 2000)
    assert allocator.free == (1,)


def test_allocate_again_for_the_same_kernel_returns_its_devices() -> None:
    """Allocating twice for one kernel is idempotent; a different amount is refused."""
    allocator = DeviceAllocator(3)
    kernel = new_kernel_id()
    assert allocator.allocate(kernel, 2000) == (0, 1)
    assert allocator.allocate(kernel, 2000) == (0, 1)
    with pytest.raises(DeviceAllocationError, match="already holds"):
        allocator.allocate(kernel, 1000)


def test_release_frees_devices_and_is_idempotent() -> None:
    """Releasing returns the kernel's devices to the pool; releasing again changes nothing."""
    allocator = DeviceAllocator(2)
    kernel = new_kernel_id()
    allocator.allocate(kernel, 2000)
    allocator.release(kernel)
    allocator.release(kernel)
    allocator.release(new_kernel_id())
    assert allocator.free == (0, 1)


def test_adopt_records_what_a_kernel_holds() -> None:
    """Adopted devices are held by that kernel and no longer free."""
    allocator = DeviceAllocator(4)
    kernel = new_kernel_id()
    allocator.adopt(kernel, [3, 1])
    assert allocator.held(kernel) == (1, 3)
    assert allocator.free == (0, 2)
    assert allocator.allocate(new_kernel_id(), 2000) == (0, 2)


def test_adopt_refuses_devices_held_by_another_kernel_or_missing() -> None:
    """Adopting a device another kernel holds, or one beyond the host's count, is an error."""
    allocator = DeviceAllocator(2)
    allocator.allocate(new_kernel_id(), 1000)
    with pytest.raises(DeviceAllocationError, match="another kernel holds"):
        allocator.adopt(new_kernel_id(), [0])
    with pytest.raises(DeviceAllocationError, match="this host has 2"):
        allocator.adopt(new_kernel_id(), [2])
    assert allocator.free == (1,)


def test_detect_gpus_counts_gpu_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """detect_gpus counts the GPUs nvidia-smi -L lists, not their MIG instances."""
    fake_nvidia_smi(
        tmp_path,
        monkeypatch,
        'echo "GPU 0: A100 (UUID: GPU-a)"\n'
        'echo "  MIG 1g.5gb Device 0: (UUID: MIG-b)"\n'
        'echo "GPU 1: A100 (UUID: GPU-c)"',
    )
    assert detect_gpus() == 2


def test_detect_gpus_is_zero_when_the_tool_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing nvidia-smi (no driver) means no GPUs, not an exception."""
    fake_nvidia_smi(tmp_path, monkeypatch, 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    assert detect_gpus() == 0


def test_detect_gpus_is_zero_without_the_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without nvidia-smi on PATH the host has no GPUs."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == 0
