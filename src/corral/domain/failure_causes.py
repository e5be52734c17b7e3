"""Every failure cause corral records on a session or kernel: one enum for writers and readers.

A cause is a stable code: agents report it with a failed kernel, the manager records it when a
phase gives up or expires, when an end is asked for, or when the scheduler refuses a session for
good. The session takes the cause of its first failed kernel (or its phase's). Retry
classification (`domain.retry.classify`) maps each of them; a test checks it maps all of them.
"""

from __future__ import annotations

from enum import StrEnum


class FailureCause(StrEnum):
    """Why a kernel or session ended badly (or why its end was asked for)."""

    # The workload itself.
    KERNEL_NONZERO_EXIT = "kernel_nonzero_exit"  # the main process exited non-zero
    OOM_KILLED = "oom_killed"  # killed by the kernel's memory limit
    OUTPUT_TOO_LARGE = "output_too_large"  # its outputs exceed what the manager stores
    KERNEL_FAILED = "kernel_failed"  # a kernel failed without saying why
    # Agents and the way to them.
    AGENT_LOST = "agent_lost"  # its agent went silent past the heartbeat timeout
    AGENT_UNAVAILABLE = "agent_unavailable"  # a phase gave up on an agent that is not ALIVE
    AGENT_SHUTDOWN = "agent_shutdown"  # its agent was stopped while the kernel ran
    KERNEL_LOST = "kernel_lost"  # its agent restarted and the kernel's process was gone
    AGENT_IO_ERROR = "agent_io_error"  # the agent could not read or write its own files
    DEVICE_UNAVAILABLE = "device_unavailable"  # an assigned GPU was not free on the agent
    MANAGER_UNREACHABLE = "manager_unreachable"  # the agent could not report to any manager
    MANAGER_REFUSED = "manager_refused"  # the manager refused the agent's report
    # Stages on the agent before the workload runs.
    IMAGE_PULL_FAILURE = "image_pull_failure"  # the image (environment) could not be had
    WORK_DIR_FAILURE = "work_dir_failure"  # the kernel's directory could not be made
    KERNEL_START_FAILURE = "kernel_start_failure"  # the process could not be started
    UPLOAD_FAILURE = "upload_failure"  # the uploaded directory could not be unpacked
    STAGE_FAILED = "stage_failed"  # a stage failed and the agent gave no cause
    # The manager's phases.
    PHASE_TIMEOUT = "phase_timeout"  # a phase took longer than its limit
    # All-or-nothing admission (spec document 2): evicted for not having every kernel ready in
    # time (back to PENDING), and cancelled after being kept deactivated past the retention.
    KERNELS_READY_TIMEOUT = "kernels_ready_timeout"
    DEACTIVATED_RETENTION = "deactivated_retention"
    # Ends asked for (`outcome.REQUESTED_RESULTS`).
    USER_CANCELLED = "user_cancelled"  # its owner (or an admin) terminated it
    TIME_LIMIT = "time_limit"  # it ran past its wall-time limit
    # The scheduler's permanent refusals: the session can never run as submitted.
    DEPENDENCY_MISSING = "dependency_missing"
    DEPENDENCY_FAILED = "dependency_failed"
    UNKNOWN_SLOT = "unknown_slot"
    REQUEST_TOO_LARGE = "request_too_large"
    QUOTA_EXCEEDED = "quota_exceeded"
    # Isolated because some part of corral cannot handle its row (a request no check of today
    # would let in, written before one did): it ends ERROR at once, so it stops no loop or route
    # for anyone else (`coordination.quarantine`).
    INVALID_REQUEST = "invalid_request"
