"""A job whose names, printed lines and error read as rich console markup, and which fails as a gloo job
does when a peer dies: one rank ends with ``Connection closed by peer`` while the other waits in a barrier.

Exercises: nothing new of torch.distributed; text. torch's CI builds gloo under ``/__w/pytorch/pytorch``
and gloo opens its errors with the source location in brackets, so a released torch's peer failure
reads ``[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by
peer ...``: to a markup parser, a closing tag. This job puts such text everywhere a job's text goes:
its mesh dim name (``AXIS``), its module names (``LINEAR``, ``MIX``), a line it prints (``PRINTED``)
and its error (``MESSAGE``). Rank 1 raises ``MESSAGE`` itself, so that text is the same on any torch
build; rank 0's barrier then fails with what its own gloo says (torch 2.13's CPU wheel: the same
location, ``Connection closed by peer [127.0.0.1]:PORT. ...``), unless the launcher stops it first.
This is an ordinary user script: it never imports meshscope.

Launch::

    torchrun --nproc-per-node 2 tests/jobs/markup_text.py [--steps 2]

Independent facts (world 2): a 1-D mesh whose dim is named ``[bold]dp``; a model
``Sequential([link=http://x]: Linear(4, 4), [/x]: Mix)`` whose ``Mix`` all-reduces a copy of its
[2, 4] float32 input (32 B) on the mesh's group in forward, with no collective in backward: per step
one all_reduce (forward, module ``[/x]``) and one ``SGD.step()``. After the last step every rank
prints ``PRINTED``; then rank 1 raises ``RuntimeError(MESSAGE)`` (the line marked below) and rank 0
issues a barrier on the world that rank 1 never reaches.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

MESSAGE = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
           "[bold] [link=http://x] :smile:")
"""What a released torch's gloo raises when a peer dies, and three more of rich's markup: a style tag, a
link tag and an emoji code."""

PRINTED = "loss [bold]1.0[/x] [link=http://x]log[/link] :smile:"
"""The line every rank prints after its last step."""

AXIS = "[bold]dp"
"""The mesh's one dim name."""

LINEAR, MIX = "[link=http://x]", "[/x]"
"""The model's two module names (``nn.Module.add_module`` refuses only names with a dot, and the empty one)."""


class Mix(nn.Module):
    """Adds its input's sum over the mesh's group in forward (a plain all_reduce of a detached copy: the
    gradient flows through the input alone, with no collective)."""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def forward(self, x):
        total = x.detach().clone()
        dist.all_reduce(total, group=self.group)
        return x + total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=(AXIS,))
    torch.manual_seed(0)
    net = nn.Sequential()
    net.add_module(LINEAR, nn.Linear(4, 4))
    net.add_module(MIX, Mix(mesh.get_group(AXIS)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(args.steps):
        net(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    print(PRINTED, flush=True)
    if dist.get_rank() == 1:
        raise RuntimeError(MESSAGE)  # the job's one error: rank 1 fails here
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
