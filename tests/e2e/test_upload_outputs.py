"""As a user: `corral run --upload DIR`, then `corral session outputs` to fetch what it wrote."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.client import Client
from corral.coordination.manager import LoopIntervals
from corral.manager.daemon import ManagerConfig, ManagerDaemon
from corral.manager.up import admin_token
from corral.store.database import Database
from corral.store.tables import uploads
from tests.e2e._cluster import poll
from tests.e2e._up import Up, start_up
from tests.e2e.test_workdir import corral_in

_TRAIN = """\
import os, pathlib
print(sorted(str(p) for p in pathlib.Path('.').rglob('*')))
print(open('data/input.csv').read().strip())
out = pathlib.Path(os.environ['CORRAL_OUTPUT_DIR'])
(out / 'ckpt').mkdir(parents=True, exist_ok=True)
(out / 'result.txt').write_text('loss=0.1\\n')
(out / 'ckpt' / 'model.bin').write_bytes(bytes(range(16)))
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """`corral up` with one local agent, shared by this module's tests."""
    yield from start_up(tmp_path_factory.mktemp("up"))


def _project(root: Path) -> Path:
    for name, text in {
        "train.py": _TRAIN,
        "data/input.csv": "a,b",
        "secret.txt": "do not send",
        ".corralignore": "secret.txt\n",
        ".git/config": "[core]\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_upload_runs_the_script_in_the_unpacked_tree_and_sends_it_once(
    up: Up, tmp_path: Path
) -> None:
    """The kernel sees the tree without .git and ignored files; a second submit sends nothing."""
    project = _project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = corral_in(
        up, elsewhere, "run", "--name", "sent", "--upload", str(project), "--",
        "python", "train.py",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    listing, data = done.stdout.splitlines()[:2]
    assert listing == str(sorted([".corralignore", "data", "data/input.csv", "train.py"]))
    assert data == "a,b"
    assert "corral: uploaded " in done.stderr
    info = _facts(corral_in(up, elsewhere, "session", "info", "sent").stdout)
    assert re.fullmatch("[0-9a-f]{64}", info["upload"]), info
    assert info["workdir"] == "the upload, unpacked in each kernel's own directory"
    again = corral_in(up, elsewhere, "run", "--upload", str(project), "--", "python", "train.py")
    assert again.returncode == 0, again.stderr
    assert "unchanged since its upload, nothing sent" in again.stderr
    assert "corral: uploaded " not in again.stderr
    (project / "train.py").write_text(_TRAIN + "print('changed')\n")
    changed = corral_in(up, elsewhere, "run", "--upload", str(project), "--", "python", "train.py")
    assert changed.returncode == 0 and "corral: uploaded " in changed.stderr
    assert changed.stdout.splitlines()[-1] == "changed"


def test_outputs_are_listed_and_downloaded(up: Up, tmp_path: Path) -> None:
    """`corral session outputs ID` fetches what the job wrote to CORRAL_OUTPUT_DIR."""
    project = _project(tmp_path / "project")
    done = corral_in(up, project, "run", "--name", "fit", "--", "python", "train.py")
    assert done.returncode == 0, done.stderr
    info = _facts(corral_in(up, tmp_path, "session", "info", "fit").stdout)
    assert (info["workdir"], info["upload"]) == (str(project), "-")
    listed = corral_in(up, tmp_path, "session", "outputs", "fit", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(f["kernel"], f["name"], f["size_bytes"]) for f in json.loads(listed.stdout)] == [
        (0, "ckpt/model.bin", 16),
        (0, "result.txt", 9),
    ]
    table = corral_in(up, tmp_path, "session", "outputs", "fit", "--list")
    assert "ckpt/model.bin" in table.stdout and "KERNEL" in table.stdout
    fetched = corral_in(up, tmp_path, "session", "outputs", "fit")
    assert fetched.returncode == 0, fetched.stderr
    target = tmp_path / "fit-outputs"
    assert (target / "result.txt").read_text() == "loss=0.1\n"
    assert (target / "ckpt" / "model.bin").read_bytes() == bytes(range(16))
    dest = tmp_path / "chosen"
    chosen = corral_in(up, tmp_path, "session", "outputs", "fit", "--dest", str(dest))
    assert chosen.returncode == 0, chosen.stderr
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "ckpt/model.bin",
        "result.txt",
    ]


def _facts(table: str) -> dict[str, str]:
    """`session info`'s `key: value` lines, up to the first blank line."""
    facts = {}
    for line in table.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        facts[key.strip()] = value.strip()
    return facts


async def test_uploads_no_session_names_are_purged_after_their_bound(
    database_url: str, tmp_path: Path
) -> None:
    """A real manager over HTTP with a one-second bound: the upload no session names goes,
    the one a session names stays until the session is removed, then goes too."""
    daemon = ManagerDaemon(
        ManagerConfig(
            database_url=database_url,
            port=0,
            prefix=f"e2e{uuid.uuid4().hex[:8]}",
            intervals=LoopIntervals(short_interval_s=0.2, long_interval_s=0.5),
            unused_upload_hours=1 / 3600,
        )
    )
    runner = await daemon.start()
    try:
        assert daemon.parts is not None
        db = daemon.parts.db
        token, _ = await admin_token(db, tmp_path / "admin-token", None)
        used, unused = tmp_path / "used", tmp_path / "unused"
        for folder in (used, unused):
            folder.mkdir()
            (folder / "train.py").write_text(f"print({folder.name!r})\n")
        async with Client(daemon.url, token) as client:
            kept = (await client.upload_directory(used)).digest
            dropped = (await client.upload_directory(unused)).digest
            session = await client.create_session(
                image="python", command=["python", "train.py"], upload=kept
            )
            await poll(lambda: _stored(db, {kept}), what="the unused upload to be purged")
            shown = await client.get_session(session.id)
            assert shown.upload == kept
            await client.terminate_session(session.id)
            await client.delete_session(session.id)
            await poll(lambda: _stored(db, set()), what="the upload of the removed session")
            assert dropped != kept
    finally:
        await daemon.stop()
        await runner


async def _stored(db: Database, digests: set[str]) -> bool:
    """Whether exactly `digests` are stored (read from the database: asking over HTTP would
    mark them used)."""
    async with db.read() as conn:
        return set((await conn.execute(sa.select(uploads.c.digest))).scalars()) == digests
