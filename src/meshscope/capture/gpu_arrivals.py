"""Each call's arrival on the GPU, for the Python kernel (`dispatch`): what native_recorder.cpp's CUDA
events do for the C++ one (its header says why the stream's point, why a reference per step, and why
they are read only at the rank's end).

A call whose first tensor is on a CUDA device gets a timed event on the current stream of that device
before it runs; the first such call records a reference event and waits for it, reading the steady
clock (``time.perf_counter``) when it completed; each step mark records another reference, and every
event is timed from its step's. `resolve` turns them into ``(call id, seconds)`` on the clock of the
calls' issue times.
"""

from __future__ import annotations

import time

import torch

MAX_MARKS = 1 << 20
"""As native_recorder.cpp's bound: past it, calls are counted, not timed."""


def cuda_device(args) -> torch.device | None:
    """The device of the first CUDA tensor among a c10d op's arguments (tensors, lists of them)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device if a.is_cuda else None
        if isinstance(a, (list, tuple)) and a:
            first = a[0][0] if isinstance(a[0], (list, tuple)) and a[0] else a[0]
            if isinstance(first, torch.Tensor):
                return first.device if first.is_cuda else None
    return None


class GpuArrivals:
    """The CUDA events of one rank's calls (the module docstring)."""

    def __init__(self):
        self.refs: list[torch.cuda.Event] = []
        self.marks: list[tuple[int, int, torch.cuda.Event]] = []  # (call id, its reference, its event)
        self.ref0 = 0.0
        self.device: torch.device | None = None
        self.dropped = 0

    def arrive(self, call_id: int, args) -> None:
        device = cuda_device(args)
        if device is None:
            return
        stream = torch.cuda.current_stream(device)
        if not self.refs:
            first = torch.cuda.Event(enable_timing=True)
            first.record(stream)
            first.synchronize()
            self.ref0, self.device = time.perf_counter(), device
            self.refs.append(first)
        if device != self.device or len(self.marks) >= MAX_MARKS:
            self.dropped += 1
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        self.marks.append((call_id, len(self.refs) - 1, event))

    def mark(self) -> None:
        """A step boundary: the next calls are timed from a reference recorded now."""
        if self.refs:
            ref = torch.cuda.Event(enable_timing=True)
            ref.record(torch.cuda.current_stream(self.device))
            self.refs.append(ref)

    def resolve(self, wait_s: float) -> tuple[list[tuple[int, float]], int]:
        """Every call's arrival (call id, seconds) and how many were left without one, waiting up to
        `wait_s` for the GPU to pass the last events; releases them."""
        refs, marks, dropped = self.refs, self.marks, self.dropped
        self.refs, self.marks, self.dropped = [], [], 0
        deadline = time.monotonic() + wait_s
        while marks and not marks[-1][2].query() and time.monotonic() < deadline:
            time.sleep(0.001)
        from0: dict[int, float] = {0: 0.0}
        out = []
        for call_id, ref, event in marks:
            if not (event.query() and refs[ref].query()):
                dropped += 1
                continue
            try:
                if ref not in from0:
                    from0[ref] = refs[0].elapsed_time(refs[ref])
                out.append((call_id, self.ref0 + (from0[ref] + refs[ref].elapsed_time(event)) * 1e-3))
            except RuntimeError:  # an event captured into a CUDA graph has no time of its own
                dropped += 1
        return out, dropped
