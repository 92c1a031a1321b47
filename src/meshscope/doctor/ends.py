"""Findings from how a traced job's ranks ended: a rank's own failure (the script's exception,
``script-error``, or meshscope's or the fake world's: `blame`), and which comes first, it or the
collectives' findings.

A rank is **blocked** when it waited in a collective that its peers were never going to join: its
error is a collective's timeout (`core.rank_end.RankEnd.timed_out`: gloo's "Timed out waiting",
the store's "wait timeout", NCCL's watchdog), or it was still inside a call when the job ended (it
failed there, or was stopped from outside) while a peer that never issued that call had gone past
it: the peer finished the step the call belongs to, or issued a different call at that position of
the group (DDP's unused parameters, a skipped collective). A rank waiting for a peer that stopped
before reaching the call (it raised, and the launcher then stopped the rest; its collective cut
off, "Connection closed by peer") is not blocked: its wait follows from that peer's exception.

Ordering: when no rank is blocked, the job failed because a script raised, and that exception
(type, message, the script's file and line) is the likely root cause, before anything the flight
logs show (a call a stopped peer never reached, a mismatch that could only be seen because the job
was cut short). When a rank is blocked, the hang is the fault and the findings keep their order by
time (a script error raised after the hang began follows from it).
"""

from __future__ import annotations

from ..core.errors import UsageError
from ..core.findings import Finding
from ..core.rundir import RunDir
from ..core.rank_end import RankEnd
from . import blame
from .evidence import RankLog, blocked_in


def ends(run_dir: RunDir) -> list[RankEnd]:
    """How each traced rank ended, for every rank with a flight log or a record (none for a run)."""
    if not run_dir.ranks_with("ranks") and run_dir.kind() != "trace":
        return []
    ranks = sorted(set(run_dir.ranks_with("ranks")) | set(run_dir.ranks_with("flight")))
    return [run_dir.read_end(r) for r in ranks]


def blocked(ended: list[RankEnd], logs: dict[int, RankLog]) -> list[int]:
    """The ranks that were blocked (module docstring)."""
    return sorted(e.rank for e in ended if e.timed_out or (not e.ended and _passed_by_a_peer(e.rank, logs)))


def _passed_by_a_peer(rank: int, logs: dict[int, RankLog]) -> bool:
    """The call `rank` was inside when it ended was skipped by a peer that went on past it."""
    if rank not in logs:
        return False
    call = blocked_in(logs, rank)
    if call is None:
        return False
    for peer in call.group:
        if peer == rank or peer not in logs:
            continue
        theirs = logs[peer].on(call)
        if len(theirs) > call.seq:
            if theirs[call.seq].op != call.op:  # it issued something else in that place
                return True
        elif logs[peer].steps_done > (call.step or 0):  # it never issued it, and finished that step
            return True
    return False


def script_errors(ended: list[RankEnd], run_dir: RunDir) -> list[Finding]:
    """One finding per way the ranks failed on their own (exception, message and place), of the kind that
    says whose failure it was (`blame`: the script's, meshscope's or the fake world's): the ranks that
    failed alike are one finding."""
    alike: dict[tuple, list[RankEnd]] = {}
    for e in ended:
        if e.script_error:
            alike.setdefault((e.exception, e.error, e.where, e.meshscope_frame), []).append(e)
    fake_world = _fake_world(run_dir) if alike else False
    out = []
    for (exception, error, where, _), group in alike.items():
        first = min(group, key=lambda e: e.time)
        at = f" at {where}" if where else ""
        raised = f" (raised in {first.origin})" if first.origin and first.origin != where else ""
        log = run_dir.log(first.rank)
        # a negative exit is a signal (torchrun's convention): the rank died in native code, and what its
        # threads ran then is Python's faulthandler dump, not a traceback (`trace.recording`'s `_fatal`)
        dump = "what each of its threads ran then (faulthandler)" if (first.exit_code or 0) < 0 else "its traceback"
        kind = blame.whose(first, fake_world)
        out.append(Finding(kind, "", [], sorted(e.rank for e in group), f"{error}{at}{raised}",
                           blame.cause(kind, first, len(group), f"{dump} is in {log}" if log.exists() else ""),
                           first.time, evidence="rank record"))
    return out


def _fake_world(run_dir: RunDir) -> bool:
    """The directory is a fake world's trace; False for a real one's and for any other directory (a run's,
    or a test's records alone)."""
    try:
        return run_dir.trace_spec().fake_world
    except UsageError:
        return False


def order(findings: list[Finding], blocked_ranks: list[int]) -> list[Finding]:
    """The findings, the likely root cause first (module docstring)."""
    by_time = sorted(findings, key=lambda f: (f.t, f.derived))  # stable: equal keys keep the order found in
    if blocked_ranks:
        return by_time
    return ([f for f in by_time if f.kind in blame.OWN_FAILURES]
            + [f for f in by_time if f.kind not in blame.OWN_FAILURES])
