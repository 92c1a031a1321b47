"""Megatron-core job: parallel_state.initialize_model_parallel, then one all_reduce per group.

Exercises: the process groups megatron-core (0.16.1) builds with
``megatron.core.parallel_state.initialize_model_parallel`` (order
"tp-cp-ep-dp-pp"), each looked up through its parallel_state getter and used
for one ``dist.all_reduce`` per step inside a tiny training loop (a local
Linear + SGD, one ``optimizer.step()`` per iteration). This is an ordinary
user script: it never imports meshscope. Needs ``pip install
megatron-core==0.16.1`` (plus numpy, packaging); runs on gloo CPU with
``create_gloo_process_groups=False`` (the groups already use the default
backend, gloo on CPU, so the extra *_GLOO groups would only duplicate them).
``--gloo-groups`` keeps Megatron's default instead
(``create_gloo_process_groups=True``: its optimizer's ``new_group(backend="gloo")``
twins of the data-parallel groups) and uses the three twins too.

Launch (WORLD_SIZE divisible by tp*pp*cp and by etp*ep*pp)::

    torchrun --nproc-per-node 4 tests/jobs/megatron_groups.py
    torchrun --nproc-per-node 4 tests/jobs/megatron_groups.py --tp 1 --pp 2 --cp 2 --ep 2
    torchrun --nproc-per-node 2 tests/jobs/megatron_groups.py

Per step, per rank, in this fixed order, exactly one all_reduce (SUM) per
group; the k-th group's tensor is fp32 with k+1 elements (k from 0) so every
all_reduce can be matched by size:

  k  name      getter                                                  numel
  0  tp        get_tensor_model_parallel_group()                         1
  1  pp        get_pipeline_model_parallel_group()                       2
  2  dp        get_data_parallel_group()                                 3
  3  dp_cp     get_data_parallel_group(with_context_parallel=True)       4
  4  cp        get_context_parallel_group()                              5
  5  mp        get_model_parallel_group()            (tp x pp)           6
  6  tp_dp     get_tensor_and_data_parallel_group()                      7
  7  tp_dp_cp  get_tensor_and_data_parallel_group(with_context_parallel=True) 8
  8  tp_cp     get_tensor_and_context_parallel_group()                   9
  9  ep        get_expert_model_parallel_group()                        10
 10  etp       get_expert_tensor_parallel_group()                       11
 11  etp_ep    get_expert_tensor_and_model_parallel_group()             12
 12  etp_ep_pp get_expert_tensor_model_pipeline_parallel_group()        13
 13  edp       get_expert_data_parallel_group()                         14

=> **14 all_reduce per rank per step** (42 with --steps 3), plus nothing
else in the loop (the Linear is local; its grads are not reduced).

With ``--gloo-groups``, three more per step, after those 14, on the gloo twins
(the same members as dp, dp_cp and edp):

 14  dp_gloo    get_data_parallel_group_gloo()                          15
 15  dp_cp_gloo get_data_parallel_group_gloo(with_context_parallel=True) 16
 16  edp_gloo   get_expert_data_parallel_group_gloo()                   17

=> 17 all_reduce per rank per step; the twins' descriptions are
DATA_PARALLEL_GROUP_GLOO, DATA_PARALLEL_GROUP_WITH_CP_GLOO and
EXPERT_DATA_PARALLEL_GROUP_GLOO.

Independent facts: group membership (rank = tp + cp*TP + dp*TP*CP +
pp*TP*CP*DP for the dense groups; rank = etp + ep*ETP + edp*ETP*EP +
pp*ETP*EP*EDP for the expert groups; DP = W/(TP*PP*CP), EDP = W/(ETP*EP*PP)).

* Defaults (--tp 2 --pp 1 --cp 1 --ep 2 --etp 1) at world 4 (DP 2, EDP 2):
  tp {0,1} {2,3}; pp {0} {1} {2} {3}; dp {0,2} {1,3}; dp_cp {0,2} {1,3};
  cp {0} {1} {2} {3}; mp {0,1} {2,3}; tp_dp {0,1,2,3}; tp_dp_cp {0,1,2,3};
  tp_cp {0,1} {2,3}; ep {0,1} {2,3}; etp {0} {1} {2} {3};
  etp_ep {0,1} {2,3}; etp_ep_pp {0,1} {2,3}; edp {0,2} {1,3}.
  Sizes per rank: tp 2, pp 1, dp 2, dp_cp 2, cp 1, mp 2, tp_dp 4, tp_dp_cp 4,
  tp_cp 2, ep 2, etp 1, etp_ep 2, etp_ep_pp 2, edp 2.
* Defaults at world 2 (DP 1, EDP 1): tp, mp, tp_dp, tp_dp_cp, tp_cp, ep,
  etp_ep, etp_ep_pp = {0,1}; pp, dp, dp_cp, cp, etp, edp = singletons.
* --tp 1 --pp 2 --cp 2 --ep 2 at world 4 (DP 1, EDP 1): cp {0,1} {2,3};
  pp {0,2} {1,3}; dp singletons; dp_cp {0,1} {2,3}; mp {0,2} {1,3};
  ep {0,1} {2,3}; edp singletons; etp_ep_pp {0,1,2,3}.
Pass ``--print-groups`` to print each group's ranks (as seen by every rank).

Setup cost: initialize_model_parallel creates every group with
``dist.new_group`` (all ranks call it for every group, members build it);
it issues no collective of its own on this path (no SHARP, no hybrid CP).
Measured on torch 2.13 CPU/gloo, megatron-core 0.16.1, at world 2 and 4
with a TorchDispatchMode counter keyed on optimizer step hooks: each step =
14 ``c10d::allreduce_``, one per group, sizes 1..14.
"""

import argparse
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

with warnings.catch_warnings():
    # "Transformer Engine and Apex are not installed" on a plain install.
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state as ps


GROUPS = [
    ("tp", lambda: ps.get_tensor_model_parallel_group()),
    ("pp", lambda: ps.get_pipeline_model_parallel_group()),
    ("dp", lambda: ps.get_data_parallel_group()),
    ("dp_cp", lambda: ps.get_data_parallel_group(with_context_parallel=True)),
    ("cp", lambda: ps.get_context_parallel_group()),
    ("mp", lambda: ps.get_model_parallel_group()),
    ("tp_dp", lambda: ps.get_tensor_and_data_parallel_group()),
    ("tp_dp_cp", lambda: ps.get_tensor_and_data_parallel_group(with_context_parallel=True)),
    ("tp_cp", lambda: ps.get_tensor_and_context_parallel_group()),
    ("ep", lambda: ps.get_expert_model_parallel_group()),
    ("etp", lambda: ps.get_expert_tensor_parallel_group()),
    ("etp_ep", lambda: ps.get_expert_tensor_and_model_parallel_group()),
    ("etp_ep_pp", lambda: ps.get_expert_tensor_model_pipeline_parallel_group()),
    ("edp", lambda: ps.get_expert_data_parallel_group()),
]
GLOO_GROUPS = [
    ("dp_gloo", lambda: ps.get_data_parallel_group_gloo()),
    ("dp_cp_gloo", lambda: ps.get_data_parallel_group_gloo(with_context_parallel=True)),
    ("edp_gloo", lambda: ps.get_expert_data_parallel_group_gloo()),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--etp", type=int, default=1)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--print-groups", action="store_true")
    p.add_argument("--gloo-groups", action="store_true",
                   help="Megatron's default create_gloo_process_groups=True, and use the gloo twins")
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


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world % (args.tp * args.pp * args.cp) or world % (args.etp * args.ep * args.pp):
        sys.exit(
            "megatron_groups.py needs WORLD_SIZE divisible by tp*pp*cp and by "
            "etp*ep*pp (got WORLD_SIZE=%d, tp=%d pp=%d cp=%d ep=%d etp=%d)"
            % (world, args.tp, args.pp, args.cp, args.ep, args.etp)
        )
    device = setup()
    rank = dist.get_rank()

    ps.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        context_parallel_size=args.cp,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=args.etp,
        create_gloo_process_groups=args.gloo_groups,
    )
    groups = [(name, get()) for name, get in GROUPS + (GLOO_GROUPS if args.gloo_groups else [])]
    if args.print_groups:
        line = " ".join(
            "%s=%s" % (name, dist.get_process_group_ranks(g)) for name, g in groups
        )
        print("rank %d: %s" % (rank, line), flush=True)

    torch.manual_seed(0)
    model = nn.Linear(args.hidden, args.hidden).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1234 + rank)
    for _ in range(args.steps):
        x = torch.randn(4, args.hidden, generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        for k, (name, group) in enumerate(groups):
            t = torch.full((k + 1,), float(rank), device=device)
            dist.all_reduce(t, group=group)
        opt.step()

    # torch 2.13 + gloo: a gloo worker thread frees each finished work
    # (whose saved thread-local state holds a Python object) only once it
    # gets the GIL; if the interpreter is already finalizing by then, the
    # process aborts with "terminate called without an active exception"
    # (seen in ~1 of 3 runs at world 4 on a loaded 2-core box). Releasing
    # the GIL for a moment before teardown lets the workers finish.
    if dist.get_backend() == "gloo":
        time.sleep(0.5)
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
