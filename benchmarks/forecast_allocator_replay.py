"""The caching allocator's model (meshscope.capture.caching_allocator) held to a real GPU's: each request and free
that benchmarks/forecast_allocator_trace.py recorded on a GPU (torch's memory history) is replayed, in the order
the GPU's allocator saw them, through the model, whose reserved peak is set beside the GPU's own
``max_memory_reserved`` and beside the reserved bytes the trace's segment events add up to. Runs anywhere (no GPU).

Run: python benchmarks/forecast_allocator_replay.py docs/results/forecast/alloc_*.json.gz
"""

from __future__ import annotations

import gzip
import json
import sys

from meshscope.capture.caching_allocator import CachingAllocator, expandable_segments

GROW, SHRINK = ("segment_alloc", "segment_map"), ("segment_free", "segment_unmap")


def replay(doc: dict) -> tuple[int, int, int]:
    """(the model's reserved peak, the trace's own reserved peak from its segment events, the allocated peak)."""
    model = CachingAllocator(expandable_segments({"PYTORCH_ALLOC_CONF": doc["alloc_conf"]}))
    streams: dict[int, int] = {}
    reserved = peak_reserved = peak_allocated = 0
    for action, addr, size, stream in doc["trace"]:
        if action == "alloc":
            model.malloc(addr, size, streams.setdefault(stream, len(streams)))
            peak_allocated = max(peak_allocated, model.allocated)
        elif action == "free_completed":
            model.free(addr)
        elif action in GROW:
            reserved += size
            peak_reserved = max(peak_reserved, reserved)
        elif action in SHRINK:
            reserved -= size
    return model.peak, peak_reserved, peak_allocated


def main() -> None:
    gib = 2**30
    for path in sys.argv[1:]:
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            doc = json.load(f)
        model, traced, allocated = replay(doc)
        c = doc["config"]
        print(f"{path}: {c['mode']} {c['layers']} blocks {c['batch']} x {c['seq']}, {c['steps']} steps, "
              f"alloc_conf {doc['alloc_conf']!r}, {doc['gpu']}: max_allocated {doc['max_allocated'] / gib:.2f} GiB "
              f"(replayed {allocated / gib:.2f}), max_reserved {doc['max_reserved'] / gib:.2f} GiB (its segments "
              f"{traced / gib:.2f}); model {model / gib:.2f} GiB ({(model / doc['max_reserved'] - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
