"""As a user: `corral run --upload DIR`, then `corral session outputs` to fetch what it wrote."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

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


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent."""
    yield from start_up(tmp_path)


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
    done = corral_in(up, elsewhere, "run", "--upload", str(project), "--", "python", "train.py")
    assert done.returncode == 0, done.stderr
    listing, data = done.stdout.splitlines()[:2]
    assert listing == str(sorted([".corralignore", "data", "data/input.csv", "train.py"]))
    assert data == "a,b"
    assert "corral: uploaded " in done.stderr
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
