"""The steady steps of a traced rank: the one selection the checks, `place` and the budgets share.

Step 0 holds set-up (DDP's and DTensor's parameter broadcasts, and collectives whose number depends on
random draws: ``trunc_normal_`` on sharded tensors issued 252 calls in one run of torchtitan's step
0 and 258 in the next); step 1 holds warm-up (DDP rebuilds its buckets after its first iteration).
The steady steps are the complete ones from `FIRST_STEADY` on: a rank that finished n steps has
steps 0..n-1 complete, so its steady steps are ``FIRST_STEADY .. n-1``.
"""

from __future__ import annotations

FIRST_STEADY = 2
"""The first step that holds neither set-up nor warm-up."""


def steady_steps(complete: int) -> list[int]:
    """The steady steps of a rank that completed `complete` steps (none when it completed too few)."""
    return list(range(FIRST_STEADY, complete))


def needed(steady: int) -> int:
    """How many complete steps give `steady` steady steps."""
    return FIRST_STEADY + steady
