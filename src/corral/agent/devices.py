"""Which of this host's cuda devices each kernel holds (the `cuda.device` slot, per index)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable

from corral.domain.types import KernelId

logger = logging.getLogger(__name__)

CUDA_DEVICE_SLOT = "cuda.device"
MILLI_PER_DEVICE = 1000
_DETECT_TIMEOUT_S = 10.0


class DeviceAllocationError(ValueError):
    """A kernel's `cuda.device` amount cannot be served from this host's devices."""


class DeviceAllocator:
    """Hands out whole cuda devices, lowest free index first, and remembers who holds which."""

    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"device count must be 0 or more, got {count}")
        self._count = count
        self._held: dict[KernelId, tuple[int, ...]] = {}

    @property
    def count(self) -> int:
        """How many devices this host has."""
        return self._count

    @property
    def free(self) -> tuple[int, ...]:
        """The indices no kernel holds, ascending."""
        taken = {device for devices in self._held.values() for device in devices}
        return tuple(d for d in range(self._count) if d not in taken)

    def held(self, kernel_id: KernelId) -> tuple[int, ...]:
        """The devices `kernel_id` holds (empty when none)."""
        return self._held.get(kernel_id, ())

    def allocate(self, kernel_id: KernelId, amount_milli: int) -> tuple[int, ...]:
        """Give the kernel `amount_milli / 1000` devices; again for the same kernel: the same."""
        if amount_milli < 0 or amount_milli % MILLI_PER_DEVICE:
            raise DeviceAllocationError(
                f"slot {CUDA_DEVICE_SLOT!r} must be a whole number of devices "
                f"(a multiple of {MILLI_PER_DEVICE} milli-units), got {amount_milli}"
            )
        wanted = amount_milli // MILLI_PER_DEVICE
        if kernel_id in self._held:
            held = self._held[kernel_id]
            if len(held) != wanted:
                raise DeviceAllocationError(
                    f"kernel {kernel_id} already holds devices {list(held)}, not {wanted}; "
                    "release them before allocating a different amount"
                )
            return held
        free = self.free
        if wanted > len(free):
            raise DeviceAllocationError(
                f"kernel {kernel_id} needs {wanted} {CUDA_DEVICE_SLOT} but only {len(free)} of "
                f"{self._count} are free on this host"
            )
        devices = free[:wanted]
        if devices:
            self._held[kernel_id] = devices
        return devices

    def release(self, kernel_id: KernelId) -> None:
        """Free the kernel's devices; nothing happens when it holds none."""
        self._held.pop(kernel_id, None)

    def adopt(self, kernel_id: KernelId, devices: Iterable[int]) -> None:
        """Record that a kernel already holds `devices` (an agent re-learning after a restart)."""
        adopted = tuple(sorted(set(devices)))
        outside = [d for d in adopted if not 0 <= d < self._count]
        if outside:
            raise DeviceAllocationError(
                f"kernel {kernel_id} holds devices {outside}, but this host has {self._count}"
            )
        others = {d for k, held in self._held.items() if k != kernel_id for d in held}
        clash = sorted(others.intersection(adopted))
        if clash:
            raise DeviceAllocationError(
                f"kernel {kernel_id} claims devices {clash}, which another kernel holds"
            )
        if adopted:
            self._held[kernel_id] = adopted
        else:
            self._held.pop(kernel_id, None)


def detect_gpus() -> int:
    """How many GPUs `nvidia-smi -L` lists; 0 when the tool is missing or fails. Never raises."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "-L"],
            capture_output=True,
            text=True,
            timeout=_DETECT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("devices.detect_unavailable", extra={"error": str(exc)})
        return 0
    if result.returncode != 0:
        extra = {"returncode": result.returncode, "error": result.stderr.strip()[:200]}
        logger.warning("devices.detect_failed", extra=extra)
        return 0
    # MIG instances are listed indented under their GPU; only whole GPUs count.
    return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))
