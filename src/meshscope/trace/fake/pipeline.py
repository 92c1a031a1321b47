"""What a fake world's pipeline stage learns from its peers in torch.distributed.pipelining's warm-up.

Before its first step a schedule runs a vote over P2P (torch 2.13 schedules.py ``_warmup_p2p``, stage.py
``_warmup_forward_vote`` / ``_warmup_backward_result``): each stage votes 1 when its user-given
metadata suffices ("static") and 0 when the shapes must be inferred ("dynamic"), the product travels
to the last stage and back, and every stage takes the result. With dynamic inference each stage then
receives its inputs' metadata from the stage before it and its outputs' gradients' metadata from the
stage after it (``_send_meta`` / ``_recv_meta``, a ``send_object_list`` / ``recv_object_list``).

A fake world's rank hears from no peer: the fake backend's receive leaves its buffer as it was, and
what an object message carries is the sender's record only where the sender ran first (`objects`). So:

- `vote_alone`: a rank's stages take the vote of their own stages (static only if every one of them
  votes static), as if every stage voted as they do; the vote's calls are issued as torch issues them.
  A job whose stages vote differently (one given its shapes, another not) is read wrongly here.
- `stage_metadata`: every stage's metadata message is also recorded under its stage and direction
  (``pp-forward-<stage>``, ``pp-backward-<stage>``), and a receiver whose own sender was not traced
  before it takes the same stage's message from whichever rank traced it (the data-parallel replicas
  of a stage send the same shapes). Where no rank has yet, a gradient's metadata is derived from this
  stage's own outputs by torch's rule for it (``_utils._derive_grad_metas``: each output's shape,
  stride and dtype); an input's metadata cannot be, and the stage fails as torch makes it fail, to be
  traced again after the others (`world.retrace`). Either way the message's bytes are assumed.
- `per_edge_setup_as_fake` (torch 2.15, which votes by an all_reduce and preconnects the stages in a set-up
  it skips on the fake backend): the set-up runs as on the backend the script named, as a real run's does,
  since ``get_backend`` answers that one (`backend.backend_as_asked`); with per-edge groups it keeps
  torch's fake path.
"""

from __future__ import annotations

import functools

from . import backend, objects


@functools.cache
def vote_alone() -> None:
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining._utils import InferenceMode
    from torch.distributed.pipelining.stage import PipelineStage

    original = schedules._PipelineSchedule._warmup_p2p

    def _warmup_p2p(self, stages, has_backward, p2p_done):
        original(self, stages, has_backward, p2p_done)
        if stages and all(isinstance(stage, PipelineStage) for stage in stages):
            static = not any(InferenceMode.needs_dynamic(stage._user_meta, has_backward) for stage in stages)
            for stage in stages:
                stage._inference_mode = InferenceMode.STATIC if static else InferenceMode.DYNAMIC

    schedules._PipelineSchedule._warmup_p2p = _warmup_p2p


KIND = "stage_meta"


def _direction(stage: int, peer: int) -> str:
    return "forward" if peer > stage else "backward"


@functools.cache
def stage_metadata() -> None:
    from torch.distributed.pipelining._utils import _derive_grad_metas, _StageBackwardMeta
    from torch.distributed.pipelining.stage import PipelineStage

    send, recv = PipelineStage._send_meta, PipelineStage._recv_meta

    def _send_meta(self, meta, dst_stage):
        key = objects.EXCHANGE.named(f"pp-{_direction(self.stage_index, dst_stage)}-{self.stage_index}")
        objects.EXCHANGE.record(key, KIND, [objects.pickled(meta)])
        return send(self, meta, dst_stage)

    def _recv_meta(self, src_stage):
        key = objects.EXCHANGE.named(f"pp-{_direction(src_stage, self.stage_index)}-{src_stage}")
        outputs = self._stage_meta.outputs

        def stand_in(own: list) -> list:
            found = objects.EXCHANGE.read_any(key, KIND)
            if found is not None:
                return [objects.unpickled(found[0])]
            if src_stage > self.stage_index and outputs is not None:
                return [_StageBackwardMeta(backward_metas=_derive_grad_metas(outputs))]
            return own

        with objects.standing_in(stand_in):
            return recv(self, src_stage)

    PipelineStage._send_meta, PipelineStage._recv_meta = _send_meta, _recv_meta


@functools.cache
def per_edge_setup_as_fake() -> None:
    """A pipeline schedule's set-up with per-edge groups sees the fake backend. torch 2.15 skips the set-up on
    the fake backend (pipelining/schedules.py ``_initialize_pipeline_distributed_state``: ``backend !=
    "fake"``), and ``get_backend`` answers the script's backend in a fake world (`backend.backend_as_asked`),
    so the set-up runs as a real run's does: the stages' vote on static shapes (an int32 all_reduce on the
    pipeline group) and the preconnect of each pair of stages (pipelining/_p2p.py
    ``_preconnect_shared_p2p_edges``: a send and recv of one int32 and all-reduces around them). Per-edge
    groups (torch's ``pipeline_per_edge_p2p`` config, TorchComms) keep torch's fake path: building them asks
    the backend for its device map, which the fake one has not."""
    from torch.distributed.pipelining import schedules

    base = schedules._PipelineSchedule
    setup = base._initialize_pipeline_distributed_state

    @functools.wraps(setup)
    def initialize(self, stages, *args, **kwargs):
        if not any(stage.p2p_per_edge for stage in stages):
            return setup(self, stages, *args, **kwargs)
        with backend.actual_backend():
            return setup(self, stages, *args, **kwargs)

    base._initialize_pipeline_distributed_state = initialize
