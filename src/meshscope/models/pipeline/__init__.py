"""Pipeline parallelism: a chain of stages joined by explicit activation/gradient P2P.

`schedules` gives each stage's ordered F/B actions (GPipe fill-drain, 1F1B) and the P2P program they
imply, as pure functions shared by the runtime and the predictor; `stage` runs a stage's program over
its boundaries, where plain send/recv cut the autograd graph and the gradient message rejoins it.
"""

from .schedules import SCHEDULES, Action, Exchange, Message, actions, check_matched, peak_stash, program, stash_bound
from .stage import StageBoundary, chain_stage, run_program, stage_forward

__all__ = ["SCHEDULES", "Action", "Exchange", "Message", "actions", "check_matched", "peak_stash", "program",
           "stash_bound", "StageBoundary", "chain_stage", "run_program", "stage_forward"]
