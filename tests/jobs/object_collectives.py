"""Object collectives from rank 0: every rank must get rank 0's objects, whose pickles differ in size by rank.

Exercises torch's four object collectives (``broadcast_object_list``, ``scatter_object_list``,
``all_gather_object``, ``gather_object``), each made of two c10d calls: the pickles' sizes (int64),
then their bytes (uint8), sized from the first (torch 2.13 distributed_c10d.py). Rank r's object is
``{"rank": r, "pad": "x" * (10 * r)}``, so its pickle is 10 * r bytes longer than rank 0's. Rank 0
broadcasts ``["from 0", its object]``, scatters ``{"to": r, "pad": "y" * (5 * r)}`` to every r, all
ranks all-gather and gather (to rank 0) their objects; then the same broadcast on a gloo subgroup of
every rank (``new_group(backend="gloo")``, the kind Megatron-core makes for its objects). One SGD step
follows, so the calls are step 0. Each rank checks what it got and prints one line per collective::

    rank R broadcast ['from 0', {'rank': 0, 'pad': ''}]
    rank R scatter {'to': R, 'pad': 'yyy...'}
    rank R all_gather [{'rank': 0, ...}, {'rank': 1, ...}, ...]
    rank 0 gather [...]            (rank 0 only)
    rank R subgroup broadcast [...]

and exits 1 with a message if what it got from rank 0 is not rank 0's object.

Launch::

    torchrun --nproc-per-node 4 tests/jobs/object_collectives.py

Hand count per rank, world W (pickle sizes from ``len(pickle.dumps(x))`` of the objects above):

* broadcast_object_list: broadcast int64 [2] (16 B), then broadcast uint8 of the two pickles (root 0);
* scatter_object_list: broadcast int64 [1] (8 B, root 0), scatter uint8 of the largest pickle (rank W-1's,
  every rank receives that many bytes), scatter int64 [1] (8 B);
* all_gather_object: all_gather int64 [1] (8 B in, 8 W out), all_gather uint8 of the largest pickle (rank
  W-1's object) in, W times that out;
* gather_object: all_gather int64 [1], then gather uint8 of the largest pickle (root 0);
* the subgroup's broadcast_object_list: as the first, on the gloo group;
* then nothing else (the model is local).

=> 9 calls on the world group and 2 on the subgroup, per rank.
"""

import pickle
import sys
import time

import torch
import torch.distributed as dist


def obj(rank):
    return {"rank": rank, "pad": "x" * (10 * rank)}


def check(rank, what, got, want):
    print("rank %d %s %s" % (rank, what, got), flush=True)
    if got != want:
        sys.exit("rank %d: %s got %r, not rank 0's %r" % (rank, what, got, want))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        sys.exit("object_collectives.py needs at least 2 ranks")

    sent = ["from 0", obj(0)]
    got = list(sent) if rank == 0 else [None, obj(rank)]  # a non-source rank's list holds its own objects
    dist.broadcast_object_list(got, src=0)
    check(rank, "broadcast", got, sent)

    out = [None]
    scattered = [{"to": r, "pad": "y" * (5 * r)} for r in range(world)] if rank == 0 else None
    dist.scatter_object_list(out, scattered, src=0)
    check(rank, "scatter", out[0], {"to": rank, "pad": "y" * (5 * rank)})

    gathered = [None] * world
    dist.all_gather_object(gathered, obj(rank))
    check(rank, "all_gather", gathered[0], obj(0))  # slot 0 is rank 0's; the others are the others'
    print("rank %d all_gather %s" % (rank, gathered), flush=True)

    at_root = [None] * world if rank == 0 else None
    dist.gather_object(obj(rank), at_root, dst=0)
    if rank == 0:
        check(rank, "gather", at_root[0], obj(0))

    everyone = dist.new_group(list(range(world)), backend="gloo", group_desc="objects_gloo")
    got = list(sent) if rank == 0 else [None, None]
    dist.broadcast_object_list(got, src=0, group=everyone)
    check(rank, "subgroup broadcast", got, sent)

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()

    assert len(pickle.dumps(obj(world - 1))) > len(pickle.dumps(obj(0)))
    time.sleep(0.5)  # gloo teardown (tests/jobs/README.md)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
