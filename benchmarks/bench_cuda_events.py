"""What a timed CUDA event costs the CPU thread that records it, part by part (one GPU).

The trace marks each call's arrival on the GPU with a timed event recorded on the issuing stream
(`capture.gpu_arrivals`, native_recorder.cpp's `gpu_arrive`): one per call and one per step mark. On
bench_trace.py's DDP step on one GPU (NCCL world 1, 8 calls and a mark per 2.5 ms step), the trace without
them cost 110-190 us per step less (docs/trace.md, "Cost"), more than the few CUDA runtime calls an event
takes were thought to. This prints, per event, the median and smallest over `--repeats` loops of
`--events` events, with the stream idle and with about 1 ms of work queued on it (as a training step's
stream has):

  construct only                 ``torch.cuda.Event(enable_timing=True)``, kept: no CUDA call (the baseline);
  create + record, timed         the first record creates the event (cudaEventCreateWithFlags) and records it,
                                 as each call's arrival does;
  create + record, untimed       the same without timing (``cudaEventDisableTiming``);
  record a created event again   a timed event created and recorded beforehand, recorded again (no creation).

Every event is kept until its loop ends, as the trace keeps its events until the rank's end.
torch.cuda.Event is at::cuda::CUDAEvent, not the c10::Event the C++ recorder uses; both come down to the
same runtime calls (c10/cuda/impl/CUDAGuardImpl.h and ATen/cuda/CUDAEvent.h, torch 2.11).

Run (device, repository root): python3 benchmarks/bench_cuda_events.py [--events 20000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a GPU: torch.cuda.is_available() is False")
    stream = torch.cuda.current_stream()
    created = [torch.cuda.Event(enable_timing=True) for _ in range(args.events)]
    for e in created:
        e.record(stream)
    torch.cuda.synchronize()

    def construct(keep, i):
        keep.append(torch.cuda.Event(enable_timing=True))

    def create_record(timing):
        def body(keep, i):
            e = torch.cuda.Event(enable_timing=timing)
            e.record(stream)
            keep.append(e)
        return body

    def record_again(keep, i):
        created[i].record(stream)

    kinds = (("construct only", construct), ("create + record, timed", create_record(True)),
             ("create + record, untimed", create_record(False)), ("record a created event again", record_again))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; us per event over {args.events} events, "
          f"{args.repeats} loops")
    for busy in (False, True):
        for name, body in kinds:
            per = []
            for _ in range(args.repeats):
                keep: list = []
                if busy:
                    torch.cuda._sleep(1_000_000)  # about 1 ms of queued work at 1-2 GHz
                t0 = time.perf_counter()
                for i in range(args.events):
                    body(keep, i)
                per.append((time.perf_counter() - t0) / args.events * 1e6)
                torch.cuda.synchronize()
            print(f"  {name:30s} stream {'busy' if busy else 'idle'}: median {statistics.median(per):6.2f}  "
                  f"min {min(per):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
