"""A planted delay for straggler tests, shared by ddp.py, transformer.py and pipelining.py.

An ordinary helper of these user scripts (it imports torch only). ``--slow-rank R --slow-in WHERE
--slow-ms MS`` makes rank R sleep MS milliseconds once per step (the first time the place runs in
that step):

* ``forward``: in the forward of the module ``--slow-module`` names (a forward pre-hook of its own,
  so the sleep runs while that module is the innermost one in forward);
* ``data``: while the step's batch is made, outside any module;
* ``backward``: in a backward pre-hook of that module (autograd's engine runs it, no module in forward);
* ``gpu``: in that module's forward, a kernel that keeps the GPU busy for MS (``torch.cuda._sleep``,
  its cycles per millisecond measured first) while the CPU runs on: the rank issues its calls on time
  and its stream reaches them MS late. Each planted kernel is timed with CUDA events of its own, and
  `report` prints those times (``delays: gpu ms [...]``), the oracle of a tracer's arrivals on the GPU.

What a tracer should report for the slowed rank: where = (forward, that module's qualified name),
(other, no module) and (backward, no module) respectively, and the other ranks waiting about MS per
step on the axis where they next meet it.
"""

import time

import torch

PLACES = ("forward", "data", "backward", "gpu")


def add_arguments(p, module: str) -> None:
    p.add_argument("--slow-rank", type=int, default=None, help="the rank that sleeps (default: none)")
    p.add_argument("--slow-in", choices=PLACES, default="forward")
    p.add_argument("--slow-ms", type=float, default=60.0)
    p.add_argument("--slow-module", default=module, help=f"the module of forward/backward (default {module})")


class Delay:
    """The sleep of one rank, once per step (`next_step` starts a step)."""

    def __init__(self, args, rank: int):
        self.on = args.slow_rank == rank
        self.where, self.seconds, self.module = args.slow_in, args.slow_ms / 1e3, args.slow_module
        self.slept = False
        self.cycles, self.timed = 0, []
        if self.on and self.where == "gpu":  # cycles per ms of this GPU's clock: a guess, then one correction
            self.cycles = 10_000_000  # the first sleep also wakes the GPU's clocks
            for _ in range(3):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(self.cycles)
                end.record()
                end.synchronize()
                self.cycles = int(self.cycles * args.slow_ms / start.elapsed_time(end))

    def next_step(self) -> None:
        self.slept = False

    def _sleep(self, *_) -> None:
        if self.on and not self.slept:
            self.slept = True
            if self.where != "gpu":
                time.sleep(self.seconds)
                return
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(self.cycles)
            end.record()
            self.timed.append((start, end))

    def report(self) -> None:
        """Print the planted GPU kernels' own times (``gpu``), in order, once the GPU passed them."""
        if self.timed:
            self.timed[-1][1].synchronize()
            print(f"delays: gpu ms {[round(a.elapsed_time(b), 3) for a, b in self.timed]}", flush=True)

    def data(self) -> None:
        if self.where == "data":
            self._sleep()

    def attach(self, model) -> None:
        """Hook the module named by --slow-module (a qualified name in `model`), for forward or backward."""
        if not self.on or self.where == "data":
            return
        module = model.get_submodule(self.module)
        if self.where in ("forward", "gpu"):
            module.register_forward_pre_hook(self._sleep)
        else:
            module.register_full_backward_pre_hook(self._sleep)
