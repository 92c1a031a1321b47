"""What the CUDA mapping costs inside backward: the TorchFunctionMode pushed around autograd's engine.

A fake world's CUDA mapping (`trace.fake.devices`) pushes its TorchFunctionMode around
``torch.autograd.graph._engine_run_backward``, so every torch call that Python code makes inside a
backward (a custom ``Function.backward``, a tensor hook) goes through the mode's handler; autograd's
own C++ backward functions make none. This times a training step with the mode pushed there against
the same step with torch's own ``_engine_run_backward`` (the mode active for the forward only, as
before), alternating the two in rounds, in one process with the fake world's CUDA rows applied:

- ``mlp``: 8 Linear(512, 512) + ReLU, batch 64: every backward function is C++;
- ``custom``: the same with a custom autograd Function after each layer whose backward makes 6
  torch calls (Megatron-core's sequence-parallel linear allocates and copies like this) on the
  gradient's device, which runs either way.

    PYTHONPATH=src python benchmarks/bench_fake_backward.py [--rounds 15] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from meshscope.trace.entry_points import rebind
from meshscope.trace.fake import patches


class Busy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        # grad.device, not torch.cuda.current_device(): without the mode in backward (the comparison) an
        # ordinal would fail, and the mode's handler runs for each call either way
        buffer = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        buffer.copy_(grad)
        scale = torch.ones((), device=grad.device)
        out = buffer.mul(scale)
        out = out.add(torch.zeros_like(out))
        return out.contiguous()


def model(custom: bool) -> torch.nn.Module:
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers).to("cuda")
    if not custom:
        return net

    class WithCustom(torch.nn.Module):
        def forward(self, x):
            for layer in net:
                x = layer(x)
                if isinstance(layer, torch.nn.ReLU):
                    x = Busy.apply(x)
            return x
    return WithCustom()


def step_time(net, x, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        net(x).sum().backward()
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    assert not torch.cuda.is_available(), "run where torch has no CUDA: the mapping is what is measured"
    patches.apply({patches.CUDA_MAP})
    from torch.autograd import graph

    pushed = graph._engine_run_backward  # the mapping's: the mode around the engine
    original = pushed.__closure__[[c for c in pushed.__code__.co_freevars].index("run_backward")].cell_contents
    x = torch.randn(64, 512, device="cuda")
    for name in ("mlp", "custom"):
        net = model(name == "custom")
        times = {"pushed": [], "torch's": []}
        step_time(net, x, 3)
        for _ in range(args.rounds):
            for variant, engine in (("pushed", pushed), ("torch's", original)):
                current = graph._engine_run_backward
                if current is not engine:
                    rebind(current, engine)
                times[variant].append(step_time(net, x, args.steps))
        rebind(graph._engine_run_backward, pushed)
        a, b = statistics.median(times["pushed"]), statistics.median(times["torch's"])
        print(f"{name:7s} mode in backward {a * 1e3:7.2f} ms/step, without {b * 1e3:7.2f} ms/step: "
              f"{(a / b - 1) * 100:+.1f} % (median of {args.rounds} rounds of {args.steps} steps)")


if __name__ == "__main__":
    main()
