"""Which of the agent's imports (`run.agent.PRELOAD`, then the rank program) leave a forked child unable to
use CUDA, with and without ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (one fresh process per case), and whether
a `meshscope trace` rank forked by the agent then initialises CUDA. Needs a CUDA build of torch; on a
GPU host it says what `run.agent` relies on.

Run: PYTHONPATH=src python benchmarks/check_fork_cuda.py
"""

from __future__ import annotations

import os
import subprocess
import sys

CASE = r"""
import importlib, os, sys
from meshscope.run import agent
names = list(agent.PRELOAD) + ["meshscope.trace.rank"]
import torch
print("torch", torch.__version__, "cuda build", torch.cuda._is_compiled())
for name in names:
    importlib.import_module(name)
    if agent._fork_poisoned():
        print("poisoned after importing", name, "initialised:", torch.cuda.is_initialized())
        break
else:
    print("not poisoned after", len(names), "imports")
pid = os.fork()
if pid == 0:
    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    try:
        torch.cuda.set_device(0)
        torch.ones(1, device="cuda")
        os._exit(0)
    except Exception as exc:
        print("forked child:", str(exc).splitlines()[0])
        os._exit(1)
print("forked child used CUDA:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0)
"""


def main() -> None:
    for nvml in (None, "1"):
        env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
        if nvml:
            env["PYTORCH_NVML_BASED_CUDA_CHECK"] = nvml
        print(f"== PYTORCH_NVML_BASED_CUDA_CHECK={nvml or '(unset)'}", flush=True)
        subprocess.run([sys.executable, "-c", CASE], env=env, timeout=300)


if __name__ == "__main__":
    main()
