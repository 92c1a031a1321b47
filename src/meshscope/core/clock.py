"""A traced rank's place on the common clock (rank 0's), as `trace.clock.Estimator` found it.

Each rank's times are seconds since its own trace started (``time.perf_counter``); `Clock.offset`
moves them onto rank 0's. On one boot of one machine every rank's ``perf_counter`` is the same
``CLOCK_MONOTONIC``, so the true offsets are known too (`truth`), and the estimate's error with them.
"""

from __future__ import annotations

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

    def to_json(self) -> dict:
        return {"offset": self.offset, "error": self.error, "start": self.start, "host": self.host}

    @classmethod
    def from_json(cls, d: dict) -> Clock:
        return cls(d.get("offset"), d.get("error"), d["start"], d.get("host", ""))


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def truth(clocks: dict[int, Clock]) -> dict[int, float] | None:
    """The true offsets when every rank ran on one boot of one machine (one monotonic clock), else None."""
    if 0 not in clocks or len({c.host for c in clocks.values()}) != 1 or not clocks[0].host:
        return None
    return {r: c.start - clocks[0].start for r, c in clocks.items()}
