"""NCCL kernel fingerprints on synthetic torch.profiler Chrome traces (no GPU needed)."""

import json

import pytest
import torch

from meshscope.core.events import CommEvent
from meshscope.timing.kernels import (
    classify,
    comm_counts,
    comm_records,
    compare_fingerprints,
    expected_kernels,
    fingerprint,
    kernel_seconds_per_step,
    profile_call,
)

NAMES = {
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "AllReduce",
    "ncclDevKernel_AllGather_RING_LL": "AllGather",
    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL": "ReduceScatter",
    "ncclDevKernel_SendRecv": "SendRecv",
    "ncclDevKernel_Broadcast_RING_LL": "Broadcast",
    "ncclDevKernel_Reduce_Sum_f32_RING_LL": "Reduce",
    "ncclKernel_AllReduce_RING_LL_Sum_float": "AllReduce",  # older NCCL
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t": "SendRecv",
    "ncclAllReduceRingLLKernel_sum_f32": "AllReduce",  # NCCL 2.4-2.6
    "ncclSendRecvKernel_copy_i8": "SendRecv",
    "ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_f32": "AllReduce",  # symmetric memory: RS/AG are phases
    "ncclSymDevKernel_AllGather_LL": "AllGather",
    "ncclSymkDevKernel_ReduceScatter_LD_sum_bf16": "ReduceScatter",
    "void ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "AllGather",
    "ncclDevKernel_Generic": "NcclOther",
}


@pytest.mark.parametrize("name,family", NAMES.items())
def test_classify_kernel_names_across_nccl_versions(name, family):
    assert classify(name) == family


def test_non_nccl_kernels_are_not_classified():
    for name in ("void at::native::vectorized_elementwise_kernel<4>", "ampere_sgemm_128x64_tn", "Memcpy DtoD"):
        assert classify(name) is None


def _kernel(name, ts=0):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": 5, "args": {"External id": ts}}


def _comm(collective, ranks, in_splits="[]", out_splits="[]", nelems=16):
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 0, "dur": 1,
            "args": {"Collective name": collective, "dtype": "Float", "In msg nelems": nelems,
                     "Out msg nelems": nelems, "Group size": 2, "In split size": in_splits,
                     "Out split size": out_splits, "Process Group Name": "1", "Process Group Ranks": ranks}}


def test_fingerprint_counts_only_gpu_kernels_by_family(tmp_path):
    # an EP rank of the chapter: 1 DP AllReduce and 4 all-to-all, which NCCL runs as SendRecv kernels
    events = [_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1)] + [_kernel("ncclDevKernel_SendRecv", t) for t in range(2, 6)]
    events += [_kernel("ampere_sgemm_128x64_tn", 9), {"ph": "X", "cat": "Kernel", "name": "ncclDevKernel_SendRecv"}]
    events += [{"ph": "X", "cat": "cpu_op", "name": "ncclDevKernel_AllGather_RING_LL"},  # not a GPU kernel
               {"ph": "M", "name": "process_name", "args": {"name": "python"}}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert fingerprint(path) == {"AllReduce": 1, "SendRecv": 5}
    assert fingerprint(json.loads(path.read_text())) == fingerprint(events)


def _ev(op, rank=0, seq=0, group=(0, 1), axis="tp", b=1024, peer=None):
    bout = 0 if op == "send" else b
    bin_ = 0 if op in ("recv", "barrier") else b
    return CommEvent(rank, seq, op, axis, group, "forward", "float32", bin_, bout, peer=peer)


def test_kernel_seconds_are_cut_into_steps_in_start_order():
    def k(name, ts, dur):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}

    ar, rs = "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"
    # 3 steps of 2 NCCL kernels each, listed out of order; the first waits 900 us for a late peer
    trace = [k(rs, 310, 20), k(ar, 0, 900), k(ar, 1000, 30), k(ar, 2000, 10), k("sgemm", 5, 70),
             k(rs, 2100, 15), k(rs, 1100, 25)]
    assert kernel_seconds_per_step(trace, 3) == pytest.approx([920e-6, 55e-6, 25e-6])
    assert kernel_seconds_per_step(trace, 4) == pytest.approx([1000e-6 / 4] * 4)  # 6 kernels do not cut into 4


def test_expected_kernels_follow_the_chapter_fingerprint_table():
    tp = [_ev("all_reduce", seq=i) for i in range(4)]
    assert expected_kernels(tp) == {"AllReduce": 4}
    sp = [_ev("all_reduce", axis="dp", group=(0, 2)), _ev("all_reduce", axis="dp", group=(0, 2), seq=1),
          _ev("reduce_scatter"), _ev("all_gather", seq=1), _ev("reduce_scatter", seq=2), _ev("all_gather", seq=3)]
    assert expected_kernels(sp) == {"AllReduce": 2, "AllGather": 2, "ReduceScatter": 2}
    # pp_mb8 on stage 0: 8 activation sends + 8 gradient recvs, each its own kernel -> 16 SendRecv
    pp = [_ev("send", seq=i, peer=1) for i in range(8)] + [_ev("recv", seq=8 + i, peer=1) for i in range(8)]
    assert expected_kernels(pp + [_ev("all_reduce", axis="dp", group=(0, 2))]) == {"AllReduce": 1, "SendRecv": 16}
    ep = [_ev("all_to_all", seq=i, axis="ep") for i in range(4)]
    assert expected_kernels(ep) == {"SendRecv": 4}
    assert expected_kernels([_ev("barrier"), _ev("broadcast", seq=1)]) == {"AllReduce": 1, "Broadcast": 1}


def test_a_batched_send_recv_pair_is_one_kernel():
    send, recv, lone = _ev("send", peer=1), _ev("recv", seq=1, peer=1), _ev("send", seq=2, peer=1)
    assert expected_kernels([send, recv, lone]) == {"SendRecv": 3}
    assert expected_kernels([send, recv, lone], batches=[(send, recv)]) == {"SendRecv": 2}
    with pytest.raises(ValueError, match="only send/recv"):
        expected_kernels([send, _ev("all_reduce")], batches=[(send, _ev("all_reduce"))])


def test_compare_fingerprints_names_each_differing_family():
    assert compare_fingerprints({"AllReduce": 1, "SendRecv": 4}, {"SendRecv": 4, "AllReduce": 1}) == []
    diff = compare_fingerprints({"AllReduce": 1, "SendRecv": 4}, {"AllReduce": 1, "SendRecv": 3})
    assert diff == ["SendRecv: predicted 4 kernels, profiled 3"]
    assert compare_fingerprints({}, {"NcclOther": 1}) == ["NcclOther: predicted 0 kernels, profiled 1"]


def test_comm_metadata_tells_ep_all_to_all_from_pp_p2p():
    # both launch ncclDevKernel_SendRecv; the record_param_comms metadata says which is which
    trace = {"traceEvents": [
        _comm("all_to_allv", "[0, 2]", "[56, 8]", "[56, 56]"), _comm("send", "[0, 4]"), _comm("recv", "[0, 4]"),
        _comm("allreduce", "[0, 1]"), _comm("wait", ""), _kernel("ncclDevKernel_SendRecv")]}
    records = comm_records(trace)
    assert [r.op for r in records] == ["all_to_all", "send", "recv", "all_reduce", "wait"]
    a2a = records[0]
    assert (a2a.group_ranks, a2a.in_splits, a2a.out_splits, a2a.in_nelems) == ((0, 2), (56, 8), (56, 56), 16)
    assert records[1].in_splits == () and records[4].group_ranks is None
    assert comm_counts(records) == {"all_to_all": {(0, 2): 1}, "send": {(0, 4): 1}, "recv": {(0, 4): 1},
                                    "all_reduce": {(0, 1): 1}}


def test_profile_call_exports_a_chrome_trace_on_cpu(tmp_path):
    path = tmp_path / "prof" / "rank0.json"
    out = profile_call(lambda: torch.ones(64, 64) @ torch.ones(64, 64), path, "cpu")
    trace = json.loads(path.read_text())
    assert any("mm" in e.get("name", "") for e in trace["traceEvents"])
    assert out == {"trace": str(path), "kernels": {}, "comm": []}  # no GPU, and gloo/CPU emit no comm records
