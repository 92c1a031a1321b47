"""meshscope: predict, run, verify and explain the communication of N-D parallel training.

The packages follow the data, one direction only (docs/design.md): a package imports only from
packages of a lower layer (or its own), never upward, and `tests/test_layers.py` enforces it.

  1 core         errors, validation, CommEvent, RunResult, layout math, group creation
  2 capture      what a rank really issued (recorder, call decoding, flight log)
  3 predict      what a rank must issue (placement rules, edges, ledger, analytic models)
  4 models       the named collective Functions and the sharded models
  5 experiments  one package per parallel mode (config, predict, reference, experiment)
  6 verify, timing
  7 doctor       root causes from flight logs
  8 run          torch's elastic agent, the rank context, the worker, the run directory
  9 trace        users' own jobs, traced unmodified
 10 suite        the chapter in one launch
 11 place        axis placement on nodes
 12 report       tables, report.md, figures
 13 cli          the command line and the rank process
"""

__version__ = "0.1.0"

LAYERS = (
    ("core",), ("capture",), ("predict",), ("models",), ("experiments",), ("verify", "timing"),
    ("doctor",), ("run",), ("trace",), ("suite",), ("place",), ("report",), ("cli",),
)
"""Subpackages from the lowest layer up; packages of one layer do not import each other."""
