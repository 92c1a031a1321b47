"""Timing statistics: percentile definition, critical rank per step, CV verdict, comparison, step timer."""

import math

import pytest

from meshscope.capture.recorder import Capture, active
from meshscope.timing.sampler import method_text, time_steps
from meshscope.timing.statistics import compare, critical_path, percentile, summarize, summarize_table


def test_percentile_is_linear_interpolation_between_order_statistics():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4; h = 3 q / 100
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 95) == pytest.approx(3.85)  # h = 2.85 -> 3 + 0.85 * 1
    numpy = pytest.importorskip("numpy")
    data = [0.3, 1.7, 0.2, 9.0, 4.4, 4.4, 2.0]
    for q in (5, 50, 95, 99):
        assert percentile(data, q) == pytest.approx(float(numpy.percentile(data, q)))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_critical_rank_is_the_max_over_ranks_of_each_step():
    # rank 0 is slow on step 0, rank 1 on step 1: the critical path takes each step's slowest rank,
    # which neither rank's own series shows.
    table = [[5.0, 1.0, 2.0], [1.0, 6.0, 2.5]]
    assert critical_path(table) == [5.0, 6.0, 2.5]
    assert summarize_table(table).median == 5.0
    with pytest.raises(ValueError, match="same number of steps"):
        critical_path([[1.0, 2.0], [1.0]])


def test_summary_figures_and_perf_unstable_verdict():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert (s.n, s.median, s.mean, s.min, s.max) == (4, 2.5, 2.5, 1.0, 4.0)
    assert s.std == pytest.approx(math.sqrt(5 / 3))  # sample std, n - 1
    assert s.cv == pytest.approx(s.std / 2.5) and s.unstable
    steady = summarize([1.00, 1.01, 0.99, 1.00, 1.02])
    assert steady.cv < 0.05 and not steady.unstable
    assert summarize([1.00, 1.01, 0.99, 1.00, 1.02], cv_threshold=0.001).unstable
    assert summarize([2.0]).std == 0.0
    doc = s.to_json()
    assert doc["unstable"] is True and "interpolation" in doc["percentiles"]


def test_comparison_counts_a_difference_only_beyond_the_spread():
    # the chapter's robust effect (Q18): pp_mb1 ~1.14 ms vs pp_mb8 ~6.97 ms, tight spreads -> distinguishable
    mb1 = summarize([1.12e-3, 1.14e-3, 1.15e-3, 1.13e-3, 1.16e-3])
    mb8 = summarize([6.9e-3, 6.97e-3, 7.0e-3, 6.95e-3, 7.05e-3])
    c = compare(mb1, mb8)
    assert c.distinguishable and not c.unstable and c.ratio == pytest.approx(6.97e-3 / 1.14e-3)
    # overlapping [P5, P95]: a 5 % median difference inside a wide spread is PERF_UNSTABLE
    a = summarize([1.0, 1.2, 0.8, 1.1, 0.9])
    b = summarize([1.05, 1.25, 0.85, 1.15, 0.95])
    c = compare(a, b)
    assert not c.distinguishable and c.unstable and "overlap" in c.detail
    # disjoint but one side has a CV above threshold: distinguishable, still flagged unstable
    noisy = summarize([10.0, 14.0, 12.0, 11.0, 13.0])
    c = compare(mb1, noisy)
    assert c.distinguishable and c.unstable and "CV" in c.detail


def test_time_steps_discards_warmup_and_states_its_method():
    calls = []
    t = time_steps(lambda: calls.append(1), 4, warmup=2)
    assert len(calls) == 6 and len(t.host_s) == 4 and t.gpu_s is None and t.steps_per_sample == 1
    assert all(x >= 0 for x in t.host_s) and t.method.startswith("per step: 4 steps after 2 warmup")
    calls.clear()
    t = time_steps(lambda: calls.append(1), 3, warmup=1, steps_per_sample=5)
    assert len(calls) == 20 and len(t.host_s) == 3
    assert "5 back-to-back steps" in t.method
    with pytest.raises(ValueError):
        time_steps(lambda: None, 0)
    with pytest.raises(ValueError, match="CUDA device"):
        time_steps(lambda: None, 2, cuda_graph=True)
    assert "each sample one replay of a CUDA graph of its 20 step(s), captured after 3 eager steps" in \
        method_text(5, 3, 20, True, True)
    assert "eager steps" in method_text(5, 3, 1, False) and "no collective recording" in method_text(5, 3, 1, False)


def test_time_steps_records_nothing_while_sampling():
    seen = []
    with Capture():
        time_steps(lambda: seen.append(active()), 3, warmup=1)
        assert active()  # the capture listens again after sampling
    assert seen == [False] * 4 and not active()
