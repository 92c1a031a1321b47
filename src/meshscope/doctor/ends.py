"""Findings from how a traced job's ranks ended: the script's own exception (``script-error``), and
which comes first, it or the collectives' findings.

A rank is **blocked** when it waited in a collective that never completed: its error is a
collective's timeout (`core.trace_result.RankEnd.timed_out`: gloo's "Timed out waiting", the
store's "wait timeout", NCCL's watchdog), or it was still inside a call when the job was stopped
from outside while no rank had failed on its own (the watchdog or the user stopping a hang). A rank
whose collective was cut off because a peer's process ended ("Connection closed by peer", "reset
by peer") or that the launcher stopped because a peer raised is not blocked: its end follows from
that peer's.

Ordering: when no rank is blocked, the job failed because a script raised, and that exception
(type, message, the script's file and line) is the likely root cause, before anything the flight
logs show (a call a stopped peer never reached, a mismatch that could only be seen because the job
was cut short). When a rank is blocked, the hang is the fault and the findings keep their order by
time (a script error raised after the hang began follows from it).
"""

from __future__ import annotations

from ..core.findings import Finding
from ..core.rundir import RunDir
from ..core.trace_result import RankEnd
from .evidence import RankLog, blocked_in


def ends(run_dir: RunDir) -> list[RankEnd]:
    """How each traced rank ended, for every rank with a flight log or a record (none for a run)."""
    if not run_dir.ranks_with("ranks") and run_dir.kind() != "trace":
        return []
    ranks = sorted(set(run_dir.ranks_with("ranks")) | set(run_dir.ranks_with("flight")))
    return [run_dir.read_end(r) for r in ranks]


def blocked(ended: list[RankEnd], logs: dict[int, RankLog]) -> list[int]:
    """The ranks that were blocked (module docstring)."""
    on_its_own = any(e.script_error for e in ended)
    return sorted(e.rank for e in ended if e.timed_out
                  or (not on_its_own and e.status in ("terminated", "missing") and e.rank in logs
                      and blocked_in(logs, e.rank) is not None))


def script_errors(ended: list[RankEnd], run_dir: RunDir) -> list[Finding]:
    """One ``script-error`` per way the ranks failed on their own (exception, message and place): the
    ranks that failed alike are one finding."""
    alike: dict[tuple, list[RankEnd]] = {}
    for e in ended:
        if e.script_error:
            alike.setdefault((e.exception, e.error, e.where), []).append(e)
    out = []
    for (exception, error, where), group in alike.items():
        first = min(group, key=lambda e: e.time)
        at = f" at {where}" if where else ""
        raised = f" (raised in {first.origin})" if first.origin and first.origin != where else ""
        log = run_dir.log(first.rank)
        said = f"; its traceback is in {log}" if log.exists() else ""
        out.append(Finding("script-error", "", [], sorted(e.rank for e in group), f"{error}{at}{raised}",
                           f"the script itself failed on {'this rank' if len(group) == 1 else 'these ranks'} "
                           f"(exit code {first.exit_code}), outside any collective{said}", first.time,
                           evidence="rank record"))
    return out


def order(findings: list[Finding], blocked_ranks: list[int]) -> list[Finding]:
    """The findings, the likely root cause first (module docstring)."""
    by_time = sorted(findings, key=lambda f: (f.t, f.derived))  # stable: equal keys keep the order found in
    if blocked_ranks:
        return by_time
    return [f for f in by_time if f.kind == "script-error"] + [f for f in by_time if f.kind != "script-error"]
