"""What each c10d function a fake world replays sends and receives (`replay`): one handler per function,
``handler(call, issue, given)``, that records what this rank sends (``call.send``), issues the function
(``issue()``: the fake backend returns at once) and writes into each part of its output what the member it
comes from sent (``call.put``, ``call.reduce_into``), reading torch 2.13's signatures
(distributed_c10d.py). Where the rank itself is the source of a part (a scatter's source, an all-to-all's
own chunk, an all-gather's own slot), it gets its own input, as a real backend gives it, whatever the fake one
wrote. Each part a member not known sends is handed with this rank's own part in its place (``own``), which
stands in for it (`replay.Call.put`: else zeros)."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ...capture.work import inside_the_job


def reduce(op, parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The members' `parts` reduced by `op` as a backend reduces them (None: an op not replayed)."""
    R = dist.ReduceOp
    stack = torch.stack([p.reshape(-1) for p in parts])
    dtype = parts[0].dtype
    if op == R.SUM:
        out = stack.sum(0)
    elif op == R.AVG:
        out = stack.sum(0) / len(parts) if dtype.is_floating_point else stack.sum(0) // len(parts)
    elif op == R.PRODUCT:
        out = stack.prod(0)
    elif op == R.MIN:
        out = stack.amin(0)
    elif op == R.MAX:
        out = stack.amax(0)
    elif op in (R.BAND, R.BOR, R.BXOR):
        bitwise = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}
        out = functools.reduce(next(f for o, f in bitwise.items() if op == o), list(stack))
    else:  # PREMUL_SUM: a factor of its own
        return None
    return out.to(dtype)


def _split(t: torch.Tensor, splits, n: int):
    """`t`'s views along dim 0 by `splits` (even when none), or None where they do not make n parts."""
    try:
        parts = torch.split(t, list(splits)) if splits else (torch.split(t, t.shape[0] // n) if t.dim() else ())
    except RuntimeError:  # splits that do not add up, or fewer rows than members: torch's own call says so
        return None
    return parts if len(parts) == n else None


def _flat(t: torch.Tensor):
    return t.view(-1) if t.is_contiguous() else None


# -- one handler per c10d function: (call, issue the function, its arguments by name) -> its result ----------

def _broadcast(call, issue, given):
    tensor, root = given["tensor"], call.root(given, "src")
    if call.me == root:
        call.send([tensor])
        return issue()
    out = issue()
    call.put(tensor, root, own=tensor)  # the fake backend leaves it: its own tensor stands in
    return out


def _all_reduce(call, issue, given):
    tensor = given["tensor"]
    if not call.small([tensor]):  # nothing to reduce: keep no copy of a gradient bucket
        call.send(None)
        return issue()
    own = tensor.detach().clone()
    call.send([tensor])
    out = issue()
    if call.op == "all_reduce" or call.me == call.root(given, "dst"):
        call.reduce_into(tensor, own, given.get("op", dist.ReduceOp.SUM))
    return out


def _all_gather(call, issue, given):
    tensor, slots = given["tensor"], given["tensor_list"]
    call.send([tensor])
    out = issue()
    for j, slot in enumerate(slots):
        if j != call.me:
            call.put(slot, j, own=tensor)
        elif slot.shape == tensor.shape:  # what a backend writes: not left to the fake one
            with torch.no_grad():
                slot.copy_(tensor)
    return out


def _all_gather_single(call, issue, given):
    inp, output = given["input_tensor"], given["output_tensor"]
    call.send([inp])
    out = issue()
    flat, k = _flat(output), inp.numel()
    if flat is not None and flat.numel() == k * call.n:
        if not (call.small([inp]) or call.counts(inp)):
            # every member's part is this one's size, above the cap, so none was recorded, and none can size a
            # call: each stands in as this rank's own (`Call.put`), written at once rather than part by part
            # (1,023 parts at world 1,024, half a rank's time under --real-tensors)
            with torch.no_grad():
                flat.view(call.n, k).copy_(inp.reshape(1, k).expand(call.n, k))
            return out
        for j in range(call.n):
            if j != call.me:
                call.put(flat[j * k:(j + 1) * k], j, own=inp)
            else:  # what a backend writes: not left to the fake one
                with torch.no_grad():
                    flat[j * k:(j + 1) * k].copy_(inp.reshape(-1))
    return out


def _gather(call, issue, given):
    tensor = given["tensor"]
    call.send([tensor])
    out = issue()
    if call.me == call.root(given, "dst"):
        for j, slot in enumerate(given.get("gather_list") or ()):
            if j != call.me:
                call.put(slot, j, own=tensor)
            elif slot.shape == tensor.shape:
                with torch.no_grad():
                    slot.copy_(tensor)
    return out


def _scatter(call, issue, given):
    tensor, root = given["tensor"], call.root(given, "src")
    if call.me == root:
        parts = list(given.get("scatter_list") or ())
        call.send(parts)
        out = issue()
        if len(parts) == call.n:  # the fake backend hands the source nothing either
            with torch.no_grad():
                tensor.copy_(parts[root])
        return out
    out = issue()
    call.put(tensor, root, lambda data: data[call.me])
    return out


def _reduce_scatter(call, issue, given):
    output, inputs = given["output"], list(given["input_list"])
    if len(inputs) != call.n or not call.small(inputs):
        call.send(None)
        return issue()
    own = inputs[call.me].detach().clone()
    call.send(inputs)
    out = issue()
    call.reduce_into(output, own, given.get("op", dist.ReduceOp.SUM), lambda data: data[call.me])
    return out


def _reduce_scatter_single(call, issue, given):
    output, inp = given["output"], given["input"]
    k = output.numel()
    flat = _flat(inp)
    if flat is None or flat.numel() != k * call.n or not call.small([inp]):
        call.send(None)
        return issue()
    call.send([inp])
    own = flat[call.me * k:(call.me + 1) * k].clone()
    out = issue()
    call.reduce_into(output, own, given.get("op", dist.ReduceOp.SUM),
                     lambda data: data[0].reshape(-1)[call.me * k:(call.me + 1) * k])
    return out


def _all_to_all_single(call, issue, given):
    output, inp = given["output"], given["input"]
    chunks = _split(inp, given.get("input_split_sizes"), call.n)
    if chunks is None:
        call.send(None)
        return issue()
    call.send(list(chunks))
    own = chunks[call.me].clone()
    out = issue()
    parts = _split(output, given.get("output_split_sizes"), call.n)
    if parts is not None:
        for j, part in enumerate(parts):
            if j != call.me:
                call.put(part, j, lambda data: data[call.me], own)
            elif part.shape == own.shape:
                with torch.no_grad():
                    part.copy_(own)
    return out


def _all_to_all(call, issue, given):
    outputs, inputs = given["output_tensor_list"], list(given["input_tensor_list"])
    call.send(inputs)
    own = inputs[call.me].clone() if len(inputs) == call.n else None
    out = _issue_as_one(given, outputs, inputs) if _as_one(outputs, inputs) else issue()
    for j, part in enumerate(outputs):
        if j != call.me:
            call.put(part, j, lambda data: data[call.me], own)
        elif own is not None and part.shape == own.shape:
            with torch.no_grad():
                part.copy_(own)
    return out


def _as_one(outputs, inputs) -> bool:
    """Whether a list-form all-to-all is issued as one tensor with splits (`_issue_as_one`): its part for some
    peer differs in size from the part it receives from that peer, and one tensor holds each list's parts."""
    if len(outputs) != len(inputs) or all(o.shape == i.shape for o, i in zip(outputs, inputs)):
        return False
    parts = (*outputs, *inputs)
    return all(t.dim() for t in parts) and len({t.shape[1:] for t in parts}) == 1 and len({t.dtype for t in parts}) == 1


def _issue_as_one(given, outputs, inputs):
    """The list-form all-to-all as the same exchange in one tensor with splits. torch 2.13's fake backend copies
    input j into output j (FakeProcessGroup.hpp ``alltoall``), which raised where they differ ("output with shape
    [1] doesn't match the broadcast shape [2]": counts exchanged, then the parts they sized), a call NCCL takes
    (ProcessGroupNCCL's ``alltoall``: a send and a receive per peer; gloo's refuses parts of different sizes). The
    ledger reads the same op, dtype, bytes and rows per member from either form; the caller then writes each part
    with what its sender sent."""
    sizes = [o.shape[0] for o in outputs]
    received = torch.empty((sum(sizes), *outputs[0].shape[1:]), dtype=outputs[0].dtype)
    work = dist.all_to_all_single(received, torch.cat(inputs), sizes, [i.shape[0] for i in inputs],
                                  group=given.get("group"), async_op=given.get("async_op", False))
    # the copies read what the call wrote, so the job's counter sees the rank need the call here, as it saw the
    # job read the parts it would have written itself (`replay.Replay.run` runs this handler outside the job)
    with torch.no_grad(), inside_the_job():
        for part, got in zip(outputs, torch.split(received, sizes)):
            part.copy_(got)
    return work


def _send(call, issue, given):
    dst = dist.get_global_rank(call.group, call.root(given, "dst"))
    call.p2p(dist.get_rank(), dst).send([given["tensor"]])
    return issue()


def _recv(call, issue, given):
    if given.get("src") is None and given.get("group_src") is None:  # any source: no pair to name
        return issue()
    src = call.root(given, "src")
    call.p2p(dist.get_global_rank(call.group, src), dist.get_rank())
    out = issue()
    call.put(given["tensor"], src)
    return out


HANDLERS = {
    "broadcast": ("broadcast", _broadcast), "all_reduce": ("all_reduce", _all_reduce), "reduce": ("reduce", _all_reduce),
    "all_gather": ("all_gather", _all_gather), "all_gather_single": ("all_gather", _all_gather_single),
    "all_gather_into_tensor": ("all_gather", _all_gather_single), "gather": ("gather", _gather),
    "scatter": ("scatter", _scatter), "reduce_scatter": ("reduce_scatter", _reduce_scatter),
    "reduce_scatter_single": ("reduce_scatter", _reduce_scatter_single),
    "reduce_scatter_tensor": ("reduce_scatter", _reduce_scatter_single),
    "all_to_all_single": ("all_to_all", _all_to_all_single), "all_to_all": ("all_to_all", _all_to_all),
    "send": ("send", _send), "isend": ("send", _send), "recv": ("recv", _recv), "irecv": ("recv", _recv),
}
"""c10d function -> (its op in the ledger, its handler). torch 2.13's ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` call ``all_gather_single`` and ``reduce_scatter_single`` (which torch 2.11 lacks),
``send`` and ``recv`` call ``isend`` and ``irecv``: the outermost call is handled, the inner ones pass."""

TARGETS = tuple(n for n in HANDLERS if n not in ("all_gather_single", "reduce_scatter_single"))
"""The names every torch read (2.11, 2.13) has: a fake world's table lists them (`patches`)."""
