"""The clock ``--measure-on`` times a rank's compute segments with (`capture.work`): each segment's start and end
marked where they happen, read once the step ended.

On a GPU a segment's time is what its stream spent between two CUDA events recorded on it: the kernels it ran
and any gap where it waited for the CPU to launch the next one, which the same job has on the GPU it is
forecast for (the counting mode's own per-op overhead adds to that gap: docs/forecast.md says how much). Events
are read after the step (`seconds` synchronizes on the later one), not per segment, so the CPU runs ahead as it
does without them. On a CPU the clock is the wall clock of the thread running the ops.
"""

from __future__ import annotations

import platform
import time

MEASURE_ON = ("cuda", "cpu")
"""The devices ``--measure-on`` takes."""


class CpuClock:
    device = "cpu"

    @staticmethod
    def mark(stream=None) -> float:
        return time.perf_counter()

    @staticmethod
    def seconds(start: float, end: float) -> float:
        return end - start

    @staticmethod
    def name() -> str:
        return f"this machine's CPU ({platform.processor() or platform.machine()}, torch's CPU kernels)"


class CudaClock:
    device = "cuda"

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def mark(self, stream=None):
        """An event recorded on `stream` (None: the default stream), by torch's own method: the job's
        ``Event.record`` is watched (`trace.fake.cuda_api.cuda_streams_watched`) and this one is not the job's."""
        cuda = self._torch.cuda
        event = cuda.Event(enable_timing=True)
        self._torch._C._CudaEventBase.record(event, stream if stream is not None else cuda.default_stream())
        return event

    @staticmethod
    def seconds(start, end) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    @staticmethod
    def name() -> str:
        import torch

        return torch.cuda.get_device_name()


def clock_for(device: str):
    """The clock of ``--measure-on DEVICE`` (one of `MEASURE_ON`), None for ``""`` (the roofline's forecast)."""
    return {"": lambda: None, "cpu": CpuClock, "cuda": CudaClock}[device]()
