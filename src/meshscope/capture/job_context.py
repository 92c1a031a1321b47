"""Where a user's job is when it issues a collective: its step, its phase and the issuing module.

A traced script is not meshscope's code, so nothing labels its calls; torch's global hooks do:

- steps: ``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``_post_hook`` fire for every
  ``torch.optim`` optimizer. Only the outermost call counts (an optimizer wrapping another, such as
  ``ZeroRedundancyOptimizer``, is one boundary; so does a framework's own step around a torch one,
  `steppers`), and only the boundary optimizer: the first one that steps, or the class the user
  names. Not the first one created: TorchRec creates ``SGD`` objects that its fused updates replace
  and never steps them, and steps ``Adam`` through ``CombinedOptimizer``. Step k is what the rank
  issued after its k-th ``step()`` returned, up to the end of the next, so step 0 includes set-up
  (DDP's broadcast, DTensor's distribution);
- phase: ``backward`` inside the autograd engine (``torch._C._current_graph_task_id() != -1``, also
  on autograd's device threads), ``optimizer`` inside any optimizer's ``step`` but outside the
  closure it was given (``step(closure)``: LBFGS, Lightning's automatic optimisation, which runs the
  training step's forward and backward in it), ``forward`` inside a module's forward (global forward
  pre/post hooks keep a stack), otherwise ``other`` (gradient clipping, a pipeline schedule's sends
  between stages, Megatron's gradient finalisation);
- region: the qualified name of the innermost module in forward, from the first root module that
  ran, without wrapper prefixes (``module.``, ``_fsdp_wrapped_module.``, ``_dmp_wrapped_module.``, ...).
  Backward calls carry no module: autograd runs them below any module hook.

Over time (where a rank's time went between its calls: docs/trace.md, "Time"), every change of
(phase, module) on the main thread is a move: module entries and exits,
optimizer steps and closures, and autograd's engine entered and left on the main thread (its one
entry, ``torch.autograd.graph._engine_run_backward``, which ``backward`` and ``grad`` call, is wrapped
while installed, as ``torch.compiler`` wraps it in torch 2.13; torch < 2.3 has none and its moves
have no backward). Under ``--cheap`` (no module hooks) the moves are the phase's alone. Each state
(phase, module, in an optimizer) is numbered once (`states`); a move goes to the `listener` as that
number, where one listens (the C++ recorder notes its time and stamps the calls after it with it), else
into `moves` with its time.

Modules are known by the objects themselves (weak references), never by ``id()``: a module built
inside a forward on every call (megatron-core 0.16.1's ``FusedScaleMaskSoftmax`` builds an
``nn.Softmax`` per call, ``fusions/fused_softmax.py:331``) often gets a freed one's address, and
must still be named and popped as the new module it is. No hook stays on a module between its
calls, so ``copy.deepcopy`` and ``torch.save`` of a model see it as the script left it.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import weakref

import torch
from torch.utils.hooks import RemovableHandle

from .steppers import Wrapped

_now = time.perf_counter

WRAPPER_PREFIXES = re.compile(
    r"(^|\.)(module|_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod|_dmp_wrapped_module)(?=\.|$)")
"""Path components that wrappers insert (DDP, FSDP1, activation checkpointing, torch.compile, TorchRec's
``DistributedModelParallel``: its model, or the DDP around it, is ``_dmp_wrapped_module``, torchrec 1.8.0
distributed/model_parallel.py:357)."""


WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel", "OptimizedModule", "DistributedModelParallel")
"""Classes whose ``module`` (or ``_orig_mod``) is the model they wrap; TorchRec's ``module`` property unwraps
its DDP too (model_parallel.py:380, ``get_unwrapped_module``)."""


def _root_name(module) -> str:
    """A root's label: its class, or for a wrapper (DDP, FSDP1, torch.compile, TorchRec's DMP) the wrapped
    model's."""
    inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
    if type(module).__name__ in WRAPPERS and inner is not None:
        return type(inner).__name__
    return type(module).__name__


def clean_name(name: str) -> str:
    """A module's qualified name without the components wrappers add."""
    return WRAPPER_PREFIXES.sub("", name).strip(".")


class JobContext:
    """The step, phase and module of the calling thread's job, kept by torch's global hooks.

    `install` registers the hooks once; `on_step` is called with the new step number after each
    boundary (the trace flushes and, with ``--steps``, stops there)."""

    def __init__(self, step_optimizer: str | None = None, on_step=None, modules: bool = True):
        self.step = 0
        self.modules = modules
        """False (`meshscope trace --cheap`): no module hooks, so no forward phase and no region."""
        self.step_optimizer = step_optimizer
        self.on_step = on_step
        self.optimizers_seen = 0
        self.stepped: dict[str, int] = {}
        """Optimizer class name -> the outermost steps in which one of that class stepped (nested ones too, each
        class once per outermost step: TorchRec's ``CombinedOptimizer.step`` steps the ``CombinedOptimizer``s
        inside it, torchrec 1.8.0 optim/keyed.py:369-371, and the job stepped once)."""
        self.stepped_outer: dict[str, int] = {}
        """The same for the frameworks' own steps around them (`steppers`)."""
        self._stepped_now: set[str] = set()
        """The classes counted in the outermost step now running."""
        self._boundary = None
        self._optimizer_depth = 0
        self._closure_depth = 0
        self._boundary_stepped = False
        self._stack: list[tuple[str, RemovableHandle | None]] = []
        """(name, its own-hooks handle or None) of every module in forward on the main thread."""
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._stale: list[RemovableHandle] = []
        self._main = threading.get_ident()
        self._handles = []
        self.listener = None
        """Called with the new state's number at every move, instead of `moves` noting it (the C++ recorder
        notes the time and stamps the calls after it with it)."""
        self._backward_depth = 0
        self.states: list[tuple[str, str, bool]] = []
        """(phase, module, inside an optimizer's step) of each state the job was in, by number."""
        self._numbers: dict[tuple[str, str, bool], int] = {}
        self._numbering = threading.Lock()
        self.moves: list[tuple[float, int]] = []
        """(``time.perf_counter()``, state number) at every move while nothing listens, in order; the trace's
        flusher takes them out as it writes them."""

    # -- hooks -----------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        self._handles = [
            optim.register_optimizer_step_pre_hook(self._pre_step),
            optim.register_optimizer_step_post_hook(self._post_step),
        ]
        if self.modules:
            self._handles += [nn_module.register_module_forward_pre_hook(self._pre_forward),
                              nn_module.register_module_forward_hook(self._post_forward, always_call=True)]
        self._wrap_engine()
        self._steppers = Wrapped(self)
        self._steppers.install()

    def _wrap_engine(self) -> None:
        graph = torch.autograd.graph
        run = getattr(graph, "_engine_run_backward", None)
        if run is None:
            return

        def engine_run_backward(*args, **kwargs):
            self.backward_begins()
            try:
                return run(*args, **kwargs)
            finally:
                self.backward_ends()

        self._restore_engine = run
        graph._engine_run_backward = torch.autograd._engine_run_backward = engine_run_backward

    def remove(self) -> None:
        """Undo `install`: every hook, and what they knew (a later `install` names the modules again)."""
        for h in (*self._handles, *self._stale, *(own for _, own in self._stack if own is not None)):
            h.remove()
        self._handles, self._stale = [], []
        self._names.clear()
        self._stack.clear()
        if hasattr(self, "_steppers"):
            self._steppers.remove()
            del self._steppers
        if hasattr(self, "_restore_engine"):
            torch.autograd.graph._engine_run_backward = torch.autograd._engine_run_backward = self._restore_engine
            del self._restore_engine

    def _is_boundary(self, opt) -> bool:
        if self.step_optimizer is not None:
            return type(opt).__name__ == self.step_optimizer
        if self._boundary is None or self._boundary() is None:
            self._boundary = weakref.ref(opt)  # the first that steps (again, once it was freed)
            self.boundary_class = type(opt).__name__
        return self._boundary() is opt

    boundary_class: str | None = None
    """The class of the optimizer whose steps are the boundaries, once one stepped (`step_optimizer` aside)."""

    def boundary_note(self) -> str | None:
        """Which optimizer's steps made the boundaries, where that was a choice: several classes stepped, or
        the class the user named never did."""
        stepped = ", ".join(f"{name} ({n} steps)" for name, n in sorted({**self.stepped, **self.stepped_outer}.items()))
        if self.step_optimizer is not None:
            if self.step_optimizer in self.stepped or self.step_optimizer in self.stepped_outer:
                return None
            return (f"--step-optimizer {self.step_optimizer}: no optimizer of that class stepped on this rank, so "
                    f"every call is in step 0; the ones that stepped: {stepped or 'none'}")
        if len(self.stepped) > 1:
            return (f"step boundaries: the outermost steps in which {self.boundary_class} stepped, the first optimizer "
                    f"that stepped (--step-optimizer names another); optimizers that stepped: {stepped}")
        return None

    def _pre_step(self, opt, args, kwargs):
        """Enter the optimizer; a closure it was given (``step(closure)``: ``args`` holds the optimizer
        first) runs as the job's own code, so it is handed on wrapped to leave the optimizer meanwhile."""
        self._optimizer_depth += 1
        self.moved()
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if not callable(closure):
            return None
        if "closure" in kwargs:
            return args, {**kwargs, "closure": self._as_job(closure)}
        return (args[0], self._as_job(closure), *args[2:]), kwargs

    def _as_job(self, closure):
        def job_closure(*args, **kwargs):
            self._closure_depth += 1
            self.moved()
            try:
                return closure(*args, **kwargs)
            finally:
                self._closure_depth -= 1
                self.moved()
        return job_closure

    def _post_step(self, opt, args, kwargs) -> None:
        """A boundary when the outermost step returns and the boundary optimizer stepped in it (itself,
        or wrapped: ZeroRedundancyOptimizer creates and steps an inner optimizer)."""
        self._optimizer_depth -= 1
        self.moved()
        self.optimizers_seen += 1
        self._count(self.stepped, type(opt).__name__)
        self._boundary_stepped = self._boundary_stepped or self._is_boundary(opt)
        self._maybe_boundary()

    def _count(self, counts: dict[str, int], name: str) -> None:
        """A step of class `name` returned: counted once per outermost step."""
        if name not in self._stepped_now:
            self._stepped_now.add(name)
            counts[name] = counts.get(name, 0) + 1

    def _maybe_boundary(self) -> None:
        """The outermost step returned with the boundary optimizer stepped inside it: the next step begins."""
        if self._optimizer_depth:
            return
        self._stepped_now.clear()
        if self._boundary_stepped:
            self._boundary_stepped = False
            self.step += 1
            if self.on_step is not None:
                self.on_step(self.step)

    def enter_step(self, stepper) -> None:
        """A framework's own step around a torch optimizer's begins (`steppers`): the optimizer's phase."""
        self._optimizer_depth += 1
        self.moved()

    def leave_step(self, stepper) -> None:
        """It returns: a boundary if the boundary optimizer stepped inside it (or ``--step-optimizer`` names
        its class); never one by itself, which would make it the boundary on a step that steps no optimizer."""
        self._optimizer_depth -= 1
        self.moved()
        name = type(stepper).__name__
        self._count(self.stepped_outer, name)
        self._boundary_stepped = self._boundary_stepped or name == self.step_optimizer
        self._maybe_boundary()

    def _pre_forward(self, module, args) -> None:
        # Dynamo traces global module hooks into a compiled module's graph (the module torch.compile
        # wraps runs its _call_impl inside the frame): under fullgraph=True (torchtitan 0.2.2's
        # per-block compile) a call it cannot trace, threading.get_ident, fails the job. The
        # wrapper's own call, outside the frame, names the region.
        if torch.compiler.is_compiling() or threading.get_ident() != self._main:
            return
        if self._stale:
            for handle in self._stale:
                handle.remove()
            self._stale.clear()
        name = self._names.get(module)
        if name is None:
            if not self._stack:  # a root: name it and everything under it
                for n, m in module.named_modules():
                    self._names.setdefault(m, clean_name(n) or _root_name(m))
            else:  # built after its root ran: named under its caller
                self._names[module] = f"{self._stack[-1][0]}.{type(module).__name__}"
            name = self._names[module]
        # torch runs global forward hooks before a module's own (nn/modules/module.py, _call_impl), and
        # the output redistribution of a parallelized module (DTensor's RowwiseParallel) is one of its own
        # hooks: such a module is popped by a hook of its own, registered after them for this call only
        self._stack.append((name, self._pop_after_own_hooks(module) if module._forward_hooks else None))
        self.moved()

    def _post_forward(self, module, args, output) -> None:
        if torch.compiler.is_compiling():  # as in _pre_forward
            return
        if threading.get_ident() == self._main and self._stack and self._stack[-1][1] is None:
            self._stack.pop()
            self.moved()

    def _pop_after_own_hooks(self, module) -> RemovableHandle:
        """A hook that pops this call's entry once the module's own forward hooks ran (a module calling
        itself sees its outer call's hook too: each pops only its own entry)."""
        def pop(module, args, output) -> None:
            if threading.get_ident() != self._main or not self._stack or self._stack[-1][1] is not own:
                return
            self._stack.pop()
            self.moved()
            # a forward that raised runs its always-called hooks while iterating the module's live hook
            # dict (_call_impl's except block): removing this one there would break that loop, so the
            # next forward does
            if sys.exc_info()[0] is None:
                own.remove()
            else:
                self._stale.append(own)

        own = module.register_forward_hook(pop, always_call=True)
        return own

    # -- what the recorder asks ------------------------------------------------------------------
    def backward_begins(self) -> None:
        """Autograd's engine runs a backward for the main thread (``torch.autograd.backward``, ``grad``)."""
        if threading.get_ident() == self._main:
            self._backward_depth += 1
            self.moved()

    def backward_ends(self) -> None:
        if threading.get_ident() == self._main:
            self._backward_depth -= 1
            self.moved()

    def moved(self) -> None:
        """A move: the main thread's state (phase, innermost module running forward, inside an optimizer's
        step and outside its closure) may have changed; told to the listener by number, else noted in `moves`."""
        # every module call runs this twice: all of it inlined (bench_module_hooks.py)
        optimizer = self._optimizer_depth > self._closure_depth
        module = self._stack[-1][0] if self._stack else ""
        state = ("backward" if self._backward_depth > 0 else "optimizer" if optimizer
                 else "forward" if module else "other", module, optimizer)
        number = self._numbers.get(state)
        if number is None:
            number = self._number(state)
        if self.listener is not None:
            self.listener(number)
        else:
            self.moves.append((_now(), number))

    def _number(self, state: tuple[str, str, bool]) -> int:
        """A new state's number: under a lock, as an optimizer may step on another thread than the main one."""
        with self._numbering:
            number = self._numbers.get(state)
            if number is None:
                self.states.append(state)
                number = self._numbers[state] = len(self.states) - 1
            return number

    @staticmethod
    def phase_of(backward: bool, optimizer: bool, region: str) -> tuple[str, str]:
        """(phase, region) of a call: autograd's engine first (a backward inside a module's forward, as
        activation checkpointing runs, is still backward), then the optimizer, then a module's forward."""
        if backward:
            return "backward", region
        if optimizer:
            return "optimizer", region
        return ("forward" if region else "other"), region

    def phase(self) -> str:
        return self.phase_of(torch._C._current_graph_task_id() != -1, self._optimizer_depth > self._closure_depth,
                             self.region())[0]

    def region(self) -> str:
        return self._stack[-1][0] if self._stack and threading.get_ident() == self._main else ""
