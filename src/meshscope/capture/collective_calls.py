"""What each collective entry point's arguments mean: op, group, dtype, logical bytes, splits, peer.

`capture` swaps the Python entry points of c10d and of the functional collectives for recorders; this module
turns one call's arguments into the `Call` the recorder stores, one decoder per entry point: ``C10D`` maps
c10d function names to decoders of their bound arguments, ``FUNCTIONAL`` maps ``torch.ops._c10d_functional``
op names to decoders of their positional arguments. Bytes are the logical input and output bytes on this
rank (chapter Q27, step 4: keep input and output bytes apart); splits are in rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ..core.groups import describe


@dataclass(slots=True)
class Call:
    """A collective call reduced to what a CommEvent needs."""

    op: str
    group: object
    dtype: str
    bytes_in: int
    bytes_out: int
    input_splits: tuple[int, ...] | None = None
    output_splits: tuple[int, ...] | None = None
    peer: int | None = None


_DTYPE_NAMES: dict = {}


def _dtype(t) -> str:
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        name = _DTYPE_NAMES[t.dtype] = str(t.dtype).removeprefix("torch.")
    return name


def _group_size(group) -> int:
    return len(describe(group)[1])


def _even_splits(rows: int, group) -> tuple[int, ...]:
    n = _group_size(group)
    return (rows // n,) * n


def _global_peer(group, peer, group_peer):
    if peer is not None:
        return peer
    if group_peer is not None:
        return dist.get_global_rank(group if group is not None else dist.group.WORLD, group_peer)
    return None


# -- c10d entry points: bound arguments -> calls --------------------------------------------------
def _c10d_all_reduce(a):
    t = a["tensor"]
    return [Call("all_reduce", a["group"], _dtype(t), t.nbytes, t.nbytes)]


def _c10d_all_gather(a):
    t = a["tensor"]
    return [Call("all_gather", a["group"], _dtype(t), t.nbytes, sum(x.nbytes for x in a["tensor_list"]))]


def _c10d_all_gather_into_tensor(a):
    i, o = a["input_tensor"], a["output_tensor"]
    return [Call("all_gather", a["group"], _dtype(i), i.nbytes, o.nbytes)]


def _c10d_reduce_scatter(a):
    o = a["output"]
    return [Call("reduce_scatter", a["group"], _dtype(o), sum(x.nbytes for x in a["input_list"]), o.nbytes)]


def _c10d_reduce_scatter_tensor(a):
    i, o = a["input"], a["output"]
    return [Call("reduce_scatter", a["group"], _dtype(i), i.nbytes, o.nbytes)]


def _c10d_all_to_all(a):
    ins, outs = a["input_tensor_list"], a["output_tensor_list"]
    return [Call("all_to_all", a["group"], _dtype(ins[0]), sum(x.nbytes for x in ins), sum(x.nbytes for x in outs),
                  tuple(t.shape[0] for t in ins), tuple(t.shape[0] for t in outs))]


def _c10d_all_to_all_single(a):
    i, o, g = a["input"], a["output"], a["group"]
    ins = tuple(a["input_split_sizes"]) if a["input_split_sizes"] else _even_splits(i.shape[0], g)
    outs = tuple(a["output_split_sizes"]) if a["output_split_sizes"] else _even_splits(o.shape[0], g)
    return [Call("all_to_all", g, _dtype(i), i.nbytes, o.nbytes, ins, outs)]


def _c10d_broadcast(a):
    t = a["tensor"]
    return [Call("broadcast", a["group"], _dtype(t), t.nbytes, t.nbytes)]


def _c10d_barrier(a):
    return [Call("barrier", a["group"], "", 0, 0)]


def _c10d_send(a):
    t = a["tensor"]
    return [Call("send", a["group"], _dtype(t), t.nbytes, 0, peer=_global_peer(a["group"], a["dst"], a.get("group_dst")))]


def _c10d_recv(a):
    t = a["tensor"]
    return [Call("recv", a["group"], _dtype(t), 0, t.nbytes, peer=_global_peer(a["group"], a["src"], a.get("group_src")))]


def _c10d_batch_isend_irecv(a):
    calls = []
    for p2p in a["p2p_op_list"]:
        name = getattr(p2p.op, "__name__", "")
        peer = _global_peer(p2p.group, getattr(p2p, "peer", None), getattr(p2p, "group_peer", None))
        t = p2p.tensor
        if "send" in name:
            calls.append(Call("send", p2p.group, _dtype(t), t.nbytes, 0, peer=peer))
        else:
            calls.append(Call("recv", p2p.group, _dtype(t), 0, t.nbytes, peer=peer))
    return calls


C10D = {
    "all_reduce": _c10d_all_reduce,
    "all_gather": _c10d_all_gather,
    "all_gather_into_tensor": _c10d_all_gather_into_tensor,
    "all_gather_single": _c10d_all_gather_into_tensor,  # torch >= 2.13 name
    "reduce_scatter": _c10d_reduce_scatter,
    "reduce_scatter_tensor": _c10d_reduce_scatter_tensor,
    "reduce_scatter_single": _c10d_reduce_scatter_tensor,  # torch >= 2.13 name
    "all_to_all": _c10d_all_to_all,
    "all_to_all_single": _c10d_all_to_all_single,
    "broadcast": _c10d_broadcast,
    "barrier": _c10d_barrier,
    "send": _c10d_send,
    "isend": _c10d_send,
    "recv": _c10d_recv,
    "irecv": _c10d_recv,
    "batch_isend_irecv": _c10d_batch_isend_irecv,
}


# -- functional collectives: torch.ops._c10d_functional(_autograd).<op>(positional args) ----------
def _f_all_reduce(x, op, group_name):
    return Call("all_reduce", group_name, _dtype(x), x.nbytes, x.nbytes)


def _f_all_gather(x, group_size, group_name):
    return Call("all_gather", group_name, _dtype(x), x.nbytes, x.nbytes * group_size)


def _f_reduce_scatter(x, op, group_size, group_name):
    return Call("reduce_scatter", group_name, _dtype(x), x.nbytes, x.nbytes // group_size)


def _f_all_to_all_single(x, output_split_sizes, input_split_sizes, group_name):
    row = x.nbytes // max(x.shape[0], 1)
    ins = tuple(int(s) for s in input_split_sizes) if input_split_sizes else _even_splits(x.shape[0], group_name)
    outs = tuple(int(s) for s in output_split_sizes) if output_split_sizes else _even_splits(x.shape[0], group_name)
    return Call("all_to_all", group_name, _dtype(x), x.nbytes, row * sum(outs), ins, outs)


def _f_broadcast(x, src, group_name):
    return Call("broadcast", group_name, _dtype(x), x.nbytes, x.nbytes)


FUNCTIONAL = {
    "all_reduce": _f_all_reduce,
    "all_reduce_": _f_all_reduce,
    "all_gather_into_tensor": _f_all_gather,
    "reduce_scatter_tensor": _f_reduce_scatter,
    "all_to_all_single": _f_all_to_all_single,
    "broadcast": _f_broadcast,
    "broadcast_": _f_broadcast,
}
AUTOGRAD = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")


def dual(call: Call) -> Call:
    """The backward collective of an autograd collective (chapter Q10, Q11, Q21: AG<->RS, A2A<->A2A with
    splits swapped)."""
    op = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}.get(call.op, call.op)
    return Call(op, call.group, call.dtype, call.bytes_out, call.bytes_in, call.output_splits, call.input_splits)
