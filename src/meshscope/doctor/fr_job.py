"""Every rank's Flight Recorder dump of one job, checked to belong together.

Dumps of one job share a format version and a backend, and on NCCL every rank's ``pg_config`` gives
the same default group (the world) with the rank in it; anything else means files of different jobs
were mixed (the default prefix ``/tmp/nccl_trace_rank_`` is shared by every job on a host), and the
doctor refuses rather than diagnose a fault that is only the mix.

Group members: from ``pg_config`` where the recorder wrote it (NCCL). gloo writes none (measured on
torch 2.13: one entry keyed ``''`` with ranks ``'[]'``), so there the default group is every dumped
rank and another group is the ranks whose entries name it: a member that never issued a call on a
group cannot be seen from gloo dumps alone.

Alignment: a full ring buffer drops its oldest entries, at a different point on each rank; a group's
collectives are compared from the newest first ``collective_seq_id`` its members still hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import UsageError
from .fr_files import decode, locate
from .fr_records import FrDump, check_version, parse


@dataclass(frozen=True)
class FrJob:
    """The dumps of one job, by rank."""

    source: str
    """The directory or prefix they were read from."""
    dumps: dict[int, FrDump]

    @property
    def version(self) -> str:
        return next(iter(self.dumps.values())).version

    @property
    def backend(self) -> str:
        return next((d.backend for d in self.dumps.values() if d.backend), "")


def _world(doc: dict) -> list[int] | None:
    default = (doc.get("pg_config") or {}).get("0")
    return sorted(int(r) for r in str(default["ranks"]).strip("[]").split(",") if r.strip()) if default else None


def _check_one_job(docs: dict[int, dict], files: dict[int, Path]) -> None:
    for what, value in (("format version", lambda d: str(d.get("version"))),
                        ("backend", lambda d: {e["profiling_name"].split(":")[0] for e in d.get("entries") or ()}),
                        ("world (pg_config's default group)", _world)):
        seen = {r: value(d) for r, d in docs.items()}
        if what == "backend":
            seen = {r: v.pop() for r, v in seen.items() if len(v) == 1} | {r: "mixed" for r, v in seen.items() if len(v) > 1}
        kinds = {repr(v) for v in seen.values() if v is not None}
        if len(kinds) > 1:
            detail = "; ".join(f"rank {r} ({files[r].name}): {v}" for r, v in sorted(seen.items()))
            raise UsageError(f"dumps of different jobs are mixed: their {what} differs ({detail}); "
                             f"give the prefix or directory of one job's dumps")
    for r, d in docs.items():
        world = _world(d)
        if world and r not in world:
            raise UsageError(f"dumps of different jobs are mixed: {files[r].name} is rank {r}, outside the job's "
                             f"world {world}; give the prefix or directory of one job's dumps")


def _members(docs: dict[int, dict]) -> dict[str, tuple[int, ...]]:
    """Group name -> the dumped ranks whose entries name it (the default group: every dumped rank)."""
    out: dict[str, set[int]] = {"0": set(docs)}
    for r, d in docs.items():
        for e in d.get("entries") or ():
            out.setdefault(str(e["process_group"][0]), set()).add(r)
    return {name: tuple(sorted(ranks)) for name, ranks in out.items()}


def _since(docs: dict[int, dict]) -> dict[str, int]:
    """Group name -> the newest first collective_seq_id that every rank holding the group still has."""
    first: dict[str, int] = {}
    for d in docs.values():
        mine: dict[str, int] = {}
        for e in d.get("entries") or ():
            if not e.get("is_p2p"):
                name = str(e["process_group"][0])
                mine[name] = min(mine.get(name, e["collective_seq_id"]), e["collective_seq_id"])
        for name, seq in mine.items():
            first[name] = max(first.get(name, seq), seq)
    return first


def load_job(path: Path, known: dict[str, tuple[str, tuple[int, ...]]] | None = None) -> FrJob | None:
    """The job whose dumps `path` names (module docstring); None if `path` holds none. `known`: group
    name -> (axis, ranks) as a trace labelled them (its DeviceMesh dim names, and the members gloo's
    dumps leave out), so a finding on a group carries the same axis from either source."""
    files = locate(path)
    if files is None:
        return None
    docs = {r: decode(p) for r, p in sorted(files.items())}
    for r, d in docs.items():
        check_version(d, str(files[r]))
    _check_one_job(docs, files)
    known = known or {}
    members, since = {**_members(docs), **{name: ranks for name, (_, ranks) in known.items()}}, _since(docs)
    for d in docs.values():
        d["entries"] = [e for e in d.get("entries") or ()
                        if e.get("is_p2p") or e["collective_seq_id"] >= since.get(str(e["process_group"][0]), 0)]
    axes = {name: axis for name, (axis, _) in known.items()}
    return FrJob(str(path), {r: parse(r, d, str(files[r]), members, axes) for r, d in docs.items()})
