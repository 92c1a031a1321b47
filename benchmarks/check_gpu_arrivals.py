"""What a trace on NCCL says of its calls' arrivals on the GPU (`CommEvent.t_gpu`), beside the job's own times.

Reads ``meshscope trace --json`` of ``tests/jobs/ddp.py`` on one GPU and prints: how many calls got an
arrival on the GPU and a time there (`gpu_ms`); the lag from each call's CPU issue to its arrival on the
GPU (it cannot be negative beyond the reference's error); and, per step, the lag of the step's first
gradient all-reduce on each rank, and the stragglers the time section names. With ``--planted RANK_LOG`` (the rank's log of a run with ``--slow-in gpu``) it also
prints the planted kernels' own CUDA-event times (``delays: gpu ms [...]``, the oracle), so that the
first all-reduce's lag of each step can be set beside the kernel that delayed it.

Run (device, repository root): python3 benchmarks/check_gpu_arrivals.py TRACE.json [--planted RUN/logs/rank0.log]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--planted", default=None)
    args = p.parse_args()
    doc = json.load(open(args.trace))
    events = [e for r in doc["per_rank"] for s in r["steps"] for e in s["events"]]
    timed = [e for e in events if e["t_gpu"] is not None]
    print(f"outcome {doc['outcome']}; calls {len(events)}; with t_gpu {len(timed)}; with gpu_ms "
          f"{sum(e['gpu_ms'] is not None for e in events)}; recorder {[r['recorder'] for r in doc['ranks']]}")
    for r in doc["ranks"]:
        if r.get("note"):
            print(f"rank {r['rank']} note: {r['note']}")
    if not timed:
        return 1
    lags = [(e["t_gpu"] - e["t_issue"]) * 1e3 for e in timed]
    print(f"issue -> GPU arrival ms: min {min(lags):.3f} median {statistics.median(lags):.3f} max {max(lags):.3f}")
    first: dict[int, dict[int, dict]] = {}
    for e in timed:
        if e["op"] == "all_reduce" and e["step"] is not None:
            first.setdefault(e["rank"], {}).setdefault(e["step"], e)
    for rank, steps in sorted(first.items()):
        print(f"rank {rank}: first all-reduce of each step, issue -> GPU arrival ms:",
              {s: round((e["t_gpu"] - e["t_issue"]) * 1e3, 3) for s, e in sorted(steps.items())})
    order = all(a["t_gpu"] <= b["t_gpu"] for a, b in zip(timed, timed[1:]) if a["rank"] == b["rank"])
    print(f"arrivals in issue order on each rank: {order}")
    if args.planted:
        text = open(args.planted).read()
        m = re.search(r"delays: gpu ms (\[[^\]]*\])", text)
        print(f"planted kernels, their own CUDA events (ms): {m.group(1) if m else 'not found'}")
    t = doc.get("time") or {}
    print(f"time: analysed {t.get('analysed')} step_ms {t.get('step_ms')} note {t.get('note')!r}")
    for a in t.get("axes", []):
        print(f"  axis {a['axis']}: inside {a['inside_ms']} ms/step, waiting {a['waiting_ms']}, gpu {a['gpu_ms']}")
    for st in t.get("stragglers", []):
        print(f"  straggler: rank {st['rank']} on {st['axis']}, {st['ms_per_step']} ms per step, where "
              f"({st['phase']}, {st['module'] or 'no module'}), {st['excess_ms']} ms more")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
