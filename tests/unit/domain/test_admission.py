"""All-or-nothing admission options: defaults, validation, the requeue backoff's arithmetic."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from corral.domain.admission import (
    RequeuingOptions,
    RequeuingTimestamp,
    WaitForKernelsReady,
    requeue_time,
)
from corral.domain.resource_group import ResourceGroupOptions
from tests.integration.store._factories import NOW


def test_the_defaults_are_the_documented_ones_and_off() -> None:
    options = ResourceGroupOptions().wait_for_kernels_ready
    assert (options.enable, options.timeout_s, options.block_admission) == (False, 300, False)
    assert options.recovery_timeout_s is None and options.deactivated_retention_s is None
    requeuing = options.requeuing
    assert requeuing.timestamp is RequeuingTimestamp.EVICTION
    assert (requeuing.backoff_base_s, requeuing.backoff_max_s) == (60, 3600)
    assert requeuing.backoff_limit_count is None and requeuing.backoff_limit_timeout_s is None
    assert not options.blocks
    assert not WaitForKernelsReady(block_admission=True).blocks  # honoured only when enabled
    assert WaitForKernelsReady(enable=True, block_admission=True).blocks


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"enable": "maybe"}, "enable"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"recovery_timeout_s": -1}, "recovery_timeout_s"),
        ({"requeuing": {"timestamp": "arrival"}}, "timestamp"),
        ({"requeuing": {"backoff_limit_count": -1}}, "backoff_limit_count"),
        ({"requeuing": {"backoff_base_s": 1.5}}, "backoff_base_s"),
        ({"deactivated_retention_s": 0}, "deactivated_retention_s"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        ResourceGroupOptions.model_validate({"wait_for_kernels_ready": options})
    (error,) = raised.value.errors()
    assert error["loc"][0] == "wait_for_kernels_ready" and error["loc"][-1] == field


def test_the_nth_eviction_waits_base_times_two_to_the_n_minus_one_capped_at_max() -> None:
    requeuing = RequeuingOptions(backoff_base_s=60, backoff_max_s=3600)
    assert [requeuing.backoff_s(n) for n in range(1, 9)] == [
        60, 120, 240, 480, 960, 1920, 3600, 3600,
    ]  # fmt: skip
    assert requeuing.backoff_s(10**9) == 3600  # capped before exponentiating
    assert RequeuingOptions(backoff_base_s=0).backoff_s(5) == 0


def test_a_requeue_time_never_moves_earlier() -> None:
    requeuing = RequeuingOptions(backoff_base_s=60)
    assert requeue_time(requeuing, 1, NOW, None) == NOW + timedelta(seconds=60)
    later = NOW + timedelta(hours=2)
    assert requeue_time(requeuing, 1, NOW, later) == later
    assert requeue_time(requeuing, 2, NOW, NOW) == NOW + timedelta(seconds=120)
