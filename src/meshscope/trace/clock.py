"""Each traced rank's offset to rank 0's clock, estimated through the job's rendezvous store.

A rank's call times are seconds since its own trace started (``time.perf_counter``), so two ranks'
times compare only once each is moved onto a common clock: rank 0's (`core.clock.Clock`). Each other
rank estimates its offset the way NTP does, through the job's store (the TCPStore torchrun's agents
share; never a collective, so nothing of meshscope's enters the job's ledger, budget or diff): it notes
its time ``t1``, asks rank 0 for its time, gets ``t2`` back at its ``t3``; rank 0's clock read ``t2``
somewhere in ``[t1, t3]``, so ``offset = t2 - (t1 + t3) / 2`` with an error of at most
``(t3 - t1) / 2``. Of `ROUNDS` rounds the one with the shortest round trip is kept, and its half
round trip is the error bound.

Rank 0 answers from `SERVERS` threads of its own (rank r is answered by thread r % SERVERS, in rank
order), started when the job's default group is initialised; each rank asks from a thread too, so the
script never waits for it, and gives up after `TIMEOUT_S` (its offset is then unknown, and the
analysis says so). Every thread opens its own client of the store, with its own timeout, not the job's.
"""

from __future__ import annotations

import os
import threading
import time

from ..core.clock import Clock, boot_id, cpus

ROUNDS = 16
SERVERS = 4
TIMEOUT_S = 30.0
PREFIX = "meshscope/clock"


def _store():
    """A client of the job's store of its own, under meshscope's prefix (None: the job has none)."""
    from datetime import timedelta

    import torch.distributed as dist

    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=TIMEOUT_S), wait_for_workers=False)
    except (KeyError, ValueError, RuntimeError):
        return None
    return dist.PrefixStore(f"{PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


class Estimator:
    """One rank's side of the estimate, run in threads once the default group exists."""

    def __init__(self, start: float):
        self.start = start
        self.offset: float | None = None
        self.error: float | None = None
        self._threads: list[threading.Thread] = []
        self._begun = False

    def now(self) -> float:
        return time.perf_counter() - self.start

    def begin(self, rank: int, world: int) -> None:
        """Start answering (rank 0) or asking (the others), in the background."""
        self._begun = True
        if rank == 0:
            self.offset = self.error = 0.0
            jobs = [(self._serve, range(first, world, SERVERS)) for first in range(1, min(world, SERVERS + 1))]
        else:
            jobs = [(self._ask, rank)]
        for target, arg in jobs:
            thread = threading.Thread(target=self._run, args=(target, arg), name="meshscope-clock", daemon=True)
            thread.start()
            self._threads.append(thread)

    @staticmethod
    def _run(target, arg) -> None:
        store = _store()
        if store is not None:
            target(store, arg)

    def _serve(self, store, ranks: range) -> None:
        for r in ranks:
            try:
                for k in range(ROUNDS):
                    store.get(f"{r}/{k}/ask")  # blocks until rank r asks
                    store.set(f"{r}/{k}/time", repr(self.now()))
            except (RuntimeError, ValueError):  # a rank that never asked (it ended first): its offset stays unknown
                continue

    def _ask(self, store, rank: int) -> None:
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

    def result(self, wait: float = 0.0) -> Clock | None:
        """This rank's clock (None where the estimate never began: a job without a default group),
        waiting up to `wait` seconds for the threads."""
        if not self._begun:
            return None
        deadline = time.monotonic() + wait
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return Clock(self.offset, self.error, self.start, boot_id(), cpus())
