"""``meshscope forecast`` on the terminal: the step, each rank class, each axis's exposed communication."""

from __future__ import annotations

from ..core.events import human_bytes
from ..forecast.result import Forecast
from .table import make_console, print_table


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.3f} s"


def render(f: Forecast, console=None) -> None:
    console = console or make_console()
    net = f.cluster["network"]
    console.print(f"forecast of {f.run_dir} (traced step {f.step}, world {f.world}) on {f.cluster['name']}: "
                  f"{f.cluster['gpu']['name']}, {net['gpus_per_node']} per node")
    rate = f", {f.tokens_per_s_per_gpu:,.0f} tokens/s per GPU" if f.tokens_per_s_per_gpu else ""
    console.print(f"step {_s(f.step_s)} (rank {f.critical_rank}'s class paces it){rate}; HFU {f.hfu:.1%} "
                  f"(counted matmul FLOPs, recomputation included, over the bf16 peak)")
    print_table(console, "rank classes", ("rank", "plays", "step", "compute", "exposed comm", "waits on side streams",
                                          "peak memory", "peak at"),
                [(c.rank, c.ranks, _s(c.step_s), _s(c.compute_s), _s(c.exposed_s), _s(c.waited_on_streams_s),
                  human_bytes(c.peak_bytes),
                  f"step {c.peak_at.get('step')} {c.peak_at.get('phase')} {c.peak_at.get('module') or ''}".strip())
                 for c in f.classes])
    print_table(console, "communication per axis (each class's step)",
                ("rank", "axis", "calls", "bytes", "on the link", "exposed", "of which waiting for peers"),
                [(c.rank, a.axis, a.calls, human_bytes(a.bytes), _s(a.seconds), _s(a.exposed_s),
                  _s(a.waiting_for_peers_s)) for c in f.classes for a in c.axes], key=2)
    console.print(f"compute: {f.compute_source}")
    for note in f.notes:
        console.print(f"note: {note}")
