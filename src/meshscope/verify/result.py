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

from collections import defaultdict
from dataclasses import asdict

from ..core.events import diff
from ..core.result import Check, RunResult
from ..experiments.numerics import worse
from ..experiments.template import Experiment, RankOutput


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


def build_result(exp: Experiment, cfg, backend: str, outputs: list[RankOutput], kernels: dict | None = None, *,
                 label: str) -> RunResult:
    """The typed result of one experiment run (docs/design.md: `run --json`); `kernels` is the section
    of `timing.profiling.profile_config` when the run was profiled (its checks join the others).
    `label` names the run and its files (the suite configuration's, or `Experiment.label` for a
    run); the result carries it as its ``label`` section."""
    predicted = exp.predict(cfg)
    captured = [e for out in outputs for e in out.events]
    problems = diff(predicted, captured)
    comm_check = Check("comm ledger == prediction", not problems,
                       f"{len(captured)} events match event by event" if not problems else "; ".join(problems[:3]))
    checks = [comm_check, *merge_checks(outputs), *replica_checks(outputs)]
    numerics: dict[str, float] = {}
    for out in outputs:
        for k, v in out.numerics.items():
            numerics[k] = worse(numerics.get(k, 0.0), float(v))  # a NaN on any rank stays NaN
    layout = cfg.layout
    result = RunResult(
        experiment=exp.name, backend=backend, world=layout.world, config=asdict(cfg), layout=layout,
        checks=checks, predicted=predicted, captured=captured, diff=problems, numerics=numerics,
        axis_labels={axis: layout.label(axis, exp.has_experts(cfg)) for axis in layout.aliases()},
        sections={"label": label, **exp.summarize(cfg, outputs, label)})
    if kernels:
        add_kernels(result, kernels)
    return result


def add_kernels(result: RunResult, kernels: dict) -> None:
    """Attach a profiled run's kernel section; its fingerprint checks join the result's checks."""
    result.kernels = kernels
    result.checks += [Check(**kernels[key]) for key in ("check", "ops_check") if key in kernels]
