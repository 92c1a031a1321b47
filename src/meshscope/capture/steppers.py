"""Frameworks' own optimizer steps around a torch one: the whole of such a step is the optimizer's phase,
and the step boundary waits for it to return.

torch's global step hooks see ``torch.optim`` optimizers only. DeepSpeed's ZeRO optimizers are no
``torch.optim.Optimizer`` (deepspeed 0.19.8 ``runtime/base_optimizer.py``: ``DeepSpeedOptimizer(object)``):
``engine.step()`` steps the torch optimizer inside them and then all-gathers the updated partitions
(ZeRO-1/2, ``runtime/zero/stage_1_and_2.py``, ``DeepSpeedZeroOptimizer.step``). Seen only through the
inner optimizer, the boundary fell where that returned, and the all-gather went to phase ``other`` of
the next step. So each step of `STEPPERS` counts as an outer optimizer step (`JobContext.enter_step`,
`leave_step`): its calls are phase ``optimizer`` of the step it ends. It is no boundary by itself (a
DeepSpeed step under gradient accumulation steps no optimizer), unless ``--step-optimizer`` names it.

Each is wrapped when its module is imported (a finder ahead of the others on ``sys.meta_path`` that
runs the wrap after the module's own code) or at once where it was imported already (a fake world's
fork server may have learned it), and unwrapped by `remove`.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

from .after_import import AfterImport


@dataclass(frozen=True)
class Stepper:
    module: str
    cls: str
    method: str
    why: str
    read: str
    """The framework release whose source it was read against."""


STEPPERS = (
    Stepper("deepspeed.runtime.engine", "DeepSpeedEngine", "step",
            "steps the ZeRO optimizer, whose torch optimizer's step is followed by the all-gather of the updated "
            "partitions (ZeRO-1/2) or the release of the fp32 partitions (ZeRO-3)", "deepspeed 0.19.8"),
)


class Wrapped:
    """The steppers wrapped for one `JobContext` (its `enter_step` and `leave_step`), until `remove`."""

    def __init__(self, context, steppers=STEPPERS):
        self.context = context
        self.by_module = {s.module: s for s in steppers}
        self.originals: list[tuple[type, str, object]] = []
        self.finder = AfterImport(self.by_module.__contains__, self.wrap)

    def install(self) -> None:
        for name, stepper in self.by_module.items():
            if name in sys.modules:
                self.wrap(sys.modules[name])
        sys.meta_path.insert(0, self.finder)

    def remove(self) -> None:
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        for cls, method, original in reversed(self.originals):
            setattr(cls, method, original)
        self.originals.clear()

    def wrap(self, module) -> None:
        stepper = self.by_module[module.__name__]
        cls = getattr(module, stepper.cls, None)
        original = getattr(cls, stepper.method, None)
        if original is None or getattr(original, "__meshscope_stepper__", False):
            return
        context = self.context

        @functools.wraps(original)
        def step(this, *args, **kwargs):
            context.enter_step(this)
            try:
                return original(this, *args, **kwargs)
            finally:
                context.leave_step(this)

        step.__meshscope_stepper__ = True
        setattr(cls, stepper.method, step)
        self.originals.append((cls, stepper.method, original))
