"""A fake world's rank, behind the calls a real rank makes (`trace.mode.RealMode`).

Its output already goes to ``logs/rank<R>.log`` (the fork server points the rank's streams there);
it has no peers to meet and no launcher to stop it; `install` applies the rows of `patches` for its
modes (the fake backend, CUDA mapped where torch has none, fake tensors) and marks what a call's
fields cannot know (`backend.assumed`); `recording` is the dispatcher's recorder, or under
``--fake-tensors`` the dispatch mode above FakeTensorMode (`tensors.shapes_only`); `explain` words
the failures only a fake world has (a value read without an answer, `values.value_read`, reported for
its first cause; a pipeline that exchanges its shapes); `record` adds what it mapped, patched and, under
``--fake-tensors``, the value reads it answered (`values.reads`).
"""

from __future__ import annotations

import traceback
from contextlib import AbstractContextManager

from ...core.rundir import RunDir
from ..mode import Explained
from ..options import RankOptions
from ..recording import RankTrace
from . import backend, devices, patches, tensors

PIPELINE_SHAPES = ("the script's pipeline stages exchange their shapes over P2P (recv_object_list), which a fake "
                   "world cannot deliver (it also takes every stage's warm-up vote as 'static shapes'): give every "
                   "PipelineStage static shapes (input_args and output_args)")


class FakeMode:
    """A rank of ``meshscope trace --fake-world N``, forked by the fork server."""

    alone = True

    def __init__(self, options: RankOptions, run_dir: RunDir, rank: int):
        self.options, self.run_dir, self.rank = options, run_dir, rank
        self.patched: list[str] = []

    @property
    def recorder(self) -> str:
        return "mode" if self.options.fake_tensors else self.options.recorder

    def start(self) -> None:
        pass

    def install(self, trace: RankTrace, stopped) -> None:
        self.patched = patches.apply(patches.modes(self.options.fake_tensors))
        if self.options.fake_tensors:
            from .values import reads

            trace.assume = lambda index, op, ins, outs: tuple(dict.fromkeys(
                backend.assumed(op, ins, outs) + reads.assumed.get(index, ())))
        else:
            trace.assume = lambda index, op, ins, outs: backend.assumed(op, ins, outs)

    def recording(self, trace: RankTrace) -> AbstractContextManager:
        return tensors.shapes_only(trace.sink) if self.options.fake_tensors else trace.recording()

    def explain(self, exc: BaseException) -> Explained:
        read = None
        if self.options.fake_tensors:
            from .values import value_read

            read = value_read(exc)
        error, cause = read if read is not None else (None, exc)
        frames = "".join(traceback.format_tb(cause.__traceback__))
        shapes = "recv_object_list" in frames or type(cause).__name__ == "PipeliningMetadataError"
        return Explained(error, PIPELINE_SHAPES if shapes else None, cause)

    def failed(self) -> None:
        pass

    def ended(self, stopped: bool) -> None:
        pass

    def record(self) -> dict:
        answered = ()
        if self.options.fake_tensors:
            from .values import reads

            answered = reads.records()
        return {"mapped": tuple(devices.used), "patched": tuple(self.patched), "answered": answered}
