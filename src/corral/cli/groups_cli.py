"""`corral group ls | show | create | set | rm`: resource groups and their options.

Options are changed as the API takes them, a JSON merge patch (RFC 7396): `--set KEY=VALUE`
replaces a key (VALUE read as JSON, else as a string; `a.b=1` reaches into an object),
`--unset KEY` resets it to its default, `--options JSON` gives a whole patch. The access
options have flags of their own: `--users`, `--add-user`, `--remove-user`, `--open`,
`--max-user-priority`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from corral.cli._common import fail
from corral.cli._remote import JsonOption, call, local_time, print_json, print_table, text
from corral.client import Client, ResourceGroup

app = typer.Typer(
    help="Resource groups (admins change them): list, show, create, set options, remove.",
    no_args_is_help=True,
)

GroupArgument = Annotated[str, typer.Argument(metavar="GROUP", help="The group's name.")]
DescriptionOption = Annotated[str | None, typer.Option(help="What the group is for.")]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="An option (VALUE as JSON, else a string; `phase_limits.StartSessions.timeout_s"
        "=600` reaches into objects). Repeatable.",
    ),
]
UnsetOption = Annotated[
    list[str] | None,
    typer.Option("--unset", metavar="KEY", help="Reset an option to its default. Repeatable."),
]
OptionsOption = Annotated[
    str | None, typer.Option("--options", metavar="JSON", help="A JSON merge patch of options.")
]
UsersOption = Annotated[
    str | None,
    typer.Option(
        "--users",
        metavar="NAME[,NAME…]",
        help="Open the group to these users only (admins always may); '' for admins only.",
    ),
]
MaxPriorityOption = Annotated[
    int | None,
    typer.Option(help="The highest priority a user may give here; above it needs an admin."),
]


@app.command("ls")
def ls_command(as_json: JsonOption = False) -> None:
    """List the resource groups with their access and ordering."""

    async def fetch(client: Client) -> list[ResourceGroup]:
        return [group async for group in client.iter_resource_groups(page_size=1000)]

    groups = call(fetch)
    if as_json:
        print_json(groups)
        return
    print_table(
        [
            "NAME",
            "ACCESS",
            "MAX USER PRIORITY",
            "SEQUENCER",
            "ORDERING",
            "ADMISSION",
            "DESCRIPTION",
        ],
        [
            [
                g.name,
                _access(g),
                text(g.options.get("max_user_priority")),
                text(g.options.get("sequencer")),
                text(g.options.get("ordering")),
                _admission(g),
                text(g.description),
            ]
            for g in groups
        ],
    )


@app.command("show")
def show_command(group: GroupArgument, as_json: JsonOption = False) -> None:
    """One group with every option (defaults filled in)."""
    found = call(lambda client: client.get_resource_group(group))
    if as_json:
        print_json(found)
        return
    rows = [
        ["name", found.name],
        ["description", text(found.description)],
        ["access", _access(found)],
        ["created", local_time(found.created_at)],
    ]
    rows += [
        [key, text(json.dumps(value) if isinstance(value, dict | list) else value)]
        for key, value in found.options.items()
    ]
    print_table(None, rows)


@app.command("create")
def create_command(
    group: GroupArgument,
    description: DescriptionOption = None,
    users: UsersOption = None,
    max_user_priority: MaxPriorityOption = None,
    set_: SetOption = None,
    options: OptionsOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a group; options left out keep their defaults (open to everyone)."""
    patch = _patch(options, set_, None)
    _access_patch(patch, users, max_user_priority)
    created = call(
        lambda client: client.create_resource_group(
            group, description=description or "", options=patch
        )
    )
    _done(created, "created", as_json)


@app.command("set")
def set_command(
    group: GroupArgument,
    description: DescriptionOption = None,
    users: UsersOption = None,
    add_user: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME", help="Add a user to the group's users. Repeatable."),
    ] = None,
    remove_user: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME", help="Take a user off the group's users. Repeatable."),
    ] = None,
    open_: Annotated[
        bool, typer.Option("--open", help="Open the group to everyone (the default).")
    ] = False,
    max_user_priority: MaxPriorityOption = None,
    set_: SetOption = None,
    unset: UnsetOption = None,
    options: OptionsOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a group's description or options (merged into the current ones, then checked
    as a whole; sessions already queued follow the new access rules)."""
    listing = [users is not None, bool(add_user or remove_user), open_]
    if sum(listing) > 1:
        fail("--users, --add-user/--remove-user and --open: give one of them")
    patch = _patch(options, set_, unset)
    _access_patch(patch, users, max_user_priority)
    if open_:
        patch["allowed_users"] = None

    async def update(client: Client) -> ResourceGroup:
        if add_user or remove_user:
            # Read, then write the whole list: a merge patch replaces a list, never edits it.
            current = (await client.get_resource_group(group)).options.get("allowed_users")
            names = set(current or ()) | set(add_user or ())
            patch["allowed_users"] = sorted(names - set(remove_user or ()))
        return await client.update_resource_group(
            group, description=description, options_patch=patch
        )

    _done(call(update), "changed", as_json)


@app.command("rm")
def rm_command(group: GroupArgument) -> None:
    """Remove a group no agent and no live session uses."""
    call(lambda client: client.delete_resource_group(group))
    typer.echo(f"resource group {group} removed")


def _patch(options: str | None, sets: list[str] | None, unsets: list[str] | None) -> dict[str, Any]:
    """The merge patch the flags make; exits 2 naming a malformed one."""
    patch: dict[str, Any] = {}
    if options is not None:
        try:
            given = json.loads(options)
        except ValueError as exc:
            fail(f"--options: not JSON: {exc}")
        if not isinstance(given, dict):
            fail('--options: must be a JSON object, like \'{"ordering": "best_effort"}\'')
        patch.update(given)
    for item in sets or ():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            fail(f"--set {item!r}: expected KEY=VALUE, like --set ordering=best_effort")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        _put(patch, key, value, f"--set {item!r}")
    for key in unsets or ():
        _put(patch, key, None, f"--unset {key!r}")
    return patch


def _put(patch: dict[str, Any], dotted: str, value: Any, flag: str) -> None:
    """Set `a.b.c` in `patch` to `value`, making the objects on the way."""
    *path, last = dotted.split(".")
    where = patch
    for key in path:
        child = where.setdefault(key, {})
        if not isinstance(child, dict):
            fail(f"{flag}: {key!r} is given a value and keys under it")
        where = child
    where[last] = value


def _access_patch(patch: dict[str, Any], users: str | None, max_user_priority: int | None) -> None:
    if users is not None:
        patch["allowed_users"] = sorted({n.strip() for n in users.split(",") if n.strip()})
    if max_user_priority is not None:
        patch["max_user_priority"] = max_user_priority


def _access(group: ResourceGroup) -> str:
    """Who may submit to the group, in a few words."""
    listed = group.options.get("allowed_users")
    if listed is None:
        return "everyone"
    if not listed:
        return "admins only"
    return "admins, " + ",".join(str(name) for name in listed)


def _admission(group: ResourceGroup) -> str:
    """The group's all-or-nothing admission in a few words ("-" when off)."""
    wait = group.options.get("wait_for_kernels_ready") or {}
    if not wait.get("enable"):
        return "-"
    words = f"ready in {wait.get('timeout_s')}s"
    return words + (", blocking" if wait.get("block_admission") else "")


def _done(group: ResourceGroup, what: str, as_json: bool) -> None:
    if as_json:
        print_json(group)
        return
    typer.echo(f"resource group {group.name} {what}: open to {_access(group)}")
