"""`meshscope trace --fake-world N`: what every rank of an N-rank job issues, before booking a GPU.

Each chosen rank runs the script in a process of its own on the fake backend (`trace.fake`), forked
from a server that imported torch once (`trace.fork_server`), one per usable core at a time; with
``--fake-tensors`` its tensors have no data (`trace.fake_tensors`). With ``--ranks auto`` rank 0 (and
beside it the last rank) runs first; the groups it created (all of
them: creation is a global protocol) give the classes of ranks (`fake.rank_classes`), and one rank
per class is traced: the lowest. Cross-rank checks then run among the ranks traced, and the result
says which ranks stand for which.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..run import rundir
from .assemble import assemble, begin, conclude, created_groups
from .fake import rank_classes
from .fork_server import ForkServer, ServerFailed


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
    asked: list[int] = []  # the first ranks handed to the server: each must end with a record
    server = ForkServer(run_dir, options.rank_arguments(run_dir), world, per_node, options.fake_tensors)
    failure = None
    try:  # one rank per usable core, each forked from a server that imported torch once
        if chosen is None:  # auto: rank 0 first, then one representative per class of its groups
            # The last rank, the last member of every group it is in, is a class of its own or its
            # class's representative (a traced member is preferred): traced beside rank 0 on a second core
            first = [0, world - 1] if cores > 1 and world > 1 else [0]
            echo(f"meshscope trace: fake world of {world}: tracing ranks {first} to find the classes of ranks\n")
            asked = first
            codes.update(server.run(first, cores))
            classes = rank_classes(world, created_groups(run_dir))
            chosen = sorted(_representative(members, codes) for members in classes.values())
        echo(f"meshscope trace: fake world of {world}: tracing ranks {chosen}\n")
        codes.update(server.run([r for r in chosen if r not in codes], cores))
    except ServerFailed as exc:
        failure = str(exc)
    except BaseException:  # Ctrl-C or a bug of meshscope's while ranks run: none is left running
        server.close(abort=True)
        raise
    server.close()
    chosen = chosen or asked  # the server failed before the classes were known
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
    if failure:
        doc["error"], doc["passed"] = failure, False
    elif failed:
        first = min(failed)
        log = run_dir / "logs" / f"rank{first}.log"
        said = next((r.error for r in result.ranks if r.rank == first and r.status != "missing"), "")  # its record
        doc["error"], doc["passed"] = f"rank {first}: {said or f'exited with code {failed[first]}'}", False
        if log.exists():
            echo("\n".join(log.read_text().splitlines()[-15:]) + "\n")
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
