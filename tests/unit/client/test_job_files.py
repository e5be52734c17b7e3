"""Job files: YAML and TOML read into the session spec, mistakes named by file, line and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corral.client.job_files import JobFileError, JobSpec, job_schema, load_job_file
from corral.domain.spec import SessionSpec

YAML_JOB = """\
name: sweep
command: [python, train.py, --lr, "0.01"]
resources:
  cpu: 2
  mem: 4g
priority: 5
env:
  WANDB_MODE: offline
array: "0-99%5"
"""

TOML_JOB = """\
name = "sweep"
command = ["python", "train.py", "--lr", "0.01"]
priority = 5
array = "0-99%5"

[resources]
cpu = 2
mem = "4g"

[env]
WANDB_MODE = "offline"
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _problems(path: Path) -> tuple[str, ...]:
    with pytest.raises(JobFileError) as caught:
        load_job_file(path)
    return caught.value.problems


@pytest.mark.parametrize(("name", "text"), [("job.yaml", YAML_JOB), ("job.toml", TOML_JOB)])
def test_a_yaml_and_a_toml_job_file_give_the_same_spec(
    tmp_path: Path, name: str, text: str
) -> None:
    """Both languages read to the same spec; the image defaults as `corral run`'s does."""
    job = load_job_file(_write(tmp_path, name, text))
    assert job.array == "0-99%5"
    assert (job.name, job.image, job.priority) == ("sweep", "python", 5)
    assert job.command == ["python", "train.py", "--lr", "0.01"]
    assert (
        job.resources.format_human()
        == load_job_file(_write(tmp_path, "again.yaml", YAML_JOB)).resources.format_human()
    )
    assert job.env == {"WANDB_MODE": "offline"}


def test_a_yaml_mistake_names_the_file_line_and_field(tmp_path: Path) -> None:
    """Each mistake is reported at its own line, in the order of the file, with its field."""
    text = YAML_JOB.replace("cpu: 2", "cpu: lots").replace("priority: 5", "priority: 500")
    problems = _problems(_write(tmp_path, "job.yaml", text + "cluster_size: 0\n"))
    assert [p.split(": ", 2)[:2] for p in problems] == [
        ["job.yaml:4", "resources.cpu"],
        ["job.yaml:6", "priority"],
        ["job.yaml:10", "cluster_size"],
    ]
    assert "'lots' is not a quantity" in problems[0]


def test_a_toml_mistake_names_the_line_from_the_key_path(tmp_path: Path) -> None:
    """TOML keeps no positions: the line is found from the key path, in a table too."""
    text = TOML_JOB.replace('mem = "4g"', 'mem = "four"').replace('"0-99%5"', '"0-99%0"')
    problems = _problems(_write(tmp_path, "job.toml", text))
    assert [p.split(": ", 2)[:2] for p in problems] == [
        ["job.toml:4", "array"],
        ["job.toml:8", "resources.mem"],
    ]


def test_an_unknown_field_and_a_missing_command_are_named(tmp_path: Path) -> None:
    """A misspelt field is refused at its line; a batch job without a command says so."""
    problems = _problems(_write(tmp_path, "job.yaml", "comand: [python]\npriority: 1\n"))
    assert problems[0].startswith("job.yaml:1: command: BATCH sessions need a command")
    assert problems[1].startswith("job.yaml:1: comand: Extra inputs are not permitted")


@pytest.mark.parametrize(
    ("name", "text", "start"),
    [
        ("job.yaml", "command: [python\npriority: 1\n", "job.yaml:2: not valid YAML"),
        ("job.toml", 'command = ["python"]\npriority = \n', "job.toml:2: not valid TOML"),
        ("job.yaml", "- python\n", "job.yaml:1: a job file is a mapping"),
        ("job.json", "{}", "job.json: a job file ends in .yaml, .yml or .toml"),
    ],
)
def test_a_file_that_does_not_parse_names_its_line(
    tmp_path: Path, name: str, text: str, start: str
) -> None:
    """Syntax errors, a non-mapping and an unknown suffix each get one problem with a line."""
    problems = _problems(_write(tmp_path, name, text))
    assert len(problems) == 1
    assert problems[0].startswith(start), problems[0]


def test_the_schema_is_the_session_spec_plus_array() -> None:
    """Generated from the one model: every SessionSpec field, plus `array` and `after` (the
    CLI's dependency syntax); image optional."""
    schema = job_schema()
    assert set(schema["properties"]) == set(SessionSpec.model_fields) | {"array", "after"}
    assert "image" not in schema.get("required", [])
    assert schema["additionalProperties"] is False
    assert JobSpec.model_fields.keys() - SessionSpec.model_fields.keys() == {"array", "after"}


ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("document", "language"),
    [("README.md", "yaml"), ("docs/job-files.md", "yaml"), ("docs/job-files.md", "toml")],
)
def test_the_documented_examples_are_valid_job_files(
    tmp_path: Path, document: str, language: str
) -> None:
    """Every job file shown in the README and docs/job-files.md loads as written."""
    text = (ROOT / document).read_text()
    blocks = re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    assert blocks
    for block in blocks:
        job = load_job_file(_write(tmp_path, f"example.{language}", block))
        assert job.command and job.array
