"""Handler results and declared transitions, as spec document 1 defines them."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import Enum, StrEnum

from corral.domain.record import record
from corral.domain.session import KernelIntent, SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId


class SchedulingResult(StrEnum):
    """How the coordinator judged one attempt of a handler on one session."""

    SUCCESS = "SUCCESS"
    NEED_RETRY = "NEED_RETRY"
    EXPIRED = "EXPIRED"
    GIVE_UP = "GIVE_UP"
    SKIPPED = "SKIPPED"


@record
class TransitionStatus:
    """Target statuses of one outcome; None leaves that entity's status unchanged.

    `ask`: what the agents are asked to do with the kernels the outcome moves to `kernel` (their
    desired state, a new generation), written by the same statement as the move. Asking after
    the move, in the same transaction, would write every kernel row twice, and a row that its
    own transaction wrote already has its foreign key checked again on PostgreSQL.
    """

    session: SessionStatus | None = None
    kernel: KernelStatus | None = None
    ask: KernelIntent | None = None

    def __post_init__(self) -> None:
        if self.ask is not None and self.kernel is None:
            raise ValueError("TransitionStatus.ask needs a kernel status: it asks of moved kernels")


@record
class StatusTransitions:
    """A handler's declared transitions per outcome; None records history only."""

    success: TransitionStatus | None = None
    need_retry: TransitionStatus | None = None
    expired: TransitionStatus | None = None
    give_up: TransitionStatus | None = None

    def for_result(self, result: SchedulingResult) -> TransitionStatus | None:
        """The transition to apply for `result` (SKIPPED never changes a status)."""
        match result:
            case SchedulingResult.SUCCESS:
                return self.success
            case SchedulingResult.NEED_RETRY:
                return self.need_retry
            case SchedulingResult.EXPIRED:
                return self.expired
            case SchedulingResult.GIVE_UP:
                return self.give_up
            case SchedulingResult.SKIPPED:
                return None


@record
class ResultNote:
    """Why a session was skipped or failed: a stable code and a message a user can read.

    `permanent` marks a failure that no retry can fix (a failed dependency, a request larger
    than any agent): the coordinator gives up at once instead of counting attempts.
    """

    code: str
    message: str
    permanent: bool = False


@dataclass(slots=True)
class HandlerResult:
    """What a handler did with its targets: attempted and succeeded, attempted and failed, skipped.

    `notes` carries the reason for any failed or skipped session (an addition to spec document
    1, so every session that did not move says why).
    """

    successes: list[SessionId] = field(default_factory=list)
    failures: list[SessionId] = field(default_factory=list)
    skipped: list[SessionId] = field(default_factory=list)
    notes: dict[SessionId, ResultNote] = field(default_factory=dict)
    # A handler that reads its own targets (`LifecycleHandler.reads_own_targets`): the
    # sessions it read, for the coordinator to judge.
    considered: list[SessionWithKernels] = field(default_factory=list)


class KernelMatchType(Enum):
    """How a promotion handler checks a session's kernels against its status set."""

    ALL = "all"
    ANY = "any"
    NOT_ANY = "not_any"

    def holds(
        self, kernel_statuses: Iterable[KernelStatus], check: Collection[KernelStatus]
    ) -> bool:
        """Whether kernels in `kernel_statuses` meet this match against `check`.

        As the promotion query has it: ALL is "no kernel outside `check`", ANY "some kernel
        inside it", NOT_ANY "no kernel inside it"; a session without kernels meets ALL and
        NOT_ANY.
        """
        if self is KernelMatchType.ANY:
            return any(status in check for status in kernel_statuses)
        if self is KernelMatchType.ALL:
            return all(status in check for status in kernel_statuses)
        return not any(status in check for status in kernel_statuses)

    def may_start_holding(
        self, before: KernelStatus, after: KernelStatus, check: Collection[KernelStatus]
    ) -> bool:
        """Whether one kernel moving from `before` to `after` can make this match hold where it
        did not: it entered `check` (ALL, ANY) or left it (NOT_ANY)."""
        if self is KernelMatchType.NOT_ANY:
            return before in check and after not in check
        return after in check and before not in check
