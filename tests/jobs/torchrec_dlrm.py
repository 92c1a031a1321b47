"""TorchRec job: a small DLRM whose EmbeddingBagCollection ``DistributedModelParallel`` shards.

Written as TorchRec's own examples train (torchrec/examples/golden_training and the DLRM example):
TorchRec's ``DLRM``/``DLRMTrain`` over an ``EmbeddingBagCollection`` built on the meta device, the
tables' optimizer fused into their backward with ``apply_optimizer_in_backward`` (SGD), the model
wrapped in ``DistributedModelParallel`` (which wraps what it does not shard in DDP with TorchRec's
defaults), the dense parameters' Adam in a ``KeyedOptimizerWrapper`` and both in one
``CombinedOptimizer``; generated batches (``RandomRecDataset``, no download). The plan is written with
TorchRec's ``construct_module_sharding_plan``: ``--sharding table_wise`` puts table i on rank i % W,
``column_wise`` splits each table's 16 columns evenly over every rank, ``row_wise`` its 100 rows.
gloo and compute device ``cpu`` without CUDA (or with ``--cpu``), nccl and ``cuda:LOCAL_RANK``
with it. It never imports meshscope. Needs torchrec 1.8.0 and fbgemm-gpu-cpu 1.8.0 (or fbgemm-gpu).

Launch::

    torchrun --nproc-per-node 2 tests/jobs/torchrec_dlrm.py [--sharding table_wise|column_wise|row_wise] [--steps 6]

Independent facts (hand count; torchrec 1.8.0, torch 2.13; the defaults: W = 2 ranks, B = 8 samples
per rank, 3 tables t0..t2 of 100 x 16 fp32, one feature each, f0..f2, a sample looking up 1, 2 and 3
ids: 6 int64 ids per sample; 8 dense features). Paths below are torchrec/distributed/ unless named.

* What is sharded and what DDP gets. ``DistributedModelParallel`` wraps the whole ``DLRMTrain`` in
  torch's DDP (model_parallel.py:421, ``DefaultDataParallelWrapper._ddp_wrap``, :183-192) with the
  sharded tables' parameters ignored, ``broadcast_buffers=False``, ``bucket_cap_mb=25`` and
  ``static_graph=True`` (the wrapper's defaults, :147-151). DDP holds the dense arch (8 x 32 + 32, 32 x
  16 + 16) and the over arch (22 x 16 + 16, 16 x 1 + 1; 22 = D + F + F(F-1)/2, models/dlrm.py:563-565):
  8 parameters, 1,201 fp32, 4,804 B: one bucket (static_graph starts with one bucket whatever the cap,
  torch nn/parallel/distributed.py:153-154; the rebuilt ones hold 4,804 B < the 1 MiB first bucket).
* Forward, on the world, in the sharded collection's forward (``ShardedModule.forward``, types.py:1290:
  ``input_dist(...).wait().wait()``, then compute and output dist), per rank and step:
  1. the KJT splits all-to-all (dist_data.py:542, from ``KJTAllToAllSplitsAwaitable``, :952-958): per
     destination rank the lengths' count, the ids' count and the batch size, int64, 3W = 6 values, 48 B
     (collective validation off: ``TORCHREC_VALIDATE_COLLECTIVES`` unset, collective_utils.py:213-233);
  2. the lengths all-to-all and 3. the ids' all-to-all (dist_data.py:823, one per
     ``KeyedJaggedTensor.dist_tensors()``: lengths int32 and values int64, sparse/jagged_tensor.py:3193-3240),
     issued when ``ShardedModule.forward`` waits on the first awaitable;
  4. the pooled embeddings' all-to-all (``PooledEmbeddingsAllToAll``, dist_data.py:1415-1439 ->
     comm_ops.py ``All2All_Pooled_Req.forward``, :1469) for table- and column-wise; row-wise instead
     reduce-scatters the partial sums (``PooledEmbeddingsReduceScatter``, dist_data.py:1789-1823 ->
     comm_ops.py ``ReduceScatterBase_Req``, :2382).
  table_wise (tw_sharding.py:428-463; t0, t2 on rank 0, t1 on rank 1): lengths 3B int32 = 96 B, ids 6B
  int64 = 384 B (the features permuted to [f0, f2 | f1] first, embeddingbag.py:1822-1829, no
  collective); pooled (W B, D x tables on the rank) fp32: rank 0 16 x 32 = 2,048 B, rank 1 16 x 16 =
  1,024 B. column_wise (cw_sharding.py:270-317: ``TwSparseFeaturesDist`` over
  ``features_per_rank`` = [3, 3], every rank holding 8 columns of every table, so each feature goes
  to both): lengths 6B int32 = 192 B, ids 12B int64 = 768 B, pooled (16, 3 x 8) fp32 = 1,536 B.
  row_wise (sharding/rw_sharding.py:478-481 and 510: ids bucketized by row block,
  embedding_sharding.py:312, then sent to the rank holding the block): lengths W x 3B int32 = 192 B,
  ids 6B int64 = 384 B; the reduce-scatter's input (W B, 48) fp32 = 3,072 B.
* Backward, on the world: the pooled embeddings' gradient all-to-all (``All2All_Pooled_Wait.backward``,
  comm_ops.py:1633, (B, 3 x 16) fp32 = 1,536 B in, every sharding but row-wise), or row-wise's
  all-gather of it (``ReduceScatterBase_Wait.backward``, comm_ops.py:2450, 1,536 B in); and DDP's one
  bucket all-reduce (4,804 B). The tables' SGD runs inside fbgemm's backward kernel: no collective.
* ``optimizer.step()`` issues nothing. It is three nested ``CombinedOptimizer.step`` calls (the
  outer one, the model's ``fused_optimizer`` and the collection's) around ``Adam.step``; the SGD
  objects ``apply_optimizer_in_backward`` made never step (fbgemm's fused update replaces them).
* Set-up (step 0, phase other): ``init_collective_validation`` (model_parallel.py:323 ->
  collective_utils.py:235-251, ``broadcast_object_list``: an int64 size, then a 4-byte pickle), DDP's
  parameter check (1 all_gather of 8 B, 1 broadcast of the 8 parameters' 24 sizes and strides, 192 B)
  and its broadcast of the 4,804 B. No plan broadcast: the plan is given, not planned collectively.
* DDP's static graph (torch 2.13 nn/parallel/distributed.py, reducer.cpp): the first backward delays
  every bucket to its end and first all-reduces the used-parameter map (8 int32, 32 B; step 0,
  ``Reducer::delay_all_reduce`` via distributed.py:395-407); the second backward records the order the
  gradients came in; the third forward rebuilds the buckets (distributed.py:1769-1777): 2 int32
  broadcasts (the 8 indices and the bucket count, 36 B; the bucket size, 4 B), phase forward, in
  step 2. So a steady step (from step 3) is, per rank: forward 4 calls (3 all-to-alls and the pooled
  all-to-all or reduce-scatter), backward 2 (the pooled gradient's, DDP's bucket); step 1 issues the
  same, step 2 adds the rebuild.

Row-wise on the CPU path runs because the plan names it: TorchRec's sharder offers it for compute
device cuda only (embedding_types.py:553-564), so its planner never proposes it on a CPU. A fake world
equals the gloo trace call for call on the CPU path (``--cpu``). On the CUDA path TorchRec builds
fbgemm's CUDA table-batched kernels (compute device cuda), which take no CPU tensor.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, row_wise, table_wise
from torchrec.distributed.types import ShardingPlan
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

IDS_PER_FEATURE = [1, 2, 3]  # one table per feature, f0..f2; a sample looks up this many ids in each
EMBEDDING_DIM = 16
NUM_DENSE = 8


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sharding", choices=("table_wise", "column_wise", "row_wise"), default="table_wise")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    p.add_argument("--cpu", action="store_true", help="the CPU path (gloo, compute device cpu) even with CUDA")
    args = p.parse_args()

    if torch.cuda.is_available() and not args.cpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.sharding == "column_wise" and EMBEDDING_DIM % world:
        raise SystemExit(f"column_wise splits each table's {EMBEDDING_DIM} columns over the world: "
                         f"world size {world} does not divide them")

    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=EMBEDDING_DIM, num_embeddings=100,
                                 feature_names=[f"f{i}"]) for i in range(len(IDS_PER_FEATURE))]
    train_model = DLRMTrain(DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=NUM_DENSE, dense_arch_layer_sizes=[32, EMBEDDING_DIM],
        over_arch_layer_sizes=[16, 1], dense_device=device))
    # TorchRec's idiom: the embedding tables' optimizer runs fused into their backward (fbgemm).
    apply_optimizer_in_backward(torch.optim.SGD, train_model.model.sparse_arch.parameters(), {"lr": 0.1})

    # The plan written out with TorchRec's helpers, so each table's place is known (the planner's
    # placement follows its cost estimates; it also offers no row-wise on a CPU).
    shard = {"table_wise": lambda i: table_wise(rank=i % world),
             "column_wise": lambda i: column_wise(ranks=list(range(world))),
             "row_wise": lambda i: row_wise()}[args.sharding]
    ebc = train_model.model.sparse_arch.embedding_bag_collection
    tables_plan = construct_module_sharding_plan(
        ebc, {t.name: shard(i) for i, t in enumerate(tables)},
        local_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)), world_size=world, device_type=device.type)
    plan = ShardingPlan({"model.sparse_arch.embedding_bag_collection": tables_plan})
    model = DistributedModelParallel(module=train_model, device=device, plan=plan)

    dense_optimizer = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                            lambda params: torch.optim.Adam(params, lr=1e-3))
    optimizer = CombinedOptimizer([model.fused_optimizer, dense_optimizer])

    # min_ids_per_features = ids_per_features: every sample looks up the same number of ids, so every
    # step's KJT (and every byte count of the docstring) is the same size.
    dataset = RandomRecDataset(keys=[f"f{i}" for i in range(len(IDS_PER_FEATURE))], batch_size=args.batch,
                               hash_size=100, ids_per_features=IDS_PER_FEATURE,
                               min_ids_per_features=IDS_PER_FEATURE, num_dense=NUM_DENSE,
                               manual_seed=1234 + rank, num_batches=args.steps)
    model.train()
    for batch in dataset:
        batch = batch.to(device)
        optimizer.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"torchrec {args.sharding}: {args.steps} steps, loss {loss.item():.4f}")
    if backend == "gloo":
        time.sleep(0.5)  # tests/jobs/README.md, "Teardown on gloo"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
