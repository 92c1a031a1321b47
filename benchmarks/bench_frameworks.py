"""The frameworks' marked subset (``pytest -m frameworks``): each case's wall time and the machine's load.

Runs ``python -m pytest -m frameworks`` (Megatron-core's GPTModel at 1,024 ranks with real and with
fake tensors, torchtitan's HSDP x TP at 1,024 ranks, Lightning's ModelParallelStrategy and
``accelerator="cuda"`` against gloo, inductor on mapped CUDA, DeepSpeed's ZeRO-2 and ZeRO-3 against gloo (its
first run on a machine compiles DeepSpeed's CPU communication op), HF Trainer with DDP against gloo,
pytorch/examples' distributed scripts)
in one process (``-n 0``: the cases run one after another, as the figures assume) and prints, per
case, the seconds of its setup (the module's shared traces are made there) and of its call, with
the 1-minute load average at the start, the end and its highest sample (every 5 s) in between. The
pytorch/examples cases need a checkout (``--examples DIR``, the folder that holds ``distributed/``;
default ``$MESHSCOPE_PYTORCH_EXAMPLES``): its commit and the sha256 of each script traced are printed
first, the proof that they ran as their authors wrote them. Without one those cases are skipped. The
picotron case (tests/test_picotron.py) likewise needs a huggingface/picotron checkout (``--picotron DIR``, the
folder holding ``train.py``; default ``$MESHSCOPE_PICOTRON``), whose commit is printed first.

Run: python benchmarks/bench_frameworks.py [--examples /path/to/pytorch/examples] [--picotron /path/to/picotron]
[-- PYTEST_ARGS]

The newer releases (torchtitan 0.3.0 on torch 2.15, megatron-core 0.19.2, both on Python 3.12) run in a venv of
their own, outside CI; each test runs only where the release it reads is installed (the others are skipped,
saying which release they read). torch 2.15 is on the index as a CUDA build only, which is what a machine
without a GPU gets (pip on this project's box caps torch, hence ``PIP_CONSTRAINT=/dev/null``)::

    python3.12 -m venv /work/compat-venv
    PIP_CONSTRAINT=/dev/null /work/compat-venv/bin/pip install torch==2.15.0 torchtitan==0.3.0 megatron-core==0.19.2 \
        pytest pytest-timeout pytest-xdist expecttest tokenizers
    PIP_CONSTRAINT=/dev/null /work/compat-venv/bin/pip install torch==2.15.0 -e .
    /work/compat-venv/bin/python benchmarks/bench_frameworks.py

picotron pins transformers 4.47 (its requirements.txt; with 5.x its config has no ``rope_theta`` and its
tokenizer no ``batch_encode_plus``), and transformers 4.47's datasets 2.19 needs numpy < 2, which needs
pyarrow < 20 and pandas < 3; so it runs in a venv of its own, where every other stack's case is skipped
(picotron is on no package index: a git checkout at 59714b1, the commit its test's counts were read at)::

    git clone https://github.com/huggingface/picotron /work/picotron && git -C /work/picotron checkout 59714b1
    python3 -m venv /work/picotron-venv
    /work/picotron-venv/bin/pip install torch==2.13.0 -e . transformers==4.47.0 datasets==2.19.1 'numpy<2' \
        'pyarrow<20' 'pandas<3' wandb pytest pytest-timeout pytest-xdist
    /work/picotron-venv/bin/python benchmarks/bench_frameworks.py --picotron /work/picotron -- tests/test_picotron.py
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["ddp-tutorial-series/multigpu_torchrun.py", "tensor_parallelism/tensor_parallel_example.py",
           "tensor_parallelism/sequence_parallel_example.py", "tensor_parallelism/fsdp_tp_example.py",
           "FSDP2/example.py"]
"""The scripts tests/test_pytorch_examples.py traces, under the checkout's ``distributed/``."""
DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")
STACKS = ("torch", "megatron-core", "lightning", "torchtitan", "deepspeed", "torchrec", "fbgemm-gpu-cpu",
          "transformers", "accelerate", "torchtune", "torchao", "nanotron", "colossalai")
"""The distributions whose code the cases trace: each one's installed version is printed (or "not
installed": its cases skip, saying which release they read)."""


def describe_stacks() -> None:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    print("stacks: " + ", ".join(f"{name} {installed(name)}" for name in STACKS))


def commit(checkout: Path) -> str:
    found = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() or "(not a git checkout)"


def describe_checkout(examples: Path) -> None:
    print(f"pytorch/examples at {examples}: commit {commit(examples)}")
    for script in SCRIPTS:
        path = examples / "distributed" / script
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "(missing)"
        print(f"  {digest}  distributed/{script}")


class LoadSampler(threading.Thread):
    """The highest 1-minute load average seen while the cases run."""

    def __init__(self, every_s: float = 5.0):
        super().__init__(daemon=True)
        self.every_s, self.peak, self.done = every_s, os.getloadavg()[0], threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            self.peak = max(self.peak, os.getloadavg()[0])


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=Path, default=os.environ.get("MESHSCOPE_PYTORCH_EXAMPLES"),
                   help="a pytorch/examples checkout (the folder holding distributed/)")
    p.add_argument("--picotron", type=Path, default=os.environ.get("MESHSCOPE_PICOTRON"),
                   help="a huggingface/picotron checkout (the folder holding train.py)")
    p.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = p.parse_args()
    env = dict(os.environ)
    if args.examples:
        if not (args.examples / "distributed").is_dir():
            sys.exit(f"--examples {args.examples}: no distributed/ folder there (a pytorch/examples checkout?)")
        describe_checkout(args.examples)
        env["MESHSCOPE_PYTORCH_EXAMPLES"] = str(args.examples.resolve())
    else:
        print("no pytorch/examples checkout (--examples or MESHSCOPE_PYTORCH_EXAMPLES): its cases are skipped")
    if args.picotron:
        if not (args.picotron / "train.py").is_file():
            sys.exit(f"--picotron {args.picotron}: no train.py there (a huggingface/picotron checkout?)")
        print(f"picotron at {args.picotron}: commit {commit(args.picotron)}")
        env["MESHSCOPE_PICOTRON"] = str(args.picotron.resolve())
    else:
        print("no picotron checkout (--picotron or MESHSCOPE_PICOTRON): its case is skipped")
    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}")
    describe_stacks()

    start = os.getloadavg()[0]
    sampler = LoadSampler()
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="bench_frameworks_") as tmp:
        cmd = [sys.executable, "-m", "pytest", "-m", "frameworks", "-n", "0", "-p", "no:cacheprovider",
               f"--basetemp={tmp}/pt", "--durations=0", "-vv", *args.pytest_args]
        print("$ " + " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    sampler.done.set()
    times: dict[str, dict[str, float]] = {}
    for line in proc.stdout.splitlines():
        if m := DURATION.match(line):
            times.setdefault(m[3], {})[m[2]] = float(m[1])
    print(f"\n{'case':<78} {'setup s':>8} {'call s':>8} {'total s':>8}")
    for case, t in sorted(times.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"{case.removeprefix('tests/'):<78} {t.get('setup', 0):8.1f} {t.get('call', 0):8.1f} "
              f"{sum(t.values()):8.1f}")
    print(f"load (1 min): {start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end, "
          f"{sampler.peak:.2f} at most")
    summary = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    print(summary[-1] if summary else proc.stdout[-3000:])
    if proc.returncode:
        print(proc.stdout[-6000:], proc.stderr[-3000:], sep="\n")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
