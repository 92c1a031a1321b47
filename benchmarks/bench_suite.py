"""Wall time of the default `meshscope suite` on this machine (issue target: at most 60 s on 2 cores).

Run: python benchmarks/bench_suite.py [extra suite flags]
"""

import os
import subprocess
import sys
import tempfile
import time


def main() -> None:
    out = tempfile.mkdtemp(prefix="bench-suite-")
    cmd = [sys.executable, "-m", "meshscope", "suite", "--out", out, *sys.argv[1:]]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    summary = [line for line in proc.stdout.splitlines() if "checked invariants" in line]
    print(f"meshscope suite {' '.join(sys.argv[1:])}: exit {proc.returncode}, wall {elapsed:.1f} s "
          f"on {os.cpu_count()} cores; {summary[-1] if summary else proc.stderr[-500:]}")


if __name__ == "__main__":
    main()
