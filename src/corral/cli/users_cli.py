"""`corral user ls | create | set | rm`: the cluster's users (admins)."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli._remote import JsonOption, call, local_time, print_json, print_table
from corral.cli.tokens_cli import ExpiresInOption, NoExpiryOption, print_issued, token_lifetime
from corral.client import Client, IssuedToken, User

app = typer.Typer(
    help="The cluster's users (admins): list, create, change the role of, remove.",
    no_args_is_help=True,
)

RoleOption = Annotated[str, typer.Option(help="`user` (own sessions only) or `admin` (all).")]


@app.command("ls")
def ls_command(as_json: JsonOption = False) -> None:
    """List the users, by name."""

    async def fetch(client: Client) -> list[User]:
        return [user async for user in client.iter_users(page_size=1000)]

    users = call(fetch)
    if as_json:
        print_json(users)
        return
    print_table(
        ["NAME", "ROLE", "CREATED"],
        [[u.name, u.role, local_time(u.created_at)] for u in users],
    )


@app.command("create")
def create_command(
    name: Annotated[str, typer.Argument(help="1 to 64 letters, digits, '.', '_', '-'.")],
    role: RoleOption = "user",
    token: Annotated[
        bool, typer.Option("--token", help="Also make the user a token, printed once.")
    ] = False,
    expires_in: ExpiresInOption = None,
    no_expiry: NoExpiryOption = False,
    as_json: JsonOption = False,
) -> None:
    """Create a user; with --token, print a token for them (on stdout, shown only now)."""
    lifetime = token_lifetime(expires_in, no_expiry) if token else None

    async def create(client: Client) -> tuple[User, IssuedToken | None]:
        user = await client.create_user(name, role=role)
        if not token:
            return user, None
        assert lifetime is not None
        issued = await client.create_token(
            name, "initial", expires_in_s=lifetime.seconds, never_expires=lifetime.never
        )
        return user, issued

    user, issued = call(create)
    if as_json:
        print_json({"user": user.model_dump(mode="json"), "token": _dump(issued)})
        return
    typer.echo(f"user {user.name} created ({user.role})", err=True)
    if issued is not None:
        print_issued(issued)


@app.command("set")
def set_command(
    name: Annotated[str, typer.Argument(help="The user's name.")],
    role: RoleOption,
    as_json: JsonOption = False,
) -> None:
    """Change a user's role (the last admin stays one)."""
    user = call(lambda client: client.update_user(name, role=role))
    if as_json:
        print_json(user)
        return
    typer.echo(f"user {user.name} is now {'an admin' if user.is_admin else 'a user'}")


@app.command("rm")
def rm_command(name: Annotated[str, typer.Argument(help="The user's name.")]) -> None:
    """Remove a user who owns no session; their tokens stop working at once."""
    call(lambda client: client.delete_user(name))
    typer.echo(f"user {name} removed, with their tokens")


def _dump(issued: IssuedToken | None) -> object:
    if issued is None:
        return None
    return issued.model_dump(mode="json")
