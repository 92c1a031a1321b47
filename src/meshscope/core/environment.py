"""The run's environment, recorded as the chapter's "versions and honesty limits" header: what ran where,
and when."""

from __future__ import annotations

import datetime
import platform
import socket
import subprocess


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def environment(backend: str, world: int) -> dict:
    import torch

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "backend": backend,
        "world": world,
        "cpu": _cpu_model(),
        "cpu_count": __import__("os").cpu_count(),
    }
    if backend == "nccl" and torch.cuda.is_available():
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["cuda"] = torch.version.cuda
        env["driver"] = _driver()
    else:
        env["gloo"] = "bundled with torch " + torch.__version__
    return env


def header(env: dict) -> str:
    """One line per fact, for the terminal and report.md."""
    device = ", ".join(env["gpus"]) if env.get("gpus") else f"CPU {env['cpu']} ({env['cpu_count']} cores)"
    backend = f"nccl {env['nccl']}, CUDA {env['cuda']}, driver {env['driver']}" if env.get("nccl") else "gloo"
    return (f"date {env['date']}; host {env['host']}; world {env['world']}; backend {backend}; device {device}; "
            f"torch {env['torch']}; python {env['python']}")
