"""DeepSpeed ZeRO job: ``deepspeed.initialize`` of a small MLP with ZeRO stage 1, 2 or 3, as its
tutorials write a training loop (``engine(x)``, ``engine.backward(loss)``, ``engine.step()``).

Exercises: DeepSpeed's own communication (its ``deepspeed.comm`` over torch.distributed, groups made
with plain ``new_group``), its ZeRO optimizers (no ``torch.optim`` optimizer: they wrap one), ZeRO-3's
parameter gathers and its module-trace check. This is an ordinary user script: it never imports
meshscope. Generated data, no download; on CPU DeepSpeed picks its CPU accelerator and gloo.

Launch (world 2)::

    torchrun --nproc-per-node 2 tests/jobs/deepspeed_zero.py --stage 2 [--overlap-comm] [--steps 4]
    torchrun --nproc-per-node 2 tests/jobs/deepspeed_zero.py --stage 3 [--persistence-threshold 0]

Independent facts (hand count, deepspeed 0.19.8, fp32, world W = 2): the model is Linear(16, 32),
ReLU, Linear(32, 8): 16 x 32 + 32 + 32 x 8 + 8 = 808 parameters, 3,232 B.

* ZeRO-1 and ZeRO-2 (``runtime/zero/stage_1_and_2.py``), per step on the world: the gradients'
  average over the data-parallel group in one bucket (``reduce_gradients``: 1 all_reduce of the 808
  fp32 gradients, 3,232 B, as DeepSpeed's CPU accelerator reduces a bucket), the overflow check's
  all_reduce of one flag (``check_overflow``: 4 B, inside ``engine.step()``), and after the inner
  torch optimizer's step the all-gather of the updated partitions (``all_gather_dp_groups``: 808 / W
  = 404 parameters per rank, 1,616 B in), also inside ``engine.step()``. Set-up broadcasts each of the
  4 parameters from rank 0 (``_broadcast_model``).
* ZeRO-3 (``runtime/zero/stage3.py``, ``partition_parameters.py``, ``partitioned_param_coordinator.py``),
  per steady step on the world: the gradients' reduce_scatter (3,232 B in, inside
  ``engine.backward``), the overflow check's all_reduce (8 B, in ``engine.step()``), and after the inner
  optimizer's step one all_gather per parameter of its updated partition (808 / W per rank, split by
  parameter: 256 + 16 + 128 + 4 elements, 1,024 + 64 + 512 + 16 B). With
  ``stage3_param_persistence_threshold`` at its default (1e5 elements) every parameter here is
  persistent: gathered in the first forward (one all_gather per Linear, its weight and bias
  coalesced: 272 and 132 elements, 1,088 and 528 B) and again in the first backward, then kept whole;
  the first forward also checks the (still empty) trace's length against rank 0's (two broadcasts, 8
  and 0 B). Once the first step recorded the module trace, the second checks it against rank 0's
  (``assert_ints_same_as_other_ranks``, ``runtime/zero/utils.py``: a broadcast of the list's length,
  8 B, then of the list from rank 0) three times (``partitioned_param_coordinator.py:260-267``): six
  broadcasts in step 1, in forward. At ``--persistence-threshold 0`` no parameter is persistent: from
  step 1 on each forward gathers all of them in one coalesced all_gather (404 elements per rank, 1,616
  B in) and nothing is gathered after the step.
"""

import argparse
import os

import torch
import torch.nn as nn

import deepspeed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--overlap-comm", action="store_true")
    p.add_argument("--persistence-threshold", type=int, default=None,
                   help="ZeRO-3's stage3_param_persistence_threshold (default: DeepSpeed's)")
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    zero = {"stage": args.stage, "overlap_comm": args.overlap_comm}
    if args.persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = args.persistence_threshold
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": zero,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    gen = torch.Generator().manual_seed(1234 + engine.global_rank)
    for _ in range(args.steps):
        x = torch.randn(4, 16, generator=gen).to(engine.device)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"deepspeed {deepspeed.__version__} ZeRO-{args.stage}: {args.steps} steps")


if __name__ == "__main__":
    main()
