"""A planted delay for straggler tests, shared by ddp.py, transformer.py and pipelining.py.

An ordinary helper of these user scripts (it imports torch only). ``--slow-rank R --slow-in WHERE
--slow-ms MS`` makes rank R sleep MS milliseconds once per step (the first time the place runs in
that step):

* ``forward``: in the forward of the module ``--slow-module`` names (a forward pre-hook of its own,
  so the sleep runs while that module is the innermost one in forward);
* ``data``: while the step's batch is made, outside any module;
* ``backward``: in a backward pre-hook of that module (autograd's engine runs it, no module in forward).

What a tracer should report for the slowed rank: where = (forward, that module's qualified name),
(other, no module) and (backward, no module) respectively, and the other ranks waiting about MS per
step on the axis where they next meet it.
"""

import time

PLACES = ("forward", "data", "backward")


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

    def next_step(self) -> None:
        self.slept = False

    def _sleep(self, *_) -> None:
        if self.on and not self.slept:
            self.slept = True
            time.sleep(self.seconds)

    def data(self) -> None:
        if self.where == "data":
            self._sleep()

    def attach(self, model) -> None:
        """Hook the module named by --slow-module (a qualified name in `model`), for forward or backward."""
        if not self.on or self.where == "data":
            return
        module = model.get_submodule(self.module)
        if self.where == "forward":
            module.register_forward_pre_hook(self._sleep)
        else:
            module.register_full_backward_pre_hook(self._sleep)
