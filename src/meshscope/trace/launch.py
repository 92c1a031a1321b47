"""`meshscope trace`: launch a user's script through torch's elastic agent with the trace in every
worker, then assemble, check and keep what it issued.

The command is the user's torchrun command with ``meshscope trace`` in front: the rendezvous flags
are torchrun's own and go to it unchanged (``--standalone`` when none is given, as for one node);
each worker runs `trace.rank` before the script. The run directory is written like `run`'s:
``spec.json`` first, an ``INCOMPLETE`` marker until the result is in, ``flight/`` and ``ledgers/``
per rank, ``ranks/`` (how each rank ended), then ``result.json`` (`core.trace_result.TraceResult`), with
the doctor's findings when the job failed or hung.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..capture.segment_clock import MEASURE_ON
from ..core.errors import UsageError
from ..core.rundir import RunDir, check_timeout
from ..core.trace_result import TraceResult
from ..core.trace_spec import TraceSpec
from ..run.launch import launch
from .assemble import assemble, conclude
from .fake import gpu
from .options import RECORDERS, RankOptions

RENDEZVOUS_FLAGS = ("node-rank", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "master-addr", "master-port")
"""torchrun's rendezvous flags that `meshscope trace` accepts and forwards unchanged."""


@dataclass(frozen=True)
class TraceOptions:
    """What `meshscope trace` was asked to do."""

    target: tuple[str, ...]
    """``SCRIPT ARGS...`` or ``-m MODULE ARGS...``, as after torchrun's own flags."""
    nproc_per_node: int | None = None
    """Workers on this node (torchrun's ``--nproc-per-node``; None: 1, or min(8, N) ranks per node of a
    fake world)."""
    nnodes: int = 1
    """Nodes, each started with its own ``meshscope trace`` (torchrun's ``--nnodes``)."""
    rendezvous: tuple[str, ...] = ()
    """torchrun's rendezvous flags as given (``--rdzv-backend``, ``--master-addr``, ``--node-rank``...)."""
    steps: int | None = None
    """End the job cleanly once every rank finished this many steps; None: run the script to its end."""
    timeout: float | None = None
    """Seconds a collective may wait before the job is stopped and diagnosed; None: the job's own."""
    step_optimizer: str | None = None
    """Class name of the optimizer whose steps mark the boundaries; None: the first one created."""
    out: Path | None = None
    """Run directory; None: ``traces/<script>-<time>-<pid>``."""
    fake_world: int | None = None
    """Trace ranks of a world of this many on torch's fake backend (`trace.fake`), a few processes at a time."""
    fake_tensors: bool = False
    """With ``fake_world``: run the script under FakeTensorMode, its tensors shapes without data (no
    memory, no arithmetic; `trace.fake.tensors` says what it supports)."""
    work: bool = False
    """With ``fake_world``: each rank counts its ops' FLOPs and bytes between its calls and the memory it
    holds, into ``work/rank<R>.json`` (`capture.work`; what ``meshscope forecast`` reads); with real tensors,
    through the Python kernel recorder."""
    measure_on: str = ""
    """With ``work`` and real tensors: ``cuda`` or ``cpu``, the device whose clock times each compute segment of
    each traced rank (`capture.segment_clock`), the ranks run one at a time; empty: none (the forecast's roofline)."""
    fake_device: str | None = None
    """With ``fake_world``: the stand-in GPU (a `trace.fake.gpu.GPUS` name) that torch.cuda's device and memory
    queries answer as where CUDA is mapped to the CPU; None: `trace.fake.gpu.DEFAULT`."""
    cheap: bool = False
    """No module hooks (no forward phase, no region) and no flight log streamed while the job runs (a
    hang leaves only what the rank wrote when it failed): the cheaper mode of docs/trace.md."""
    recorder: str = "native"
    """``native``: the C++ recorder (`capture.native`, built here once per torch before the ranks start;
    the Python kernel where it cannot be built); ``python``: the Python kernel (`capture.dispatch`)."""
    flight_recorder: bool = True
    """torch's Flight Recorder on in every worker, dumped into ``fr/`` on a failure (`trace.fr_dump`)."""
    ranks: str = "auto"
    """Fake world: ``auto`` (one rank per class, `fake.rank_classes`) or a comma list such as ``0,7,1023``."""
    env: dict = field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.fake_world or self.nnodes * self.local

    @property
    def local(self) -> int:
        """Workers on this node."""
        return self.nproc_per_node if self.nproc_per_node is not None else 1

    def chosen_ranks(self) -> list[int] | None:
        """The fake world's ranks to trace, None for ``auto``; UsageError on a bad list."""
        if self.ranks == "auto":
            return None
        try:
            ranks = sorted({int(r) for r in self.ranks.split(",") if r.strip()})
        except ValueError:
            raise UsageError(f"--ranks {self.ranks!r} must be 'auto' or a comma list of ranks, e.g. 0,7") from None
        bad = [r for r in ranks if not 0 <= r < self.world]
        if not ranks or bad:
            raise UsageError(f"--ranks {self.ranks!r}: ranks must lie in [0, {self.world - 1}] (world {self.world})")
        return ranks

    def validate(self) -> None:
        if not self.target:
            raise UsageError("meshscope trace needs the job after '--': meshscope trace [options] -- SCRIPT [ARGS...]")
        if self.target[0] == "-m":
            if len(self.target) < 2:
                raise UsageError("-m needs a module name: meshscope trace -- -m MODULE [ARGS...]")
        elif not Path(self.target[0]).is_file():
            raise UsageError(f"script {self.target[0]!r} does not exist; give the path of a Python script or "
                             f"-m MODULE")
        for name, value in (("--nproc-per-node", self.local), ("--nnodes", self.nnodes)):
            if value < 1:
                raise UsageError(f"{name} {value} must be a positive integer")
        if self.fake_world is not None:
            if self.fake_world < 1:
                raise UsageError(f"--fake-world {self.fake_world} must be a positive number of ranks")
            if self.nnodes != 1 or self.rendezvous:
                raise UsageError("--fake-world runs every rank on this machine: leave out --nnodes and the rendezvous flags")
            if self.nproc_per_node and self.fake_world % self.nproc_per_node:
                divisors = [d for d in range(1, min(self.fake_world, 64) + 1) if self.fake_world % d == 0]
                raise UsageError(f"--nproc-per-node {self.nproc_per_node} does not divide --fake-world "
                                 f"{self.fake_world}: every node holds as many ranks (divisors up to 64: "
                                 f"{', '.join(map(str, divisors))})")
            self.chosen_ranks()
        elif self.fake_tensors:
            raise UsageError("--fake-tensors needs --fake-world N: a real job's tensors hold its data")
        if self.work and self.fake_world is None:
            raise UsageError("--work needs --fake-world N: the ops are counted as a fake world's ranks run them")
        if self.measure_on:
            self._check_measure_on()
        if self.fake_device is not None:
            if self.fake_world is None:
                raise UsageError(f"--fake-device needs --fake-world N: a real job asks its own GPU ({_gpu_names()})")
            if gpu.lookup(self.fake_device) is None:
                raise UsageError(f"--fake-device {self.fake_device!r} is not a stand-in GPU: choose one of "
                                 f"{_gpu_names()}")
        if self.steps is not None and self.steps < 1:
            raise UsageError(f"--steps {self.steps} must be a positive number of steps (leave it out to run the "
                             f"script to its end)")
        if self.timeout is not None:
            check_timeout(self.timeout)
        if self.recorder not in RECORDERS:
            raise UsageError(f"--recorder {self.recorder!r}: choose one of {', '.join(RECORDERS)}")

    def _check_measure_on(self) -> None:
        if self.measure_on not in MEASURE_ON:
            raise UsageError(f"--measure-on {self.measure_on!r}: choose one of {', '.join(MEASURE_ON)}")
        if not self.work or self.fake_tensors:
            raise UsageError(f"--measure-on {self.measure_on} times the ops as they run: it needs --work and real "
                             f"tensors (leave out --fake-tensors)")
        if self.measure_on == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise UsageError("--measure-on cuda: this machine has no CUDA device (torch.cuda.is_available() is "
                                 "False); leave it out to forecast compute from the cluster's roofline")

    def run_dir(self) -> Path:
        if self.out is not None:
            return self.out
        stem = Path(self.target[1] if self.target[0] == "-m" else self.target[0]).stem
        return Path("traces") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

    def rank_program(self, run_dir: Path) -> list[str]:
        """What torchrun runs in every worker: `trace.rank` with `rank_options`."""
        return ["-m", "meshscope.trace.rank", *self.rank_options(run_dir).to_argv()]

    def rank_options(self, run_dir: Path) -> RankOptions:
        """What every rank is told (`trace.options.RankOptions`)."""
        return RankOptions(run_dir=run_dir, target=self.target, steps=self.steps, timeout=self.timeout,
                           step_optimizer=self.step_optimizer, fake=bool(self.fake_world),
                           fake_tensors=self.fake_tensors, work=self.work, cheap=self.cheap,
                           # real tensors' work is counted above the Python kernel, whose calls it numbers
                           recorder="python" if self.work and not self.fake_tensors else self.recorder,
                           flight_recorder=self.flight_recorder, measure_on=self.measure_on,
                           fake_device=(gpu.lookup(self.fake_device or gpu.DEFAULT) if self.fake_world else ""))


def _gpu_names() -> str:
    return ", ".join(f"{key} ({g.name}{', the default' if key == gpu.DEFAULT else ''})" for key, g in gpu.GPUS.items())


def add_trace_options(p: argparse.ArgumentParser) -> None:
    """The flags of `meshscope trace` (and of the traces `meshscope budget` and `check` make), but its
    --out and --json: their one definition."""
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="workers on this node, as torchrun's (default 1; with --fake-world, ranks per node: min(8, N))")
    p.add_argument("--nnodes", type=int, default=1, help="nodes, each running its own meshscope trace (default 1)")
    for flag in RENDEZVOUS_FLAGS:
        p.add_argument(f"--{flag}", default=None, help="passed to torchrun unchanged")
    p.add_argument("--steps", type=int, default=None,
                   help="end the job cleanly once every rank finished this many optimizer steps (default: run to the end)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop the job and diagnose it once a collective has waited this many seconds (default: the job's own)")
    p.add_argument("--step-optimizer", default=None,
                   help="class name of the optimizer whose step() marks the step boundary (default: the first created)")
    p.add_argument("--cheap", action="store_true",
                   help="no module hooks (no forward phase or module) and no flight log streamed while the job runs")
    p.add_argument("--recorder", choices=RECORDERS, default="native",
                   help="native: the C++ recorder, built once per torch (the Python kernel where it cannot be "
                        "built); python: the Python kernel")
    p.add_argument("--flight-recorder", action=argparse.BooleanOptionalAction, default=True,
                   help="torch's Flight Recorder in every worker, dumped into RUN_DIR/fr/ when a rank fails or "
                        "is stopped (default on)")
    p.add_argument("--fake-world", type=int, default=None,
                   help="trace ranks of a world of this many on torch's fake backend, one CPU process each")
    p.add_argument("--fake-tensors", action="store_true",
                   help="with --fake-world: tensors with shapes and no data (no memory, no arithmetic), recorded "
                        "by a dispatch mode (--recorder does not apply); values the script reads get placeholders, "
                        "counted in the result, and a shape that depends on values stops the rank (docs/trace.md)")
    p.add_argument("--fake-device", default=None, metavar="NAME",
                   help=f"with --fake-world, where CUDA is mapped to the CPU: the GPU torch.cuda's device and memory "
                        f"queries answer as: {', '.join(gpu.GPUS)} (default {gpu.DEFAULT})")
    p.add_argument("--ranks", default="auto",
                   help="with --fake-world: auto (one rank per class, the default) or a comma list such as 0,7,1023")
    p.add_argument("--work", action="store_true",
                   help="with --fake-world N: count each op's FLOPs and bytes between the calls and the memory each "
                        "rank holds, into RUN_DIR/work/ (what meshscope forecast reads)")
    p.add_argument("--measure-on", default="", choices=MEASURE_ON, metavar="DEVICE",
                   help="with --work and real tensors: time each compute segment as it runs, on cuda (this host's "
                        "GPU: every traced rank runs its own shard's kernels there, one rank at a time) or cpu")


def options_of(args: argparse.Namespace, target, out: Path | None = None) -> TraceOptions:
    """`TraceOptions` from flags `add_trace_options` parsed (`out`: the run directory)."""
    rendezvous = tuple(f"--{flag}={getattr(args, flag.replace('-', '_'))}" for flag in RENDEZVOUS_FLAGS
                       if getattr(args, flag.replace("-", "_")) is not None)
    return TraceOptions(target=tuple(target), nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                        rendezvous=rendezvous, steps=args.steps, timeout=args.timeout,
                        step_optimizer=args.step_optimizer, out=out, fake_world=args.fake_world, ranks=args.ranks,
                        cheap=args.cheap, recorder=args.recorder, flight_recorder=args.flight_recorder,
                        fake_tensors=args.fake_tensors, work=args.work, fake_device=args.fake_device,
                        measure_on=args.measure_on)


def ready_recorder(options: TraceOptions, echo=None) -> TraceOptions:
    """Build the C++ recorder before any rank starts (a rank only loads it), or fall back to the
    Python kernel, saying why. Not with fake tensors: their calls are recorded by a dispatch mode."""
    if options.recorder != "native" or options.fake_tensors or options.work:
        return options
    from ..capture.native_build import NativeUnavailable, ensure  # torch only if it must be compiled

    say = echo or (lambda line: sys.stderr.write(line))
    try:
        ensure(log=lambda text: say(f"meshscope trace: {text}\n"))
    except NativeUnavailable as exc:
        say(f"meshscope trace: the C++ recorder cannot be built here ({exc}); recording with the Python kernel\n")
        return replace(options, recorder="python")
    return options


def trace(options: TraceOptions, echo=None) -> TraceResult:
    """Run the traced job; returns its result (also the run directory's result.json)."""
    options.validate()
    run_dir = RunDir(options.run_dir())
    run_dir.check()
    options = ready_recorder(options, echo)
    if options.fake_world:
        from .fake.world import trace_fake_world

        return trace_fake_world(options, run_dir, echo)
    one_node = options.nnodes == 1
    run_dir.begin(TraceSpec(world=options.world, command=tuple(options.target), traced=options.local,
                            expected=tuple(range(options.world)) if one_node else None,
                            nproc_per_node=options.local, nnodes=options.nnodes, steps=options.steps,
                            timeout=options.timeout))
    rendezvous = list(options.rendezvous) or ["--standalone"]
    launched = launch(run_dir.path, options.local, None, program=options.rank_program(run_dir.path),
                      rendezvous=rendezvous if one_node else [f"--nnodes={options.nnodes}", *rendezvous],
                      echo=echo or (lambda line: sys.stderr.write(line)), env=options.env)
    result = assemble(run_dir, account=launched.error if launched.returncode else None)
    return conclude(run_dir, result)
