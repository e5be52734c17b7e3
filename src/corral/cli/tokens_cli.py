"""`corral token ls | create | revoke`: your API tokens (admins: anyone's, with --user)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import typer

from corral.cli._common import fail
from corral.cli._remote import JsonOption, age, call, local_time, print_json, print_table
from corral.client import Client, IssuedToken, NotFoundError, Token
from corral.domain.time_limit import format_duration, parse_duration
from corral.domain.tokens import MAX_TOKEN_LIFETIME_S

app = typer.Typer(
    help="Your API tokens: list, create, revoke (admins: any user's, with --user).",
    no_args_is_help=True,
)

UserOption = Annotated[
    str | None, typer.Option("--user", help="Admins: this user's tokens (default: yours).")
]
ExpiresInOption = Annotated[
    str | None,
    typer.Option(
        help="How long the token lasts: 30d, 12h, 90m (default: the manager's token_ttl_days)."
    ),
]
NoExpiryOption = Annotated[
    bool, typer.Option("--no-expiry", help="The token never expires (revoke it when done).")
]


@dataclass(frozen=True, slots=True)
class Lifetime:
    """What a new token's request says of its expiry: seconds, never, or (both unset) the
    manager's default."""

    seconds: int | None = None
    never: bool = False


def token_lifetime(expires_in: str | None, no_expiry: bool) -> Lifetime:
    """The lifetime `--expires-in` and `--no-expiry` ask for; exits 2 on a bad value."""
    if expires_in is not None and no_expiry:
        fail("--expires-in and --no-expiry: give one or the other")
    if expires_in is None:
        return Lifetime(never=no_expiry)
    try:
        return Lifetime(parse_duration(expires_in, what="--expires-in", max_s=MAX_TOKEN_LIFETIME_S))
    except ValueError as exc:
        fail(str(exc))


def print_issued(issued: IssuedToken) -> None:
    """The secret alone on stdout (`TOKEN=$(corral token create ci)`), the rest on stderr."""
    expiry = issued.expires_at
    lasts = "never expires" if expiry is None else f"expires {_expiry(expiry)}"
    typer.echo(
        f"token {issued.name} ({issued.id}) for {issued.user}, {lasts}; "
        "shown only now, keep it secret",
        err=True,
    )
    typer.echo(issued.token)


@app.command("ls")
def ls_command(user: UserOption = None, as_json: JsonOption = False) -> None:
    """List the tokens (never their secrets), oldest first."""

    async def fetch(client: Client) -> list[Token]:
        owner = user or (await client.me()).name
        return [token async for token in client.iter_tokens(owner, page_size=1000)]

    tokens = sorted(call(fetch), key=lambda t: t.created_at)
    if as_json:
        print_json(tokens)
        return
    if not tokens:
        typer.echo("no tokens", err=True)
        return
    now = datetime.now(UTC)
    print_table(
        ["ID", "NAME", "CREATED", "EXPIRES", "LAST USED"],
        [
            [
                str(t.id),
                t.name,
                local_time(t.created_at),
                _expiry(t.expires_at, now),
                age(t.last_used_at, now) + ("" if t.last_used_at is None else " ago"),
            ]
            for t in tokens
        ],
    )


@app.command("create")
def create_command(
    name: Annotated[str, typer.Argument(help="What the token is for, e.g. laptop or ci.")],
    user: UserOption = None,
    expires_in: ExpiresInOption = None,
    no_expiry: NoExpiryOption = False,
    as_json: JsonOption = False,
) -> None:
    """Make a token; its secret is printed on stdout, this once only."""
    lifetime = token_lifetime(expires_in, no_expiry)

    async def create(client: Client) -> IssuedToken:
        owner = user or (await client.me()).name
        return await client.create_token(
            owner, name, expires_in_s=lifetime.seconds, never_expires=lifetime.never
        )

    issued = call(create)
    if as_json:
        print_json(issued)
        return
    print_issued(issued)


@app.command("revoke")
def revoke_command(
    token: Annotated[
        str, typer.Argument(metavar="TOKEN", help="The token's id, a unique prefix, or its name.")
    ],
    user: UserOption = None,
) -> None:
    """Revoke a token: every manager refuses it at once."""

    async def revoke(client: Client) -> uuid.UUID:
        token_id = _as_id(token)
        if token_id is None:
            owner = user or (await client.me()).name
            token_id = _pick([t async for t in client.iter_tokens(owner)], token, owner)
        await client.revoke_token(token_id)
        return token_id

    typer.echo(f"token {call(revoke)} revoked")


def _as_id(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _pick(tokens: list[Token], ref: str, owner: str) -> uuid.UUID:
    """The one token of `tokens` whose name is `ref`, else whose id starts with it."""
    for matches in (
        [t for t in tokens if t.name == ref],
        [t for t in tokens if str(t.id).startswith(ref.lower())],
    ):
        if len(matches) == 1:
            return matches[0].id
        if len(matches) > 1:
            ids = ", ".join(str(t.id) for t in matches)
            fail(f"{ref!r} names {len(matches)} tokens of {owner} ({ids}); give the id")
    raise NotFoundError(f"{owner} has no token named {ref!r} or with an id starting so")


def _expiry(expires_at: datetime | None, now: datetime | None = None) -> str:
    """When a token expires, in local time, with how long is left (or that it has expired)."""
    if expires_at is None:
        return "never"
    left = (expires_at - (now or datetime.now(UTC))).total_seconds()
    when = local_time(expires_at)
    return f"{when} (expired)" if left <= 0 else f"{when} (in {format_duration(left)})"
