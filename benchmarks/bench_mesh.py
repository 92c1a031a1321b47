"""Layout math at scale: time to compute every group of each axis for 100,000 ranks.

Run: python benchmarks/bench_mesh.py [--world 100000]
"""

import argparse
import time

from meshscope.core.mesh import GROUP_NAMES, Layout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=100_000)
    args = parser.parse_args()
    layout = Layout(args.world, tp=8, cp=5, pp=5, ep=4, etp=2)
    print(f"world {args.world}: sizes {layout.sizes}")
    for name in GROUP_NAMES:
        start = time.perf_counter()
        groups = layout.groups(name)
        elapsed = time.perf_counter() - start
        print(f"  {name:>6}: {len(groups):6d} groups of {len(groups[0]):6d} ranks in {elapsed * 1e3:7.1f} ms")
    start = time.perf_counter()
    coords = [layout.coords(r) for r in range(args.world)]
    print(f"  coords of all {len(coords)} ranks: {(time.perf_counter() - start) * 1e3:.1f} ms")
    start = time.perf_counter()
    order = layout.creation_order()
    print(f"  creation order ({len(order)} groups): {(time.perf_counter() - start) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
