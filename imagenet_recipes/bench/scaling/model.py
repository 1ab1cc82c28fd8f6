"""The scaling model of data-parallel training: predicted img/s and scaling efficiency.

The model, in one paragraph. A device computes one step of `batch` images in T1 (taken from a
published or measured single-device throughput; forward ~1/3, backward ~2/3 of it). Gradients
of S bytes are then averaged across N devices on M nodes; that collective costs T_comm from the
alpha-beta model (alpha: latency per message step, beta = 1/bandwidth per byte) for one of three
algorithms: flat ring all-reduce, hierarchical all-reduce, or a sharded parameter server. DDP
and Horovod cut the gradients into buckets that are reduced while backward is still running, so
part of T_comm hides behind backward; what is left is added to the step. Throughput is
N * batch / (T1 + exposed comm), efficiency is that over N times the single-device throughput.
Optional ceilings (input pipeline per node, shared storage) cap the result when given.

The hardware it is given and the published results it is checked against are in cases.py; its
tables and the RESULTS.md block in report.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

GB = 1e9                 # bandwidths are decimal, as vendors quote them
GBIT = 1e9 / 8
MIB = 2 ** 20            # bucket sizes are binary, as the frameworks define them
US = 1e-6

# --------------------------------------------------------------------------------------------
# Model sizes. Counted with torchvision 0.29 on the meta device (`--check-params` recounts them;
# the CLI recounts any arch not listed). Inception V3 without its auxiliary head, as trained
# by tf_cnn_benchmarks. The second number is the parameter-tensor count (messages for a
# parameter server that ships each tensor separately).
PARAMS: Dict[str, Tuple[int, int]] = {
    "resnet18": (11_689_512, 62),
    "resnet50": (25_557_032, 161),
    "resnet101": (44_549_160, 314),
    "resnet152": (60_192_808, 467),
    "vgg16": (138_357_544, 32),
    "inception_v3": (23_834_568, 284),
}
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}


def torchvision_params(arch: str) -> Tuple[int, int]:
    """(parameter count, tensor count) of a torchvision model, built on the meta device."""
    import torch
    import torchvision

    kwargs = {"aux_logits": False, "init_weights": False} if arch == "inception_v3" else {}
    with torch.device("meta"):
        model = getattr(torchvision.models, arch)(weights=None, **kwargs)
    tensors = list(model.parameters())
    return sum(t.numel() for t in tensors), len(tensors)


def params(arch: str) -> Tuple[int, int]:
    if arch not in PARAMS:
        PARAMS[arch] = torchvision_params(arch)
    return PARAMS[arch]


def check_params() -> List[str]:
    """Where the PARAMS table and torchvision's models disagree (empty: they agree)."""
    problems = []
    for arch, expected in PARAMS.items():
        got = torchvision_params(arch)
        if got != expected:
            problems.append(f"{arch}: table {expected}, torchvision {got}")
    return problems


# --------------------------------------------------------------------------------------------
# Inputs
@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s, one direction, per device (intra) or per NIC (inter)
    latency: float    # seconds per message step (the alpha of the alpha-beta model)


@dataclass(frozen=True)
class Hardware:
    name: str
    devices_per_node: int
    intra: Link            # device <-> device inside a node
    inter: Link            # one NIC
    nics_per_node: int
    overlap: float = 1.0   # share of backward during which buckets can be reduced (0..1)
    collective_latency: float = 8.4 * US  # fixed cost per collective call (NCCL base latency)
    source: str = ""


@dataclass(frozen=True)
class Workload:
    arch: str
    batch: int                     # images per device per micro-batch
    img_s_1: float                 # single-device throughput, images/s
    grad_dtype: str = "fp32"       # dtype the gradients travel in
    bucket_bytes: Optional[float] = 25 * MIB  # DDP default; None: one message per tensor
    backward_fraction: float = 2 / 3
    accum: int = 1                 # micro-batches per all-reduce (gradient accumulation)

    @property
    def step_time_1(self) -> float:
        return self.batch / self.img_s_1

    @property
    def grad_bytes(self) -> float:
        return params(self.arch)[0] * DTYPE_BYTES[self.grad_dtype]

    @property
    def n_buckets(self) -> int:
        if self.bucket_bytes is None:
            return params(self.arch)[1]
        return max(1, math.ceil(self.grad_bytes / self.bucket_bytes))


# --------------------------------------------------------------------------------------------
# Collectives (alpha-beta). p: ranks, size: bytes per rank, link: the slowest link on the path.
def ring_allreduce_time(p: int, size: float, link: Link) -> float:
    """Ring all-reduce: a reduce-scatter then an all-gather, each p-1 steps. Every step moves
    size/p bytes over every link at once, so each rank sends 2(p-1)/p * size in total (the
    bandwidth term, independent of p for large p) and waits 2(p-1) times for a message to
    arrive (the latency term, linear in p)."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) / p * size / link.bandwidth + 2 * (p - 1) * link.latency


def flat_ring_time(n: int, g: int, size: float, hw: Hardware) -> float:
    """One ring through all n devices (NCCL's default, Horovod's and DDP's). Inside a node it
    runs on NVLink/PCIe; between nodes it crosses a NIC. With k NICs per node NCCL runs k rings
    side by side, one per NIC, so the node-crossing bandwidth is k NICs. The ring is as fast as
    its slowest hop; of its 2(n-1) steps, 2(m-1) pay the network latency."""
    if n <= 1:
        return 0.0
    m = math.ceil(n / g)
    if m == 1:
        return ring_allreduce_time(n, size, hw.intra)
    bandwidth = min(hw.intra.bandwidth, hw.nics_per_node * hw.inter.bandwidth)
    steps_inter = 2 * (m - 1)
    steps_intra = 2 * (n - 1) - steps_inter
    return (2 * (n - 1) / n * size / bandwidth
            + steps_intra * hw.intra.latency + steps_inter * hw.inter.latency)


def hierarchical_time(n: int, g: int, size: float, hw: Hardware, leaders_only: bool = False
                      ) -> float:
    """Hierarchical all-reduce: (1) reduce-scatter inside each node over NVLink, so each of
    the g local devices owns 1/g of the node's sum; (2) all-reduce across the m nodes;
    (3) all-gather inside the node. In (2) the g shards travel as g parallel rings that share
    the node's NICs (all NICs busy), or, with leaders_only, the node first reduces to one
    leader, which all-reduces the whole gradient with the other leaders through a single NIC
    and broadcasts it back (a pipelined reduce/broadcast costs what reduce-scatter/all-gather
    cost, so only the NIC count changes)."""
    if n <= 1:
        return 0.0
    m = math.ceil(n / g)
    if m == 1:
        return ring_allreduce_time(n, size, hw.intra)
    intra_half = (g - 1) / g * size / hw.intra.bandwidth + (g - 1) * hw.intra.latency
    nic_bandwidth = hw.inter.bandwidth * (1 if leaders_only else hw.nics_per_node)
    inter = 2 * (m - 1) / m * size / nic_bandwidth + 2 * (m - 1) * hw.inter.latency
    return 2 * intra_half + inter


def ps_phases(n: int, g: int, size: float, hw: Hardware, servers: int, colocated: bool = True,
              local_aggregation: bool = True) -> Tuple[float, float]:
    """Synchronous parameter server sharded over k servers -> (push time, pull time). Every
    worker pushes its gradient (1/k to each server), each server sums its shard, then every
    worker pulls the new parameters back. Each phase is limited by the busiest NIC: a server
    receives (later sends) pushers*S/k, a worker node sends (later receives) its pushers' S.
    With local_aggregation the g devices of a node first reduce over NVLink/PCIe and push once
    per node (TF's distributed_replicated), and broadcast the pulled copy afterwards.
    Colocated servers run on worker nodes, so the shard a node serves itself never crosses its
    NIC. With k = m colocated servers the traffic per NIC is 2(m-1)/m * S, the ring's: a fully
    sharded PS is a reduce-scatter + all-gather. With one dedicated server it grows as m * S,
    which is why a PS needs many servers."""
    if n <= 1:
        return 0.0, 0.0
    m = math.ceil(n / g)
    k = max(1, min(servers, m) if colocated else servers)
    per_node = 1 if local_aggregation else min(g, n)
    pushers = m * per_node
    # reduce to one device, later broadcast from it: each about half a ring all-reduce
    intra_half = (ring_allreduce_time(min(g, n), size, hw.intra) / 2
                  if local_aggregation else 0.0)
    node_bandwidth = hw.nics_per_node * hw.inter.bandwidth
    if colocated:
        server_in = (pushers - per_node) * size / k          # its own node's part stays local
        worker_out = per_node * size * ((1 - 1 / k) if k == m else 1.0)
    else:
        server_in = pushers * size / k
        worker_out = per_node * size
    network = max(server_in, worker_out) / node_bandwidth + hw.inter.latency
    if colocated and m == 1:
        network = 0.0                                        # everything stayed on the node
    return intra_half + network, network + intra_half


def ps_time(n: int, g: int, size: float, hw: Hardware, servers: int, colocated: bool = True,
            local_aggregation: bool = True) -> float:
    """Push + pull time of one synchronous PS round (see ps_phases)."""
    return sum(ps_phases(n, g, size, hw, servers, colocated, local_aggregation))


# --------------------------------------------------------------------------------------------
def exposed_comm(t_comm: float, t_backward: float, n_buckets: int, overlap: float) -> float:
    """Communication left after backward ends. Backward produces gradients at a steady rate;
    bucket i can be reduced once it is full, and buckets are reduced one after another. So
    comm hides behind at most `overlap` of backward, and never the last bucket, which is only
    ready when backward ends:
        exposed = max(T_comm / n, T_comm - overlap * T_backward * (1 - 1/n)).
    One bucket, or overlap 0, exposes all of T_comm."""
    if t_comm <= 0:
        return 0.0
    if n_buckets <= 1 or overlap <= 0:
        return t_comm
    return t_comm - min(t_comm, overlap * t_backward) * (1 - 1 / n_buckets)


@dataclass
class Prediction:
    devices: int
    nodes: int
    algo: str
    t_comm: float
    exposed: float
    step_time: float
    img_s: float
    efficiency: float
    capped_by: str = ""


ALGOS = ("ring", "hier", "hier-leaders", "ps")


def comm_time(algo: str, n: int, wl: Workload, hw: Hardware, ps_servers: Optional[int] = None,
              ps_colocated: bool = True, ps_local_aggregation: bool = True
              ) -> Tuple[float, float]:
    """Per-step communication -> (time that can overlap backward, time that cannot). One
    collective per bucket, each paying its own latency. All-reduce buckets can all run during
    backward. A synchronous PS can push during backward, but the pull has to wait until every
    worker has pushed and the servers have summed: it always adds to the step."""
    g = hw.devices_per_node
    buckets = wl.n_buckets
    size = wl.grad_bytes / buckets
    if n <= 1:
        return 0.0, 0.0
    if algo == "ring":
        return buckets * (flat_ring_time(n, g, size, hw) + hw.collective_latency), 0.0
    if algo in ("hier", "hier-leaders"):
        one = hierarchical_time(n, g, size, hw, leaders_only=algo == "hier-leaders")
        return buckets * (one + hw.collective_latency), 0.0
    if algo == "ps":
        servers = ps_servers or math.ceil(n / g)
        push, pull = ps_phases(n, g, size, hw, servers, ps_colocated, ps_local_aggregation)
        return buckets * push, buckets * pull
    raise ValueError(f"unknown algorithm {algo!r} (choose from {', '.join(ALGOS)})")


def predict(wl: Workload, hw: Hardware, n: int, algo: str = "ring", *,
            ps_servers: Optional[int] = None, ps_colocated: bool = True,
            ps_local_aggregation: bool = True, overlap: Optional[float] = None,
            host_img_s_per_node: Optional[float] = None,
            storage_img_s: Optional[float] = None) -> Prediction:
    """Throughput and efficiency of n devices (weak scaling: `batch` per device)."""
    nodes = math.ceil(n / hw.devices_per_node)
    t1 = wl.step_time_1
    hideable, serial = comm_time(algo, n, wl, hw, ps_servers, ps_colocated,
                                 ps_local_aggregation)
    t_comm = hideable + serial
    ov = hw.overlap if overlap is None else overlap
    # Only the last micro-batch's backward can hide the all-reduce.
    exposed = exposed_comm(hideable, wl.backward_fraction * t1, wl.n_buckets, ov) + serial
    step = wl.accum * t1 + exposed
    img_s = n * wl.accum * wl.batch / step
    capped = ""
    if host_img_s_per_node and img_s > nodes * host_img_s_per_node:
        img_s, capped = nodes * host_img_s_per_node, "input pipeline"
    if storage_img_s and img_s > storage_img_s:
        img_s, capped = storage_img_s, "storage"
    return Prediction(n, nodes, algo, t_comm, exposed, step, img_s, img_s / (n * wl.img_s_1),
                      capped)
