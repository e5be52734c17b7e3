"""`corral up`'s admin token: kept in the data directory and used again while it is good."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from corral.domain.types import utcnow
from corral.manager.up import ADMIN_TOKEN_FILE, admin_token
from corral.store.database import Database
from corral.store.user_directory import get_user_record, list_tokens
from corral.store.users import create_user, principal_for, revoke_token, set_role


async def _token_ids(db: Database) -> int:
    admin = await get_user_record(db, "admin")
    assert admin is not None
    return len(await list_tokens(db, admin.id))


async def test_the_kept_token_is_used_again(db: Database, tmp_path: Path) -> None:
    """The first start makes the admin and a token with the TTL; the next uses it again."""
    kept = tmp_path / ADMIN_TOKEN_FILE
    first, new = await admin_token(db, kept, ttl_s=3600)
    assert new and kept.read_text().strip() == first
    assert kept.stat().st_mode & 0o777 == 0o600
    again, new = await admin_token(db, kept, ttl_s=3600)
    assert (again, new) == (first, False)
    assert await _token_ids(db) == 1


@pytest.mark.parametrize("spoil", ["revoked", "expired", "garbled"])
async def test_a_token_no_longer_good_is_replaced(db: Database, tmp_path: Path, spoil: str) -> None:
    """Revoked, expired, or not a token at all: a new one is made and kept instead."""
    kept = tmp_path / ADMIN_TOKEN_FILE
    first, _ = await admin_token(db, kept, ttl_s=None if spoil == "expired" else 3600)
    admin = await get_user_record(db, "admin")
    assert admin is not None
    if spoil == "revoked":
        (token,) = await list_tokens(db, admin.id)
        await revoke_token(db, token.id, utcnow())
    elif spoil == "expired":
        first, _ = await admin_token(db, tmp_path / "other", ttl_s=-1.0)  # expired at once
        kept.write_text(first)
    else:
        kept.write_text("crl_not-a-token\n")
    fresh, new = await admin_token(db, kept, ttl_s=3600)
    assert new and fresh != first and kept.read_text().strip() == fresh
    holder = await principal_for(db, fresh, utcnow() + timedelta(minutes=59))
    assert holder is not None and holder.name == "admin"


async def test_an_admin_user_demoted_meanwhile_is_not_handed_a_token(
    db: Database, tmp_path: Path
) -> None:
    """Another admin made `admin` a plain user: no token is made for it, and the error says
    how to make it an admin again."""
    kept = tmp_path / ADMIN_TOKEN_FILE
    await admin_token(db, kept, ttl_s=3600)
    await create_user(db, "other-admin", "admin", utcnow())
    await set_role(db, "admin", "user", utcnow())
    with pytest.raises(ValueError, match="no longer an admin; make it one again"):
        await admin_token(db, kept, ttl_s=3600)
    assert await _token_ids(db) == 1
