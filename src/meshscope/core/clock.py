"""A traced rank's place on the common clock (rank 0's), as `trace.clock.Estimator` found it.

Each rank's times are seconds since its own trace started (``time.perf_counter``); `Clock.offset`
moves them onto rank 0's. On one boot of one machine every rank's ``perf_counter`` is the same
``CLOCK_MONOTONIC``, so the true offsets are known there (`truth`), and the estimate's error with them.
`offsets` uses what is exact where it can: the ranks of rank 0's host get their true offsets; the
ranks of another host share that host's best estimate (the one with the fastest round trip), each
moved by its start on their common clock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """A rank's place on the common clock."""

    offset: float | None
    """Seconds to add to this rank's times to put them on rank 0's (None: not estimated)."""
    error: float | None
    """The estimate's bound: half its shortest round trip through the store."""
    start: float
    """This rank's trace start on its own monotonic clock (``time.perf_counter``)."""
    host: str
    """The machine's boot id: ranks of one boot share one monotonic clock."""
    cpus: int = 0
    """The CPUs this rank's process may run on (``os.sched_getaffinity``; 0: unknown): ranks of one host
    that outnumber them take turns on a CPU, and their arrivals say who the scheduler ran too."""

    def to_json(self) -> dict:
        return {"offset": self.offset, "error": self.error, "start": self.start, "host": self.host, "cpus": self.cpus}

    @classmethod
    def from_json(cls, d: dict) -> Clock:
        return cls(d.get("offset"), d.get("error"), d["start"], d.get("host", ""), d.get("cpus", 0))


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 0


def crowded(clocks: dict[int, Clock | None]) -> dict[str, tuple[int, int]]:
    """Host -> (its traced ranks, its CPUs) for the hosts whose ranks outnumber their CPUs."""
    hosts: dict[str, list[Clock]] = {}
    for c in clocks.values():
        if c is not None and c.host:
            hosts.setdefault(c.host, []).append(c)
    out = {}
    for host, cs in hosts.items():
        n = max(c.cpus for c in cs)
        if 0 < n < len(cs):
            out[host] = (len(cs), n)
    return out


def truth(clocks: dict[int, Clock]) -> dict[int, float] | None:
    """The true offsets when every rank ran on one boot of one machine (one monotonic clock), else None."""
    if 0 not in clocks or len({c.host for c in clocks.values()}) != 1 or not clocks[0].host:
        return None
    return {r: c.start - clocks[0].start for r, c in clocks.items()}


def offsets(clocks: dict[int, Clock | None]) -> dict[int, tuple[float, float]]:
    """Rank -> (offset, error bound) on rank 0's clock, for every rank whose host has rank 0 or an estimate."""
    hosts: dict[str, list[int]] = {}
    for r, c in clocks.items():
        if c is not None:
            hosts.setdefault(c.host or f"rank {r}", []).append(r)
    out: dict[int, tuple[float, float]] = {}
    zero = clocks.get(0)
    for host, ranks in hosts.items():
        if zero is not None and zero.host and host == zero.host:
            best, base, error = 0, 0.0, 0.0
        else:
            estimated = [r for r in ranks if clocks[r].offset is not None]
            if not estimated:
                continue
            best = min(estimated, key=lambda r: clocks[r].error if clocks[r].error is not None else float("inf"))
            base, error = clocks[best].offset, clocks[best].error or 0.0
        for r in ranks:
            out[r] = (base + clocks[r].start - clocks[best].start, error)
    return out
