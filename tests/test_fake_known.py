"""What a ``--fake-tensors`` rank can know (`trace.fake.known`), in-process under FakeTensorMode and the rank's
recorder, on torch's fake process group as rank 1 of 4: each value by hand."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode

from meshscope.trace.fake import values
from meshscope.trace.fake.known import AS_THIS_RANK


@pytest.fixture
def rank1_of_4():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=1, world_size=4, store=FakeStore())
    calls = []
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), values.recorder(lambda *call: calls.append(call) or len(calls)):
            yield calls
    finally:
        dist.destroy_process_group()


def _answered() -> dict:
    return {(key[2]): n for key, n in values.reads.counts.items()}


def test_balanced_routing_counts_are_its_own_values(rank1_of_4):
    """torchtitan's forced balance: token i's k-th choice is expert (i * k + j) % experts; 6 tokens x top 2 over 4
    experts is 3 per expert, and sorting by expert is the stable order of those choices."""
    before = _answered()
    choices = (torch.arange(6 * 2) % 4).view(6, 2)
    counts = torch.bincount(choices.flatten(), minlength=4)
    order = torch.argsort(choices.flatten(), stable=True)
    assert counts.tolist() == [3, 3, 3, 3]
    assert order.tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    assert int(counts.sum()) == 12 and bool((counts == 3).all())
    assert _answered() == before  # values, not answers: nothing counted


def test_what_follows_from_the_model_or_a_draw_stays_unknown(rank1_of_4):
    weights = torch.nn.Linear(8, 4)(torch.ones(6, 8))  # the model's arithmetic
    with pytest.raises(DynamicOutputShapeException):
        torch.bincount(weights.argmax(dim=-1))
    with pytest.raises(DynamicOutputShapeException):
        torch.bincount(torch.randint(0, 4, (12,)))  # a fake world's draws are not the job's
    total = torch.zeros(4)
    total.add_(weights.sum(dim=0))  # an unknown operand written into a known tensor
    before = _answered().get("1.0", 0)
    assert total.sum().item() == 1.0 and _answered()["1.0"] == before + 1  # a placeholder, counted


def test_a_collective_of_known_values_holds_every_member_as_this_rank(rank1_of_4):
    """Rank 1 of 4 sends [5, 6, 7, 8] (one element to each member); were every member rank 1, each would send
    rank 1 its second element: 6 from all four. An all-reduce's sum of [2, 3] is [8, 12], an all-gather repeats;
    what is read of them is an answer, counted (it may size calls). (Tensors of one element are FakeTensorMode's
    own constants, which it answers itself, stale after a collective: torch 2.13.)"""
    received = torch.empty(4, dtype=torch.int64)
    dist.all_to_all_single(received, torch.tensor([5, 6, 7, 8]))
    summed = torch.tensor([2, 3])
    dist.all_reduce(summed)
    gathered = torch.empty(8, dtype=torch.int64)
    dist.all_gather_into_tensor(gathered, torch.tensor([1, 2]))
    before = dict(_answered())
    assert received.tolist() == [6, 6, 6, 6]
    assert summed.tolist() == [8, 12]
    assert gathered.tolist() == [1, 2] * 4
    after = _answered()
    assert after[f"6 ({AS_THIS_RANK})"] - before.get(f"6 ({AS_THIS_RANK})", 0) == 4
    assert after[f"12 ({AS_THIS_RANK})"] - before.get(f"12 ({AS_THIS_RANK})", 0) == 1
    lists = [torch.zeros(1, dtype=torch.int64) for _ in range(4)]
    dist.all_gather(lists, torch.tensor([3]))  # a collective the rule does not fill: its outputs are not known
    before = _answered().get("1", 0)
    assert int(lists[2]) == 1 and _answered()["1"] == before + 1
