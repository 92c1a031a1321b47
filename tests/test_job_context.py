"""`capture.job_context` in one process, without a process group: the region and phase a call would
be stamped with, read where the call would be issued. The oracle is the code's own structure: which
module's forward, autograd's backward or the optimizer's step encloses the probe."""

from __future__ import annotations

import copy
import io
import sys

import pytest
import torch
from torch import nn

from meshscope.capture.job_context import JobContext


@pytest.fixture
def ctx():
    context = JobContext()
    context.install()
    # what the C++ recorder's listener holds: a module object, which neither pickles nor deep-copies
    context.listener = lambda state, _unpicklable=sys: None
    yield context
    context.remove()


def _where(ctx: JobContext) -> tuple[str, str]:
    return ctx.phase(), ctx.region()


class Probe(nn.Module):
    """Records where it runs (what a collective issued here would be labelled)."""

    def __init__(self, ctx, seen):
        super().__init__()
        self.ctx, self.seen = ctx, seen

    def forward(self, x):
        self.seen.append(_where(self.ctx))
        return x


class Attention(nn.Module):
    """Builds a fresh submodule on every call, as megatron-core 0.16.1's FusedScaleMaskSoftmax builds
    an nn.Softmax (fusions/fused_softmax.py:331), until CPython hands it a freed one's address."""

    def __init__(self, ctx, seen):
        super().__init__()
        self.ctx, self.seen, self.ids, self.reused = ctx, seen, set(), 0
        self.proj = nn.Linear(2, 2)

    def forward(self, x):
        x = self.proj(x)
        for _ in range(64):
            fresh = Probe(self.ctx, self.seen)
            x = fresh(x)
            key = id(fresh)
            del fresh
            if key in self.ids:
                self.reused += 1
                break
            self.ids.add(key)
        self.seen.append(_where(self.ctx))  # after the fresh module returned: the caller's forward again
        return x


def test_a_module_built_per_call_is_named_and_popped_even_at_a_reused_address(ctx):
    seen = []
    model = nn.Sequential()
    model.attention = Attention(ctx, seen)
    for _ in range(5):
        model(torch.ones(1, 2))
        seen.append(_where(ctx))  # outside every module
    assert model.attention.reused == 5  # every call met a freed module's address
    assert set(seen) == {("forward", "attention.Probe"), ("forward", "attention"), ("other", "")}
    assert seen[-1] == ("other", "") and not ctx._stack


class Rowwise(nn.Module):
    def __init__(self, ctx, seen):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        # as DTensor's RowwiseParallel redistributes its output: a forward hook of the module's own
        self.register_forward_hook(lambda module, args, output: seen.append(_where(ctx)))

    def forward(self, x):
        return self.fc(x)


class Failing(Rowwise):
    def forward(self, x):
        raise ValueError("planted")


def test_a_modules_own_forward_hooks_are_its_forward_and_leave_nothing_behind(ctx):
    seen = []
    model = nn.Sequential(Rowwise(ctx, seen), Probe(ctx, seen))
    own = {i: dict(m._forward_hooks) for i, m in enumerate(model.modules())}
    for _ in range(2):
        model(torch.ones(1, 2))
    assert seen == [("forward", "0"), ("forward", "1")] * 2
    assert {i: dict(m._forward_hooks) for i, m in enumerate(model.modules())} == own
    # no meshscope hook stays on a module between calls: a model copies and pickles as the script made it
    plain = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    plain[0].register_forward_hook(_halved)
    plain(torch.ones(1, 2))
    copy.deepcopy(plain)(torch.ones(1, 2))
    torch.save(plain, io.BytesIO())
    assert not ctx._stack


def _halved(module, args, output):
    return output / 2


def test_a_forward_that_raises_pops_its_module(ctx):
    seen = []
    failing = Failing(ctx, seen)
    model = nn.Sequential(Probe(ctx, seen), failing)
    for _ in range(2):
        with pytest.raises(ValueError, match="planted"):
            model(torch.ones(1, 2))
        assert _where(ctx) == ("other", "") and not ctx._stack
    model[0](torch.ones(1, 2))  # the next forward removes what the failed one could not
    assert len(failing._forward_hooks) == 1 and seen[-1] == ("forward", "0")


class Doubled(torch.autograd.Function):
    """Records where autograd runs its backward (a backward collective would be labelled so)."""

    @staticmethod
    def forward(fctx, x, probe):
        fctx.probe = probe
        return 2 * x

    @staticmethod
    def backward(fctx, grad):
        fctx.probe()
        return 2 * grad, None


class Owning(torch.optim.SGD):
    """Issues calls of its own around the closure, as ZeroRedundancyOptimizer broadcasts after it."""

    def __init__(self, params, probe):
        super().__init__(params, lr=0.1)
        self.probe = probe

    def step(self, closure=None):
        self.probe()
        loss = super().step(closure)  # SGD runs the closure: an optimizer inside an optimizer
        self.probe()
        return loss


def test_a_closure_is_the_jobs_own_code_inside_the_optimizers_step():
    """``optimizer.step(closure)`` (LBFGS, Lightning): forward in the closure's module calls, backward
    in autograd, other in the closure outside modules, optimizer in the optimizer's own code."""
    seen, steps = [], []
    ctx = JobContext(on_step=steps.append)
    ctx.install()
    try:
        probe = lambda: seen.append(_where(ctx))  # noqa: E731
        model = nn.Sequential(nn.Linear(2, 2), Probe(ctx, seen))
        opt = Owning(model.parameters(), probe)

        def closure():
            opt.zero_grad()
            loss = Doubled.apply(model(torch.ones(1, 2)), probe).sum()
            probe()  # a loss all-reduce for the log, outside every module
            loss.backward()
            return loss

        opt.step(closure)
        opt.step(closure=closure)
        lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=1)
        lbfgs.step(closure)
        assert probe() is None and seen.pop() == ("other", "")
    finally:
        ctx.remove()
    job = [("forward", "1"), ("other", ""), ("backward", "")]
    assert seen == [("optimizer", ""), *job, ("optimizer", "")] * 2 + job
    assert steps == [1, 2]  # Owning is the boundary: one per outermost step, its inner SGD step included


def test_the_boundary_is_the_first_optimizer_that_steps_not_the_first_created():
    """TorchRec creates SGD objects that its fused updates replace and never steps them, then steps Adam
    (torchrec 1.8 ``apply_optimizer_in_backward``, ``CombinedOptimizer``): Adam's steps are the boundaries."""
    steps = []
    ctx = JobContext(on_step=steps.append)
    ctx.install()
    try:
        w = nn.Parameter(torch.ones(2))
        never = torch.optim.SGD([w], lr=0.1)  # noqa: F841 - created first, never stepped
        adam = torch.optim.Adam([w])
        for _ in range(3):
            w.grad = torch.ones(2)
            adam.step()
    finally:
        ctx.remove()
    assert steps == [1, 2, 3] and ctx.stepped == {"Adam": 3} and ctx.boundary_note() is None


def test_which_optimizer_makes_the_boundaries_is_said_when_it_was_a_choice():
    w = nn.Parameter(torch.ones(2))
    for named, expect_steps, note in [
            (None, 2, "step boundaries: the outermost steps in which SGD stepped, the first optimizer that stepped "
                      "(--step-optimizer names another); optimizers that stepped: Adam (2 steps), SGD (2 steps)"),
            ("Adam", 2, None),
            ("DeepSpeedZeroOptimizer", 0, "--step-optimizer DeepSpeedZeroOptimizer: no optimizer of that class stepped "
                                          "on this rank, so every call is in step 0; the ones that stepped: Adam (2 "
                                          "steps), SGD (2 steps)")]:
        ctx = JobContext(step_optimizer=named)
        ctx.install()
        try:
            sgd, adam = torch.optim.SGD([w], lr=0.1), torch.optim.Adam([w])
            for _ in range(2):
                w.grad = torch.ones(2)
                sgd.step()
                adam.step()
        finally:
            ctx.remove()
        assert (ctx.step, ctx.boundary_note()) == (expect_steps, note)


def test_a_frameworks_own_step_is_the_optimizers_phase_and_ends_the_step(tmp_path, monkeypatch):
    """A step around a torch optimizer's, as DeepSpeed's ``engine.step()`` all-gathers the updated partitions
    after its inner optimizer returns (`capture.steppers`): wrapped when its module is imported, its calls
    after the inner step are phase optimizer of the step it ends; a step that steps no optimizer (gradient
    accumulation) is no boundary."""
    from meshscope.capture.steppers import Stepper, Wrapped

    (tmp_path / "ms_engine.py").write_text(
        "class Engine:\n"
        "    def __init__(self, opt, probe):\n"
        "        self.opt, self.probe = opt, probe\n"
        "    def step(self, boundary=True):\n"
        "        if boundary:\n"
        "            self.opt.step()\n"
        "        self.probe()  # the all-gather of the updated partitions\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen, steps = [], []
    ctx = JobContext(on_step=steps.append)
    ctx.install()
    wrapped = Wrapped(ctx, (Stepper("ms_engine", "Engine", "step", "a test's engine", "none"),))
    wrapped.install()
    try:
        import ms_engine

        w = nn.Parameter(torch.ones(2))
        engine = ms_engine.Engine(torch.optim.SGD([w], lr=0.1), lambda: seen.append((ctx.phase(), ctx.step)))
        w.grad = torch.ones(2)
        engine.step(boundary=False)
        engine.step()
        engine.step()
    finally:
        wrapped.remove()
        ctx.remove()
        sys.modules.pop("ms_engine", None)
    assert seen == [("optimizer", 0), ("optimizer", 0), ("optimizer", 1)] and steps == [1, 2]
    assert not getattr(ms_engine.Engine.step, "__meshscope_stepper__", False)  # unwrapped by remove


class Combined(torch.optim.Optimizer):
    """Steps the optimizers it holds, as TorchRec 1.8.0's ``CombinedOptimizer.step`` does (optim/keyed.py:369-371);
    DistributedModelParallel's ``fused_optimizer`` is itself one, so a job's ``step()`` is nested three deep."""

    def __init__(self, inner):
        super().__init__([nn.Parameter(torch.ones(1))], {})
        self.inner = inner

    def step(self, closure=None):
        for opt in self.inner:
            opt.step()


def test_a_step_nested_inside_an_outer_optimizers_step_counts_once():
    """TorchRec's DLRM (tests/jobs/torchrec_dlrm.py): the outer CombinedOptimizer steps the model's fused one,
    which steps the collection's, and Adam; 3 ``step()`` calls of the job are 3 steps of each class, and the
    note says so (it said 9 of CombinedOptimizer)."""
    steps = []
    ctx = JobContext(on_step=steps.append)
    ctx.install()
    try:
        w = nn.Parameter(torch.ones(2))
        adam = torch.optim.Adam([w])
        optimizer = Combined([Combined([Combined([])]), adam])
        for _ in range(3):
            w.grad = torch.ones(2)
            optimizer.step()
    finally:
        ctx.remove()
    assert steps == [1, 2, 3] and ctx.stepped == {"Combined": 3, "Adam": 3}
    assert ctx.boundary_note().endswith("optimizers that stepped: Adam (3 steps), Combined (3 steps)")


class DistributedModelParallel(nn.Module):
    """TorchRec 1.8.0's wrapper as the hooks see it: the model (or the DDP around it) is ``_dmp_wrapped_module``
    (distributed/model_parallel.py:357), ``module`` unwraps it (:380), ``forward`` calls it (:410)."""

    def __init__(self, model, ctx, seen):
        super().__init__()
        self._dmp_wrapped_module, self.ctx, self.seen = model, ctx, seen

    @property
    def module(self):
        return self._dmp_wrapped_module

    def forward(self, x):
        self.seen.append(_where(self.ctx))
        return self._dmp_wrapped_module(x)


def test_torchrecs_model_parallel_wrapper_adds_no_prefix_and_names_the_root_by_its_model(ctx):
    """The regions under TorchRec's DistributedModelParallel are the model's own paths (its plan's keys:
    ``model.sparse_arch.embedding_bag_collection``), and the wrapper's own forward is the wrapped model's."""
    seen = []
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(Probe(ctx, seen)))
    DistributedModelParallel(model, ctx, seen)(torch.ones(1, 2))
    assert seen == [("forward", "Sequential"), ("forward", "1.0")]
