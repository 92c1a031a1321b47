"""Placement advisor at scale: time to rank every placement of 16,384 ranks over five axes.

The work: 120 orders validated by `mesh.Layout`, deduplicated by group sets, and per distinct placement
and axis the groups that cross nodes, per pipeline stage and per stage boundary (one vectorised pass
over the ranks per distinct group set), then each of the 8 stages timed on its own groups.

Run: python benchmarks/bench_place.py [--world 16384] [--gpus-per-node 8] [--stage-layers 6,4,4,4,4,4,4,2]
"""

import argparse
import time

from meshscope.place.advisor import rank_placements
from meshscope.predict.model_spec import ModelSpec, parse_stage_layers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=16384)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--stage-layers", default="", help="32 layers over 8 stages; default: 4 each")
    args = parser.parse_args()
    sizes = {"tp": 8, "cp": 2, "pp": 8, "ep": 8, "etp": 1}
    spec = ModelSpec(layers=32, hidden=4096, ffn=14336, seq_len=4096, heads=32, experts=64, topk=2,
                     sequence_parallel=True, microbatches=16, stage_layers=parse_stage_layers(args.stage_layers))
    start = time.perf_counter()
    ranking = rank_placements(args.world, args.gpus_per_node, spec, sizes)
    elapsed = time.perf_counter() - start
    best = ranking.placements[0]
    print(f"world {args.world} ({args.world // args.gpus_per_node} nodes of {args.gpus_per_node}), "
          f"sizes {ranking.layout.sizes}")
    print(f"  {len(ranking.placements)} distinct placements from {sum(len(p.orders) for p in ranking.placements)} valid orders "
          f"ranked in {elapsed:.3f} s")
    print(f"  best {best.order}: step {best.step_s * 1e3:.1f} ms (stage {best.pacing.stage} paces), per-axis sum "
          f"{best.total_s * 1e3:.1f} ms; {best.reason()}")


if __name__ == "__main__":
    main()
