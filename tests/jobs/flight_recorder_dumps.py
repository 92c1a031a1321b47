"""A small gloo job that leaves one Flight Recorder dump per rank: `--fault` plants one mistake.

Run under torch's elastic agent with ``TORCH_FR_BUFFER_SIZE`` set (as a script, or as a module whose ``main(argv)``
each rank runs: tests/test_fr_gloo.py launches it as ``meshscope run`` launches its ranks); each rank writes
``<--prefix><rank>`` (pickle, from ``_dump_fr_trace``) and, with ``--json``, ``<--prefix><rank>.json``.
A blocked collective ends by the process group's own timeout (``--timeout`` seconds), after which the
rank dumps what its recorder saw: the state a hung job leaves behind.

Faults: ``none``; ``skip`` (rank 1 skips the second world all_reduce); ``size`` (rank 1 passes 8
floats where the others pass 4, in the tp group: gloo aborts rank 0); ``shape`` (rank 1 passes
a [2, 2] tensor where the others pass [4]: gloo runs it, the recorder shows it); ``op`` (rank 1 broadcasts where the others
all-reduce).
"""

import argparse
import datetime
import sys

import torch
import torch.distributed as dist


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--fault", default="none", choices=("none", "skip", "size", "shape", "op"))
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    tp_ranks = [[r, r + 1] for r in range(0, world, 2)]
    dp_ranks = [list(range(i, world, 2)) for i in range(2)]
    groups = {}
    for desc, all_ranks in (("mesh_tp", tp_ranks), ("mesh_dp", dp_ranks)):
        for ranks in all_ranks:
            pg = dist.new_group(ranks, timeout=datetime.timedelta(seconds=args.timeout), group_desc=desc)
            if rank in ranks:
                groups[desc] = pg
    try:
        dist.all_reduce(torch.ones(4))
        dist.all_gather_into_tensor(torch.zeros(4 * world), torch.ones(4))
        dist.all_to_all_single(torch.zeros(2 * world), torch.ones(2 * world))
        if rank == 0:
            dist.send(torch.ones(3), 1)
        elif rank == 1:
            dist.recv(torch.zeros(3), 0)
        if not (args.fault == "skip" and rank == 1):
            dist.all_reduce(torch.ones(4))
        if args.fault == "op" and rank == 1:
            dist.broadcast(torch.ones(4), 0, group=groups["mesh_tp"])
        else:
            shape = {"size": (8,), "shape": (2, 2)}.get(args.fault, (4,)) if rank == 1 else (4,)
            dist.all_reduce(torch.ones(shape), group=groups["mesh_tp"])
        dist.all_reduce(torch.ones(2), group=groups["mesh_dp"])
        dist.barrier()
    except RuntimeError as exc:  # a blocked collective timed out: dump what the recorder holds
        print(f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
    finally:
        with open(f"{args.prefix}{rank}", "wb") as f:
            f.write(torch._C._distributed_c10d._dump_fr_trace())
        if args.json:
            with open(f"{args.prefix}{rank}.json", "wb") as f:
                f.write(torch._C._distributed_c10d._dump_fr_trace_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
