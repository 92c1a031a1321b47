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
