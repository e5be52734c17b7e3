"""What the proxy's fakes of the manager's client share: `async with client_factory()`."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class FakeClientContext:
    """Entered as a client is (`async with`), giving itself; nothing to close."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None
