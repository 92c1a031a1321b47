"""The time of one collective or point-to-point call on a cluster, with the terms that make it up.

A forecast puts a traced job's calls on a cluster it has not run on, so each call's time must come from the
cluster's figures (`cluster`), the call's group and where its ranks sit: a node map (`NodeOf`, rank -> node),
by default rank r on node r // gpus_per_node (`default_nodes`); ``place --from-trace --cluster`` passes the map of
each placement it weighs (`place.forecast_ranking`). A group inside one node moves its bytes over NVLink (``intra-node``); a group over
several nodes crosses the network (``inter-node``), and there a ring's bus bandwidth is the smaller of NVLink's
and the NICs' of the group's ranks on one node: each node passes the whole ring traffic in and out through the
NICs of its own members, one NIC per GPU, so m ranks on a node give m NICs (nccl-tests#309: 8 x 400 Gb/s NICs
peak at 400 GB/s busbw between nodes).

Collectives follow NCCL's cost model (src/graph/tuning.cc, NVIDIA/nccl 5067397c) and pick, as NCCL does, the
fastest of the algorithms and protocols it would consider; every one considered is in the result. With S in
nccl-tests' convention (`predict.alpha_beta.model_bytes`), n ranks, k nodes, B the bus bandwidth above:
  ring     t = base + (steps - net_steps) * nvlink_step + net_steps * net_step + S * busfactor(op, n) / (B * f_p)
           steps = 2(n-1) for all_reduce, else n-1; net_steps = 2(k-1) for all_reduce, else k-1 (tuning.cc's
           nsteps and nInterSteps; broadcast and reduce, which it gives other latencies, as a chain of n-1
           steps); busfactor from `BUS_FACTOR`, 1 for broadcast and reduce (nccl-tests PERFORMANCE.md).
  tree     all_reduce across nodes only: t = base + 2 ((n/k - 1) * nvlink_step + floor(log2 k) * net_step)
           + 2 S / (B * tree_efficiency (0.92) * f_p). A double binary tree: each node is inner in one tree and
           a leaf in the other, each tree carrying S/2, so per direction a node's NICs move S/2 * (2 + 1) + S/2
           = 2 S (the chain inside the node as much on NVLink); tuning.cc converts the tree's bus bandwidth to
           algorithm bandwidth with a factor 0.5, the same 2 S. A ring moves 2 (n-1)/n S: the tree loses on
           bandwidth and wins on latency (2 (n/k - 1) NVLink and 2 log2 k network steps against 2 (n-1)
           steps), so it takes small sizes first and, as nodes grow, larger ones too.
  nvls     all_reduce inside a node with NVLink SHARP: t = 25 us + S * busfactor / nvls_busbw.
LL's bus bandwidth is also capped (tuning.cc llMaxBws). Not modelled: NCCL's tree correction factors for
medium sizes, PAT (one rank per node, all_gather/reduce_scatter), NVLS across nodes (NVLS Tree), CollNet,
the 2-node tree's lighter NIC load, the ring "plateau" factor and the network-overhead floor on ring steps.

Point-to-point calls, which tuning.cc does not model, take one Simple ring step: t = base + step + bytes /
bandwidth of the link between the two ranks (one NIC between nodes). all_to_all is NCCL's grouped send/recv:
a rank sends (n - n_local)/n of its data off-node through its NIC while NVLink carries the rest, at once.
gather and scatter are the root's n-1 point-to-point transfers (torch's NCCL backend issues them so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..core.events import CommEvent, P2P
from ..predict.alpha_beta import BUS_FACTOR, model_bytes
from .cluster import INTER, INTRA, ClusterSpec, NetworkSpec, Protocol

RING_OPS = ("all_reduce", "barrier", "all_gather", "reduce_scatter", "broadcast", "reduce")
"""Ops NCCL runs as ring collectives (a barrier is NCCL's all-reduce of one element)."""


@dataclass(frozen=True, slots=True)
class CollectiveTime:
    """One call's modelled time, and the terms of the model that gave it."""

    seconds: float
    """latency_s + bandwidth_s."""
    link: str
    """``intra-node``, ``inter-node``, or ``none`` for a group of one rank."""
    algorithm: str
    """ring, tree, nvls, p2p (send, recv, gather, scatter), pairwise (all_to_all) or local."""
    protocol: str
    """LL, LL128 or Simple; ``sweep`` where a measured intra-node link replaced the model."""
    latency_s: float
    """The latency terms."""
    bandwidth_s: float
    """The bandwidth term: link_bytes / busbw."""
    size_bytes: int
    """S: the call's size in nccl-tests' convention."""
    link_bytes: float
    """Bytes over the bottleneck link of one rank: S * bus factor for a ring, 2 S for a tree."""
    busbw: float
    """Bytes/s those link bytes move at."""
    nodes: int
    """Nodes the group spans."""
    ranks_per_node: int
    """Fewest of the group's ranks on one of its nodes (for a ring: the NICs a node's crossing uses)."""
    considered: tuple[tuple[str, float], ...] = ()
    """Every algorithm/protocol weighed, with its seconds; the fastest was taken."""

    def to_json(self) -> dict:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["considered"] = dict(self.considered)
        return out


NodeOf = Callable[[int], int]
"""A placement: a global rank of the job (as its trace numbers it) -> the node it sits on. Only which ranks share
a node matters to the model, not the nodes' numbers."""


def node_of(rank: int, gpus_per_node: int) -> int:
    """The node of global rank `rank` under the default placement."""
    return rank // gpus_per_node


def default_nodes(gpus_per_node: int) -> NodeOf:
    """The default placement: rank r on node r // gpus_per_node (`node_of`)."""
    return partial(node_of, gpus_per_node=gpus_per_node)


def span(group, node: NodeOf) -> tuple[int, int]:
    """(nodes the ranks of `group` span, fewest of them on one node), the ranks placed by `node`."""
    counts: dict[int, int] = {}
    for r in group:
        counts[node(r)] = counts.get(node(r), 0) + 1
    return len(counts), min(counts.values(), default=0)


def collective_time(e: CommEvent, cluster: ClusterSpec, node: NodeOf | None = None) -> CollectiveTime:
    """The time of call `e` on `cluster`, from rank e.rank's side, its ranks placed by `node` (default:
    `default_nodes` of the cluster's node size)."""
    net = cluster.network
    if node is None:
        node = default_nodes(net.gpus_per_node)
    if e.op in P2P:
        return _send_recv(e, net, node)
    if len(e.group) <= 1:
        return CollectiveTime(0.0, "none", "local", "", 0.0, 0.0, model_bytes(e), 0.0, 0.0, 1, 1)
    if e.op == "all_to_all":
        return _all_to_all(e, net, node)
    if e.op in ("gather", "scatter"):
        return _gather_scatter(e, net, node)
    if e.op in RING_OPS:
        return _collective(e, net, node)
    raise ValueError(f"no time model for op {e.op!r} (modelled: {', '.join(RING_OPS + P2P)}, all_to_all, "
                     f"gather, scatter)")


def _collective(e: CommEvent, net: NetworkSpec, node: NodeOf) -> CollectiveTime:
    op = "all_reduce" if e.op == "barrier" else e.op
    n, size = len(e.group), model_bytes(e)
    k, local = span(e.group, node)
    link_bytes = size * (BUS_FACTOR[op](n) if op in BUS_FACTOR else 1.0)
    bus = net.intra_busbw if k == 1 else min(net.intra_busbw, local * net.inter_busbw)
    if k == 1 and net.intra_call_latency_s is not None:  # a sweep measured this link: its alpha and busbw
        return _result(INTRA, k, local, size, [("ring", "sweep", net.intra_call_latency_s, link_bytes, bus)])
    cap = net.ll_busbw_cap[min(k, 3) - 1]
    steps, net_steps = (2 * (n - 1), 2 * (k - 1)) if op == "all_reduce" else (n - 1, k - 1)
    candidates = []
    for p in net.protocols:
        net_step = p.tree_net_s if n == k else p.ring_net_s  # one rank per node: tuning.cc takes Tree's NET
        latency = p.ring_base_s + (steps - net_steps) * p.ring_nvlink_s + net_steps * net_step
        candidates.append(("ring", p.name, latency, link_bytes, _capped(p, bus * p.ring_bw_factor, cap)))
        if op == "all_reduce" and k > 1:
            latency = p.tree_base_s + 2 * ((n // k - 1) * p.tree_nvlink_s + (k.bit_length() - 1) * p.tree_net_s)
            tree_bus = bus * net.tree_efficiency * p.tree_bw_factor
            candidates.append(("tree", p.name, latency, 2.0 * size, _capped(p, tree_bus, cap)))
    if op == "all_reduce" and k == 1 and net.nvls_busbw > 0:
        candidates.append(("nvls", "Simple", net.nvls_latency_s, link_bytes, net.nvls_busbw))
    return _result(INTRA if k == 1 else INTER, k, local, size, candidates)


def _capped(p: Protocol, busbw: float, cap: float) -> float:
    return min(busbw, cap) if p.name == "LL" else busbw


def _result(link: str, nodes: int, local: int, size: int, candidates) -> CollectiveTime:
    """The fastest of `candidates` (algorithm, protocol, latency_s, link_bytes, busbw)."""
    timed = [(lat + b / bw, algo, proto, lat, b, bw) for algo, proto, lat, b, bw in candidates]
    seconds, algo, proto, lat, b, bw = min(timed, key=lambda t: t[0])
    considered = tuple((f"{t[1]}/{t[2]}", t[0]) for t in timed) if len(timed) > 1 else ()
    return CollectiveTime(seconds, link, algo, proto, lat, b / bw, size, b, bw, nodes, local, considered)


def _simple(net: NetworkSpec) -> Protocol:
    return next(p for p in net.protocols if p.name == "Simple")


def _p2p_latency(net: NetworkSpec, crosses: bool) -> tuple[str, float]:
    """One Simple ring step on the link: NCCL's base latency and one hop (tuning.cc has no p2p model)."""
    if not crosses and net.intra_call_latency_s is not None:
        return "sweep", net.intra_call_latency_s
    p = _simple(net)
    return "Simple", p.ring_base_s + (p.ring_net_s if crosses else p.ring_nvlink_s)


def _send_recv(e: CommEvent, net: NetworkSpec, node: NodeOf) -> CollectiveTime:
    if e.peer is None:
        raise ValueError(f"rank {e.rank}'s {e.op} #{e.seq} names no peer")
    size = model_bytes(e)
    crosses = node(e.rank) != node(e.peer)
    proto, latency = _p2p_latency(net, crosses)
    bw = net.inter_busbw if crosses else net.intra_busbw  # nccl-tests sendrecv: busbw = algbw
    link_bytes = size * BUS_FACTOR["sendrecv"](2)
    return CollectiveTime(latency + link_bytes / bw, INTER if crosses else INTRA, "p2p", proto, latency,
                          link_bytes / bw, size, link_bytes, bw, 1 + crosses, 1)


def _split_bytes(total: int, splits, group, mine: int, node: NodeOf) -> tuple[float, float]:
    """(bytes to or from ranks of my node other than me, to or from other nodes) of one direction of an
    all_to_all moving `total` bytes: by its splits (rows per member) where known, else evenly."""
    n = len(group)
    if splits and len(splits) == n:
        per = [total * s / sum(splits) if sum(splits) else 0.0 for s in splits]
    else:
        per = [total / n] * n
    home = node(mine)
    on = sum(b for r, b in zip(group, per) if r != mine and node(r) == home)
    off = sum(b for r, b in zip(group, per) if node(r) != home)
    return on, off


def _all_to_all(e: CommEvent, net: NetworkSpec, node: NodeOf) -> CollectiveTime:
    size = model_bytes(e)
    k, local = span(e.group, node)
    sent = _split_bytes(e.bytes_in, e.input_splits, e.group, e.rank, node)
    received = _split_bytes(e.bytes_out, e.output_splits, e.group, e.rank, node)
    on, off = max(sent[0], received[0]), max(sent[1], received[1])  # the heavier direction bounds the time
    proto, latency = _p2p_latency(net, k > 1)
    intra, inter = on / net.intra_busbw, off / net.inter_busbw  # NVLink and the NIC work at once
    b, bw = (off, net.inter_busbw) if inter >= intra and off > 0 else (on, net.intra_busbw)
    return CollectiveTime(latency + max(intra, inter), INTER if k > 1 else INTRA, "pairwise", proto, latency,
                          max(intra, inter), size, b, bw, k, local)


def _gather_scatter(e: CommEvent, net: NetworkSpec, node: NodeOf) -> CollectiveTime:
    """The root's side: it receives (gather) or sends (scatter) one piece per other rank, NVLink pieces and
    NIC pieces at once; the call is taken to last as long on every rank."""
    n = len(e.group)
    root = e.peer if e.peer is not None else e.group[0]
    piece = e.bytes_in if e.op == "gather" else e.bytes_out
    k, local = span(e.group, node)
    on = sum(1 for r in e.group if r != root and node(r) == node(root))
    off = n - 1 - on
    proto, latency = _p2p_latency(net, off > 0)
    intra, inter = on * piece / net.intra_busbw, off * piece / net.inter_busbw
    b, bw = (off * piece, net.inter_busbw) if inter >= intra and off > 0 else (on * piece, net.intra_busbw)
    return CollectiveTime(latency + max(intra, inter), INTER if off > 0 else INTRA, "p2p", proto, latency,
                          max(intra, inter), piece * n, b, bw, k, local)
