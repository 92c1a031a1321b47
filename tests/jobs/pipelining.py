"""Pipeline-parallel job: torch.distributed.pipelining, one stage per rank.

Exercises: ``torch.distributed.pipelining.PipelineStage`` built with static
shapes (``input_args=`` / ``output_args=`` example microbatches, so the stages
exchange no shape metadata) driven by ``ScheduleGPipe`` or ``Schedule1F1B``
(``--schedule gpipe|1f1b``), with ``--microbatches`` microbatches, a
``loss_fn`` on the last stage and one optimizer per stage (per rank).
This is an ordinary user script: it never imports meshscope.

Launch (world >= 2; tested at 2 and 4; one stage per rank)::

    torchrun --nproc-per-node 2 tests/jobs/pipelining.py
    torchrun --nproc-per-node 4 tests/jobs/pipelining.py --schedule 1f1b --microbatches 4

Model: stage s = Linear(H, H) -> ReLU -> Linear(H, H) (H = --hidden = 32);
global batch --batch 8 split into M = --microbatches 4 microbatches of 2;
every activation / gradient message is one fp32 [2, 32] tensor (256 B).
The loss is MSE on the last stage. All P2P is in the default (world) group.

Independent facts (S = WORLD_SIZE stages, M = --microbatches), per step:

* Stage 0 (rank 0):        sends M activations to rank 1, receives M
  gradients from rank 1: **send M, recv M** (4 / 4).
* Last stage (rank S-1):   receives M activations from S-2, sends M
  gradients to S-2: **recv M, send M** (4 / 4).
* Middle stage (0<r<S-1):  recv M activations + send M activations +
  recv M gradients + send M gradients: **send 2M, recv 2M** (8 / 8).
* Pipeline total per step: (S-1)*M activation sends + (S-1)*M gradient
  sends = 2*M*(S-1) sends (8 at world 2, 24 at world 4), each matched by a recv.
* No collectives at all (no all-reduce etc.) and no shape-inference P2P,
  because every stage is given ``input_args`` and ``output_args``.
* First step only, extra: torch 2.13's P2P warm-up vote (one int32[1]
  tensor per hop) goes stage 0 -> 1 -> ... -> S-1 and back S-1 -> ... -> 0:
  rank 0 send 1 + recv 1, last rank recv 1 + send 1, middle ranks
  send 2 + recv 2.
* The schedule only changes the order, not the counts. GPipe: all M
  forwards (F0..F3), then all M backwards (B0..B3). 1F1B on stage s:
  min(S - s, M) warm-up forwards, then alternating 1 backward / 1 forward,
  then the remaining backwards: at world 2, stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3
  and stage 1 runs F0 B0 F1 B1 F2 B2 F3 B3.
  Observed P2P order per step at world 2 (s = send, r = recv, peer in brackets):
  - gpipe, rank 0: s[1] s[1] s[1] s[1] r[1] r[1] r[1] r[1]
  - gpipe, rank 1: r[0] r[0] r[0] r[0] s[0] s[0] s[0] s[0]
  - 1f1b,  rank 0: s[1] s[1] r[1] s[1] r[1] s[1] r[1] r[1]
  - 1f1b,  rank 1: r[0] s[0] r[0] s[0] r[0] s[0] r[0] s[0]
* On gloo each P2POp of a ``batch_isend_irecv`` runs as its own
  ``c10d::send`` / ``c10d::recv_``; on NCCL the same ops are coalesced per
  batch, but the per-tensor counts above are unchanged.
* One ``optimizer.step()`` (SGD) per step per rank, on that rank's stage only.
* ``--slow-rank R --slow-in forward|data|backward --slow-ms MS`` plants a
  delay on rank R once per step (`delays.py`; forward and backward in its
  stage's ``fc1``): the calls are unchanged.

Measured on torch 2.13 CPU/gloo at world 2 and 4 (both schedules) with a
TorchDispatchMode counter keyed on optimizer step hooks: ops ``c10d::send``
and ``c10d::recv_``; step 1 = the counts above plus the vote, steps 2.. =
exactly the counts above (world 4: ranks 0 and 3 send 4 / recv 4, ranks 1
and 2 send 8 / recv 8).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import delays

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--infer-shapes", action="store_true",
                   help="give only the first stage's input_args: the stages exchange the other shapes over P2P")
    delays.add_arguments(p, module="fc1")
    return p.parse_args()


def setup():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return device


class StageBlock(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2 or args.batch % args.microbatches:
        sys.exit(
            "pipelining.py needs WORLD_SIZE >= 2 (one stage per rank) and "
            "--batch divisible by --microbatches (got WORLD_SIZE=%d, batch=%d, "
            "microbatches=%d)" % (world, args.batch, args.microbatches)
        )
    device = setup()
    rank = dist.get_rank()
    num_stages = world

    # Build the whole model from one seed, keep only this rank's stage.
    torch.manual_seed(0)
    blocks = [StageBlock(args.hidden) for _ in range(num_stages)]
    stage_mod = blocks[rank].to(device)
    del blocks
    delay = delays.Delay(args, rank)
    delay.attach(stage_mod)

    mb = args.batch // args.microbatches
    # Static metadata. torch 2.13 also reads requires_grad from the examples:
    # an output example without requires_grad means "no gradient comes back"
    # and the stage's backward then fails ("grad can be implicitly created only
    # for scalar outputs"), so mark what carries gradients.
    example_in = torch.empty(mb, args.hidden, device=device, requires_grad=rank > 0)
    example_out = torch.empty(mb, args.hidden, device=device, requires_grad=True)
    shapes = {"input_args": (example_in,), "output_args": (example_out,)}
    if args.infer_shapes:  # torch needs the first stage's inputs; the rest is exchanged over P2P
        shapes = {"input_args": (example_in,)} if rank == 0 else {}
    stage = PipelineStage(
        stage_mod,
        stage_index=rank,
        num_stages=num_stages,
        device=device,
        **shapes,
    )

    def loss_fn(output, target):
        return nn.functional.mse_loss(output, target)

    schedule = SCHEDULES[args.schedule](
        stage, n_microbatches=args.microbatches, loss_fn=loss_fn
    )
    opt = torch.optim.SGD(stage_mod.parameters(), lr=args.lr)

    gen = torch.Generator().manual_seed(1234)
    for _ in range(args.steps):
        delay.next_step()
        delay.data()
        # Every rank draws the same batch so rank 0 and the last rank agree.
        x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        y = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x)
        elif rank == num_stages - 1:
            losses = []
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()

    # torch 2.13 + gloo: a gloo worker thread frees each finished work
    # (whose saved thread-local state holds a Python object) only once it
    # gets the GIL; if the interpreter is already finalizing by then, the
    # process aborts with "terminate called without an active exception"
    # (seen in ~1 of 3 runs at world 4 on a loaded 2-core box). Releasing
    # the GIL for a moment before teardown lets the workers finish.
    if dist.get_backend() == "gloo":
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
