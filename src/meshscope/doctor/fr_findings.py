"""Diagnoses from Flight Recorder dumps: the doctor's own checks run on the recorder's entries, plus
what only the recorder shows.

Each rank's entries become a `RankLog` (its calls as `CommEvent`s, those known finished as completed),
so ``collective`` names who never joined collective #k of a group (with each one's last entry) and who
issued it with another op, dtype or size, and ``p2p`` names a send without its receive (NCCL only:
gloo records no send or recv). Only the recorder has:

  group-order       a group name that ranks describe differently: torch names groups by creation count,
                    so ranks that created them in different orders disagree on what group "3" is
  group-membership  a group whose pg_config ranks differ between ranks (NCCL)
  shape             ranks pass tensors of the same size but different shapes to collective #k
  stuck             every member issued collective #k of a group and none finished it: the ranks agree,
                    so the cause is below the call (a peer blocked elsewhere, a dead link, a hung kernel)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from ..core.agreement import OWN
from .collective import collectives
from ..core.findings import Finding
from .evidence import RankLog, brief, key
from .fr_job import FrJob
from .fr_records import FrEntry
from .p2p import p2p

EVIDENCE = "flight recorder"


def rank_logs(job: FrJob) -> dict[int, RankLog]:
    """Each dumped rank's entries as the doctor's per-rank log (no group creations: the recorder has none)."""
    return {r: RankLog(r, [], [e.event for e in d.entries], {key(e.event) for e in d.entries if e.done},
                       {key(e.event): e.event.t_issue for e in d.entries}) for r, d in job.dumps.items()}


def _by_group(job: FrJob) -> dict[str, dict[int, list[FrEntry]]]:
    out: dict = defaultdict(lambda: defaultdict(list))
    for r, d in job.dumps.items():
        for e in d.entries:
            if e.event.op not in ("send", "recv"):
                out[e.group.name][r].append(e)
    return out


def group_views(job: FrJob) -> list[Finding]:
    """Ranks that disagree on what a group name stands for (description or members)."""
    views: dict = defaultdict(dict)
    for r, d in job.dumps.items():
        for g in list(d.groups.values()) + [e.group for e in d.entries]:
            views[g.name].setdefault(r, g)
    out = []
    for name, per_rank in sorted(views.items()):
        ref_rank = min(per_rank)
        ref = per_rank[ref_rank]
        for field, kind in (("desc", "group-order"), ("ranks", "group-membership")):
            off = sorted(r for r, g in per_rank.items() if getattr(g, field) != getattr(ref, field)
                         and getattr(g, field) is not None and getattr(ref, field) is not None)
            if off:
                e = next((x for x in job.dumps[off[0]].entries if x.group.name == name), None)
                g = per_rank[off[0]]
                out.append(Finding(
                    kind, e.event.axis if e else ref.desc, list(g.ranks or ()), off,
                    f"group {name!r}: rank {off[0]} has {g.desc}{list(g.ranks or ())}, rank {ref_rank} has "
                    f"{ref.desc}{list(ref.ranks or ())}",
                    "ranks created their process groups in different orders or with different members; group "
                    "creation is a global protocol that every rank must follow identically (see docs/chapter.md, Q3)",
                    e.event.t_issue if e else float("-inf"), evidence=EVIDENCE))
                break
    return out


def _own_shapes(x: FrEntry) -> tuple[tuple[int, ...], ...]:
    """The shapes of the rank's own tensors, the ones members must agree on (`core.agreement`): a
    scatter's output (the root's input is its list of every member's chunk), else the input (a
    gather's root receives the list)."""
    return x.output_sizes if OWN.get(x.event.op) == "bytes_out" else x.input_sizes


def shapes(job: FrJob, already: set[tuple]) -> list[Finding]:
    """Collective #k of a group with equal sizes but different shapes (groups not already diagnosed)."""
    out = []
    for name, per_rank in sorted(_by_group(job).items()):
        for k in range(min(len(v) for v in per_rank.values())):
            have = {r: v[k] for r, v in per_rank.items()}
            e = next(iter(have.values())).event
            if (e.axis, e.group) in already or len({_own_shapes(x) for x in have.values()}) < 2 or e.op == "all_to_all":
                continue
            out.append(Finding("shape", e.axis, list(e.group), sorted(have),
                               f"collective #{k} of {e.axis}{list(e.group)}: " + "; ".join(
                                   f"rank {r} {x.event.op} {[list(s) for s in _own_shapes(x)]}"
                                   for r, x in sorted(have.items())),
                               "ranks pass tensors of different shapes to the same collective",
                               min(x.event.t_issue for x in have.values()), evidence=EVIDENCE))
            break
    return out


def stuck(job: FrJob) -> list[Finding]:
    """Groups whose every member's last entry is the same collective, finished on none of them; only
    where the members are known (pg_config, or the default group), since an inferred group may lack one."""
    out = []
    for name, per_rank in sorted(_by_group(job).items()):
        last = {r: v[-1] for r, v in per_rank.items()}
        e = next(iter(last.values()))
        members = set(e.event.group)
        if not (e.group.listed or name == "0") or len(members) < 2 or set(last) != members or len({x.collective_seq_id for x in last.values()}) > 1 or \
                any(x.done for x in last.values()):
            continue
        where = f" (issued at {e.frame})" if e.frame else ""
        out.append(Finding("stuck", e.event.axis, list(e.event.group), sorted(last),
                           f"collective #{e.event.seq} of {e.event.axis}{list(e.event.group)}: {brief(e.event)}{where}",
                           f"every rank of the group issued it ({e.profiling_name}, state {e.state}) and none finished: "
                           "they agree on the call, so it is blocked below it (a peer stuck in another group, a "
                           "dead link or process, a hung kernel)",
                           max(x.event.t_issue for x in last.values()), derived=True, evidence=EVIDENCE))
    return out


def diagnose_job(job: FrJob) -> list[Finding]:
    """Every finding of one job's dumps; group views first, since a mis-named group makes the rest suspect."""
    views = group_views(job)
    if views:
        return views
    logs = rank_logs(job)
    found = [replace(f, evidence=EVIDENCE) for f in collectives(logs) + p2p(logs)]
    found += shapes(job, {(f.axis, tuple(f.group)) for f in found})
    return found + stuck(job)

