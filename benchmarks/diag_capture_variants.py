"""Where does a recorded call's cost go inside a real step? The chapter's TP step on 2 GPUs, in
interleaved blocks of 20 steps, with dist.all_reduce replaced by: nothing (off), a bare Python
wrapper, a wrapper that also decodes the arguments as the capture does, the capture itself; and the
garbage collector off. Prints rank 0's median step, forward and backward host time per variant.

Run: PYTHONPATH=src torchrun --standalone --nproc-per-node 2 benchmarks/diag_capture_variants.py
"""
import contextlib
import gc
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshscope.capture.collective_calls import C10D
from meshscope.capture.recorder import Capture
from meshscope.core.mesh import Layout
from meshscope.models.collectives import AllReduceSum
from meshscope.run.runtime import RankContext

ctx = RankContext.start("nccl", 60, None)
tp = ctx.mesh(Layout(ctx.world, tp=ctx.world))["tp"]
g = torch.Generator().manual_seed(0)
x_BD = torch.randn(128, 512, generator=g).to(ctx.device)
w1 = torch.randn(512, 512, generator=g).to(ctx.device).requires_grad_()
w2 = torch.randn(512, 512, generator=g).to(ctx.device).requires_grad_()
def step():
    t0 = time.perf_counter()
    y = AllReduceSum.apply(F.linear(F.gelu(F.linear(x_BD, w1)), w2), tp)
    loss = y.square().mean()
    t1 = time.perf_counter(); loss.backward(); t2 = time.perf_counter()
    torch.cuda.synchronize(); return t1 - t0, t2 - t1
orig = dist.all_reduce
@contextlib.contextmanager
def plain_wrapper():
    def w(*a, **k): return orig(*a, **k)
    dist.all_reduce = w
    try: yield
    finally: dist.all_reduce = orig
@contextlib.contextmanager
def wrapper_decode():
    import inspect
    names = list(inspect.signature(orig).parameters)
    def w(*a, **k):
        arguments = dict(zip(names, a)); arguments.update(k); arguments.setdefault("group", None)
        C10D["all_reduce"](arguments)
        return orig(*a, **k)
    dist.all_reduce = w
    try: yield
    finally: dist.all_reduce = orig
@contextlib.contextmanager
def capture_gc_off():
    gc.disable()
    try:
        with Capture(): yield
    finally: gc.enable()
@contextlib.contextmanager
def off_gc_off():
    gc.disable()
    try: yield
    finally: gc.enable()
modes = {"off": contextlib.nullcontext, "python wrapper": plain_wrapper, "wrapper+decode": wrapper_decode,
         "capture": Capture, "off, gc off": off_gc_off, "capture, gc off": capture_gc_off}
res = {m: [] for m in modes}
for i in range(16):
    for m, make in modes.items():
        with make():
            for j in range(20):
                dist.barrier(); torch.cuda.synchronize()
                s = time.perf_counter(); f, b = step(); e = time.perf_counter() - s
                if i: res[m].append((e, f, b))
if ctx.rank == 0:
    for m, r in res.items():
        med = [statistics.median(x[k] for x in r) * 1e6 for k in range(3)]
        print(f"{m:16s} step {med[0]:7.1f} us  fwd {med[1]:6.1f}  bwd {med[2]:6.1f}")
ctx.close()
