"""meshscope: predict, run, verify and explain the communication of N-D parallel training.

The packages follow the data, one direction only (docs/design.md): a package imports only from
packages of a lower layer (or its own), never upward, and `tests/test_layers.py` enforces it. From
the lowest up (`LAYERS` holds the order):

  core         errors, validation, CommEvent, RunResult, layout math, group creation
  capture      what a rank really issued (recorder, call decoding, flight log)
  predict      what a rank must issue (placement rules, edges, ledger, analytic models)
  models       the named collective Functions and the sharded models
  experiments  one package per parallel mode (config, predict, reference, experiment)
  verify, timing
  doctor       root causes from flight logs
  run          torch's elastic agent, the rank context, the worker, the run directory
  trace        users' own jobs, traced unmodified
  forecast     a traced job's step time, exposed communication and peak memory on a named cluster
  suite        the chapter in one launch
  place        axis placement on nodes
  budget       communication budgets: a job's ledger as formulas, held against a re-trace
  testing      the Python API for tests: trace a script, query its ledger, check a budget
  report       tables, report.md, figures
  cli          the command line and the rank process
"""

__version__ = "0.1.0"

LAYERS = (
    ("core",), ("capture",), ("predict",), ("models",), ("experiments",), ("verify", "timing"),
    ("doctor",), ("run",), ("trace",), ("forecast",), ("suite",), ("place",), ("budget",), ("testing",), ("report",), ("cli",),
)
"""Subpackages from the lowest layer up; packages of one layer do not import each other."""
