"""`corral run`: the spec it submits, output untouched on stdout, progress on stderr, exit codes."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from corral.domain.images import default_image
from tests.unit.client._fake_api import FakeApi
from tests.unit.client.conftest import Cli


def _runs(api: FakeApi, stdout: bytes = b"", stderr: bytes = b"", **ending: object) -> None:
    """When the session's output is followed, it is scheduled, runs, writes and ends."""

    async def lifecycle(session_id: str) -> None:
        for status in ("SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING"):
            await api.move(session_id, status)
        await api.delivered()  # the phases are shown before the output and the end
        api.logs[(session_id, "stdout")] = stdout
        api.logs[(session_id, "stderr")] = stderr
        await api.finish(session_id, **ending)  # type: ignore[arg-type]

    api.on_follow = lifecycle


def test_the_commands_output_alone_reaches_stdout(cli: Cli, api: FakeApi) -> None:
    """stdout holds exactly what the command printed; the phases and the end go to stderr."""
    _runs(api, stdout=b"42\n")
    result = cli("run", "--", "python", "-c", "print(42)")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b"42\n"
    session_id = next(iter(api.sessions))
    # The scheduler's reason (indented) may show while the session is PENDING.
    phases = [line for line in result.stderr.splitlines() if not line.startswith("corral:  ")]
    assert phases == [f"corral: session 1 ({session_id}) PENDING"] + [
        f"corral: session 1 {status}"
        for status in ("SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING")
    ] + ["corral: session 1 TERMINATED (success), exit code 0"]


def test_the_submitted_spec_is_a_batch_session_with_the_flags(cli: Cli, api: FakeApi) -> None:
    """Resources, cluster, image, name, environment and a creation id go into the spec."""
    _runs(api)
    result = cli(
        "run",
        "--cpu", "2",
        "--mem", "4g",
        "--gpus", "1",
        "--cluster-size", "2",
        "--multi-node",
        "--name", "train",
        "-e", "SEED=1",
        "--",
        "python", "train.py", "--epochs", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (spec,) = api.created
    assert spec["type"] == "BATCH"
    assert spec["image"] == "python"
    assert spec["command"] == ["python", "train.py", "--epochs", "3"]
    assert spec["resources"] == {"cpu": 2, "mem": 4 * 1024**3, "cuda.device": 1}
    assert (spec["cluster_size"], spec["cluster_mode"]) == (2, "multi-node")
    assert (spec["name"], spec["env"]) == ("train", {"SEED": "1"})
    assert len(spec["creation_id"]) == 32


def test_options_end_at_the_command_so_no_double_dash_is_needed(cli: Cli, api: FakeApi) -> None:
    """`corral run python -c ...`: the command's own options are not corral's."""
    _runs(api, stdout=b"1\n")
    result = cli("run", "python", "-c", "print(1)")
    assert result.exit_code == 0, result.output
    assert api.created[0]["command"] == ["python", "-c", "print(1)"]


def test_a_shell_script_runs_under_the_shell_image() -> None:
    """One argument with shell syntax is a script for `shell`; anything else is an argv."""
    assert default_image(["make && ./bench | tee log"]) == "shell"
    assert default_image(["echo $HOME"]) == "shell"
    assert default_image(["nvidia-smi"]) == "python"
    assert default_image(["python", "-c", "print('a b')"]) == "python"


def test_the_exit_code_is_the_commands(cli: Cli, api: FakeApi) -> None:
    """A command that exits 3 makes `corral run` exit 3; its stderr reaches stderr untouched."""
    _runs(api, stderr=b"Traceback\n", exit_code=3, result="failure")
    result = cli("run", "--", "python", "fail.py")
    assert result.exit_code == 3
    assert "Traceback\n" in result.stderr
    assert result.stderr.endswith("TERMINATED (failure), exit code 3\n")


@pytest.mark.parametrize(
    ("status", "exit_code", "expected"),
    [("ERROR", None, 1), ("ERROR", 137, 137), ("CANCELLED", None, 1), ("TERMINATED", -9, 137)],
)
def test_an_unsuccessful_end_exits_nonzero(
    cli: Cli, api: FakeApi, status: str, exit_code: int | None, expected: int
) -> None:
    """Errors and cancellations exit 1 unless a code is known; a signal death is 128 + N."""
    _runs(api, status=status, exit_code=exit_code, failure_cause="agent_lost")
    result = cli("run", "--", "python", "x.py")
    assert result.exit_code == expected
    last = result.stderr.splitlines()[-1]
    assert f"{status} (" in last and "): agent_lost" in last


def test_detach_prints_the_number_and_returns(cli: Cli, api: FakeApi) -> None:
    """`--detach` prints only the session's number and follows nothing."""
    api.add_session(status="TERMINATED")  # numbered 1: the new one is 2
    result = cli("run", "--detach", "--", "sleep", "100")
    assert result.exit_code == 0
    assert result.stdout == "2\n"
    assert [r.url.path for r in api.requests] == ["/v1/sessions"]


def test_no_follow_waits_for_the_end_without_the_output(cli: Cli, api: FakeApi) -> None:
    """`--no-follow` reads no logs, and still exits with the session's code when it ends."""

    async def ends(session_id: str | None) -> None:
        assert session_id is not None
        await api.finish(session_id, exit_code=4, result="failure")

    api.on_events = ends
    result = cli("run", "--no-follow", "--", "python", "x.py")
    assert result.exit_code == 4
    assert result.stdout == ""
    assert not any(r.url.path.endswith("/logs") for r in api.requests)


def test_an_invalid_flag_is_refused_before_submitting(cli: Cli, api: FakeApi) -> None:
    """A bad memory amount exits 2 with the problem, and nothing is sent."""
    result = cli("run", "--mem", "lots", "--", "true")
    assert result.exit_code == 2
    assert result.stderr.startswith("corral: error: --mem lots: 'lots' is not a size")
    assert api.requests == []


def test_a_bad_env_item_is_refused(cli: Cli, api: FakeApi) -> None:
    """`--env` without `=` is a usage error."""
    result = cli("run", "-e", "SEED", "--", "true")
    assert (result.exit_code, result.stderr) == (
        2,
        "corral: error: --env 'SEED': expected KEY=VALUE\n",
    )


def test_ctrl_c_without_a_terminal_terminates_and_exits_130(cli: Cli, api: FakeApi) -> None:
    """Ctrl-C with no one to ask terminates the session, shows its end, and exits 130."""

    async def interrupted(session_id: str) -> None:
        await api.move(session_id, "RUNNING")
        api.logs[(session_id, "stdout")] = b"partial\n"
        os.kill(os.getpid(), signal.SIGINT)

    async def stopped(session_id: str) -> None:
        await api.finish(session_id, exit_code=-2, result="failure")

    api.on_follow = interrupted
    api.on_terminate = stopped
    result = cli("run", "--", "python", "train.py")
    assert result.exit_code == 130
    assert result.stdout_bytes == b"partial\n"
    session_id = next(iter(api.sessions))
    assert api.sent("POST", f"/v1/sessions/{session_id}/terminate")
    assert "corral: session 1: terminating" in result.stderr


def test_a_lost_connection_says_the_session_may_still_run(cli: Cli, api: FakeApi) -> None:
    """If the manager goes away mid-run, the error says how to check on the session."""

    async def broken(session_id: str) -> None:
        raise httpx.ReadError("connection reset by peer")

    api.on_follow = broken
    result = cli("run", "--", "python", "train.py")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].endswith("may still be running: `corral session info 1`")


def test_retry_flags_make_the_sessions_retry_policy(cli: Cli, api: FakeApi) -> None:
    """--retries, --retry-delay, --backoff, --max-retry-delay, --retry-on: only those given."""
    _runs(api)
    result = cli(
        "run",
        "--retries", "3",
        "--retry-delay", "30s",
        "--backoff", "exponential",
        "--max-retry-delay", "10m",
        "--retry-on", "oom_killed,agent_transient",
        "--", "python", "train.py",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (spec,) = api.created
    assert spec["retry_policy"] == {
        "max_retries": 3,
        "retry_delay": 30.0,
        "backoff": "exponential",
        "max_retry_delay": 600.0,
        "eligible_causes": ["agent_transient", "oom_killed"],
    }


def test_bad_retry_flags_are_refused_before_submitting(cli: Cli, api: FakeApi) -> None:
    """An unknown cause or delay exits 2 naming the flag; nothing is sent."""
    result = cli("run", "--retries", "1", "--retry-on", "user_cancelled", "--", "true")
    assert result.exit_code == 2
    assert result.stderr.startswith("corral: error: --retry-on 'user_cancelled': not a retry")
    result = cli("run", "--retries", "1", "--retry-delay", "soon", "--", "true")
    assert result.exit_code == 2
    assert result.stderr.startswith("corral: error: --retry-delay 'soon': write a delay like")
    result = cli("run", "--retries", "1", "--max-retry-delay", "2d", "--", "true")
    assert result.exit_code == 2
    assert "--max-retry-delay" in result.stderr
    assert api.requests == []
