"""Redis clients for the hint bus, the lock manager and the event bus.

redis-py's default pool refuses a command outright ("Too many connections") once 100 are in
flight. A manager sends one at a time per caller, and a burst of callers is normal: a thousand
agents registering at once each set a hint. So every client here draws from a blocking pool:
past `MAX_CONNECTIONS` a command waits for a connection to come free (up to
`POOL_TIMEOUT_S`, then redis-py's ConnectionError) instead of failing at once.
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis

# Connections one client keeps to Redis at most; commands beyond them wait for one.
MAX_CONNECTIONS = 50
# How long a command waits for a free connection before it fails.
POOL_TIMEOUT_S = 20.0


def redis_client(url: str) -> Redis:
    """A client for `url` whose commands wait for a free connection rather than fail."""
    pool = BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=POOL_TIMEOUT_S
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes both
