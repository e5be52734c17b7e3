"""Where a process kernel starts and what `python` means there: never corral's own venv."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.agent.runtime import KernelLaunch
from corral.agent.runtime._host_python import corral_venv, host_python, outside_corral_venv
from corral.agent.runtime.process import ProcessKernel, ProcessRuntime
from tests.integration.agent.test_process_runtime import make_launch, stdout_of

_REPORT = (
    "import json, os, sys; print(json.dumps({'cwd': os.getcwd(), 'exe': sys.executable, "
    "'prefix': sys.prefix, 'venv': os.environ.get('VIRTUAL_ENV'), "
    "'path': os.environ['PATH'], 'workdir': os.environ['CORRAL_WORKDIR'], "
    "'outputs': os.environ['CORRAL_OUTPUT_DIR']}))"
)


@pytest.fixture
async def started() -> AsyncIterator[list[ProcessKernel]]:
    """Kernels a test started; whatever still runs is killed at teardown."""
    kernels: list[ProcessKernel] = []
    yield kernels
    for kernel in kernels:
        await kernel.terminate(0)


async def _report(
    runtime: ProcessRuntime, launch: KernelLaunch, started: list[ProcessKernel]
) -> tuple[dict[str, str], ProcessKernel]:
    await runtime.preload(launch)
    kernel = await runtime.start(launch)
    started.append(kernel)
    return json.loads(await stdout_of(kernel)), kernel


async def test_kernel_starts_in_its_workdir_with_the_host_python(
    tmp_path: Path, started: list[ProcessKernel]
) -> None:
    """An existing workdir is the kernel's cwd and CORRAL_WORKDIR; python is not corral's venv."""
    project = tmp_path / "project"
    project.mkdir()
    launch = dataclasses.replace(make_launch(tmp_path, ("python", "-c", _REPORT)), workdir=project)
    seen, kernel = await _report(ProcessRuntime(), launch, started)
    assert seen["cwd"] == seen["workdir"] == str(project)
    assert seen["outputs"] == str(launch.output_dir)
    assert kernel.info["cwd"] == str(project)
    assert seen["venv"] is None
    venv = corral_venv()
    if venv is not None:  # corral runs from a venv here (`make`): the kernel stays out of it
        assert not _inside(seen["prefix"], venv)
        assert outside_corral_venv(seen["path"]) == seen["path"]
    assert Path(seen["exe"]).parent == host_python().parent


async def test_missing_workdir_starts_in_the_kernels_own_directory_and_says_so(
    tmp_path: Path, started: list[ProcessKernel]
) -> None:
    """A workdir this host lacks: the kernel starts in its own directory; stderr says why."""
    gone = tmp_path / "not-on-this-host"
    launch = dataclasses.replace(make_launch(tmp_path, ("python", "-c", _REPORT)), workdir=gone)
    seen, kernel = await _report(ProcessRuntime(host="node-7"), launch, started)
    assert seen["cwd"] == seen["workdir"] == str(launch.work_dir)
    stderr = (await kernel.read_log("stderr", 0, 1 << 16)).decode()
    assert stderr.startswith(f"corral: workdir {gone} does not exist on node-7; ")
    assert str(launch.work_dir) in stderr.splitlines()[0]


async def test_no_workdir_starts_in_the_kernels_own_directory_quietly(
    tmp_path: Path, started: list[ProcessKernel]
) -> None:
    """Without a workdir (API submissions) the kernel starts in its own directory, no note."""
    launch = make_launch(tmp_path, ("python", "-c", _REPORT))
    seen, kernel = await _report(ProcessRuntime(), launch, started)
    assert seen["cwd"] == str(launch.work_dir)
    assert await kernel.read_log("stderr", 0, 1 << 16) == b""


async def test_python_setting_may_name_a_venv(tmp_path: Path, started: list[ProcessKernel]) -> None:
    """`--python VENV`: jobs run in that venv, as its image would (VIRTUAL_ENV set)."""
    venv = tmp_path / "jobs-venv"
    venv.mkdir()
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    runtime = ProcessRuntime(python=venv)
    seen, _ = await _report(runtime, make_launch(tmp_path, ("python", "-c", _REPORT)), started)
    assert seen["venv"] == str(venv)
    assert seen["path"].split(os.pathsep)[0] == str(venv / "bin")
    assert runtime.python == venv / "bin" / "python"
    assert runtime.notes().lines[-1] == f"python: {venv}"  # said in the agent's startup log


def test_a_python_setting_that_is_no_interpreter_is_refused(tmp_path: Path) -> None:
    """A wrong `--python` stops the agent at its start, naming the path."""
    with pytest.raises(ValueError, match=r"--python: .*nowhere/python3 does not exist"):
        ProcessRuntime(python=tmp_path / "nowhere" / "python3")


def _inside(path: str, venv: Path) -> bool:
    return Path(path).resolve().is_relative_to(venv)


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_host_python_skips_corral_venv_and_resolves_shims(tmp_path: Path) -> None:
    """The first python3 outside corral's venv; a shim script is asked for its interpreter."""
    real = _executable(tmp_path / "real" / "python3", "\x7fELF not really\n")
    assert host_python(str(real.parent)) == real
    shim = _executable(tmp_path / "shims" / "python3", f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    assert host_python(f"{shim.parent}{os.pathsep}{real.parent}") == Path(sys.executable)
    assert host_python(str(tmp_path / "empty")) == Path(sys._base_executable)  # type: ignore[attr-defined]
    venv = corral_venv()
    if venv is not None:
        inside = f"{venv / 'bin'}{os.pathsep}{real.parent}"
        assert host_python(inside) == real
        assert outside_corral_venv(inside) == str(real.parent)
