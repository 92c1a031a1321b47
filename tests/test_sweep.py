"""Collective sweep: nccl-tests bus bandwidth, the alpha-beta fit, ledger time prediction, a real gloo sweep."""

import json

import pytest

from meshscope.core.errors import UsageError
from meshscope.core.events import CommEvent
from meshscope.predict.alpha_beta import OPS, busbw, fit_alpha_beta, predict_time
from meshscope.timing.sweep import SweepConfig, parse_sizes, render

from .helpers import cli_here


def test_busbw_uses_nccl_tests_factors():
    mib, second = 1 << 20, 1.0
    assert busbw("all_reduce", mib, second, 4) == pytest.approx(mib * 2 * 3 / 4)
    assert busbw("all_reduce", mib, second, 2) == pytest.approx(mib)  # 2(n-1)/n = 1 at n = 2
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw(op, mib, second, 8) == pytest.approx(mib * 7 / 8)
    assert busbw("sendrecv", mib, 0.5, 8) == pytest.approx(2 * mib)  # busbw = algbw


def test_sizes_parse_and_bad_configs_are_usage_errors():
    assert parse_sizes("4096,64K,1M,1GiB") == (4096, 65536, 1 << 20, 1 << 30)
    for bad in ("1X", "-4", "", "K"):
        with pytest.raises(UsageError):
            parse_sizes(bad)
    SweepConfig(world=4, tp=2, axis="tp", sizes=(1024,)).validate()
    with pytest.raises(UsageError, match="split into 4"):
        SweepConfig(world=4, sizes=(1000,)).validate()  # 250 floats do not split over 4 ranks
    with pytest.raises(UsageError, match="groups of 1"):
        SweepConfig(world=2, axis="tp").validate()
    with pytest.raises(UsageError, match="valid ops"):
        SweepConfig(ops=("all_reduce", "gather")).validate()
    with pytest.raises(UsageError, match="not a group"):
        SweepConfig(axis="xp").validate()


def test_fit_recovers_alpha_and_beta():
    alpha, beta = 50e-6, 1 / 200e9  # 50 us, 200 GB/s
    sizes = [1024 << k for k in range(17)]
    fit = fit_alpha_beta("all_reduce", 2, sizes, [alpha + beta * s for s in sizes])
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9) and fit.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
    assert max(abs(r) for r in fit.rel_err) < 1e-9
    # +-3 % multiplicative noise: parameters within a few percent, residuals report the noise
    noisy = [(alpha + beta * s) * (1.03 if k % 2 else 0.97) for k, s in enumerate(sizes)]
    fit = fit_alpha_beta("all_reduce", 2, sizes, noisy)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.05) and fit.beta_s_per_byte == pytest.approx(beta, rel=0.05)
    assert 0.02 < max(abs(r) for r in fit.rel_err) < 0.05
    with pytest.raises(ValueError):
        fit_alpha_beta("all_reduce", 2, [1024, 1024], [1.0, 1.0])


def test_predict_time_sums_alpha_beta_per_rank_and_takes_the_critical_rank():
    ar = fit_alpha_beta("all_reduce", 2, [1000, 2000], [1.0 + 1000e-3, 1.0 + 2000e-3])  # alpha 1 s, beta 1 ms/B
    a2a = fit_alpha_beta("all_to_all", 2, [1000, 2000], [2.0 + 1000e-3, 2.0 + 2000e-3])
    p2p = fit_alpha_beta("sendrecv", 2, [1000, 2000], [0.5 + 1000e-3, 0.5 + 2000e-3])

    def ev(rank, op, b_in, b_out, group=(0, 1), peer=None):
        return CommEvent(rank, 0, op, "ep", group, "forward", "float32", b_in, b_out, peer=peer)

    events = [ev(0, "all_reduce", 100, 100), ev(1, "all_reduce", 100, 100),
              ev(0, "all_to_all", 300, 500), ev(1, "all_to_all", 500, 300),  # uneven: larger direction counts
              ev(0, "send", 200, 0, group=(0, 2), peer=2)]  # pp group of 2 elsewhere: looked up by op
    t = predict_time(events, [ar, a2a, p2p])
    assert t.per_rank_s[0] == pytest.approx((1 + 0.1) + (2 + 0.5) + (0.5 + 0.2))
    assert t.per_rank_s[1] == pytest.approx((1 + 0.1) + (2 + 0.5))
    assert t.critical_s == pytest.approx(t.per_rank_s[0])
    with pytest.raises(ValueError, match="no fit for all_gather"):
        predict_time([ev(0, "all_gather", 100, 200)], [ar])


def test_sweep_on_two_gloo_ranks_through_the_cli(tmp_path):
    out = tmp_path / "sw"
    proc = cli_here("sweep", "--world", 2, "--sizes", "1K,8K,64K", "--iters", 3, "--warmup", 1, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert json.loads((out / "sweep.json").read_text()) == doc
    assert doc["groups"] == [[0, 1]] and doc["clock"] == "host" and "critical rank" in doc["timing"]
    assert [(p["op"], p["bytes"]) for p in doc["points"]] == [(op, s) for op in OPS for s in (1024, 8192, 65536)]
    factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5, "sendrecv": 1.0}
    for p in doc["points"]:
        assert p["time_s"] > 0 and p["algbw_GBps"] == pytest.approx(p["bytes"] / p["time_s"] / 1e9)
        assert p["busbw_GBps"] == pytest.approx(p["algbw_GBps"] * factor[p["op"]])
    assert [(f["op"], f["group_size"], len(f["rel_err"])) for f in doc["fits"]] == [(op, 2, 3) for op in OPS]
    text = render(doc).splitlines()
    assert len(text) == 2 + 15 + 5 and text[-1].startswith("fit of wall time, sendrecv n=2: alpha")
    assert "kernel_fits" not in doc  # kernel time needs CUDA graphs on GPUs
    bad = cli_here("sweep", "--world", 2, "--axis", "tp", "--json")
    assert bad.returncode == 2 and bad.stdout == "" and "groups of 1" in bad.stderr


def test_kernel_time_fits_are_preferred_and_shown(tmp_path):
    from meshscope.timing.profiling import load_fits

    wall = fit_alpha_beta("all_reduce", 2, [1024, 2048], [20e-6, 22e-6])
    kernel = fit_alpha_beta("all_reduce", 2, [1024, 2048], [6e-6, 7e-6], basis="kernel")
    doc = {"config": {"axis": "world"}, "groups": [[0, 1]], "backend": "nccl", "clock": "gpu", "timing": "t",
           "points": [{"op": "all_reduce", "bytes": 1024, "time_s": 20e-6, "cv": 0.01, "unstable": False,
                       "algbw_GBps": 0.05, "busbw_GBps": 0.05, "kernel_time_s": 6e-6}],
           "fits": [wall.to_json()], "kernel_fits": [kernel.to_json()]}
    (tmp_path / "sweep.json").write_text(json.dumps(doc))
    [fit] = load_fits(str(tmp_path / "sweep.json"))
    assert (fit.basis, fit.alpha_s) == ("kernel", pytest.approx(5e-6))
    text = render(doc).splitlines()
    assert text[1].endswith("kernel us") and text[2].split()[-1] == "6.0"
    assert text[-1].startswith("fit of kernel time, all_reduce n=2: alpha 5.0 us")
    del doc["kernel_fits"]
    (tmp_path / "sweep.json").write_text(json.dumps(doc))
    assert load_fits(str(tmp_path / "sweep.json"))[0].basis == "wall"
