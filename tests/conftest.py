"""The one resource the suite's parallel workers share: the host's CPUs.

A test marked ``alone`` times ranks against each other (a planted 60 ms delay must be named as the
straggler, docs/trace.md "Time"): it runs with no other test of the run beside it, holding a lock that
every other test holds shared while it runs (its module fixtures' launches included: they run in the
protocol of the first test that uses them). On two CPUs another worker's 4-rank job beside it
starved the healthy rank of the FSDP2 data-loading case on some steady steps, so that the slowed rank held
it on fewer than 75 % of them: it failed in 2 of 3 full runs on 2026-12-03 (2-core box), and beside three
busy loops it named the rank in 9 of 10 runs, with ranks forked or started fresh alike.
How the analysis fares on a busy host is `benchmarks/bench_stragglers.py`'s measure, not this suite's.
"""

from __future__ import annotations

import fcntl

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not hasattr(item.config, "workerinput"):  # one process: nothing beside it
        return (yield)
    # pytest-xdist gives each worker <the run's basetemp>/<worker id>: the parent is the run's own
    shared = item.config._tmp_path_factory.getbasetemp().parent
    with open(shared / "cpus.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        return (yield)


@pytest.fixture(scope="session", autouse=True)
def warm_starts(tmp_path_factory):
    """One zygote per test process (`meshscope.run.zygote`): every agent and fake-world fork server the
    tests launch, in this process or in a ``python -m meshscope`` it starts (itself forked from it:
    `helpers.cli`), is forked from it instead of importing torch again (about 3 s of the 4 s a small
    2-rank trace took, 2026-12-05). It ends with this process: its stdin is a pipe only this process holds."""
    import os
    import subprocess
    import sys

    from meshscope.run import zygote

    path = tmp_path_factory.mktemp("zygote") / "socket"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "JE_ARROW_MALLOC_CONF": "background_thread:false"}
    env.pop(zygote.ENV, None)
    warm = ["meshscope.run.agent", "meshscope.trace.rank", "meshscope.trace.fake.fork_server", "meshscope.cli.worker",
            "meshscope.cli.parser", "meshscope.experiments"]  # the last two: `helpers.cli`'s own commands
    log = path.with_name("zygote.log")
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "meshscope.run.zygote", str(path), *warm],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
    if proc.stdout.readline().strip() != "ready":
        # loud: without it every launch starts fresh and the suite passes at twice its time (a zygote that died
        # of its own start-up error had, 2026-12-07)
        proc.kill()
        pytest.fail(f"the suite's zygote did not start: {log.read_text()[-2000:]}", pytrace=False)
    os.environ[zygote.ENV] = str(path)
    try:
        yield
    finally:
        os.environ.pop(zygote.ENV, None)
        proc.stdin.close()
        proc.wait(timeout=30)


HEAVY_FIRST = ("test_trace.py", "test_fr_gloo.py", "test_fake_tensors.py", "test_budget.py", "test_doctor.py",
               "test_torchtitan.py", "test_multinode.py", "test_forecast.py", "test_fake_devices.py",
               "test_fake_world.py", "test_fake_gaps.py", "test_faults.py", "test_pp.py", "test_suite.py",
               "test_capture.py", "test_torchrec.py", "test_nd.py", "test_time.py")
"""The files that take longest, longest first (each 12-38 s of a worker's time: ``--durations=0`` on the
project's 2-core box, 2026-12-07). The workers take files in the order they are collected (pyproject's
``--no-loadscope-reorder``; xdist's own order is by count of tests), so these go first and the many short files
even out the two workers' ends: collected alphabetically, test_torchtitan.py, test_torchrec.py and
test_trace.py came last, and one worker ran them while the other had finished (277 against 300 s of tests).
A file missing here only runs in its collected place: the order changes how long the suite takes, never what
it runs."""


def pytest_collection_modifyitems(config, items):
    from pathlib import Path

    missing = [name for name in HEAVY_FIRST if not (Path(__file__).parent / name).exists()]
    if missing:  # a file renamed or gone: the list is kept with the files
        raise pytest.UsageError(f"tests/conftest.py HEAVY_FIRST names files that are not in tests/: {missing}")
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: the rest keep their order)
