"""One clock for every rank of a traced job: each rank's offset to rank 0, through the job's store.

A rank's call times are seconds since its own trace started (``time.perf_counter``), so two ranks'
times compare only once each is moved onto a common clock: rank 0's. Each other rank estimates its
offset the way NTP does, through the job's rendezvous store (the TCPStore torchrun's agents share;
never a collective, so nothing of meshscope's enters the job's ledger): it notes its time ``t1``,
asks rank 0 for its time, gets ``t2`` back at its ``t3``; rank 0's clock read ``t2`` somewhere in
``[t1, t3]``, so ``offset = t2 - (t1 + t3) / 2`` with an error of at most ``(t3 - t1) / 2``. Of a few
rounds the one with the shortest round trip is kept, and its half round trip is the error bound.

Rank 0 answers the ranks one after another from a thread of its own, started when the job's default
group is initialised; each rank asks from a thread too, so the script never waits for it, and gives
up after `TIMEOUT_S` (the offset is then unknown, and the analysis says so). On one host every rank's
``perf_counter`` is the same ``CLOCK_MONOTONIC``, so the true offset is known too (`Clock.truth`)
and the estimate's error can be measured against it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

ROUNDS = 5
TIMEOUT_S = 30.0
PREFIX = "meshscope/clock"


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


class Estimator:
    """One rank's side of the estimate, run in a thread once the default group exists."""

    def __init__(self, start: float):
        self.start = start
        self.offset: float | None = 0.0
        self.error: float | None = 0.0
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return time.perf_counter() - self.start

    def begin(self, rank: int, world: int) -> None:
        """Start serving (rank 0) or asking (the others), in the background, on a client of the job's store
        of its own (its timeout is not the job's)."""
        if rank != 0:
            self.offset = self.error = None  # until estimated
        target = self._serve if rank == 0 else self._ask
        self._thread = threading.Thread(target=self._run, args=(target, rank, world), name="meshscope-clock",
                                        daemon=True)
        self._thread.start()

    def _run(self, target, rank: int, world: int) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        try:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                  timeout=timedelta(seconds=TIMEOUT_S), wait_for_workers=False)
        except (KeyError, ValueError, RuntimeError):  # no rendezvous store to share: the offset stays unknown
            return
        target(dist.PrefixStore(f"{PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store), rank, world)

    def _serve(self, store, rank: int, world: int) -> None:
        try:
            for r in range(1, world):
                for k in range(ROUNDS):
                    store.get(f"{r}/{k}/ask")  # blocks until rank r asks
                    store.set(f"{r}/{k}/time", repr(self.now()))
        except (RuntimeError, ValueError):  # a rank that never asked (it ended first): the others stay unknown
            return

    def _ask(self, store, rank: int, world: int) -> None:
        best = None
        try:
            for k in range(ROUNDS):
                t1 = self.now()
                store.set(f"{rank}/{k}/ask", "1")
                t2 = float(store.get(f"{rank}/{k}/time"))
                t3 = self.now()
                if best is None or t3 - t1 < best[0]:
                    best = (t3 - t1, t2 - (t1 + t3) / 2)
        except (RuntimeError, ValueError):  # timed out or the store is gone: the offset stays unknown
            return
        self.error, self.offset = best[0] / 2, best[1]

    def result(self, wait: float = 0.0) -> Clock:
        if self._thread is not None:
            self._thread.join(wait)
        return Clock(self.offset, self.error, self.start, boot_id())

