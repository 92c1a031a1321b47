"""Communication budgets: formulas fitted from traces at several depths hold at another, and each of ten
planted regressions (one line changed in a copy of a job of tests/jobs/) fails the check, naming the
entry that moved. The formulas, the templates and the fitting are tested in pure Python; the jobs'
facts come from their docstrings (tests/jobs/budgeted.py, ddp.py, pipelining.py, moe_a2a.py)."""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from meshscope.budget.check import compare
from meshscope.budget.formula import Formula, FormulaError, fit_bytes, fit_count
from meshscope.budget.ledger import Key, module_key, rank_class
from meshscope.budget.record import read, write
from meshscope.budget.template import Vary, check_names, grid, match, substitute
from meshscope.core.errors import UsageError
from meshscope.testing import TraceFailed, check, trace
from meshscope.trace.assemble import load

from .helpers import ROOT, cli, cli_here

JOBS = ROOT / "tests" / "jobs"


# -- formulas --------------------------------------------------------------------------------------

def test_formulas_parse_by_their_grammar_and_evaluate_exactly():
    assert Formula.parse("2*layers + 2").evaluate({"layers": 3}) == 8
    assert Formula.parse("4 * ceil(262144 / (4 * dp))").evaluate({"dp": 3}) == 87384
    assert Formula.parse("-(1 - dp) * 2").evaluate({"dp": 4}) == 6
    for text in ("__import__('os').system('true')", "2 ** 3", "layers.bit_length()", "1 +", "ceil 3"):
        with pytest.raises(FormulaError):
            Formula.parse(text)
    with pytest.raises(FormulaError, match="not a whole number"):
        Formula.parse("7 / dp").evaluate({"dp": 2})
    with pytest.raises(FormulaError, match="needs tp"):
        Formula.parse("tp").evaluate({})


def test_counts_fit_the_fewest_terms_and_say_whether_points_verify_them():
    three = [({"layers": 2}, 6), ({"layers": 3}, 8), ({"layers": 4}, 10)]
    fit = fit_count(three, ["layers"])
    assert fit.text == "2*layers + 2" and fit.verified
    two = fit_count(three[:2], ["layers"])
    assert two.text == "2*layers + 2" and not two.verified  # as many parameters as points: fitted only
    assert fit_count([({"layers": 2}, 1), ({"layers": 5}, 1)], ["layers"]).text == "1"
    grid_fit = fit_count([({"a": a, "b": b}, a * b + 1) for a in (1, 2, 3) for b in (2, 3)], ["a", "b"])
    assert grid_fit.text == "a*b + 1" and grid_fit.verified


def test_bytes_fit_constant_proportional_inverse_or_padded():
    assert fit_bytes([({"dp": 2}, 64), ({"dp": 4}, 64)], ["dp"]).text == "64"
    assert fit_bytes([({"tp": 2}, 128), ({"tp": 4}, 256), ({"tp": 8}, 512)], ["tp"]).text == "64*tp"
    inverse = fit_bytes([({"dp": 2}, 4096), ({"dp": 4}, 2048), ({"dp": 8}, 1024)], ["dp"])
    assert inverse.text == "8192 / dp" and inverse.verified
    # FSDP2's padding: 25 rows of 4 B split over 3 and over 5 ranks: ceil(25/3) * 4, ceil(25/5) * 4
    padded = fit_bytes([({"dp": 3}, 36), ({"dp": 5}, 20), ({"dp": 7}, 16)], ["dp"])
    assert all(f.evaluate({"dp": 3}) == 36 for f in padded.forms) and "ceil" in padded.text


def test_a_dependence_the_points_do_not_determine_is_never_guessed():
    """dp and world grow together at these points: both forms are kept, and a point where they disagree
    cannot be served."""
    fit = fit_bytes([({"dp": 2, "world": 8}, 512), ({"dp": 4, "world": 16}, 256)], ["dp", "world"])
    assert sorted(f.text for f in fit.forms) == ["1024 / dp", "4096 / world"]
    assert fit.value({"dp": 8, "world": 32}) == 128
    with pytest.raises(FormulaError, match="do not determine"):
        fit.value({"dp": 8, "world": 64})


# -- templates -------------------------------------------------------------------------------------

def test_placeholders_substitute_escape_and_match_back():
    template = ["job.py", "--layers", "{layers}", "--name=m{layers}x{world}", "{{literal}}"]
    assert substitute(template, {"layers": 3, "world": 16}) == ["job.py", "--layers", "3", "--name=m3x16", "{literal}"]
    assert match(template, ["job.py", "--layers", "8", "--name=m8x32", "{literal}"], "args") == {"layers": 8, "world": 32}
    with pytest.raises(UsageError, match="'--layerz' does not match the budget's '--layers'"):
        match(template, ["job.py", "--layerz", "8", "--name=m8x32", "{literal}"], "args")
    with pytest.raises(UsageError, match="placeholder {depth} names no --vary"):
        check_names(["--layers", "{depth}"], [Vary.parse("layers=2,3")])
    with pytest.raises(UsageError, match="values must be integers"):
        Vary.parse("schedule=gpipe,1f1b")
    assert grid([Vary.parse("a=1,2"), Vary.parse("b=3")]) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]


def test_module_keys_and_rank_classes():
    assert module_key("layers.12.attention.wq") == "layers.*.attention.wq" and module_key("") == "-"
    assert module_key("block2.fc") == "block2.fc"
    axes = {"tp": [[0, 1, 2], [3, 4, 5]], "dp": [[0, 3], [1, 4], [2, 5]]}
    # first or not, as a fake world classes ranks: the class of tp's last member at tp 3 is its middle one's
    assert [rank_class(r, axes) for r in (0, 1, 2, 5)] == ["dp=first, tp=first", "dp=first, tp=other",
                                                           "dp=first, tp=other", "dp=other, tp=other"]
    # in order where the calls on an axis tell its members apart (a pipeline's sends): ends and the middles' parity
    pp = {"pp": [[0, 1, 2, 3, 4]]}
    assert [rank_class(r, pp, frozenset({"pp"})) for r in range(5)] == [
        "pp=first", "pp=middle 1", "pp=middle 0", "pp=middle 1", "pp=last"]


# -- a budget fitted at depths 2, 3, 4 holds at 8; ten planted regressions fail it ---------------

REGRESSIONS = {
    # name: (job, a one-line change, the entry that must move)
    "dropped backward all-gather": ("budgeted.py", ("fully_shard(m, mesh=mesh[\"dp\"], mp_policy=policy)",
                                                    "fully_shard(m, mesh=mesh[\"dp\"], mp_policy=policy, "
                                                    "reshard_after_forward=False)"),
                                    "dp all_gather backward float32 -"),
    "per-parameter collective in clipping": ("budgeted.py", ("        loss.backward()\n", "        loss.backward()\n"
                                                             "        norms = [p.grad.full_tensor().norm() for p in "
                                                             "model.parameters()]\n"), "all_gather other float32 -"),
    "extra all-reduce": ("budgeted.py", ("        dist.all_reduce(logged, group=log[\"dp\"])\n",
                                         "        dist.all_reduce(logged, group=log[\"dp\"])\n"
                                         "        dist.all_reduce(logged, group=log[\"dp\"])\n"),
                         "dp all_reduce other float32 -"),
    "collective on the wrong axis": ("budgeted.py", ("group=log[\"dp\"])", "group=log[\"tp\"])"),
                                     "tp all_reduce other float32 -"),
    "fp32 reduce where the budget has bf16": ("budgeted.py", ("policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)",
                                                              "policy = MixedPrecisionPolicy(reduce_dtype=torch.float32)"),
                                              "dp reduce_scatter backward bfloat16 -"),
    "group creation reordered": ("budgeted.py", ("LOG_AXES = (\"dp\", \"tp\")", "LOG_AXES = (\"tp\", \"dp\")"),
                                 "group creation order"),
    "TP switched to SP": ("budgeted.py", ("mesh[\"tp\"], use_seq_parallel=False", "mesh[\"tp\"], use_seq_parallel=True"),
                          "tp reduce_scatter forward float32"),
    "changed DDP bucket size": ("ddp.py", ("\"--bucket-cap-mb\", type=float, default=0.2)",
                                           "\"--bucket-cap-mb\", type=float, default=0.5)"),
                                "world all_reduce backward float32 -"),
    "missing P2P send/recv pair": ("pipelining.py", ("\"--microbatches\", type=int, default=4)",
                                                     "\"--microbatches\", type=int, default=2)"), "send other float32"),
    "changed all-to-all split": ("moe_a2a.py", ("\"--hot-weight\", type=int, default=7)",
                                                "\"--hot-weight\", type=int, default=6)"),
                                 "all_to_all"),
}

BUDGETS = {
    # job: (trace options, job arguments, --vary)
    "budgeted.py": (["--fake-world", "4", "--ranks", "0"], ["--layers", "{layers}", "--steps", "4"], ["layers=2,3,4"]),
    "ddp.py": (["--fake-world", "2", "--ranks", "0"], ["--steps", "4"], []),
    "pipelining.py": (["--fake-world", "2", "--ranks", "0"], ["--steps", "4", "--schedule", "1f1b"], []),
    "moe_a2a.py": (["--nproc-per-node", "2"], ["--steps", "4"], []),  # a fake world assumes the splits
}


@pytest.fixture(scope="module")
def budgets(tmp_path_factory):
    """job -> (its copy, its budget file): each fitted once, through the command line, two at a time (a
    fake world's server imports on one core)."""
    roots = {job: tmp_path_factory.mktemp(job.removesuffix(".py")) for job in BUDGETS}  # mktemp is not thread-safe

    def fit(job):
        (options, args, vary), root = BUDGETS[job], roots[job]
        copy = root / job
        shutil.copy(JOBS / job, copy)
        shutil.copy(JOBS / "delays.py", root / "delays.py")  # the helper module the jobs import beside them
        budget = root / "budget.toml"
        proc = cli("budget", *options, "--budget", budget, "--out", root / "points",
                   *[f for v in vary for f in ("--vary", v)], "--", copy, *args, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return job, (copy, budget)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(fit, BUDGETS))


def test_a_budget_over_depth_is_verified_and_holds_at_depth_8(budgets, tmp_path):
    copy, path = budgets["budgeted.py"]
    budget = read(path)
    assert budget.varying == ("layers",) and budget.pinned["tp"] == 2 and budget.pinned["world"] == 4
    entry = {(e.key.axis, e.key.op, e.key.phase, e.key.module): e for e in budget.entries}
    # tests/jobs/transformer.py's counts: L blocks re-gathered in the backward, the reduce-scatters of L
    # blocks and the root in bf16, one tp all-reduce of each block's wo and w2 outputs
    assert entry[("dp", "all_gather", "backward", "-")].count.text == "layers"
    assert entry[("tp", "all_reduce", "forward", "layers.*.attention.wo")].count.text == "layers"
    assert all(e.verified for e in budget.entries), [e.key.label() for e in budget.entries if not e.verified]
    proc = cli("check", path, "--out", tmp_path / "check", "--json", "--", copy, "--layers", "8", "--steps", "4",
               timeout=300)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["verdict"] == "holds", proc.stdout[-3000:] + proc.stderr[-2000:]
    assert doc["points"][0]["values"]["layers"] == 8


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_each_planted_regression_fails_the_check_naming_its_entry(budgets, tmp_path, name):
    job, (old, new), moved = REGRESSIONS[name]
    copy, path = budgets[job]
    original = copy.read_text()
    assert original.count(old) == 1, f"the one line to change is not in {job}: {old!r}"
    try:
        copy.write_text(original.replace(old, new))
        args = ["--layers", "2", "--steps", "4"] if job == "budgeted.py" else []
        result = check(path, *([str(copy), *args] if args else []), out=tmp_path / "check")
    finally:
        copy.write_text(original)
    assert result.verdict == "violated" and result.exit_code == 1, result.to_json()
    named = [v.entry for p in result.points for v in p.violations]
    assert any(moved in entry for entry in named), (moved, named)


def test_a_budget_never_passes_a_failed_or_empty_retrace(budgets, tmp_path):
    copy, path = budgets["ddp.py"]
    original = copy.read_text()
    try:
        copy.write_text(original.replace("    args = parse_args()\n", "    args = parse_args()\n    raise SystemExit(0)\n", 1))
        result = check(path, out=tmp_path / "check")
    finally:
        copy.write_text(original)
    assert result.verdict == "not_passed" and result.exit_code == 3 and result.points[0].outcome == "empty"


def test_a_point_the_budget_cannot_serve_is_bad_input(budgets, tmp_path):
    """In-process over a point the fixture traced, and through the command line for what needs no trace."""
    copy, path = budgets["budgeted.py"]
    budget = read(path)
    traced = load(Path(budget.points[0].dir))
    with pytest.raises(UsageError, match="fitted at world = 8 only"):
        compare(replace(budget, pinned={**budget.pinned, "world": 8}), traced, {"layers": 2}, "p")
    with pytest.raises(UsageError, match=r"rank class \[dp=first, tp=first\] of this trace is not in the budget"):
        compare(replace(budget, classes=tuple(c for c in budget.classes if c != "dp=first, tp=first")), traced,
                {"layers": 2}, "p")
    # moe_a2a.py's real trace: its second rank is ep's other member; a budget fitted before classes were first
    # or other named it ep's last
    _, moe_path = budgets["moe_a2a.py"]
    moe = read(moe_path)
    assert any("=other" in c for c in moe.classes), moe.classes
    older = tuple(c.replace("=other", "=last") for c in moe.classes)
    with pytest.raises(UsageError, match=r"as an older meshscope did .*re-fit it with `meshscope check FILE --update`"):
        compare(replace(moe, classes=older), load(Path(moe.points[0].dir)), {}, "p")
    bad = tmp_path / "bad.toml"
    bad.write_text("[budget\n")
    proc = cli_here("check", bad)
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli_here("check", path, "--", copy, "--layerz", "2", "--steps", "4")
    assert proc.returncode == 2 and "'--layerz' does not match the budget's '--layers'" in proc.stderr


def test_the_budget_file_round_trips(budgets, tmp_path):
    _, path = budgets["budgeted.py"]
    budget = read(path)
    write(budget, tmp_path / "again.toml")
    again = read(tmp_path / "again.toml")
    assert again.entries == budget.entries and again.creation == budget.creation and again.vary == budget.vary


def test_an_unlisted_call_kind_is_a_violation(budgets):
    """In-process over the fixture's point: a budget without one of its entries flags that entry's calls
    as unlisted, with their first call named."""
    _, path = budgets["ddp.py"]
    budget = read(path)
    traced = load(Path(budget.points[0].dir))
    dropped = replace(budget, entries=[e for e in budget.entries if e.key.op != "all_reduce"])
    point = compare(dropped, traced, {}, "p")
    assert [v.field for v in point.violations] == ["unlisted"] and "all_reduce backward" in point.violations[0].entry
    assert point.violations[0].first_call.startswith("step 3 call #0: all_reduce on world[0, 1] in backward")


# -- the Python API --------------------------------------------------------------------------------

def test_the_python_api_queries_a_steady_step_and_refuses_a_failed_trace(tmp_path):
    job = trace(str(JOBS / "ddp.py"), "--steps", "4", fake_world=2, ranks="0", out=tmp_path / "ddp")
    # ddp.py's docstring: 4 buckets of 256 KiB per steady step, in the backward, on the world group
    assert job.outcome == "passed" and job.steady_step == 3
    assert job.count(axis="world", op="all_reduce", phase="backward") == 4
    assert job.bytes(op="all_reduce") == 4 * 262144 and job.count(module="no.such.module") == 0
    assert list(job.classes) == ["world=first"]
    raising = tmp_path / "raises.py"
    raising.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\nraise ValueError('x')\n")
    with pytest.raises(TraceFailed, match="the trace is failed: rank 0: ValueError: x"):
        trace(str(raising), fake_world=2, ranks="0", out=tmp_path / "raises")


def _doc_example() -> str:
    text = (ROOT / "docs" / "budget.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/budget.md has no python example"
    return blocks[0]


def test_the_docs_example_runs(tmp_path, monkeypatch):
    """docs/budget.md's pytest test, extracted and run as written (its count is a formula in the layers)."""
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    exec(compile(_doc_example(), "docs/budget.md", "exec"), namespace)  # noqa: S102 - the docs' own example
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert tests
    for test in tests:
        test(tmp_path / test.__name__)


def test_budget_keys_name_what_they_are_about():
    assert Key("tp=first", "tp", "all_reduce", "forward", "float32", "layers.*.attention.wo").label() == \
        "[tp=first] tp all_reduce forward float32 layers.*.attention.wo"
