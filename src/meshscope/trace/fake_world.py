"""`meshscope trace --fake-world N`: what every rank of an N-rank job issues, before booking a GPU.

Each chosen rank runs the script in a process of its own on the fake backend (`trace.fake`), a few
at a time (one per core). With ``--ranks auto`` rank 0 runs first; the groups it created (all of
them: creation is a global protocol) give the classes of ranks (`fake.rank_classes`), and one rank
per class is traced: the lowest. Cross-rank checks then run among the ranks traced, and the result
says which ranks stand for which.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..run import rundir
from .assemble import assemble, begin, conclude, created_groups
from .fake import environment, rank_classes


def _run_rank(options, run_dir: Path, rank: int, per_node: int) -> int:
    (run_dir / "logs").mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **environment(rank, options.world, per_node)}
    with open(run_dir / "logs" / f"rank{rank}.log", "w") as log:
        return subprocess.run([sys.executable, *options.rank_program(run_dir)], stdout=log, stderr=subprocess.STDOUT,
                              env=env).returncode


def trace_fake_world(options, echo=None) -> tuple[Path, dict]:
    echo = echo or (lambda line: sys.stderr.write(line))
    world = options.world
    per_node = options.nproc_per_node or min(8, world)
    run_dir = options.run_dir()
    rundir.check(run_dir)
    chosen = options.chosen_ranks()
    spec = {"kind": "trace", "world": world, "fake_world": True, "command": list(options.target),
            "nproc_per_node": per_node, "steps": options.steps, "ranks": options.ranks}
    begin(run_dir, {**spec, "traced": len(chosen) if chosen else 1})
    classes = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    codes: dict[int, int] = {}
    with ThreadPoolExecutor(max(1, cores)) as pool:  # one rank per usable core
        def run(ranks):
            codes.update(zip(ranks, pool.map(lambda r: _run_rank(options, run_dir, r, per_node), ranks)))

        if chosen is None:  # auto: rank 0 first, then one representative per class of its groups
            # The last rank, the last member of every group it is in, is a class of its own or its
            # class's representative (a traced member is preferred): traced beside rank 0 on a second core
            first = [0, world - 1] if cores > 1 and world > 1 else [0]
            echo(f"meshscope trace: fake world of {world}: tracing ranks {first} to find the classes of ranks\n")
            run(first)
            classes = rank_classes(world, created_groups(run_dir))
            chosen = sorted(_representative(members, codes) for members in classes.values())
        todo = [r for r in chosen if r not in codes]
        echo(f"meshscope trace: fake world of {world}: tracing ranks {chosen}\n")
        run(todo)
    spec["traced"] = len(chosen)
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=1))
    result = assemble(run_dir)
    doc = result.to_json()
    doc["fake_world"] = {"world": world, "traced": chosen,
                         "classes": [{"representative": _representative(m, codes), "ranks": _ranges(m), "size": len(m)}
                                     for m in sorted(classes.values(), key=min)] if classes else None,
                         "how": ("one rank per class of rank 0's group creations: ranks in the same place (first, "
                                 "middle or last member, group size) of every kind of group; a script that "
                                 "branches on its rank number can defeat this") if classes else "the ranks given"}
    doc["notes"].append("fake backend: collectives return their input, so what an all-to-all receives (and uneven "
                        "splits computed from it) is assumed, marked in each call's `assumed` field, and received "
                        "P2P data is absent")
    failed = {r: c for r, c in codes.items() if c}
    if failed:
        first = min(failed)
        tail = (run_dir / "logs" / f"rank{first}.log").read_text().splitlines()[-15:]
        doc["error"], doc["passed"] = f"rank {first} exited with code {failed[first]}", False
        echo("\n".join(tail) + "\n")
    conclude(run_dir, doc)
    return run_dir, doc


def _representative(members: list[int], traced) -> int:
    """A class's traced rank: one already traced if any, else its lowest."""
    return next((r for r in members if r in traced), min(members))


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)
