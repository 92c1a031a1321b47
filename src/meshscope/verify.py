"""Turn the ranks' outputs of one experiment into its verdict: the `run --json` result contract.

Checks, each with its figure:
- the captured ledger equals the predicted one, event by event per rank and group (`events.diff`);
- every rank-local check (outputs and gradients vs the unsharded reference, finite losses...)
  holds on every rank; the worst figure is reported;
- state that must be identical across a group (DP replicas of a shard, expert replicas) has the
  same digest on every member.
`passed` is true only if every check holds.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import asdict

import torch

from .events import counts, diff
from .experiments import Check, Experiment, RankOutput
from .experiments.numerics import worse


def digest(tensors) -> str:
    """Bit-exact fingerprint of a sequence of tensors (replicas must match to the last bit)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def merge_checks(outputs: list[RankOutput]) -> list[Check]:
    """One check per name: passed on every rank; the detail of the first failing rank, else rank 0's."""
    by_name: dict[str, list[tuple[int, Check]]] = defaultdict(list)
    for out in outputs:
        for c in out.checks:
            by_name[c.name].append((out.rank, c))
    merged = []
    for name, items in by_name.items():
        failed = [(r, c) for r, c in items if not c.passed]
        if failed:
            r, c = failed[0]
            merged.append(Check(name, False, f"rank {r}: {c.detail}"))
        else:
            merged.append(Check(name, True, f"{items[0][1].detail} (all {len(items)} ranks)"))
    return merged


def replica_checks(outputs: list[RankOutput]) -> list[Check]:
    """For each replicated state name: every group's members hold identical digests."""
    groups: dict[str, dict[tuple[int, ...], set[str]]] = defaultdict(lambda: defaultdict(set))
    for out in outputs:
        for name, (ranks, dig) in out.replicas.items():
            groups[name][tuple(ranks)].add(dig)
    checks = []
    for name, by_group in groups.items():
        bad = [list(g) for g, digs in by_group.items() if len(digs) > 1]
        sizes = {len(g) for g in by_group}
        detail = (f"differs within {bad}" if bad else
                  f"identical within each of {len(by_group)} group(s) of {'/'.join(map(str, sorted(sizes)))} ranks")
        checks.append(Check(f"replicas equal: {name}", not bad, detail))
    return checks


def build_result(exp: Experiment, cfg, backend: str, outputs: list[RankOutput], kernels: dict | None = None) -> dict:
    """The result document of one experiment run (design brief: `run --json`); `kernels` is the section
    of `profiling.profile_config` when the run was profiled (its check joins the others)."""
    predicted = exp.predict(cfg)
    captured = [e for out in outputs for e in out.events]
    problems = diff(predicted, captured)
    comm_check = Check("comm ledger == prediction", not problems,
                       f"{len(captured)} events match event by event" if not problems else "; ".join(problems[:3]))
    checks = [comm_check, *merge_checks(outputs), *replica_checks(outputs)]
    for key in ("check", "ops_check"):
        if kernels and key in kernels:
            checks.append(Check(**kernels[key]))
    numerics: dict[str, float] = {}
    for out in outputs:
        for k, v in out.numerics.items():
            numerics[k] = worse(numerics.get(k, 0.0), float(v))  # a NaN on any rank stays NaN
    layout = exp.layout(cfg)
    world = layout.world
    per_rank = [{"rank": r,
                 "predicted": counts(e for e in predicted if e.rank == r),
                 "captured": counts(e for e in captured if e.rank == r)} for r in range(world)]
    return {
        "experiment": exp.name,
        "backend": backend,
        "world": world,
        "config": asdict(cfg),
        "axis_labels": {axis: layout.label(axis, exp.has_experts(cfg)) for axis in layout.aliases()},
        "passed": all(c.passed for c in checks),
        "checks": [c.to_json() for c in checks],
        "comm": {"match": not problems, "diff": problems, "per_rank": per_rank,
                 "events": {"predicted": [e.to_json() for e in predicted], "captured": [e.to_json() for e in captured]}},
        "numerics": numerics,
        **({"kernels": kernels} if kernels else {}),
        **exp.summarize(cfg, outputs),
    }
