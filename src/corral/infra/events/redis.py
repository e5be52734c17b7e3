"""The Redis event bus: PUBLISH `<prefix>:events`, one pub/sub listener per bus."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import redis.asyncio as aioredis
import redis.exceptions
import sqlalchemy as sa
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from corral.domain.events import Event
from corral.infra._redis import redis_client
from corral.infra.events import PING_INTERVAL_S, EventBusError
from corral.infra.events._listener import ListeningBus
from corral.store.database import Database
from corral.store.events import WHOLE_EVENTS_MAX, event_notices

logger = logging.getLogger(__name__)

SUBSCRIBE_TIMEOUT_S = 10.0
# Messages decoded together at most (those already received).
_BATCH_MAX = 1_000


class RedisEventBus(ListeningBus[PubSub]):
    """Events fanned out with Redis pub/sub to every manager on one Redis."""

    transient_errors = (
        OSError,
        TimeoutError,
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        # Reading a notice's events back failed: handled as a lost connection, so the
        # subscribers get a gap marker (events.dropped) and the listener goes on.
        sa.exc.DBAPIError,
        sa.exc.TimeoutError,
    )

    def __init__(
        self,
        url: str,
        *,
        db: Database | None = None,
        prefix: str = "corral",
        ping_interval_s: float = PING_INTERVAL_S,
        backoff_base_s: float = 0.05,
        backoff_cap_s: float = 10.0,
    ) -> None:
        super().__init__(prefix, backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s)
        # Where appended events are read back from for a notice; without it, every event
        # is published whole.
        self._db = db
        self.channel = f"{prefix}:events"
        self._ping_interval_s = ping_interval_s
        self._publisher = redis_client(url)
        # No silent retries on the listening connection: redis-py would reconnect and
        # resubscribe without a word, and subscribers would never learn of the gap.
        self._subscriber = aioredis.from_url(
            url,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=int(ping_interval_s),
            client_name=self.channel,  # names the listener in CLIENT LIST
        )

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        db: Database | None = None,
        prefix: str = "corral",
        ping_interval_s: float = PING_INTERVAL_S,
    ) -> RedisEventBus:
        """A bus already subscribed (so it gets every event published after this returns)."""
        bus = cls(url, db=db, prefix=prefix, ping_interval_s=ping_interval_s)
        try:
            await bus._start()
        except BaseException:
            await bus._close_clients()
            raise
        return bus

    async def publish(self, events: Sequence[Event]) -> None:
        self._check_open()
        if not events:
            return
        try:
            async with self._publisher.pipeline(transaction=False) as pipe:
                for message in self._messages(events):
                    pipe.publish(self.channel, message)
                await pipe.execute()
        except (*self.transient_errors, redis.exceptions.RedisError) as exc:
            raise EventBusError(
                f"could not publish {len(events)} events: {type(exc).__name__}: {exc}"
            ) from exc

    def _messages(self, events: Sequence[Event]) -> list[str]:
        """What to PUBLISH: each event whole, or for more than WHOLE_EVENTS_MAX appended
        events, notices of their ids and kinds (`EventNotice`), read back by the listeners
        whose subscribers want those kinds. Sending every event of a large batch whole cost
        each manager a message to receive and decode per event, wanted or not."""
        ids = [event.id for event in events if event.id is not None]
        if self._db is None or len(events) <= WHOLE_EVENTS_MAX or len(ids) < len(events):
            return [event.to_json() for event in events]
        return event_notices(sorted(ids), {event.kind for event in events})

    async def close(self) -> None:
        await self._stop_listening()
        await self._close_clients()

    async def _close_clients(self) -> None:
        await self._publisher.aclose()
        await self._subscriber.aclose()

    async def _connect(self) -> PubSub:
        pubsub = self._subscriber.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            # PUBLISH only reaches connections whose SUBSCRIBE the server has processed.
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT_S):
                message = None
                while message is None or message["type"] != "subscribe":
                    message = await pubsub.get_message(timeout=None)
        except BaseException:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
            raise
        return pubsub

    async def _pump(self, pubsub: PubSub) -> None:
        while True:
            # The timeout makes redis-py PING an idle connection (health_check_interval).
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=self._ping_interval_s
            )
            batch: list[str | bytes] = []
            # With what else has arrived: the notices among them are read in one statement.
            while message is not None and len(batch) < _BATCH_MAX:
                if message.get("type") == "message":
                    batch.append(message["data"])
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0)
            if batch:
                self._deliver(await self._decode(self._db, batch))

    async def _disconnect(self, pubsub: PubSub) -> None:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
