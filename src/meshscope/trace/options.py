"""What every traced rank is told: one frozen record, spelled as command-line flags in one place.

The launcher (`trace.launch`) writes these flags into the command torchrun starts for each worker,
the fork server (`trace.fake.fork_server`) hands them to each rank it forks, and the rank program
(`trace.rank`) reads them back: `RankOptions.to_argv` and `from_argv` are the only spelling of them.
``torchrun -m meshscope.trace`` builds the same record from its environment (`trace.__main__`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

RECORDERS = ("native", "python")

RECORDER_ENV = "MESHSCOPE_RECORDER"
"""The default of ``--recorder`` for ``torchrun -m meshscope.trace``: ``native`` (the C++ recorder,
`capture.native`, built by the first rank that needs it) or ``python`` (the Python kernel)."""


@dataclass(frozen=True)
class RankOptions:
    """One traced rank's options, the same on every rank of a job."""

    run_dir: Path
    target: tuple[str, ...]
    """``SCRIPT ARGS...`` or ``-m MODULE ARGS...``."""
    steps: int | None = None
    """End cleanly once every rank finished this many steps (`trace.rank`'s stop protocol)."""
    timeout: float | None = None
    """Seconds a collective may wait (every group the job creates)."""
    step_optimizer: str | None = None
    """Class name of the optimizer whose steps mark the boundaries; None: the first one created."""
    fake: bool = False
    """A rank of a fake world (`trace.fake`): the fake backend, CUDA mapped to the CPU."""
    fake_tensors: bool = False
    """With `fake`: the script's tensors without data (`trace.fake.tensors`)."""
    work: bool = False
    """With `fake`: count every op's FLOPs and bytes and the memory held (`capture.work`)."""
    fake_device: str = ""
    """With `fake`: the stand-in GPU torch.cuda's device queries answer as (a `trace.fake.gpu.GPUS` name)."""
    measure_on: str = ""
    """With `work` and real tensors: ``cuda`` or ``cpu``, the device whose clock times each compute segment
    (`capture.segment_clock`); empty: none."""
    cheap: bool = False
    """No module hooks, no flight log streamed while the job runs."""
    recorder: str = "native"
    """``native`` (the C++ recorder) or ``python`` (the Python kernel)."""
    flight_recorder: bool = False
    """torch's Flight Recorder on, dumped into ``fr/`` when the rank fails or is stopped."""

    @property
    def module(self) -> bool:
        """The job is ``-m MODULE``, not a script path."""
        return self.target[0] == "-m"

    @property
    def script_argv(self) -> list[str]:
        """``sys.argv`` as the job sees it: the script (or module) and its arguments, as ``python SCRIPT``
        or ``python -m MODULE`` would set it."""
        return [self.target[1] if self.module else self.target[0], *self.target[2 if self.module else 1:]]

    def to_argv(self) -> list[str]:
        flags = [str(self.run_dir), *(["--steps", str(self.steps)] if self.steps else []),
                 *(["--timeout", repr(self.timeout)] if self.timeout else []),
                 *(["--step-optimizer", self.step_optimizer] if self.step_optimizer else []),
                 *(["--fake"] if self.fake else []), *(["--fake-tensors"] if self.fake_tensors else []),
                 *(["--work"] if self.work else []),
                 *(["--fake-device", self.fake_device] if self.fake_device else []),
                 *(["--measure-on", self.measure_on] if self.measure_on else []),
                 *(["--cheap"] if self.cheap else []), "--recorder", self.recorder,
                 *(["--flight-recorder"] if self.flight_recorder else [])]
        return [*flags, "--", *self.target]

    @classmethod
    def from_argv(cls, argv: list[str]) -> RankOptions:
        if "--" not in argv:
            raise SystemExit("meshscope trace: missing '--' before the script")
        cut = argv.index("--")
        p = argparse.ArgumentParser(prog="meshscope.trace.rank")
        p.add_argument("run_dir", type=Path)
        p.add_argument("--steps", type=int, default=None)
        p.add_argument("--timeout", type=float, default=None)
        p.add_argument("--step-optimizer", default=None)
        p.add_argument("--fake", action="store_true")
        p.add_argument("--fake-tensors", action="store_true")
        p.add_argument("--work", action="store_true")
        p.add_argument("--fake-device", default="")
        p.add_argument("--measure-on", default="")
        p.add_argument("--cheap", action="store_true")
        p.add_argument("--recorder", choices=RECORDERS, default=os.environ.get(RECORDER_ENV, "native"))
        p.add_argument("--flight-recorder", action="store_true")
        args = p.parse_args(argv[:cut])
        return cls(target=tuple(argv[cut + 1:]), **vars(args))
