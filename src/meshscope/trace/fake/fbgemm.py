"""fbgemm's table-batched embeddings built for the CPU where a script asks for CUDA's, in a fake world that maps CUDA.

TorchRec computes its sharded tables' lookups in fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` (a TBE), one
``(rows, dims, location, compute device)`` spec per table: ``EmbeddingLocation.DEVICE`` (or a UVM location for the
``fused_uvm`` kernels) and ``ComputeDevice.CUDA`` where its device is cuda, ``HOST`` and ``CPU`` where it is the CPU
(torchrec 1.8.0 distributed/batched_embedding_kernel.py:3740-3753, ``BatchedFusedEmbeddingBag``; :2541-2554 for the
sequence tables). A CUDA TBE keeps its tables in ``weights_dev`` and hands its lookup op the GPU's weight layout,
whose host wrapper refuses a CPU tensor ("weights[0] must be a GPU or MTIA tensor", fbgemm 1.8.0
codegen/training/pt2/embedding_split_host_pt2_autograd_template.cpp; the invoker picks the layout by
``host_weights.numel() > 0``, split_embedding_codegen_lookup_invokers/lookup_sgd.py:37). fbgemm-gpu-cpu has no
CUDA kernel, but it has the CPU TBE, which TorchRec builds itself on the CPU path.

So where torch has no CUDA, a TBE whose specs name ``ComputeDevice.CUDA`` is built as TorchRec builds it for the
CPU: every table ``HOST`` on ``ComputeDevice.CPU``, the rest of its arguments as given. Its ``device`` stays the
CUDA one TorchRec passed (the local rank's where none was), so its tensors are made through the devices mode and
stand for the GPU's (`cuda_tensors`), and so do its lookups' outputs, which TorchRec's output dist sends.

The collectives are not the TBE's: it issues none (its optimizer update runs inside its backward kernel). TorchRec
issues them around it, sized by the plan, the features and the pooled output, ``(batch, sum of the local dims)``
on either device: the KJT all-to-alls of the input dist and the output dist's all-to-all or reduce-scatter
(dist_data.py, comm_ops.py), on the CUDA branches it takes by the script's device. DDP, around the rest of the
model, does not see the TBE: what it finds of the sharded collection is its tables' weights, which TorchRec has it
ignore (model_parallel.py:206-222; its one bucket holds the dense layers' 4,804 B on either path). What TorchRec
reads back from the TBE is the same on both: ``split_embedding_weights()`` and the specs, by location
(batched_embedding_kernel.py:1676-1694, the tables' parameters and fused optimizer). Not covered: the 2D
``FULLY_SHARDED`` strategy of ``DMPCollection`` (``ShardedBatchedFusedEmbedding(Bag)``, :2697-2701 and :4474-4478)
reduce-scatters and all-gathers ``weights_dev`` itself, which the CPU's TBE leaves empty: those calls would read 0 B.

What the CPU's TBE cannot do is refused in one line (`devices.Unmapped`) before fbgemm asserts: an optimizer it
has no kernel for (fbgemm 1.8.0 split_table_batched_embeddings_ops_training.py:1047-1054: exact SGD, exact
(row-wise) Adagrad, EMA-in-place row-wise Adagrad; Adam and the rest are CUDA's), ``OptimType.NONE``, and a
quantized pooled output (:832-837). fbgemm's inference TBE (``IntNBitTableBatchedEmbeddingBagsCodegen``,
TorchRec's quantized tables) and its SSD tables are not mapped.

fbgemm is imported by the script (through TorchRec), and importing it costs 0.5 s: the row (`patch`) waits for
the import (`capture.after_import`, as `capture.steppers` does), or patches at once
where it was imported already (a fork server that learned it).
"""

from __future__ import annotations

import functools
import sys

from ...capture.after_import import AfterImport
from ..entry_points import arguments
from .devices import mark, unmapped

MODULE = "fbgemm_gpu.split_table_batched_embeddings_ops_training"
TBE = f"{MODULE}.SplitTableBatchedEmbeddingBagsCodegen"
CPU_OPTIMIZERS = ("EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD", "EMAINPLACE_ROWWISE_ADAGRAD")
"""The optimizers fbgemm 1.8.0's CPU TBE has kernels for (split_table_batched_embeddings_ops_training.py:1047-1054)."""
CUDA_OPTIMIZERS = (*CPU_OPTIMIZERS, "ADAM", "LAMB", "LARS_SGD", "PARTIAL_ROWWISE_ADAM", "PARTIAL_ROWWISE_LAMB",
                   "ENSEMBLE_ROWWISE_ADAGRAD", "NONE")
"""Its CUDA TBE's (:1056-1069); any other (the deprecated SGD and ROWWISE_ADAGRAD) fbgemm refuses on either."""
CPU_OUTPUTS = ("FP32", "FP16", "BF16")
"""The pooled output types of fbgemm 1.8.0's CPU TBE (:832-837)."""


@functools.cache
def patch() -> None:
    """The TBE built for the CPU once fbgemm's training module is imported, or now where it is."""
    if MODULE in sys.modules:
        cpu_tables(sys.modules[MODULE])
    else:
        sys.meta_path.insert(0, AfterImport(MODULE.__eq__, cpu_tables))


def cpu_tables(module) -> None:
    """``SplitTableBatchedEmbeddingBagsCodegen.__init__`` builds a CUDA TBE as the CPU's."""
    import torch

    cls = module.SplitTableBatchedEmbeddingBagsCodegen
    original = cls.__init__
    if getattr(original, "__meshscope_cpu_tables__", False):
        return
    location, compute = module.EmbeddingLocation, module.ComputeDevice
    bind = arguments(original)

    @functools.wraps(original)
    def init(tbe, *args, **kwargs):
        given = bind((tbe, *args), kwargs)
        specs = list(given["embedding_specs"])
        if not any(spec[3] == compute.CUDA for spec in specs):
            return original(tbe, *args, **kwargs)
        _cpu_can(given)
        mark("fbgemm's CUDA embedding tables")
        given["embedding_specs"] = [(rows, dims, location.HOST, compute.CPU) for rows, dims, *_ in specs]
        if given.get("device") is None:  # fbgemm's own default for CUDA: the current device
            given["device"] = torch.device("cuda", torch.cuda.current_device())
        return original(**given)

    init.__meshscope_cpu_tables__ = True
    cls.__init__ = init


def _cpu_can(given: dict) -> None:
    """Raise `devices.Unmapped` for what the CPU's TBE has no kernel for."""
    optimizer, output = given.get("optimizer"), given.get("output_dtype")
    if optimizer is not None and optimizer.name in CUDA_OPTIMIZERS and optimizer.name not in CPU_OPTIMIZERS:
        raise unmapped(f"fbgemm's table-batched embedding with optimizer {optimizer.name} (its CPU kernels: "
                       f"{', '.join(CPU_OPTIMIZERS)})")
    if output is not None and output.name not in CPU_OUTPUTS:
        raise unmapped(f"fbgemm's table-batched embedding with a {output.name} pooled output (its CPU kernels: "
                       f"{', '.join(CPU_OUTPUTS)})")
