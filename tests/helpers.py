"""Test helpers: launch several experiments in one torchrun launch (one start-up cost per world)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from meshscope.capture.segment_clock import CpuClock
from meshscope.run.launch import launch

ROOT = Path(__file__).resolve().parents[1]


class CountClock(CpuClock):
    """`capture.segment_clock`'s CPU clock whose time is what `read()` returns, a count: a measured segment's
    "seconds" are how much it grew between the segment's marks."""

    def __init__(self, read):
        self.read = read

    def mark(self, stream=None) -> int:
        return self.read()

    @staticmethod
    def name() -> str:
        return "a count"


def skip_unless_installed(*modules: str) -> None:
    """Skip the calling test module unless every one of `modules` is installed. Found, not imported:
    importing megatron.core, lightning or torchtitan costs 4-6 s in each pytest worker that collects
    the module, and the jobs that use them import them in their own processes anyway."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}", allow_module_level=True)


def only_with(distribution: str, version: str):
    """A mark that skips a test unless `distribution` `version` is what is installed: its counts are read from
    that release's code (a distribution's metadata is read, its modules are not imported)."""
    try:
        found = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        found = None
    return pytest.mark.skipif(found != version, reason=f"reads {distribution} {version}'s code; installed: "
                                                       f"{found or 'none'}")


TORCH = tuple(int(part) for part in importlib.metadata.version("torch").split("+")[0].split(".")[:2])
"""The installed torch release, (2, 13): where torch's own behaviour differs between the releases a test reads."""


def run_many(tmp_path: Path, items, world: int, timeout: float = 60.0, backend: str = "gloo") -> list[dict]:
    """Run [(experiment, overrides), ...] on `world` gloo ranks in one launch; return their results."""
    spec = {"backend": backend, "timeout": timeout,
            "experiments": [{"name": name, "overrides": overrides} for name, overrides in items]}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    outcome = launch(tmp_path, world, timeout)
    assert outcome.returncode == 0, f"run failed: {outcome.error}\n{(tmp_path / 'launcher.log').read_text()[-3000:]}"
    doc = json.loads((tmp_path / "result.json").read_text())
    return doc["results"] if "results" in doc else [doc]


def cli(*args, timeout: float = 120.0, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `python -m meshscope ARGS` in `cwd` and return the completed process (text stdout/stderr);
    `env` adds to this process's environment (this checkout's ``src`` first on the path, wherever `cwd` is).
    Forked from the suite's zygote (tests/conftest.py) unless `env` is given, a variable the zygote's imports
    may have read: ``meshscope run`` imports torch before it launches (3 s of CPU a call on the 2-core box)."""
    return run_module("meshscope", *args, timeout=timeout, env=env, cwd=cwd)


def run_module(module: str, *args, timeout: float = 120.0, env: dict | None = None,
               cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`cli` for any ``python -m MODULE ARGS`` (``meshscope.run.agent``: a launch as ``meshscope run`` makes it,
    its ranks forked; a module in `cwd` is importable, as ``python -m`` puts the working directory first)."""
    from meshscope.run import zygote

    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", module, *map(str, args)]
    child_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    if env is not None:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=child_env)
    proc = zygote.start(command, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(cwd))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # as subprocess.run does
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def cli_here(*args) -> subprocess.CompletedProcess:
    """`cli` in this process, without a new interpreter (and, for `run` and `suite`, its torch import) per
    call: a bad input's one-line error, or a launch of a command whose start through ``python -m meshscope``
    other tests make with `cli` (the launched ranks are processes of their own either way). An exception
    meshscope lets escape fails the test here, as its traceback would fail `cli`'s one-line checks."""
    from meshscope.cli.parser import main
    from meshscope.core.rank_end import exit_code

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's own errors
            code = exit_code(exc)
    return subprocess.CompletedProcess(["meshscope", *map(str, args)], code, out.getvalue(), err.getvalue())


def trace_json(out: Path, *args, cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess, dict]:
    """``meshscope trace ARGS[:-1] --out OUT --json -- JOB`` (the last argument is the job, a list) in
    `cwd`, in this process (`cli_here`; tests/test_trace.py's fixture starts the command line): the
    completed process and the one JSON document it printed."""
    here = os.getcwd()
    os.chdir(cwd)
    try:
        proc = cli_here("trace", *args[:-1], "--out", out, "--json", "--", *args[-1])
    finally:
        os.chdir(here)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc, json.loads(proc.stdout)


def failed_checks(result: dict) -> list[dict]:
    return [c for c in result["checks"] if not c["passed"]]


def fake_equals_real(tmp_path: Path, world: int, job: list[str], fake_job: list[str] | None = None) -> dict:
    """Trace `job` on `world` gloo ranks and `fake_job` (default `job`) in a fake world of as many, every
    rank; the fake side's document once `meshscope diff` found the two the same (the frameworks' oracle)."""
    real, _ = trace_json(tmp_path / "real", "--nproc-per-node", world, job)
    fake, doc = trace_json(tmp_path / "fake", "--fake-world", world, "--ranks", ",".join(map(str, range(world))),
                           fake_job or job)
    assert real.returncode == 0 and fake.returncode == 0 and doc["passed"], real.stderr[-2000:] + fake.stderr[-2000:]
    proc = cli_here("diff", tmp_path / "real", tmp_path / "fake", "--json")
    assert json.loads(proc.stdout)["verdict"] == "same", proc.stdout[-3000:]
    return doc


def steady_calls(doc: dict, rank: int) -> Counter:
    """(op, phase, bytes_in) -> calls, in `rank`'s first steady step of a ``--json`` document."""
    first = doc["steady"][str(rank)]["first"]
    (mine,) = [r for r in doc["per_rank"] if r["rank"] == rank]
    (step,) = [s for s in mine["steps"] if s["step"] == first]
    return Counter((e["op"], e["phase"], e["bytes_in"]) for e in step["events"])
