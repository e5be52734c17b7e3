"""The SDK's calls that run the cluster: users, API tokens, resource groups, agents' drain and
removal. Admins make most of them; any user manages their own tokens."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator, Awaitable, Mapping
from typing import Any
from urllib.parse import quote

from corral.client._paging import every_item
from corral.client._transport import TransportCalls
from corral.client.models import Agent, IssuedToken, Page, ResourceGroup, Token, User


class ClusterCalls(TransportCalls):
    """Users, tokens, resource groups and agents; mixed into `Client`."""

    # --- users (admins) -------------------------------------------------------------------

    async def list_users(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[User]:
        """One page of the users, by name (admins)."""
        params = {"limit": limit, "cursor": cursor}
        return Page[User].model_validate(await self._json("GET", "/v1/users", params=params))

    async def iter_users(self, *, page_size: int | None = None) -> AsyncGenerator[User, None]:
        """Every user, page by page (admins)."""

        def fetch(cursor: str | None) -> Awaitable[Page[User]]:
            return self.list_users(limit=page_size, cursor=cursor)

        async with contextlib.aclosing(every_item(fetch)) as users:
            async for user in users:
                yield user

    async def create_user(self, name: str, *, role: str = "user") -> User:
        """Make a user (`admin` or `user`), without a token yet (admins)."""
        body = {"name": name, "role": role}
        return User.model_validate(await self._json("POST", "/v1/users", json=body))

    async def update_user(self, name: str, *, role: str) -> User:
        """Give a user another role; the last admin stays one (admins)."""
        return User.model_validate(await self._json("PATCH", _user_path(name), json={"role": role}))

    async def delete_user(self, name: str) -> None:
        """Remove a user who owns no session, with their tokens (admins)."""
        await self._send("DELETE", _user_path(name))

    # --- tokens (one's own; admins: anyone's) ---------------------------------------------

    async def list_tokens(
        self, user: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[Token]:
        """One page of a user's tokens, without their secrets."""
        params = {"limit": limit, "cursor": cursor}
        return Page[Token].model_validate(
            await self._json("GET", f"{_user_path(user)}/tokens", params=params)
        )

    async def iter_tokens(
        self, user: str, *, page_size: int | None = None
    ) -> AsyncGenerator[Token, None]:
        """Every token of a user, page by page."""

        def fetch(cursor: str | None) -> Awaitable[Page[Token]]:
            return self.list_tokens(user, limit=page_size, cursor=cursor)

        async with contextlib.aclosing(every_item(fetch)) as tokens:
            async for token in tokens:
                yield token

    async def create_token(
        self,
        user: str,
        name: str,
        *,
        expires_in_s: int | None = None,
        never_expires: bool = False,
    ) -> IssuedToken:
        """Make a token for `user`; its secret is in the answer only. It lasts `expires_in_s`,
        else for ever with `never_expires`, else the manager's `token_ttl_days`."""
        if never_expires and expires_in_s is not None:
            raise ValueError("give expires_in_s or never_expires, not both")
        body: dict[str, Any] = {"name": name}
        if expires_in_s is not None or never_expires:
            body["expires_in_s"] = expires_in_s
        return IssuedToken.model_validate(
            await self._json("POST", f"{_user_path(user)}/tokens", json=body)
        )

    async def revoke_token(self, token_id: uuid.UUID | str) -> None:
        """Revoke a token: refused at once everywhere."""
        await self._send("DELETE", f"/v1/tokens/{quote(str(token_id), safe='')}")

    # --- resource groups ------------------------------------------------------------------

    async def list_resource_groups(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[ResourceGroup]:
        """One page of the resource groups, by name."""
        params = {"limit": limit, "cursor": cursor}
        return Page[ResourceGroup].model_validate(
            await self._json("GET", "/v1/resource-groups", params=params)
        )

    async def iter_resource_groups(
        self, *, page_size: int | None = None
    ) -> AsyncGenerator[ResourceGroup, None]:
        """Every resource group, page by page."""

        def fetch(cursor: str | None) -> Awaitable[Page[ResourceGroup]]:
            return self.list_resource_groups(limit=page_size, cursor=cursor)

        async with contextlib.aclosing(every_item(fetch)) as groups:
            async for group in groups:
                yield group

    async def get_resource_group(self, name: str) -> ResourceGroup:
        """One resource group with its options."""
        return ResourceGroup.model_validate(await self._json("GET", _group_path(name)))

    async def create_resource_group(
        self, name: str, *, description: str = "", options: Mapping[str, Any] | None = None
    ) -> ResourceGroup:
        """Make a resource group; options left out keep their defaults (admins)."""
        body = {"name": name, "description": description, "options": dict(options or {})}
        return ResourceGroup.model_validate(
            await self._json("POST", "/v1/resource-groups", json=body)
        )

    async def update_resource_group(
        self,
        name: str,
        *,
        description: str | None = None,
        options_patch: Mapping[str, Any] | None = None,
    ) -> ResourceGroup:
        """Change a group: its description, and its options by a JSON merge patch (RFC 7396:
        given keys replace, null resets a key to its default) (admins)."""
        body: dict[str, Any] = {}
        if description is not None:
            body["description"] = description
        if options_patch is not None:
            body["options"] = dict(options_patch)
        return ResourceGroup.model_validate(await self._json("PATCH", _group_path(name), json=body))

    async def delete_resource_group(self, name: str) -> None:
        """Delete a group no agent and no live session uses (admins)."""
        await self._send("DELETE", _group_path(name))

    # --- agents (admins) ------------------------------------------------------------------

    async def drain_agent(self, agent_id: str) -> Agent:
        """Place no new kernels on the agent; its kernels keep running."""
        return Agent.model_validate(await self._json("POST", f"{_agent_path(agent_id)}/drain"))

    async def undrain_agent(self, agent_id: str) -> Agent:
        """Let the scheduler place kernels on the agent again."""
        return Agent.model_validate(await self._json("POST", f"{_agent_path(agent_id)}/undrain"))

    async def remove_agent(self, agent_id: str) -> None:
        """Remove an agent that left (LOST or TERMINATED) and runs nothing."""
        await self._send("DELETE", _agent_path(agent_id))


def _user_path(name: str) -> str:
    return f"/v1/users/{quote(name, safe='')}"


def _group_path(name: str) -> str:
    return f"/v1/resource-groups/{quote(name, safe='')}"


def _agent_path(agent_id: str) -> str:
    return f"/v1/agents/{quote(agent_id, safe='')}"
