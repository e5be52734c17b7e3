"""`corral submit JOB_FILE` as a user runs it: YAML and TOML job files against `corral up`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._cli import corral
from tests.e2e._up import Up, start_up

YAML_ARRAY = """\
# three elements, one at a time
name: sweep
command:
  - python
  - -c
  - "import os; open(os.path.join({out!r}, os.environ['CORRAL_ARRAY_INDEX']), 'w').write('ok')"
resources:
  cpu: 0.1
  mem: 32m
array: "0-4:2%1"
"""

TOML_SESSION = """\
name = "single"
command = ["python", "-c", "import os; open({out!r}, 'w').write(os.environ['GREETING'])"]

[resources]
cpu = 0.1
mem = "32m"

[env]
GREETING = "hello from toml"
"""


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent."""
    yield from start_up(tmp_path)


def test_a_yaml_array_and_a_toml_session_run_from_job_files(up: Up, tmp_path: Path) -> None:
    """A YAML job array runs each of its indexes; a TOML session runs with its env; --wait
    returns each one's exit code once it has ended."""
    out = tmp_path / "array-out"
    out.mkdir()
    yaml_file = tmp_path / "sweep.yaml"
    yaml_file.write_text(YAML_ARRAY.format(out=str(out)))
    done = up.corral("submit", str(yaml_file), "--wait", timeout_s=300)
    assert done.returncode == 0, done.stderr
    assert "3 sessions, at most 1 at once" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["0", "2", "4"]
    listed = json.loads(up.corral("session", "ls", "--array", done.stdout.strip(), "--json").stdout)
    assert {(e["name"], e["status"]) for e in listed} == {("sweep", "TERMINATED")}

    greeting = tmp_path / "greeting.txt"
    toml_file = tmp_path / "single.toml"
    toml_file.write_text(TOML_SESSION.format(out=str(greeting)))
    single = up.corral("submit", str(toml_file), "--wait", timeout_s=300)
    assert single.returncode == 0, single.stderr
    assert greeting.read_text() == "hello from toml"
    info = json.loads(up.corral("session", "info", single.stdout.strip(), "--json").stdout)
    assert (info["name"], info["status"]) == ("single", "TERMINATED")
    assert single.stdout.strip() == str(info["number"])  # what users type
    single_id = info["id"]

    # `after` names sessions as `corral run --after` does: a name, an array's number, a kind.
    array_number = done.stdout.strip()
    then = tmp_path / "then.yaml"
    then.write_text(f"command: [python, -c, 'pass']\nafter: [single, 'afterany:{array_number}']\n")
    waited = up.corral("submit", str(then), "--wait", timeout_s=300)
    assert waited.returncode == 0, waited.stderr
    info = json.loads(up.corral("session", "info", waited.stdout.strip(), "--json").stdout)
    assert info["status"] == "TERMINATED"
    # The array's number stands for each of its elements.
    assert {(d["session"], d["kind"]) for d in info["dependencies"]} == {
        (single_id, "afterok"),
        *((e["id"], "afterany") for e in listed),
    }


def test_a_job_file_with_a_mistake_is_refused_naming_its_line(tmp_path: Path) -> None:
    """The CLI exits 2 with `file:line: field: message` for each mistake; nothing is sent (no
    server is even configured)."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: sweep\ncommand: [python, train.py]\nresources:\n  cpu: -2\narray: 0-9%\n"
        "after: ['sometime:12']\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"HOME": str(tmp_path), "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    done = corral("submit", str(job), env=env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "corral: error: 3 mistakes:" in done.stderr
    assert "job.yaml:4: resources.cpu: " in done.stderr
    assert "job.yaml:5: array: the throttle after '%'" in done.stderr
    assert "job.yaml:6: after: 'sometime:12': unknown dependency kind 'sometime'" in done.stderr
    schema = corral("submit", "--schema", env=env)
    assert schema.returncode == 0
    assert "array" in json.loads(schema.stdout)["properties"]
