"""picotron (huggingface/picotron, not on the package index), unmodified: its own ``train.py`` from a checkout
given by path (``MESHSCOPE_PICOTRON``, the folder holding ``train.py``; skipped without it), on the tiny Llama,
tokenizer, documents and config that tests/jobs/picotron_assets.py writes, with tests/jobs/picotron_shim
standing in for flash-attn. picotron pins transformers 4.47 (its requirements.txt): with 5.x its
``model_config.rope_theta`` (model.py:225) is gone from the config and its data loader's
``tokenizer.batch_encode_plus`` (data.py:60) from the tokenizer, so it runs in a venv of its own
(benchmarks/bench_frameworks.py, ``--picotron``) and is skipped where transformers 4.47.0 is not installed.

Its ``use_cpu`` mode allocates on CUDA (utils.py:75, ``get_num_params``; pp_communications.py:30 and :44,
``torch.cuda.synchronize``), so it cannot run on gloo unmodified: its GPU configuration runs in a fake
world, and the oracle is the counts by hand below."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from meshscope.run import zygote

from .helpers import ROOT, cli, only_with, skip_unless_installed

pytestmark = [pytest.mark.frameworks, only_with("transformers", "4.47.0")]

_spec = importlib.util.spec_from_file_location("picotron_assets", ROOT / "tests" / "jobs" / "picotron_assets.py")
picotron_assets = importlib.util.module_from_spec(_spec)  # the job's writer: imports transformers when it writes
_spec.loader.exec_module(picotron_assets)

SHIM = ROOT / "tests" / "jobs" / "picotron_shim"


@pytest.fixture
def train_py() -> Path:
    """picotron's train.py in the checkout ``MESHSCOPE_PICOTRON`` names."""
    checkout = os.environ.get("MESHSCOPE_PICOTRON")
    if not checkout:
        pytest.skip("MESHSCOPE_PICOTRON is not set (a huggingface/picotron checkout, the folder holding train.py)")
    if not (Path(checkout) / "train.py").is_file():
        pytest.fail(f"MESHSCOPE_PICOTRON={checkout}: no train.py there (a huggingface/picotron checkout?)")
    skip_unless_installed("datasets", "wandb", "tokenizers", "safetensors")  # train.py's imports, and the writer's
    return Path(checkout).resolve() / "train.py"


def step_calls(doc: dict, rank: int, step: int) -> Counter:
    """(axis, op, phase, bytes_in, bytes_out) -> calls, in `rank`'s `step`."""
    (mine,) = [r for r in doc["per_rank"] if r["rank"] == rank]
    (found,) = [s for s in mine["steps"] if s["step"] == step]
    return Counter((e["axis"], e["op"], e["phase"], e["bytes_in"], e["bytes_out"]) for e in found["events"])


def by_hand(first_stage: bool) -> Counter:
    """A steady step of one rank at dp 2 x tp 2 x pp 2 (picotron at 59714b1, paths under picotron/ unless named).

    The assets: hidden 64, FFN 128, vocab 256, 4 heads of 16 and 2 KV heads, 4 layers; micro batch 1 x sequence
    32, 2 gradient-accumulation steps (M = 2 microbatches), bf16 (train.py:76: CUDA, not ``use_cpu``).
    Ranks: ``grid = arange(8).view(dp, pp, cp, tp)`` (process_group_manager.py:13), so rank = 4 dp + 2 pp + tp:
    stage 0 is ranks 0, 1, 4, 5, the last stage 2, 3, 6, 7; each stage holds 2 layers
    (pipeline_parallel.py:48-51), stage 0 the embedding (:18), the last the final norm and projection (:22-23).
    An activation or its gradient is 1 x 32 x 64 bf16 = 4,096 B. Bytes are (in, out): a send's out and a recv's in
    are 0.

    * tp, forward, all_reduce 4,096 B: ``ReduceFromModelParallelRegion`` (tp_communications.py:44) after each
      row-parallel linear (tensor_parallel.py:188; ``out_proj`` and ``down_proj``, :39 and :42) and the
      vocab-parallel embedding (:270): per microbatch 2 x 2 + 1 on stage 0, 2 x 2 on the last: 10 and 8.
    * tp, backward, all_reduce 4,096 B: ``CopyToModelParallelRegion.backward`` (tp_communications.py:32) of each
      column-parallel linear (``linear_with_all_reduce``, :104; q, k, v, up, gate: tensor_parallel.py:36-41),
      and the final projection on the last stage (:50): per microbatch 5 x 2, + 1: 20 and 22.
    * tp, forward, all_gather: the final projection's ``gather_output`` (tp_communications.py:62) on the last
      stage, of its 1 x 32 x 128 bf16 shard, 8,192 B in, 16,384 B out: 2.
    * dp, backward, all_reduce: ``DataParallelBucket`` (data_parallel/data_parallel.py:83: one bucket of 25 MB of
      fp32 gradients on ``cp_dp_group``, = dp at cp 1) once, in the last microbatch's backward (only then
      ``require_backward_grad_sync``, pipeline_parallel.py:187, :201, :215; bucket.py:31). The stage's TP-local
      parameters: per layer q 32 x 64, k and v 16 x 64, out 64 x 32, up and gate 64 x 64, down 64 x 64, 2
      norms of 64: 18,560; stage 0 adds the embedding 128 x 64 (45,312, 181,248 B), the last stage the final
      norm 64 and the projection 128 x 64 (45,376, 181,504 B).
    * dp, other, all_reduce 4 B: ``average_loss_across_dp_cp_ranks`` (utils.py:97), on the last stage only.
    * P2P on the world (``batch_isend_irecv`` with global peers, pp_communications.py:29 and :41), 4,096 B each,
      phase other (between the stage's forward and backward calls): 1F1B (pipeline_parallel.py:147-220) with 1
      warm-up microbatch on stage 0 (send), then send + recv (``send_fwd_recv_bwd``), then recv in the
      cool-down: 2 sends, 2 recvs; none of warm-up on the last stage: recv, send + recv
      (``send_bwd_recv_fwd``), send: 2 sends, 2 recvs.
    """
    act = 4096
    p2p = {("world", "send", "other", act, 0): 2, ("world", "recv", "other", 0, act): 2}
    if first_stage:
        return Counter({("tp", "all_reduce", "forward", act, act): 10, ("tp", "all_reduce", "backward", act, act): 20,
                        ("dp", "all_reduce", "backward", 181248, 181248): 1, **p2p})
    return Counter({("tp", "all_reduce", "forward", act, act): 8, ("tp", "all_reduce", "backward", act, act): 22,
                    ("tp", "all_gather", "forward", 8192, 16384): 2,
                    ("dp", "all_reduce", "backward", 181504, 181504): 1,
                    ("dp", "all_reduce", "other", 4, 4): 1, **p2p})


SET_UP = Counter({("pp", "all_reduce", "other"): 1, ("world", "barrier", "other"): 6,
                  ("world", "broadcast", "other"): 4})
"""What step 0 issues besides a steady step: ``get_num_params``' all_reduce on the pp group (utils.py:78), the
barriers of train.py:124, :168 and :217 and checkpoint.py:105, :107 and :112, and two ``broadcast_object_list``
(the tokenizer, data.py:31, and the model config, train.py:164), each a size and a pickle (whose bytes are
the pickle's, not counted here)."""


def test_train_py_dp2_tp2_pp2_in_a_fake_world_of_8(tmp_path, train_py):
    """picotron's GPU configuration at dp 2 x tp 2 x pp 2, 3 steps, every rank traced: the layout is picotron's
    grid (tp fastest, then pp, then dp), steps 1 and 2 of every rank are the hand counts of its stage, and step 0
    adds the set-up's calls."""
    config = picotron_assets.write(tmp_path / "run")
    # The flash-attn stand-in on the ranks' path: a fork server started fresh, not by the tests' zygote, whose
    # children keep the path it started with whatever PYTHONPATH a request gives (run/zygote.py sets only the
    # environment and sys.path[0]).
    path = os.pathsep.join(p for p in (str(SHIM), str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    proc = cli("trace", "--fake-world", 8, "--ranks", ",".join(map(str, range(8))), "--out", tmp_path / "t", "--json",
               "--", train_py, "--config", config, cwd=config.parent, timeout=280,
               env={"PYTHONPATH": path, zygote.ENV: "", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                    "WANDB_MODE": "disabled", "HF_DATASETS_CACHE": str(tmp_path / "hf")})
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["outcome"] == "passed", proc.stderr[-3000:]
    assert doc["layout"]["text"].startswith("tp 2 x pp 2 x dp 2"), doc["layout"]["text"]
    for rank in range(8):
        steady = by_hand(first_stage=rank // 2 % 2 == 0)
        for step in (1, 2):
            assert step_calls(doc, rank, step) == steady, (rank, step)
        set_up = Counter()
        for (axis, op, phase, *_), n in (step_calls(doc, rank, 0) - steady).items():
            set_up[axis, op, phase] += n
        assert set_up == SET_UP and step_calls(doc, rank, 0) >= steady, rank
