"""What a rank's process holds when its script's first line runs: its random state and signal handlers.

An ordinary torchrun script (it imports torch only). Each rank prints one line ``state {json}``: a draw of ``random`` and of
NumPy's global generator (never seeded by the script: a fresh interpreter seeds both from the system,
so ranks draw differently), and whether SIGINT and SIGHUP have Python's start-up handlers. Then it trains
``Linear(8, 8)`` under DDP for ``--steps`` steps with a worker thread that is not a daemon and ends only
when the script reaches its end: a launcher that stops the script early must not wait for it.

    torchrun --nproc-per-node 2 tests/jobs/process_state.py --steps 3
"""

import argparse
import json
import random
import signal
import sys
import threading

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state = {"rank": rank, "random": random.random(), "numpy": float(np.random.rand()),
             "sigint_python": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
             "sighup_default": signal.getsignal(signal.SIGHUP) == signal.SIG_DFL}
    sys.stdout.write(f"state {json.dumps(state)}\n")  # one write: the ranks share the console
    sys.stdout.flush()
    done = threading.Event()
    worker = threading.Thread(target=done.wait)  # not a daemon: a plain exit waits for it
    worker.start()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    done.set()
    worker.join()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
