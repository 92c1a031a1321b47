"""Whose failure a rank's own failure was: the script's (``script-error``), meshscope's (``meshscope-error``)
or the fake world's (``fake-world-gap``).

A rank that failed outside any collective was blamed on its script alone, also where meshscope broke the
job (issue 42 item 11, the stacks tried on 2026-12-05: N1, N3, C1): nanotron's numpy ranks made meshscope's
group log raise in ``json.dumps``, and a fake world led libraries onto CUDA-only paths that a CPU build of
torch refuses (bitsandbytes' ``torch._C._cuda_getCurrentRawStream``, ``torch.Generator(device="cuda")``).
The rank records what tells them apart (`core.rank_end.RankEnd`): meshscope's own frame where it failed
(``meshscope_frame``), and an error of CUDA-only work (`core.rank_end.CUDA_ONLY`), which is the fake
world's gap only in a fake world: a real job's on a machine without CUDA is the script's, as torch's own.
meshscope's frame is checked first: its own code failing is the most specific fact.

A fake world's rank that failed after a receive of integers whose sender it could not hear (a rank not
traced before it) computed on values the fake world made up (`core.rank_end.RankEnd.made_up`: zeros, or its
own): its failure is the fake world's gap too, named with that receive, the fix being to trace the sender
first. With received_sizes.py's ``--check 0`` alone (``--ranks 0``) rank 0 exits on rank 1's size, which
it could not know; TorchRec's rank 0 crashed in fbgemm on the counts the fake backend had left it.
"""

from __future__ import annotations

from ..core.rank_end import RankEnd

OWN_FAILURES = ("script-error", "meshscope-error", "fake-world-gap")
"""The kinds of a rank that failed on its own, outside any collective (`ends.order` puts them first when no
rank was blocked)."""

FAKE_WORLD_DOCS = "docs/trace.md, \"A large world on one CPU: --fake-world N\""


def whose(end: RankEnd, fake_world: bool) -> str:
    """The kind of finding `end`'s failure is (module docstring)."""
    if end.meshscope_frame:
        return "meshscope-error"
    if fake_world and (end.cuda_only or end.made_up):
        return "fake-world-gap"
    return "script-error"


def cause(kind: str, first: RankEnd, ranks: int, traceback: str) -> str:
    """A finding's cause in words: whose failure (`kind`, of `whose`), on how many `ranks` (`first` the
    earliest), and where `traceback` is (``its traceback is in logs/rank0.log``, or nothing)."""
    these = "this rank" if ranks == 1 else "these ranks"
    said = f"; {traceback}" if traceback else ""
    if kind == "meshscope-error":
        return (f"meshscope itself failed on {these}, in its own code at {first.meshscope_frame}, not the script "
                f"(exit code {first.exit_code}): please report it as a meshscope bug{said}")
    if kind == "fake-world-gap" and first.cuda_only:
        return (f"the fake world has no mapping for this CUDA-only work (torch here has no CUDA), not the script's "
                f"fault: a CUDA build of torch has what it asked for (exit code {first.exit_code}); see "
                f"{FAKE_WORLD_DOCS} for what the fake world maps{said}")
    if kind == "fake-world-gap":
        return (f"{these} failed after a receive of integers (a size, a count) that the fake world made up, not "
                f"knowing what its sender sent: {first.made_up}; the failure may be the fake world's, not the "
                f"script's (exit code {first.exit_code}): trace the sending ranks first (--ranks) to have what "
                f"they sent replayed, see {FAKE_WORLD_DOCS}{said}")
    return f"the script itself failed on {these} (exit code {first.exit_code}), outside any collective{said}"
