"""As a user with a script in a directory: `corral run -- python train.py` from there."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._up import Up, start_up

# Where the job runs and with what: `python` must be the host's, not corral's virtualenv.
_TRAIN = """\
import json, os, sys
print("trained")
print(json.dumps({"cwd": os.getcwd(), "workdir": os.environ["CORRAL_WORKDIR"],
                  "prefix": sys.prefix, "venv": os.environ.get("VIRTUAL_ENV")}), file=sys.stderr)
"""


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent."""
    yield from start_up(tmp_path)


def corral_in(up: Up, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` run from the directory `cwd`, as a user in that directory types it."""
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        cwd=cwd,
        env=up.env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_readme_example_runs_the_script_from_its_directory(up: Up, tmp_path: Path) -> None:
    """`corral run -- python train.py` finds train.py, outside corral's own virtualenv."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(_TRAIN)
    done = corral_in(up, project, "run", "--", "python", "train.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained\n"
    seen = _job_report(done.stderr)
    assert seen["cwd"] == seen["workdir"] == str(project)
    assert seen["venv"] is None
    assert Path(seen["prefix"]).resolve() != Path(sys.prefix).resolve()  # not corral's venv


def test_workdir_flag_and_a_missing_workdir(up: Up, tmp_path: Path) -> None:
    """`--workdir DIR` picks the directory; one the agent lacks falls back and says so."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(_TRAIN)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = corral_in(up, elsewhere, "run", "--workdir", str(project), "--", "python", "train.py")
    assert done.returncode == 0, done.stderr
    assert _job_report(done.stderr)["cwd"] == str(project)
    missing = tmp_path / "not-there"
    failed = corral_in(up, elsewhere, "run", "--workdir", str(missing), "--", "python", "train.py")
    assert failed.returncode != 0
    assert f"corral: workdir {missing} does not exist on " in failed.stderr
    assert "can't open file" in failed.stderr  # the job itself then runs in its own directory


def _job_report(stderr: str) -> dict[str, str]:
    """The JSON line train.py printed to its stderr (corral's progress lines around it)."""
    for line in stderr.splitlines():
        if line.startswith("{"):
            found: dict[str, str] = json.loads(line)
            return found
    raise AssertionError(f"train.py's report is not in:\n{stderr}")
