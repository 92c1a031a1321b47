"""``torch.distributed._shard`` placements on CUDA in a fake world whose CUDA is the CPU (`devices`).

A shard's placement names its rank and device (``ShardMetadata(placement="rank:0/cuda:0")``: TorchRec's
sharded embedding tables). The placement stays as written: TorchRec picks its kernels by
``placement.device().type``. Only where torch checks a shard's tensor against its placement, its tensor
being on the CPU, does the placement's CUDA device read as the CPU (`SHARD_CHECKS`).
"""

from __future__ import annotations

import functools

from ..entry_points import rebind
from .devices import is_cuda, mark


SHARD_CHECKS = ("torch.distributed._shard.sharded_tensor.shard.Shard.__post_init__",
                "torch.distributed._shard.sharded_tensor.utils.build_metadata_from_local_shards",
                "torch.distributed._shard.sharded_tensor.api.ShardedTensor._init_from_local_shards_and_global_metadata")
"""Where torch 2.13 compares a shard's tensor's device with its placement's (shard.py:35,
utils.py:159, api.py:1047: "Local shard tensor device does not match with local Shard's placement")."""


@functools.cache
def cpu_shard_placements() -> None:
    """Inside torch's checks of a shard against its placement (`SHARD_CHECKS`), a placement's CUDA device
    (``_remote_device.device()`` of ``rank:R/cuda:L``) reads as the CPU, where its tensor is; everywhere
    else it stays what was written, as the script's ``torch.device`` objects do: TorchRec 1.8.0 groups its
    tables and picks their kernels by ``placement.device().type`` (distributed/embeddingbag.py:154,
    quant_embedding_kernel.py:161), and a ShardedTensor's ``.cuda()`` / ``.cpu()`` read it. torch
    allocates a shard on its placement's device (``ShardedTensor.__init__``), which the mode maps."""
    import threading

    import torch
    from torch.distributed import remote_device
    from torch.distributed._shard.sharded_tensor import api, shard, utils

    cpu, checking = torch.device("cpu"), threading.local()
    placed = remote_device._remote_device.device

    def device(placement) -> torch.device:
        answer = placed(placement)
        if getattr(checking, "depth", 0) and is_cuda(answer):
            mark("_shard placement 'rank:R/cuda:L'")
            return cpu
        return answer

    def checked(check):
        @functools.wraps(check)
        def run(*args, **kwargs):
            checking.depth = getattr(checking, "depth", 0) + 1
            try:
                return check(*args, **kwargs)
            finally:
                checking.depth -= 1
        return run

    remote_device._remote_device.device = device
    shard.Shard.__post_init__ = checked(shard.Shard.__post_init__)  # the dataclass's __init__ looks it up
    rebind(utils.build_metadata_from_local_shards, checked(utils.build_metadata_from_local_shards))
    init = vars(api.ShardedTensor)["_init_from_local_shards_and_global_metadata"]  # a classmethod
    api.ShardedTensor._init_from_local_shards_and_global_metadata = classmethod(checked(init.__func__))
