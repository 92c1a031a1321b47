"""One pipeline stage and its boundaries: where plain P2P cuts the autograd graph, and how it is rejoined.

Chapter Q14 (the pipeline's communication boundary): ``dist.send``/``dist.recv`` move bytes, not graphs. So

  forward : the upstream stage sends ``h.detach()``; the downstream stage makes the received tensor a
            NEW LEAF with ``requires_grad_(True)`` and builds its own local graph on it;
  backward: after its local backward the downstream stage sends ``h.grad`` (the leaf's gradient)
            upstream, and the upstream stage calls ``h.backward(grad)`` on the output it stashed,
            which continues its own graph down to its weight.

Nothing here relies on autograd crossing processes: the explicit gradient message IS the edge. The
stash holds (input leaf, output) per microbatch from its forward to its backward; its size over a step
is the activation memory a schedule costs (GPipe: M, 1F1B: min(M, pp - stage)).

Legend: b = microbatch rows, I = this stage's input width, O = its output width.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...capture.recorder import phase, region
from ...core.groups import AxisGroup
from .schedules import Exchange, Message


def stage_forward(x_bI: torch.Tensor, w_OI: torch.Tensor, last: bool) -> torch.Tensor:
    """The chain's layer s: Linear (+ GELU except on the last stage, whose output feeds the loss)."""
    y_bO = F.linear(x_bI, w_OI)
    return y_bO if last else F.gelu(y_bO)


class StageBoundary:
    """This stage's P2P with its neighbours over the pipeline group (global ranks from the mesh)."""

    def __init__(self, group: AxisGroup, stage: int, widths: list[int], rows: int, device,
                 expect_extra_rows: int = 0, send_first_with: int | None = None, drop_gradients: bool = False):
        self.group, self.stage, self.widths, self.rows, self.device = group, stage, widths, rows, device
        self.pp = len(widths) - 1
        self.expect_extra_rows = expect_extra_rows
        """Fault knob: rows this stage wrongly expects on top of the activations it receives."""
        self.send_first_with = send_first_with
        """Fault knob: the neighbour stage with which this stage completes each blocking send before
        posting its receives. Done on both ends of a boundary, an exchange with messages in both
        directions deadlocks (the chapter's "PP hang": send/recv order mismatch)."""
        self.drop_gradients = drop_gradients
        """Fault knob: this stage never sends activation gradients upstream (chapter Q14, Q15: no gradient in
        PP backward)."""

    def shape(self, msg: Message) -> tuple[int, int]:
        """[b, width of the boundary]: an activation and its gradient have the same shape."""
        extra = self.expect_extra_rows if msg.receiver == self.stage and msg.kind == "activation" else 0
        return self.rows + extra, self.widths[msg.boundary + 1]

    def check_shapes(self, microbatches: int) -> None:
        """Agree on every message shape with both neighbours once, before training.

        A blocking recv whose buffer differs from the message is not a clean error: gloo silently
        accepts a shorter message into a larger buffer and aborts the process (SIGABRT, no Python
        exception) on a longer one; NCCL hangs. So each stage sends the [M, rows, width] it will send
        and the receiver compares it with what it expects, failing with both shapes in the message.
        """
        works, got = [], None
        if self.stage + 1 < self.pp:
            mine = Message("activation", 0, self.stage)
            desc = torch.tensor([microbatches, *self.shape(mine)], dtype=torch.int64, device=self.device)
            works.append(dist.isend(desc, self.group.ranks[self.stage + 1], group=self.group.pg))
        if self.stage > 0:
            got = torch.empty(3, dtype=torch.int64, device=self.device)
            works.append(dist.irecv(got, self.group.ranks[self.stage - 1], group=self.group.pg))
        for w in works:
            w.wait()
        if got is not None:
            want = [microbatches, *self.shape(Message("activation", 0, self.stage - 1))]
            if got.tolist() != want:
                m, r, c = got.tolist()
                raise RuntimeError(
                    f"P2P shape mismatch: rank {self.group.ranks[self.stage]} (stage {self.stage}) expects "
                    f"{want[0]} activations of [{want[1]}, {want[2]}] from rank {self.group.ranks[self.stage - 1]} "
                    f"(stage {self.stage - 1}), which sends {m} of [{r}, {c}]")

    def exchange(self, ex: Exchange, outbox: dict[Message, torch.Tensor]) -> dict[Message, torch.Tensor]:
        """Post every message of `ex` (activation first), then wait for all; return what arrived.

        Under the `send_first_with` fault the sends go first and each is a blocking ``send``: it
        returns only once the peer has posted the matching receive, so the flight log shows it
        issued and never completed when the peer does the same."""
        peer = self.group.ranks[ex.peer_stage]
        send_first = ex.peer_stage == self.send_first_with
        messages = sorted(ex.messages, key=lambda m: m.sender != self.stage) if send_first else ex.messages
        works, inbox = [], {}
        for msg in messages:
            with phase(msg.phase), region(msg.region, msg.microbatch):
                if msg.sender == self.stage:
                    tensor = outbox.pop(msg)
                    if self.drop_gradients and msg.kind == "gradient":
                        continue
                    if send_first:
                        dist.send(tensor, peer, group=self.group.pg)
                    else:
                        works.append(dist.isend(tensor, peer, group=self.group.pg))
                else:
                    inbox[msg] = torch.empty(self.shape(msg), device=self.device)
                    works.append(dist.irecv(inbox[msg], peer, group=self.group.pg))
        for w in works:
            w.wait()
        return inbox


def chain_stage(w_OI: torch.Tensor, target_mbO, last: bool, microbatches: int):
    """forward(i, x) of the chapter's chain for `run_program`: Linear (+ GELU), and on the last stage the
    MSE loss of microbatch i divided by M, so the accumulated gradient is that of the batch mean."""

    def forward(i: int, x_bI: torch.Tensor):
        y_bO = stage_forward(x_bI, w_OI, last)
        return y_bO, (F.mse_loss(y_bO, target_mbO[i]) / microbatches if last else y_bO)

    return forward


def run_program(prog, boundary: StageBoundary, forward, inputs, recorder=None) -> tuple[list, list, int]:
    """Execute one training step of a stage's program; return (outputs, losses, peak stash).

    forward(i, x) -> (y, out): microbatch i's stage output y (recorded) and `out`, the tensor sent
    downstream or, on the last stage, microbatch i's loss. x is inputs[i] on the first stage and the
    received activation, made a fresh leaf, elsewhere (chapter Q14: send/recv move bytes, not graphs). Every
    collective the stage computation issues carries region ``stage<s>`` and microbatch i. `recorder`
    (a `timeline.Recorder`), if given, records each F and B span.
    """
    stage = boundary.stage
    first, last = stage == 0, stage == boundary.pp - 1
    inbox: dict[Message, torch.Tensor] = {}
    outbox: dict[Message, torch.Tensor] = {}
    stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    outputs: list = [None] * len(inputs)
    losses: list = [None] * len(inputs)
    peak = 0
    span = recorder.span if recorder is not None else (lambda kind, i: contextlib.nullcontext())
    for item in prog:
        if isinstance(item, Exchange):
            inbox.update(boundary.exchange(item, outbox))
            continue
        i = item.microbatch
        if item.kind == "F":
            # The received activation is a fresh leaf: autograd on this rank starts here.
            x = inputs[i] if first else inbox.pop(Message("activation", i, stage - 1)).requires_grad_(True)
            with span("F", i), region(f"stage{stage}", i):
                y, out = forward(i, x)
            outputs[i] = y.detach()
            if last:
                losses[i] = out.detach()
            else:
                outbox[Message("activation", i, stage)] = out.detach()  # bytes only, no graph
            stash[i] = (x, out)
            peak = max(peak, len(stash))
        else:
            x, out = stash.pop(i)
            with span("B", i):
                if last:
                    out.backward()
                else:  # continue the local graph with the gradient the next stage sent back
                    out.backward(inbox.pop(Message("gradient", i, stage)))
            if not first:
                outbox[Message("gradient", i, stage - 1)] = x.grad
    if inbox or outbox or stash:
        raise RuntimeError(f"stage {stage} ended the step with unconsumed messages or activations "
                           f"({len(inbox)} received, {len(outbox)} unsent, {len(stash)} stashed)")
    return outputs, losses, peak
