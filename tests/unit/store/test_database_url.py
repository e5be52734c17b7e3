"""The URL a user writes chooses the backend and corral picks the async driver."""

from __future__ import annotations

import pytest

from corral.store.database import DatabaseURLError, async_url


@pytest.mark.parametrize(
    ("given", "driver"),
    [
        ("sqlite:///tmp/corral.db", "sqlite+aiosqlite"),
        ("sqlite+aiosqlite:///tmp/corral.db", "sqlite+aiosqlite"),
        ("postgresql://postgres@127.0.0.1:5432/test", "postgresql+asyncpg"),
        ("postgres://postgres@127.0.0.1/test", "postgresql+asyncpg"),
        ("postgresql+psycopg://u@h/db", "postgresql+asyncpg"),
    ],
)
def test_plain_urls_get_the_async_driver(given: str, driver: str) -> None:
    """sqlite:// and postgresql:// URLs map to aiosqlite and asyncpg."""
    assert async_url(given).drivername == driver


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("mysql://root@localhost/db", "not supported"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("not a url", "is not a URL"),
    ],
)
def test_unusable_urls_say_what_to_use_instead(given: str, message: str) -> None:
    """Unsupported or unshareable URLs fail with a message that names the fix."""
    with pytest.raises(DatabaseURLError, match=message):
        async_url(given)
