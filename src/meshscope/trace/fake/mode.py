"""A fake world's rank, behind the calls a real rank makes (`trace.mode.RealMode`).

Its output already goes to ``logs/rank<R>.log`` (the fork server points the rank's streams there);
it has no peers to meet and no launcher to stop it; `install` applies the rows of `patches` for its
modes (the fake backend, CUDA mapped where torch has none with its stand-in GPU, fake tensors), lets
the object collectives and the tensor calls record and read what ranks sent (`objects.EXCHANGE`,
`replay.REPLAY`; not under ``--fake-tensors``, whose tensors hold nothing) and marks what a call's
fields cannot know (`assumed`: what a rank's own integers stood in for may have sized, `replay`; an
object collective's stand-in sizes; under ``--fake-tensors``, every all-to-all's receives and the sizes
from a value read without data); `recording` is the
dispatcher's recorder, or under ``--fake-tensors`` the dispatch mode above FakeTensorMode
(`tensors.shapes_only`); `explain` words the failures only a fake world has (a value read without an
answer, `values.value_read`, reported for its first cause; a pipeline that exchanges its shapes; a
CUDA type check; an attention DTensor cannot shard on the CPU); `record` adds what it mapped and
patched, what the rank wrote in its own layer of files (`files`, taken by the fork server), the
stand-in GPU's answers and, under ``--fake-tensors``, the value reads it answered (`values.reads`), and
writes the calls it kept its own integers in (`replay.StandIn`), naming the first in its end (`RankEnd.made_up`,
also where it dies of a signal: `last_words`).
"""

from __future__ import annotations

import json
import traceback
from contextlib import AbstractContextManager, ExitStack

from ...core.rundir import RunDir
from .. import script_frames
from ..mode import Explained
from ..options import RankOptions
from ..recording import RankTrace
from . import attention, cuda_tensors, devices, files, gpu, objects, patches, replay, storage, tensors

PIPELINE_SHAPES = ("the script's pipeline stages exchange their shapes over P2P (recv_object_list): a fake world "
                   "delivers a stage's inputs' shapes only from a traced rank of the stage before it, so trace one "
                   "(--ranks), or give every PipelineStage static shapes (input_args and output_args)")


class FakeMode:
    """A rank of ``meshscope trace --fake-world N``, forked by the fork server."""

    alone = True

    def __init__(self, options: RankOptions, run_dir: RunDir, rank: int):
        self.options, self.run_dir, self.rank = options, run_dir, rank
        self.patched: list[str] = []
        self.work = None
        """The rank's `capture.work.WorkCounter` under ``--work``."""
        self.inferred = dict
        """The axes of the groups the job named not, by their members (`RankTrace.inferred`, once installed)."""

    @property
    def recorder(self) -> str:
        return "mode" if self.options.fake_tensors else self.options.recorder

    def start(self) -> None:
        pass

    def install(self, trace: RankTrace, stopped) -> None:
        gpu.choose(self.options.fake_device or gpu.DEFAULT)
        self.patched = patches.apply(patches.modes(self.options.fake_tensors, self.options.measure_on))
        objects.EXCHANGE.begin(self.run_dir, self.rank)
        # a FakeTensor holds nothing to send: --fake-tensors replays nothing
        replay.REPLAY.begin(self.run_dir, self.rank, trace.context, on=not self.options.fake_tensors)
        trace.assume = self.assumed
        self.inferred = trace.inferred
        trace.last_words = lambda: {"made_up": replay.REPLAY.made_up(self.inferred)}  # dead in native code: fbgemm
        if self.options.work:
            from ...capture.work import WorkCounter

            from .cuda_api import StreamWatch

            from ...capture.segment_clock import clock_for

            # measured on a GPU, the job's tensors are real: a CPU storage is the host's
            on_host = (lambda storage: storage.device.type == "cpu") if self.options.measure_on == "cuda" else (
                cuda_tensors.on_host)
            self.work = WorkCounter(self.rank, trace.context, StreamWatch.current, clock_for(self.options.measure_on),
                                    on_host)
            StreamWatch.listener = self.work
            storage.ResizeWatch.listener = self.work

    def assumed(self, index: int, group: str, op: str, input_splits, output_splits, t: float) -> tuple[str, ...]:
        """The fields of this rank's `index`-th call (on `group`, issued at `t`) it could not know."""
        fields = replay.REPLAY.assumed(group, op, input_splits, output_splits, t)
        fields = tuple(dict.fromkeys(fields + objects.EXCHANGE.assumed(group, t)))
        if self.options.fake_tensors:
            from .values import reads

            fields = tuple(dict.fromkeys(fields + reads.assumed.get(index, ())))
        return fields

    def recording(self, trace: RankTrace) -> AbstractContextManager:
        if self.options.fake_tensors:
            return tensors.shapes_only(trace.sink, self.work)
        if self.work is not None:  # counted above the dispatcher's recorder (`capture.work.CountingMode`)
            from ...capture.work import CountingMode

            stack = ExitStack()
            stack.enter_context(trace.recording())
            stack.enter_context(CountingMode(self.work, lambda: trace.issued))
            return stack
        return trace.recording()

    def explain(self, exc: BaseException) -> Explained:
        read = None
        if self.options.fake_tensors:
            from .values import value_read

            read = value_read(exc)
        error, cause = read if read is not None else (None, exc)
        if error is None and devices.needed():
            where = script_frames.where(traceback.extract_tb(cause.__traceback__))
            error = attention.explain(cause, where) or devices.explain(cause)
        frames = "".join(traceback.format_tb(cause.__traceback__))
        shapes = "recv_object_list" in frames or type(cause).__name__ == "PipeliningMetadataError"
        return Explained(error, PIPELINE_SHAPES if shapes else None, cause)

    def failed(self) -> None:
        pass

    def ended(self, stopped: bool) -> None:
        pass

    def record(self) -> dict:
        mapped = devices.used + ([devices.COMPILED] if devices.compiled() else [])
        answered = ()
        if self.options.fake_tensors:
            from .values import reads

            answered = reads.records()
        replay.REPLAY.write()
        if self.work is not None:
            from ...core.rundir import write_atomic

            self.run_dir.work(self.rank).parent.mkdir(exist_ok=True)
            write_atomic(self.run_dir.work(self.rank), json.dumps(self.work.finish().to_json()))
        return {"mapped": tuple(mapped), "patched": tuple(self.patched),
                "device": gpu.lookup(self.options.fake_device or gpu.DEFAULT) if devices.needed() else "",
                "device_calls": tuple(gpu.answered), "answered": answered, "stood_in": len(objects.EXCHANGE.stood_in),
                "unheard": tuple(sorted(objects.EXCHANGE.unheard)), "made_up": replay.REPLAY.made_up(self.inferred),
                **files.record()}
