"""A transformer-style model description, the input of the per-axis volume model (`volume`).

The chapter's toy models (one MLP, a two-Linear pipeline, a one-Linear expert) are enough to verify collectives
event by event; placing axes on a cluster needs the shapes of a real model. `ModelSpec` holds the few numbers
the communication volume depends on (chapter Q8: the TP activation payload follows tokens x hidden x dtype size,
not the parameter bytes): tokens per microbatch, hidden and FFN widths, layer count, experts.

A layer is an attention block (when heads > 0) followed by an MLP block, dense or MoE (every layer is
MoE when experts > 0, as in Mixtral). heads = 0 gives MLP-only layers: the chapter's TP MLP is one such
layer. Weights per layer: attention QKV [3h, h] and O [h, h] (no GQA), MLP W1 [ffn, h] and W2 [h, ffn],
MoE router [experts, h] and W1/W2 per expert. By default embeddings, norms and biases are not modelled;
`vocab`, `position_rows`, `norm_params`, `mlp_bias` and `separate_qkv` add them as torch's test Transformer
(`torch.testing._internal.distributed._tensor.common_dtensor`) has them, so that the model can be held against
a trace of real code (`place --compare-trace`); `data_parallel` picks how gradients are synced (`grad_sync`).

The layers are split over the pipeline stages evenly, or as `stage_layers` says: the chapter's unbalanced
stages (one stage holding more layers than another), whose heavier stage paces the pipeline (`place`).

Legend: b micro_batch, s seq_len, h hidden, f ffn, E experts, k topk.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..core.errors import UsageError
from ..core.events import DTYPE_BYTES
from ..core.sizes import check_int

DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}
"""Short dtype names accepted on the command line, besides the names of `events.DTYPE_BYTES`."""
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")
DP_FLAVOURS = ("per-tensor", "ddp", "fsdp")
"""How data parallelism syncs gradients (`grad_sync`): one all-reduce per tensor, DDP buckets, FSDP2 units."""


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a transformer-style model, per microbatch; validated against a layout by `check`."""

    layers: int = 32
    """Transformer layers, split over the pipeline stages evenly or as `stage_layers` says."""
    hidden: int = 4096
    """Model width h: every activation that crosses a TP, PP or EP boundary is [tokens, h]."""
    ffn: int = 16384
    """MLP (and expert) inner width f: W1 [f, h], W2 [h, f]."""
    seq_len: int = 2048
    """Tokens s per sequence."""
    micro_batch: int = 1
    """Sequences b per microbatch; a microbatch holds b * s tokens per data-parallel replica."""
    heads: int = 32
    """Attention heads (sharded over tp); 0 = MLP-only layers, like the chapter's TP MLP."""
    experts: int = 0
    """Experts per MoE layer E (sharded over ep); 0 = dense MLP layers."""
    topk: int = 2
    """Experts each token is routed to k (MoE only): dispatch sends k copies of each token."""
    dtype: str = "bfloat16"
    """Activation and gradient dtype (a name of `events.DTYPE_BYTES` or fp32/bf16/fp16)."""
    microbatches: int = 1
    """Microbatches M per training step per data-parallel replica (pipeline depth / grad accumulation)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (Korthikanti et al. 2022): AG + RS instead of each TP all-reduce."""
    stage_layers: tuple[int, ...] = ()
    """Layers of each pipeline stage, first stage first (one entry per pp stage, summing to `layers`);
    empty = an even split."""
    vocab: int = 0
    """Vocabulary V: a token embedding [V, h] on the first stage and an output layer [V, h] on the last, both
    split by rows over tp (Megatron's VocabParallelEmbedding; torch's Transformer.parallelize), the logits
    all-gathered; 0 = neither is modelled."""
    tied_embeddings: bool = False
    """The output layer reuses the token embedding's weight (one tensor to sync, on the first stage)."""
    position_rows: int = 0
    """Rows of a learned position table, split by rows over tp like the token table (torch's
    Transformer.parallelize: its [s, h] output is all-reduced, or reduce-scattered under SP); 0 = none."""
    norm_params: int = 0
    """Tensors per norm (LayerNorm 2: weight and bias; RMSNorm 1): two norms per layer (one without attention)
    and a final one;
    0 = norms not modelled. Under sequence parallelism each one's gradient is all-reduced over tp."""
    mlp_bias: bool = False
    """The MLP's W1 and W2 have biases (W1's split over tp, W2's replicated)."""
    separate_qkv: bool = False
    """Q, K and V as three weight tensors (torch's test Transformer) instead of one fused QKV (Megatron)."""
    data_parallel: str = "per-tensor"
    """Gradient sync over dp: per-tensor (one all-reduce per weight), ddp (bucketed all-reduces) or fsdp
    (FSDP2 / ZeRO-3: all-gathers of each unit's parameters and a reduce-scatter of its gradients)."""
    bucket_mb: float | None = None
    """DDP's bucket_cap_mb; None = DDP's default (the first bucket 1 MiB, then 25 MiB)."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn", "seq_len", "micro_batch", "microbatches"):
            check_int(_FLAGS.get(name, name), getattr(self, name), minimum=1)
        for name in ("heads", "experts", "topk", "vocab", "position_rows", "norm_params"):
            check_int(_FLAGS.get(name, name), getattr(self, name), minimum=0)
        object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        if self.stage_layers and (any(not isinstance(n, int) or n < 1 for n in self.stage_layers)
                                  or sum(self.stage_layers) != self.layers):
            raise UsageError(f"--stage-layers {_csv(self.stage_layers)} must be integers >= 1 summing to "
                             f"--layers {self.layers}")
        if self.data_parallel not in DP_FLAVOURS:
            raise UsageError(f"--data-parallel {self.data_parallel!r}: valid are {', '.join(DP_FLAVOURS)}")
        if self.bucket_mb is not None and not self.bucket_mb > 0:
            raise UsageError(f"--bucket-mb {self.bucket_mb} must be > 0 (DDP's bucket_cap_mb)")
        if self.tied_embeddings and not self.vocab:
            raise UsageError("--tied-embeddings needs --vocab (the table the output layer shares)")
        dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if dtype not in FLOAT_DTYPES:
            raise UsageError(f"--dtype {self.dtype!r} is not a float dtype; valid: "
                             f"{', '.join(FLOAT_DTYPES)} (or {', '.join(DTYPE_ALIASES)})")
        object.__setattr__(self, "dtype", dtype)
        if self.heads and self.hidden % self.heads:
            raise UsageError(f"--heads {self.heads} does not divide --hidden {self.hidden}")
        if self.experts and not 1 <= self.topk <= self.experts:
            raise UsageError(f"--topk {self.topk} must be between 1 and --experts {self.experts}")

    @property
    def elem(self) -> int:
        """Bytes per element of `dtype`."""
        return DTYPE_BYTES[self.dtype]

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch of one data-parallel replica: b * s."""
        return self.micro_batch * self.seq_len

    def layers_per_stage(self, pp: int) -> tuple[int, ...]:
        """Layers held by each of the `pp` stages (`check` has validated the split)."""
        return self.stage_layers or (self.layers // pp,) * pp

    def check(self, tp: int, cp: int, pp: int, ep: int, etp: int) -> None:
        """Raise `UsageError` when a parallel size cannot split this model as asked."""
        need = [("--ffn", self.ffn, "--tp", tp), ("--seq", self.seq_len, "--cp", cp), ("--vocab", self.vocab, "--tp", tp),
                ("--position-rows", self.position_rows, "--tp", tp)]
        if self.stage_layers and len(self.stage_layers) != pp:
            raise UsageError(f"--stage-layers {_csv(self.stage_layers)} lists {len(self.stage_layers)} stage(s); "
                             f"--pp {pp} needs one entry per stage")
        if not self.stage_layers:
            need.append(("--layers", self.layers, "--pp", pp))
        if self.heads:
            need.append(("--heads", self.heads, "--tp", tp))
        if self.experts:
            need += [("--experts", self.experts, "--ep", ep), ("--ffn", self.ffn, "--etp", etp)]
        if self.sequence_parallel or self.experts:
            need.append(("the sequence shard --seq / --cp =", self.seq_len // cp, "--tp", tp))
        for what, value, axis, size in need:
            if value % size:
                raise UsageError(f"{axis} {size} does not divide {what} {value}; pick a divisor")
        if (ep > 1 or etp > 1) and not self.experts:
            raise UsageError(f"--ep {ep} / --etp {etp} need an MoE model: give --experts, a multiple of --ep")
        # Megatron asserts the same: with TP, MoE tokens are routed from each rank's sequence shard.
        if self.experts and tp > 1 and not self.sequence_parallel:
            raise UsageError(f"MoE with --tp {tp} needs --sp (sequence parallel): each TP rank routes its "
                             f"own sequence shard of {self.tokens // tp} tokens")

    def to_json(self) -> dict:
        return asdict(self)


def parse_stage_layers(text: str) -> tuple[int, ...]:
    """The `--stage-layers` flag: comma-separated layer counts, e.g. "6,2"; empty = an even split."""
    try:
        return tuple(int(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise UsageError(f"--stage-layers {text!r} is not a comma-separated list of integers, e.g. 6,2") from None


def _csv(values) -> str:
    return ",".join(map(str, values))


_FLAGS = {"seq_len": "seq", "micro_batch": "micro-batch", "position_rows": "position-rows", "norm_params": "norm-params"}
"""Fields whose CLI option is spelled differently."""
