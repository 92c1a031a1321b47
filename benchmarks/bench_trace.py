"""What `meshscope trace` costs a training step: no trace / the trace / --cheap / torch's CommDebugMode.

Launches 2 gloo ranks (``--nproc``; ``--backend nccl``: one rank per GPU) through torch's elastic agent
(``torch.distributed.run --standalone``) and times, in one run, three steps under five modes:

steps
  ``tp``       the chapter's TP step: MLP D 512, H 1024, batch 128, DTensor ColwiseParallel fc1 /
               RowwiseParallel fc2 over a 1-D "tp" mesh of both ranks, SGD;
  ``ddp``      DistributedDataParallel over 8 bias-free Linear(512, 512) (8 MiB of parameters),
               bucket_cap_mb=1 (one bucket per layer), batch 64, SGD;
  ``fsdp_tp``  torch's test Transformer (``common_dtensor``: ModelArgs(n_layers=3, dropout_p=0),
               ``Transformer.parallelize(model, mesh["tp"], use_seq_parallel=True, local_output_for_attn=True)``:
               SDPA's CPU kernel has no DTensor strategy in torch 2.13, so attention runs on local
               heads), then
               ``fully_shard`` of every TransformerBlock and the root over ``mesh["dp"]`` of the 2-D
               mesh (dp 1, tp 2) (or --fsdp-mesh 2x1: dp 2, tp 1), batch 8 x 16 tokens, AdamW.
               Per step (CommDebugMode and the trace agree): dp 1 x tp 2 issues 45 collectives, all TP's
               on the 2 ranks (16 all_gather, 15 reduce_scatter, 14 all_reduce; FSDP2 on its 1-rank dp
               group issues none); dp 2 x tp 1 issues FSDP2's 11 (7 all_gather, 4 reduce_scatter) and
               DTensor none. The default is dp 1 x tp 2: more calls per step, a better per-call figure;
  ``calls``    (only when named in --steps) `CALLS` all_reduces of one float: what a mode adds per call.
modes
  ``none``       ``capture.dispatch.uninstall()``, no hook: exactly torch;
  ``trace``      what ``meshscope.trace.rank`` installs: a JobContext with its hooks, a RankTrace whose
                 flusher thread writes the flight log to a temporary directory, its C++ recorder on
                 (``capture.native``, built before the ranks start), the DeviceMesh labels (its
                 ``__init__`` patch; the meshes themselves are built once, labelled);
  ``trace-py``   the same with the Python kernel (``meshscope trace --recorder python``);
  ``cheap``      ``meshscope trace --cheap``: ``trace`` without module hooks and without the streamed
                 flight log (its records are built and written at the end);
  ``commdebug``  ``torch.distributed.tensor.debug.CommDebugMode`` entered around every step.

A sample is K back-to-back steps (--steps-per-sample) of one step under one mode: the mode is set up
(a fresh JobContext and RankTrace for a trace sample, as a traced job has one), one untimed step is
run (module naming, caches), a barrier lines the ranks up, then the K steps are timed. A trace
sample's window ends with ``RankTrace.flush()`` of its own records, so all the flusher's work for
those steps is paid inside the window (the 0.5 s timer would otherwise leave part of it outside).
The sample's time is the max over ranks. A round is one sample of every (step, mode), modes in a
random order drawn from the round number (the same on both ranks); one round of warm-up is
discarded. Figures are per step: median, P5/P95, CV of the samples; the overhead vs ``none`` as a
ratio of medians and as the median (and IQR) of the per-round paired ratios; the trace's collectives
per step (by op and group) and the per-call cost derived from them. The same table is printed for the
CPU time of the sample (``time.process_time`` of each rank process, all its threads, summed over the
ranks): under a loaded machine it moves less than the wall time. Nothing is asserted.

torch's Flight Recorder (on in every traced worker unless ``--no-flight-recorder``) cannot be turned
on and off within one process: torch reads ``TORCH_FR_BUFFER_SIZE`` once. ``--recorder-pairs N``
therefore runs N pairs of launches, one with the recorder on, one without (in a random order per
pair), each printing nothing but its medians per (step, mode), and reports per (step, mode) the
median over pairs of the on / off ratio, wall and CPU.

Run: PYTHONPATH=src python benchmarks/bench_trace.py [--samples 30] [--steps-per-sample K] [--modes none trace]
     PYTHONPATH=src python benchmarks/bench_trace.py --backend nccl --nproc 1 --steps ddp   (one GPU)
     PYTHONPATH=src python benchmarks/bench_trace.py --recorder-pairs 8 --samples 10 --modes none trace --steps calls tp ddp fsdp_tp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

MODES = ("none", "trace", "trace-py", "cheap", "commdebug")
TRACES = ("trace", "trace-py", "cheap")
DEVICE = None
"""Where the steps run: the CPU (gloo), or each rank's GPU (``--backend nccl``); set by `worker`."""
STEPS = ("tp", "ddp", "fsdp_tp", "calls")
DEFAULT_K = {"tp": 16, "ddp": 4, "fsdp_tp": 3, "calls": 4}
"""Steps per sample when --steps-per-sample is not given (a sample of about 0.1-0.5 s on 2 cores under load)."""


# -- the three steps -------------------------------------------------------------------------------
def build_tp(world: int):
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(512, 1024)
            self.fc2 = nn.Linear(1024, 512)

        def forward(self, x):
            return self.fc2(nn.functional.gelu(self.fc1(x)))

    mesh = init_device_mesh(DEVICE.type, (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = parallelize_module(MLP().to(DEVICE), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(128, 512, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step, model, "MLP 512-1024-512, batch 128, DTensor tp 2 (Colwise fc1, Rowwise fc2), SGD"


def build_ddp(rank: int):
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    layers = []
    for i in range(8):
        layers += [nn.Linear(512, 512, bias=False)] + ([nn.ReLU()] if i < 7 else [])
    model = DDP(nn.Sequential(*layers).to(DEVICE), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1 + rank)).to(DEVICE)
    params = sum(p.numel() * p.element_size() for p in model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step, model, f"DDP, 8 x Linear(512, 512, bias=False) = {params / 2**20:.1f} MiB fp32, bucket_cap_mb=1, batch 64, SGD"


def build_fsdp_tp(world: int, dp: int):
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed._tensor.common_dtensor import (
        ModelArgs,
        Transformer,
        TransformerBlock,
    )

    tp = world // dp
    mesh = init_device_mesh(DEVICE.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    args = ModelArgs(n_layers=3, dropout_p=0.0)
    # local_output_for_attn: wq/wk/wv hand plain local tensors (their heads) to SDPA, whose CPU kernel
    # (aten._scaled_dot_product_flash_attention_for_cpu) has no DTensor sharding strategy in torch 2.13
    model = Transformer.parallelize(Transformer(args).to(DEVICE), mesh["tp"], use_seq_parallel=True, local_output_for_attn=True)
    for m in model.modules():
        if isinstance(m, TransformerBlock):
            fully_shard(m, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + mesh["dp"].get_local_rank())
    tokens = torch.randint(0, args.vocab_size, (8, args.max_seq_len), generator=g).to(DEVICE)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(tokens)
        nn.functional.cross_entropy(out.reshape(-1, args.vocab_size), tokens.reshape(-1)).backward()
        opt.step()

    return step, model, (f"torch test Transformer (ModelArgs n_layers 3, dim {args.dim}, heads {args.n_heads}, vocab "
                  f"{args.vocab_size}, seq {args.max_seq_len}, dropout 0), Transformer.parallelize on mesh['tp'] "
                  f"use_seq_parallel=True local_output_for_attn=True, fully_shard per block + root on mesh['dp'], 2-D mesh (dp {dp}, tp {tp}), "
                  f"batch 8, AdamW")


def build_calls():
    import torch
    import torch.distributed as dist

    x = torch.ones(1, device=DEVICE)

    def step():
        for _ in range(CALLS):
            dist.all_reduce(x)

    return step, torch.nn.Module(), f"{CALLS} all_reduce of one float and nothing else: a per-call cost, not a step"


CALLS = 64
"""Collectives per step of ``calls``."""


# -- the modes -------------------------------------------------------------------------------------
def no_kernels() -> None:
    """Neither recorder's kernels registered: the dispatcher runs exactly as torch's."""
    from meshscope.capture import dispatch, native

    dispatch.uninstall()
    native.uninstall()


class NoneMode:
    def __init__(self, **_):
        pass

    def enter(self):
        no_kernels()

    def run(self, step):
        step()

    def end_window(self):
        pass

    def exit(self):
        pass


class TraceMode:
    """What trace/rank.py's `main` sets up around the script (a fresh one per sample)."""

    cheap = False
    recorder = "native"

    def __init__(self, run_dir: Path, rank: int, label_init, **_):
        self.run_dir, self.rank, self.label_init = run_dir, rank, label_init

    def enter(self):
        from torch.distributed import device_mesh

        from meshscope.capture.job_context import JobContext
        from meshscope.core.rundir import RunDir
        from meshscope.trace.recording import RankTrace

        self.context = JobContext(None, modules=not self.cheap)
        self.trace = RankTrace(RunDir(self.run_dir), self.rank, self.context, stream=not self.cheap,
                               recorder=self.recorder)
        if self.trace.recorder != self.recorder:
            raise RuntimeError(f"asked for the {self.recorder} recorder, got {self.trace.recorder}: {self.trace.recorder_note}")
        self.context.on_step = self.trace.step_done
        self.context.install()
        self._mesh_init = device_mesh.DeviceMesh.__init__
        device_mesh.DeviceMesh.__init__ = self.label_init  # mesh_dims.label_device_meshes's patch (built once)
        self.trace.start()
        self.recording = self.trace.recording()
        self.recording.__enter__()  # registers the dispatcher kernels (after a none sample removed them)

    def run(self, step):
        step()

    def end_window(self):
        self.trace.flush()

    def calls(self):
        """Collectives recorded so far (the flight log's "issued" events)."""
        return [(e.axis, tuple(e.group), e.op) for e in self.trace.ledger()]

    def exit(self):
        from torch.distributed import device_mesh

        self.recording.__exit__(None, None, None)
        self.context.remove()
        device_mesh.DeviceMesh.__init__ = self._mesh_init
        self.trace.finish("ok", 0)


class PythonTraceMode(TraceMode):
    """`meshscope trace --recorder python`: the Python kernel."""

    recorder = "python"


class CheapMode(TraceMode):
    """`meshscope trace --cheap`: no module hooks, nothing written until the end."""

    cheap = True

    def end_window(self):
        pass

    def calls(self):
        self.trace._drain()  # numbers the calls that --cheap leaves as tuples until the end
        return [(e.axis, tuple(e.group), e.op) for e in self.trace.ledger()]


class CommDebugModeMode:
    def __init__(self, **_):
        from torch.distributed.tensor.debug import CommDebugMode

        self.cls = CommDebugMode

    def enter(self):
        no_kernels()

    def run(self, step):
        with self.cls():
            step()

    def end_window(self):
        pass

    def exit(self):
        pass


# -- the worker ------------------------------------------------------------------------------------
def worker(args) -> None:
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed import device_mesh

    from meshscope.capture import dispatch, native
    from meshscope.trace import mesh_dims

    warnings.filterwarnings("ignore")  # torch's UserWarnings about the jobs (view outputs, backward hooks)
    global DEVICE
    DEVICE = torch.device("cpu")
    if args.backend == "nccl":  # one rank per GPU; the window ends when the GPU is done
        DEVICE = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    # The meshes are built as in a traced job: with mesh_dims.label_device_meshes's patch on (these meshes
    # are built by DeviceMesh.__init__, none unflattened). Keep the patched __init__ for the trace samples,
    # restore torch's.
    original_init = device_mesh.DeviceMesh.__init__
    mesh_dims.label_device_meshes()
    label_init = device_mesh.DeviceMesh.__init__
    dp = int(args.fsdp_mesh.split("x")[0])
    builders = {"tp": lambda: build_tp(world), "ddp": lambda: build_ddp(rank), "calls": build_calls,
                "fsdp_tp": lambda: build_fsdp_tp(world, dp)}
    steps, models, descs = {}, {}, {}
    for name in args.steps:
        steps[name], models[name], descs[name] = builders[name]()
    device_mesh.DeviceMesh.__init__ = original_init
    dispatch.uninstall()

    def hooks():
        """What a trace could leave behind: a `none` or `commdebug` sample must find torch's own state."""
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        return (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks),
                len(optim._global_optimizer_pre_hooks), len(optim._global_optimizer_post_hooks),
                sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for md in models.values() for m in md.modules()),
                len(dispatch._libs), dispatch._sink, native.installed(), device_mesh.DeviceMesh.__init__ is original_init,
                torch.optim.Optimizer.__init__)

    clean = hooks()

    tmp = Path(tempfile.mkdtemp(prefix="bench_trace_"))
    K = {s: args.steps_per_sample or DEFAULT_K[s] for s in args.steps}
    times = {(s, m): [] for s in args.steps for m in args.modes}  # this rank's wall seconds per sample
    cpu = {(s, m): [] for s in args.steps for m in args.modes}  # this process's CPU seconds (all its threads)
    calls: dict[str, Counter] = {}
    flush_s = {s: [] for s in args.steps}
    modes = {"none": NoneMode, "trace": TraceMode, "trace-py": PythonTraceMode, "cheap": CheapMode,
             "commdebug": CommDebugModeMode}
    n = 0
    t_start = time.perf_counter()
    for rnd in range(args.samples + 1):  # round 0 is warm-up
        for s in args.steps:
            order = list(args.modes)
            random.Random(1000 * rnd + STEPS.index(s)).shuffle(order)  # the same on every rank
            for m in order:
                n += 1
                mode = modes[m](run_dir=tmp / f"sample{n}", rank=rank, label_init=label_init)
                mode.enter()
                if m in ("none", "commdebug") and hooks() != clean:
                    raise RuntimeError(f"a {m} sample found state left by the trace: {hooks()} != {clean}")
                mode.run(steps[s])  # untimed: first-use costs of this sample's mode
                if m in TRACES:
                    mode.trace.flush() if m != "cheap" else None
                    before = len(mode.calls())
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(K[s]):
                    mode.run(steps[s])
                if DEVICE.type == "cuda":
                    torch.cuda.synchronize()
                t1 = time.perf_counter()
                mode.end_window()
                t2, c2 = time.perf_counter(), time.process_time()
                if rnd:
                    times[s, m].append(t2 - t0)
                    cpu[s, m].append(c2 - c0)
                if m in TRACES:
                    ops = [c for c in mode.calls()[before:] if c[2] != "barrier"]  # the sample's own barrier
                    calls[s] = Counter(ops)
                    calls[s] = Counter({op: c / K[s] for op, c in calls[s].items()})
                    if rnd and m == "trace":
                        flush_s[s].append(t2 - t1)
                mode.exit()
    loop_s = time.perf_counter() - t_start
    dispatch.uninstall()
    gathered = [None] * world
    dist.all_gather_object(gathered, (times, calls, flush_s, loop_s, cpu))
    if rank == 0:
        report(args, gathered, descs, K)
    dist.barrier()
    dist.destroy_process_group()
    shutil.rmtree(tmp, ignore_errors=True)  # the trace samples' flight logs and ledgers


# -- the figures -----------------------------------------------------------------------------------
def pct(xs, q):
    xs = sorted(xs)
    i = q * (len(xs) - 1)
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def table(t: dict, unit: str) -> tuple[float, float]:
    """Print one row per mode of the per-step samples `t[mode]`; returns the trace's overhead per step in
    seconds, (from the ratio of medians, from the median paired ratio)."""
    base = statistics.median(t["none"])
    print(f"  {'mode':10s} {'median ' + unit:>10s} {'P5':>9s} {'P95':>9s} {'CV %':>6s}  {'ratio of medians':>16s}"
          f"  {'paired ratio: median [IQR]':>28s}  {'drift 2nd/1st half':>18s}")
    over = (0.0, 0.0)
    for m, xs in t.items():
        med = statistics.median(xs)
        cv = 100 * statistics.stdev(xs) / statistics.mean(xs)
        half = len(xs) // 2
        drift = statistics.median(xs[half:]) / statistics.median(xs[:half])
        if m == "none":
            rom = paired = ""
        else:
            ratios = [a / b for a, b in zip(xs, t["none"])]
            rom = f"{100 * (med / base - 1):+.1f} %"
            paired = (f"{100 * (statistics.median(ratios) - 1):+.1f} % [{100 * (pct(ratios, .25) - 1):+.1f}, "
                      f"{100 * (pct(ratios, .75) - 1):+.1f}]")
            if m == "trace":
                over = (med - base, (statistics.median(ratios) - 1) * base)
        print(f"  {m:10s} {med * 1e3:10.3f} {pct(xs, .05) * 1e3:9.3f} {pct(xs, .95) * 1e3:9.3f} {cv:6.1f}  "
              f"{rom:>16s}  {paired:>28s}  {drift:18.3f}")
    return over


def report(args, gathered, descs, K) -> None:
    import torch

    world = len(gathered)
    per_rank_calls = [g[1] for g in gathered]
    summary: dict = {}
    print(f"\nrounds {args.samples} (+1 warm-up discarded), {world} ranks {args.backend}, {torch.get_num_threads()} torch thread(s) "
          f"per rank; timed loop {gathered[0][3]:.1f} s on rank 0")
    for s in args.steps:
        n = range(args.samples)
        wall = {m: [max(g[0][s, m][i] for g in gathered) / K[s] for i in n] for m in args.modes}
        cpu = {m: [sum(g[4][s, m][i] for g in gathered) / K[s] for i in n] for m in args.modes}
        summary[s] = {m: {"wall": statistics.median(wall[m]), "cpu": statistics.median(cpu[m])} for m in args.modes}
        counts = per_rank_calls[0].get(s, Counter())
        ncalls = sum(counts.values())
        same = all(r.get(s) == counts for r in per_rank_calls)
        print(f"\n[{s}] {descs[s]}")
        print(f"  {K[s]} steps per sample, {args.samples} samples per mode")
        print("  wall time per step, max over ranks (ms):")
        w_med, w_pair = table(wall, "ms")
        print(f"  CPU time per step, summed over the {world} rank processes (all their threads; ms):")
        c_med, c_pair = table(cpu, "ms")
        ops = ", ".join(f"{op} {c:g} on ranks {list(g)} (axis '{axis}')" for (axis, g, op), c in sorted(counts.items()))
        differ = "" if same else " (ranks differ: " + str([r.get(s) for r in per_rank_calls]) + ")"
        print(f"  trace: {ncalls:g} collectives per step: {ops}{differ}")
        flush = statistics.median(max(g[2][s][i] for g in gathered) for i in n) / K[s]
        if ncalls:
            def us(x):
                return f"{x * 1e6:.0f}"

            print(f"  trace overhead per step (medians / paired): wall {us(w_med)} / {us(w_pair)} us, CPU (both ranks) "
                  f"{us(c_med)} / {us(c_pair)} us")
            print(f"  per collective: wall {us(w_med / ncalls)} / {us(w_pair / ncalls)} us, CPU per rank "
                  f"{us(c_med / ncalls / world)} / {us(c_pair / ncalls / world)} us (everything the trace adds per step, "
                  f"hooks and flight log included, over its collectives); the window's last flush: {us(flush)} us per step")
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary))
    print("\n(axis: meshscope's label. The tp step's 1-D mesh reuses the default group, so in this one process the "
          "DDP step's calls on that group read 'tp' too.)")


def machine() -> str:
    import torch

    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"cpu {cpu}, {os.cpu_count()} logical cores; python {platform.python_version()}; torch {torch.__version__}; "
            f"OMP_NUM_THREADS per rank {os.environ.get('OMP_NUM_THREADS', '1 (set by torch.distributed.run)')}")


def load() -> str:
    return "load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=30, help="timed rounds: samples per (step, mode)")
    p.add_argument("--steps-per-sample", type=int, default=None,
                   help="K steps per sample (default per step: " + ", ".join(f"{k} {v}" for k, v in DEFAULT_K.items()) + ")")
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS[:3]))
    p.add_argument("--fsdp-mesh", choices=("1x2", "2x1"), default="1x2", help="dp x tp of the fsdp_tp step's mesh")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="nccl: one rank per GPU")
    p.add_argument("--nproc", type=int, default=2, help="ranks (one per GPU with nccl)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="none must be among them")
    p.add_argument("--recorder-pairs", type=int, default=0,
                   help="instead: this many pairs of launches, one with torch's Flight Recorder on "
                        f"(TORCH_FR_BUFFER_SIZE={RECORDER_BUFFER}), one without, in a random order per pair")
    p.add_argument("--summary", default=None, help=argparse.SUPPRESS)  # a launch's medians, for --recorder-pairs
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if "none" not in args.modes:
        p.error("--modes must include none (the baseline)")
    print(" ".join([Path(sys.executable).name, *sys.argv]))
    print(machine())
    print("start " + load(), flush=True)
    from meshscope.capture import native

    native.build(log=print)  # as `meshscope trace` does before its ranks start
    t0 = time.time()
    code = recorder_pairs(args) if args.recorder_pairs else launch(args)
    print(f"\nend {load()}; wall {time.time() - t0:.0f} s")
    sys.exit(code)


def launch(args, recorder: bool = False, summary: str | None = None, quiet: bool = False) -> int:
    """One launch of the ranks running every (step, mode) sample; `recorder`: the Flight Recorder on."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc), __file__,
           "--worker", "--samples", str(args.samples), "--steps", *args.steps, "--fsdp-mesh", args.fsdp_mesh,
           "--backend", args.backend, "--modes", *args.modes, *(["--summary", summary] if summary else [])]
    if args.steps_per_sample:
        cmd += ["--steps-per-sample", str(args.steps_per_sample)]
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    if recorder:
        env["TORCH_FR_BUFFER_SIZE"] = RECORDER_BUFFER
    out = subprocess.DEVNULL if quiet else None
    return subprocess.run(cmd, check=False, env=env, stdout=out, stderr=out).returncode


RECORDER_BUFFER = "2000"
"""The buffer `meshscope trace` gives torch's Flight Recorder (trace.fr_dump.BUFFER_SIZE)."""


def recorder_pairs(args) -> int:
    """The recorder's cost: torch reads TORCH_FR_BUFFER_SIZE once per process, so on and off cannot
    alternate within one launch; pairs of launches (on, off, in a random order) each give per (step,
    mode) the median step, and the figure is the median over pairs of on / off."""
    ratios: dict = {}
    offs: dict = {}  # the recorder-off medians, per step
    tmp = Path(tempfile.mkdtemp(prefix="bench_recorder_"))
    for i in range(args.recorder_pairs):
        pair = {}
        for recorder in random.Random(i).sample([False, True], 2):
            path = tmp / f"pair{i}-{int(recorder)}.json"
            if launch(args, recorder, str(path), quiet=True) != 0:
                print(f"pair {i}: a launch failed", file=sys.stderr)
                return 1
            pair[recorder] = json.loads(path.read_text())
        for s, modes in pair[True].items():
            for m, med in modes.items():
                for unit in ("wall", "cpu"):
                    ratios.setdefault((s, m, unit), []).append(med[unit] / pair[False][s][m][unit])
                    offs.setdefault((s, m, unit), []).append(pair[False][s][m][unit])
        print(f"pair {i + 1}/{args.recorder_pairs} done; {load()}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nFlight Recorder on / off, median [min, max] over {args.recorder_pairs} pairs of launches "
          f"({args.samples} samples per mode each):")
    for s in args.steps:
        for m in args.modes:
            cells = []
            for unit in ("wall", "cpu"):
                xs, base = ratios[s, m, unit], statistics.median(offs[s, m, unit])
                cells.append(f"{unit} {100 * (statistics.median(xs) - 1):+.1f} % [{100 * (min(xs) - 1):+.1f}, "
                             f"{100 * (max(xs) - 1):+.1f}] of {base * 1e3:.2f} ms")
            print(f"  {s:8s} {m:10s} " + "   ".join(cells))
    return 0



if __name__ == "__main__":
    main()
