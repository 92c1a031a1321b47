"""A transformer-style model description, the input of the per-axis volume model (`volume`).

The chapter's toy models (one MLP, a two-Linear pipeline, a one-Linear expert) are enough to verify collectives
event by event; placing axes on a cluster needs the shapes of a real model. `ModelSpec` holds the few numbers
the communication volume depends on (chapter Q8: the TP activation payload follows tokens x hidden x dtype size,
not the parameter bytes): tokens per microbatch, hidden and FFN widths, layer count, experts.

A layer is an attention block (when heads > 0) followed by an MLP block, dense or MoE (every layer is
MoE when experts > 0, as in Mixtral). heads = 0 gives MLP-only layers: the chapter's TP MLP is one such
layer. Weights per layer: attention QKV [3h, h] and O [h, h] (no GQA), MLP W1 [ffn, h] and W2 [h, ffn],
MoE router [experts, h] and W1/W2 per expert. Embeddings, norms and biases are not modelled.

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

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn", "seq_len", "micro_batch", "microbatches"):
            check_int(_FLAGS.get(name, name), getattr(self, name), minimum=1)
        for name in ("heads", "experts", "topk"):
            check_int(name, getattr(self, name), minimum=0)
        object.__setattr__(self, "stage_layers", tuple(self.stage_layers))
        if self.stage_layers and (any(not isinstance(n, int) or n < 1 for n in self.stage_layers)
                                  or sum(self.stage_layers) != self.layers):
            raise UsageError(f"--stage-layers {_csv(self.stage_layers)} must be integers >= 1 summing to "
                             f"--layers {self.layers}")
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
        need = [("--ffn", self.ffn, "--tp", tp), ("--seq", self.seq_len, "--cp", cp)]
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


_FLAGS = {"seq_len": "seq", "micro_batch": "micro-batch"}
"""Fields whose CLI option is spelled differently."""
