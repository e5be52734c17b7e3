"""The Redis hint bus: a key per set hint, and a PUBLISH on the bus's channel to wake waiters.

Keys are `{prefix}:hint:{name}` and the channel is `{prefix}:hints`. Each bus keeps one
subscription, read by a supervised listener task that wakes the bus's local waiters.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from corral.infra._backoff import reconnect_delays
from corral.infra._redis import redis_client
from corral.infra.hints import ClaimableHintBus, HintBusError

logger = logging.getLogger(__name__)

RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 10.0
SUBSCRIBE_TIMEOUT_S = 10.0


class RedisHintBus(ClaimableHintBus):
    """Hints shared through Redis by every manager using the same server and prefix."""

    server_errors = (RedisError, OSError, TimeoutError)

    def __init__(self, client: Redis, *, prefix: str = "corral", owns_client: bool = False) -> None:
        super().__init__()
        self._client = client
        self._owns_client = owns_client
        self._prefix = prefix
        self._channel = f"{prefix}:hints"
        self._pubsub = client.pubsub()
        self._subscribed = asyncio.Event()
        self._listener_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(
        cls, url: str, *, prefix: str = "corral", subscribe_timeout_s: float = SUBSCRIBE_TIMEOUT_S
    ) -> RedisHintBus:
        """Connect to `url`, subscribe, and return once the subscription is active."""
        bus = cls(redis_client(url), prefix=prefix, owns_client=True)
        try:
            await bus.start(subscribe_timeout_s)
        except BaseException:
            await bus.close()
            raise
        return bus

    async def start(self, subscribe_timeout_s: float = SUBSCRIBE_TIMEOUT_S) -> None:
        """Subscribe and start the listener; returns once Redis confirmed the subscription."""
        await self._pubsub.subscribe(self._channel)
        self._listener_task = asyncio.create_task(
            self._listen(), name=f"hints-listener:{self._prefix}"
        )
        self._listener_task.add_done_callback(self._on_listener_done)
        # Until Redis has processed SUBSCRIBE, a PUBLISH reaches nobody: a wait that checked the
        # keys before that moment could miss a hint set right after its check.
        async with asyncio.timeout(subscribe_timeout_s):
            await self._subscribed.wait()
        self._waiters.raise_if_failed()

    async def _send(self, names: list[str]) -> None:
        """SET each hint's key, then PUBLISH its name, in one pipeline (keys exist first)."""
        async with self._client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.set(self._key(name), b"1")
                pipe.publish(self._channel, name)
            await pipe.execute()
        self._waiters.wake(names)

    async def _take(self, name: str) -> bool:
        """GETDEL the hint's key: Redis runs it atomically, so exactly one consumer sees it."""
        return await self._client.getdel(self._key(name)) is not None

    async def close(self) -> None:
        """Stop the listener, unsubscribe and (if owned) close the client; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._waiters.fail(HintBusError(f"the redis hint bus {self._prefix!r} is closed"))
        if self._listener_task is not None:
            self._listener_task.cancel()
            await asyncio.gather(self._listener_task, return_exceptions=True)
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        if self._owns_client:
            await self._client.aclose()

    def _key(self, name: str) -> str:
        return f"{self._prefix}:hint:{name}"

    async def _any_set(self, names: frozenset[str]) -> bool:
        count: int = await self._client.exists(*(self._key(name) for name in names))
        return count > 0

    async def _listen(self) -> None:
        delays = reconnect_delays(RECONNECT_MIN_S, RECONNECT_MAX_S)
        while True:
            try:
                message: dict[str, Any] | None = await self._pubsub.get_message(timeout=None)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                # The next read reconnects, and redis-py then subscribes again.
                delay_s = next(delays)
                logger.warning(
                    "hints.listener_reconnect backend=redis channel=%s error=%s retry_in_s=%.2f",
                    self._channel,
                    type(exc).__name__,
                    delay_s,
                )
                await asyncio.sleep(delay_s)
                continue
            if message is None:
                continue
            delays = reconnect_delays(RECONNECT_MIN_S, RECONNECT_MAX_S)
            if message["type"] == "subscribe":
                # (Re)subscribed: what was published while unsubscribed is lost, so every waiter
                # checks the keys again.
                self._subscribed.set()
                self._waiters.wake_all()
            elif message["type"] == "message":
                data = message["data"]
                self._waiters.wake([data.decode() if isinstance(data, bytes) else str(data)])

    def _on_listener_done(self, task: asyncio.Task[None]) -> None:
        if self._closed:
            return
        error = None if task.cancelled() else task.exception()
        reason = "cancelled" if task.cancelled() else repr(error) if error else "returned"
        logger.error(
            "hints.listener_failed backend=redis channel=%s reason=%s",
            self._channel,
            reason,
            exc_info=error,
        )
        self._waiters.fail(
            HintBusError(f"the redis hint listener for {self._channel!r} stopped ({reason})")
        )
        self._subscribed.set()  # lets start() see the failure instead of timing out
