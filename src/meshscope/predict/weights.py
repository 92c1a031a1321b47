"""The dense weight tensors of a `ModelSpec` on one rank, in the order the model registers them.

The data-parallel sync (`data_parallel`) moves gradients, so it needs each tensor's local size
under tensor parallelism (Narayanan et al. 2021: column-parallel weights split their output rows,
row-parallel weights their input columns, everything else is replicated), its first dim (FSDP pads
dim 0 to a multiple of the group), its unit (FSDP wraps each transformer layer, and the root holds
the rest) and whether sequence parallelism leaves its gradient partial over tp (Korthikanti et al.
2022: a norm applied to a sequence shard sees only its shard's tokens, so its replicated weight's
gradient is all-reduced over tp).

Per layer, in registration order (torch's test Transformer, which Megatron's GPT layer follows):
the attention norm, Q K V (one fused tensor unless `separate_qkv`), O, the MLP norm, W1 (and its
bias), W2 (and its bias); MoE layers replace the MLP by the router (replicated over tp, expert
weights are synced over edp by `volume`). The root, when `vocab` > 0 or norms are modelled: the
token embedding (stage 0), the position table (stage 0), the final norm and the output layer (the
last stage; none when tied to the token embedding). Token and output tables are split by vocab rows
over tp (Megatron's VocabParallelEmbedding, torch's RowwiseParallel / ColwiseParallel on them);
the position table by its rows too, as torch's `Transformer.parallelize` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_spec import ModelSpec


@dataclass(frozen=True)
class Weight:
    """One parameter tensor on one rank."""

    name: str
    """What it is: attention QKV, mlp W1 bias, norm, token embedding..."""
    numel: int
    """Elements on this rank (after the tp split)."""
    dim0: int
    """Its first dim on this rank: FSDP shards (and pads) dim 0."""
    unit: int | None
    """The layer (0-based, within the stage) holding it, or None for the root's tensors."""
    partial_under_sp: bool = False
    """Replicated over tp but computed from a sequence shard: its gradient is all-reduced over tp
    under sequence parallelism."""


def layer_weights(spec: ModelSpec, tp: int, unit: int) -> list[Weight]:
    """The tensors of transformer layer `unit` on one rank of a tp group of `tp`."""
    h, f = spec.hidden, spec.ffn
    out: list[Weight] = []

    def norm():
        out.extend(Weight("norm", h, h, unit, True) for _ in range(spec.norm_params))

    if spec.heads:
        norm()
        qkv = [("attention Q", h), ("attention K", h), ("attention V", h)] if spec.separate_qkv else [
            ("attention QKV", 3 * h)]
        out += [Weight(name, rows // tp * h, rows // tp, unit) for name, rows in qkv]
        out.append(Weight("attention O", h * h // tp, h, unit))
    norm()
    if spec.experts:
        out.append(Weight("router", spec.experts * h, spec.experts, unit))
        return out
    out.append(Weight("mlp W1", f // tp * h, f // tp, unit))
    if spec.mlp_bias:
        out.append(Weight("mlp W1 bias", f // tp, f // tp, unit))
    out.append(Weight("mlp W2", h * f // tp, h, unit))
    if spec.mlp_bias:
        out.append(Weight("mlp W2 bias", h, h, unit))  # replicated; no tp all-reduce under SP (measured)
    return out


def embedding_weights(spec: ModelSpec, tp: int) -> list[Weight]:
    """The token and position tables (pipeline stage 0)."""
    h, v, p = spec.hidden, spec.vocab, spec.position_rows
    return ([Weight("token embedding", v // tp * h, v // tp, None)] if v else []) + (
        [Weight("position embedding", p // tp * h, p // tp, None)] if p else [])


def head_weights(spec: ModelSpec, tp: int) -> list[Weight]:
    """The final norm and the output layer (the last pipeline stage; no output tensor when tied)."""
    h, v = spec.hidden, spec.vocab
    norms = [Weight("final norm", h, h, None, True) for _ in range(spec.norm_params)]
    return norms + ([Weight("output layer", v // tp * h, v // tp, None)] if v and not spec.tied_embeddings else [])


def stage_weights(spec: ModelSpec, tp: int, stage: int, pp: int) -> list[Weight]:
    """Every dense tensor of one rank of pipeline `stage`, in registration order."""
    layers = [w for unit in range(spec.layers_per_stage(pp)[stage]) for w in layer_weights(spec, tp, unit)]
    return ((embedding_weights(spec, tp) if stage == 0 else []) + layers
            + (head_weights(spec, tp) if stage == pp - 1 else []))
