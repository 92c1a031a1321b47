"""Per-step, per-axis communication volume of a transformer-style model under a parallel layout.

The chapter's method of predicting a trace from the model's shapes (docs/chapter.md, Q27) applied to a whole
model instead of a toy: each layout change of an activation is a collective on one axis, its backward is the
dual, and the orthogonal DP sync comes last. The result is a list of `Traffic` records for a rank of one
pipeline stage for one training step (M microbatches), each a count of calls of one size on one axis; every rank
of a stage moves the same bytes. `step_traffic` is the BUSIEST stage's. Order does not enter here: volumes
depend on the axis sizes only; where the groups sit is `place`'s business.

Stages may hold different numbers of layers (`ModelSpec.stage_layers`, the chapter's unbalanced stages):
what is per layer (TP, CP, EP, ETP) and what is per weight (DP, expert DP) scales with the stage's
own layers; the PP messages do not (one activation per boundary and microbatch, whatever the stage).

Per layer and microbatch, with T = b * s / cp tokens on a rank and A = T * h * bytes:
  TP   (Narayanan et al. 2021, Megatron-LM): each TP block (attention, dense MLP) all-reduces its
       row-parallel output [b, s, h] forward and the column-parallel input gradient backward:
       2 all-reduces of A forward and 2 backward per transformer layer (4 backward with separate Q, K
       and V column-parallel layers: each reduces its input's gradient).
       With sequence parallelism (Korthikanti et al. 2022) each all-reduce becomes an all-gather
       (output A) and a reduce-scatter (input A); a ring moves (n-1)/n of each, the same link bytes
       as the ring all-reduce's 2(n-1)/n.
  CP   modelled as Megatron's ring attention: K and V blocks [b, s/cp, 2h/tp] travel cp-1 hops
       forward; backward sends K/V again and their gradients (2(cp-1) hops). Sends only: each hop's
       receive overlaps its send (batched isend/irecv), unlike the blocking pipeline P2P below.
  PP   per microbatch and stage boundary, the activation forward and its gradient backward
       (Narayanan et al. 2021: b*s*h per message); with sequence parallelism only the rank's
       sequence shard A / tp is sent. A middle stage talks to two boundaries, an end stage to one;
       each record names the stage at the other end (`peer_stage`), so `place` can tell which
       boundary crosses nodes.
  EP   per MoE layer: dispatch and combine all-to-alls forward, their reverses backward (the chapter's
       full MoE step); each carries the rank's T/tp tokens x k copies x h (balanced routing).
  ETP  around each expert: all-gather of the received tokens over etp and reduce-scatter of the
       outputs forward, the duals backward (the SP pattern inside the expert group).
  Embeddings and output layer (when `vocab` > 0; Megatron's vocab-parallel tables, torch's
       Transformer.parallelize): the first stage all-reduces the token lookup's partial sums A
       forward (and a learned position table's [s, h], split by rows as torch's test model does);
       under SP a reduce-scatter forward and an all-gather of the gradient backward. The last
       stage all-gathers the column-parallel logits [b, s, V] forward and all-reduces its input's
       gradient A backward; under SP it all-gathers its input A forward and reduce-scatters the
       gradient backward. Norms under SP: each norm tensor (replicated, applied to a sequence
       shard) has its gradient all-reduced over tp, h elements per call, every microbatch.
  DP   the dense weights of the stage (`weights`) synced over dp x cp once per step, as the
       spec's `data_parallel` says (`grad_sync`: one all-reduce per tensor, DDP's buckets, or
       FSDP2's all-gathers and reduce-scatters per unit); expert weights one all-reduce per
       tensor over edp. Phase optimizer: once per step, wherever the framework issues it.

Sizes follow nccl-tests (as `sweep.model_bytes`): all_gather output, reduce_scatter input, all_reduce
the buffer, all_to_all what the rank sends, send/recv the message. Logical bytes, never wire bytes:
`link_bytes` applies the ring factor of `sweep.BUS_FACTOR`.

Legend: b micro_batch, s seq_len, h hidden, f ffn, E experts, k topk, M microbatches, L layers of the stage.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..core.mesh import Layout
from .alpha_beta import BUS_FACTOR, MODEL_OF_OP
from .grad_sync import grad_sync
from .model_spec import ModelSpec
from .weights import stage_weights


@dataclass(frozen=True)
class Traffic:
    """`count` calls of one collective of `size` bytes each, on one axis, per step, on the busiest rank."""

    axis: str
    """Group name as in `mesh.Layout`: tp, cp, dp (dp-cp when cp > 1), pp, ep, etp, edp."""
    op: str
    """all_reduce, all_gather, reduce_scatter, all_to_all, send or recv."""
    phase: str
    """forward, backward or optimizer (once per step, after the last microbatch: the gradient sync)."""
    region: str
    """What moves: attention, mlp, kv, activation, dispatch, combine, expert, <weight name>."""
    count: int
    """Calls per training step."""
    size: int
    """Bytes per call in the nccl-tests convention (all_gather: output, reduce_scatter: input)."""
    peer_stage: int | None = None
    """pp only: the stage at the other end of each message (the boundary it crosses)."""

    @property
    def bytes(self) -> int:
        return self.count * self.size


def dp_axis(layout: Layout) -> str:
    """Name of the dense gradient-sync group: dp, or dp-cp when context parallelism shares it."""
    return "dp-cp" if layout.cp > 1 else "dp"


def step_traffic(spec: ModelSpec, layout: Layout) -> list[Traffic]:
    """Every collective of one training step on the busiest rank (the stage moving the most bytes)."""
    stages = [stage_traffic(spec, layout, s) for s in range(layout.pp)]
    return max(stages, key=lambda ts: sum(t.bytes for t in ts))


def stage_traffic(spec: ModelSpec, layout: Layout, stage: int) -> list[Traffic]:
    """Every collective of one training step on a rank of pipeline `stage`, derived from the spec's shapes."""
    spec.check(layout.tp, layout.cp, layout.pp, layout.ep, layout.etp)
    tp, cp, pp, ep, etp = layout.tp, layout.cp, layout.pp, layout.ep, layout.etp
    h, f, e, m = spec.hidden, spec.ffn, spec.elem, spec.microbatches
    layers = spec.layers_per_stage(pp)[stage]
    per_mb = layers * m  # layer passes per step on one rank
    tokens = spec.tokens // cp
    act = tokens * h * e  # A: one [b, s/cp, h] activation
    out: list[Traffic] = []

    def add(axis, op, phase, region, count, size, peer_stage=None):
        if count and layout.size(axis) > 1:
            out.append(Traffic(axis, op, phase, region, count, size, peer_stage))

    tp_blocks = (["attention"] if spec.heads else []) + ([] if spec.experts else ["mlp"])
    for block in tp_blocks:
        for phase in ("forward", "backward"):
            if spec.sequence_parallel:
                add("tp", "all_gather", phase, block, per_mb, act)
                add("tp", "reduce_scatter", phase, block, per_mb, act)
            else:
                # separate Q, K and V column-parallel layers each reduce their input's gradient
                inputs = 3 if block == "attention" and phase == "backward" and spec.separate_qkv else 1
                add("tp", "all_reduce", phase, block, per_mb * inputs, act)
    if spec.heads:
        kv = 2 * tokens * h // tp * e
        for phase, hops in (("forward", cp - 1), ("backward", 2 * (cp - 1))):
            add("cp", "send", phase, "kv", per_mb * hops, kv)  # each hop's recv overlaps it (isend/irecv)
    p2p = act // tp if spec.sequence_parallel else act
    # Towards the previous stage: receive activations forward, send their gradients backward; towards
    # the next stage the mirror image. End stages have one neighbour, middle stages two.
    if stage > 0:
        add("pp", "recv", "forward", "activation", m, p2p, stage - 1)
        add("pp", "send", "backward", "activation grad", m, p2p, stage - 1)
    if stage < pp - 1:
        add("pp", "send", "forward", "activation", m, p2p, stage + 1)
        add("pp", "recv", "backward", "activation grad", m, p2p, stage + 1)
    if spec.experts:
        routed = tokens // tp * spec.topk * h * e  # the rank's sequence shard, k copies per token
        for phase, regions in (("forward", ("dispatch", "combine")), ("backward", ("combine", "dispatch"))):
            for region in regions:
                add("ep", "all_to_all", phase, region, per_mb, routed)
            add("etp", "all_gather", phase, "expert", per_mb, routed * etp)
            add("etp", "reduce_scatter", phase, "expert", per_mb, routed * etp)
    first, last = stage == 0, stage == pp - 1
    if first:  # vocab- (and position-) parallel lookups: partial sums of the rank's rows
        tables = ([("token embedding", act)] if spec.vocab else []) + (
            [("position embedding", spec.seq_len // cp * h * e)] if spec.position_rows else [])  # [s, h] once
        for region, size in tables:
            if spec.sequence_parallel:
                add("tp", "reduce_scatter", "forward", region, m, size)
                add("tp", "all_gather", "backward", region, m, size)
            else:
                add("tp", "all_reduce", "forward", region, m, size)
    if last and spec.vocab:  # column-parallel output layer, logits gathered; its input's gradient reduced
        add("tp", "all_gather", "forward", "logits", m, tokens * spec.vocab * e)
        if spec.sequence_parallel:
            add("tp", "all_gather", "forward", "output layer", m, act)
            add("tp", "reduce_scatter", "backward", "output layer", m, act)
        else:
            add("tp", "all_reduce", "backward", "output layer", m, act)
    weights = stage_weights(spec, tp, stage, pp)
    if spec.sequence_parallel:
        for w in weights:
            if w.partial_under_sp:
                add("tp", "all_reduce", "backward", w.name, m, w.numel * e)
    for op, phase, region, count, size in grad_sync(spec, weights, layout.size(dp_axis(layout))):
        add(dp_axis(layout), op, phase, region, count, size)
    if spec.experts:
        add("edp", "all_reduce", "optimizer", "expert W1/W2", layers * 2 * spec.experts // ep, f * h // etp * e)
    return out


def table(traffic) -> dict[str, dict[str, tuple[int, int]]]:
    """{axis: {op: (calls, bytes)}} per step on the busiest rank."""
    out: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for t in traffic:
        cell = out[t.axis][t.op]
        cell[0] += t.count
        cell[1] += t.bytes
    return {axis: {op: tuple(v) for op, v in ops.items()} for axis, ops in out.items()}


def link_bytes(t: Traffic, n: int) -> float:
    """Bytes one rank's link carries for `t` on a group of `n`: ring all-reduce 2(n-1)/n of the
    buffer, all-gather / reduce-scatter / all-to-all (n-1)/n, point-to-point 1x."""
    return t.bytes * BUS_FACTOR[MODEL_OF_OP[t.op]](n)
