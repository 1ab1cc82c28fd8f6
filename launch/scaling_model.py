"""Scaling model for data-parallel training: predicted img/s and scaling efficiency.

    launch/env.sh python launch/scaling_model.py                    # presets + validation table
    launch/env.sh python launch/scaling_model.py --runs runs/bench-cpu  # + this CPU, measured
    launch/env.sh python launch/scaling_model.py --measure-loopback --runs runs/sweep-x
    launch/env.sh python launch/scaling_model.py --predict --preset dgx-a100 --arch resnet50 \\
        --grad-dtype fp32 --img-s 2470 --batch 256 --devices 8 16 64 --algo ring hier ps
    launch/env.sh python launch/scaling_model.py --runs runs/bench-cpu --update-results

The model, in one paragraph. A device computes one step of `batch` images in T1 (taken from a
published or measured single-device throughput; forward ~1/3, backward ~2/3 of it). Gradients
of S bytes are then averaged across N devices on M nodes; that collective costs T_comm from the
alpha-beta model (alpha: latency per message step, beta = 1/bandwidth per byte) for one of three
algorithms: flat ring all-reduce, hierarchical all-reduce, or a sharded parameter server. DDP
and Horovod cut the gradients into buckets that are reduced while backward is still running, so
part of T_comm hides behind backward; what is left is added to the step. Throughput is
N * batch / (T1 + exposed comm), efficiency is that over N times the single-device throughput.
Optional ceilings (input pipeline per node, shared storage) cap the result when given.

Hardware inputs come only from published figures (see PRESETS, each with its source); the
single-device throughput of each validation case comes from the same published table as the
multi-device result it is compared with. Nothing here is fitted to a multi-device result.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]

GB = 1e9                 # bandwidths are decimal, as vendors quote them
GBIT = 1e9 / 8
MIB = 2 ** 20            # bucket sizes are binary, as the frameworks define them
US = 1e-6

BLOCK_START = "<!-- scaling_model:start -->"
BLOCK_END = "<!-- scaling_model:end -->"

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
# Hardware presets. Bandwidths are per direction. Every figure names its source; latencies are
# NCCL's own per-step constants for large messages (ring, "Simple" protocol), because no vendor
# datasheet quotes the latency of one all-reduce step (NVIDIA/nccl src/graph/tuning.cc, NCCL
# 2.7: NVLink 3.4 us, PCIe 5.7 us, network 9.6 us per step, 8.4 us per call).
NCCL_LAT_NVLINK, NCCL_LAT_PCI, NCCL_LAT_NET = 3.4 * US, 5.7 * US, 9.6 * US
PCIE3_X16 = 15.75 * GB  # PCIe 3.0: 8 GT/s x 16 lanes x 128/130 encoding / 8 bits

PRESETS: Dict[str, Hardware] = {
    "dgx-a100": Hardware(
        "DGX A100 (8x A100 SXM, NVSwitch)", 8,
        # A100: 12 third-generation NVLinks, 600 GB/s total (both directions) per GPU, all
        # GPUs one NVSwitch hop apart (nvidia.com/data-center/nvlink; A100 white paper).
        intra=Link(300 * GB, NCCL_LAT_NVLINK),
        # Compute fabric: 8 single-port 200 Gb/s HDR InfiniBand adapters per system (DGX A100
        # data sheet / SuperPOD reference architecture RA-09950-001). Not checked against a
        # source in this study; no validation case below uses it (all are single-node).
        inter=Link(200 * GBIT, NCCL_LAT_NET), nics_per_node=8,
        source="A100: 12 NVLink-3 links, 600 GB/s per GPU (www.nvidia.com/data-center/nvlink; "
               "NVSwitch GPU-to-GPU 600 GB/s, A100 white paper); 8x HDR 200 Gb/s per node from "
               "the DGX A100 data sheet, not re-checked (unused below)"),
    "dgx1-v100": Hardware(
        "DGX-1 (8x V100 SXM2, NVLink hybrid cube-mesh)", 8,
        # V100: 6 second-generation NVLinks, 300 GB/s total per GPU (NVLink page / table of
        # NVLink generations). The cube-mesh is not all-to-all; NCCL builds rings over it.
        intra=Link(150 * GB, NCCL_LAT_NVLINK),
        # 4x 100 Gb/s EDR InfiniBand per DGX-1 (NADDOD, "HPC Networking: Delivering High
        # Performance for DGX Server", 2023). Not used by a validation case.
        inter=Link(100 * GBIT, NCCL_LAT_NET), nics_per_node=4,
        source="V100: 6 NVLink-2 links, 300 GB/s per GPU (www.nvidia.com/data-center/nvlink: "
               "A100 went from 6 to 12 links); 4x 100 Gb/s EDR per DGX-1 (www.naddod.com/blog/"
               "hpc-networking-delivering-high-performance-for-dgx-server; unused below)"),
    "hal-v100-edr": Hardware(
        "NCSA HAL (IBM AC922, 4x V100 per node, EDR InfiniBand)", 4,
        # V100 NVLink 2 as above. (AC922 pairs GPUs per socket; the cross-socket path is not
        # modelled -- it matters little next to the 8x slower EDR link.)
        intra=Link(150 * GB, NCCL_LAT_NVLINK),
        # "16 IBM POWER9 servers with 4 NVIDIA V100 GPUs each, interconnected with Mellanox EDR
        # InfiniBand" (Kindratenko et al., HAL, PEARC 2020, doi:10.1145/3311790.3396649).
        # EDR = 4 lanes x 25.78125 Gb/s, 64b/66b, 100 Gb/s effective (ConnectX-4 user manual).
        # NICs per node: not stated in the sources found; 1 assumed.
        inter=Link(100 * GBIT, NCCL_LAT_NET), nics_per_node=1,
        source="HAL: 16 POWER9 servers x 4 V100, Mellanox EDR InfiniBand (Kindratenko et al., "
               "PEARC 2020, doi:10.1145/3311790.3396649); EDR = 100 Gb/s effective (NVIDIA "
               "ConnectX-4 user manual); NVLink 2 as DGX-1; NICs per node not published: 1 "
               "assumed"),
    "horovod-p100-25g": Hardware(
        "Horovod benchmark cluster (4x Pascal per server, 25 Gb/s RoCE)", 4,
        # The servers' GPU interconnect is not published; PCIe 3.0 x16 assumed (Pascal
        # servers without NVLink); the 3.125 GB/s network is 5x slower either way.
        intra=Link(PCIE3_X16, NCCL_LAT_PCI),
        # "128 servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s network"
        # (horovod/horovod docs/benchmarks.rst).
        inter=Link(25 * GBIT, NCCL_LAT_NET), nics_per_node=1,
        source="'128 servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s "
               "network' (horovod/horovod docs/benchmarks.rst); GPU link inside a server not "
               "published: PCIe 3.0 x16 (15.75 GB/s, PCIe 3.0 spec) assumed"),
    "aws-p2.8xlarge": Hardware(
        "AWS p2.8xlarge (8x K80 GPU, 10 Gb/s)", 8,
        # K80 boards on PCIe 3.0 x16 with peer-to-peer ("GPU Peer to Peer: Y").
        intra=Link(PCIE3_X16, NCCL_LAT_PCI),
        # "p2.8xlarge 8 GPUs ... 10Gbps" network bandwidth in a placement group (AWS GPU/FPGA
        # briefing, March 2017, speakerdeck.com/porcaro33/gpu-fpga-briefing-plus-march-plus-2017).
        inter=Link(10 * GBIT, NCCL_LAT_NET), nics_per_node=1,
        source="p2.8xlarge: 8 GPUs, GPU peer-to-peer, 10 Gbps network (AWS P2 table in "
               "speakerdeck.com/porcaro33/gpu-fpga-briefing-plus-march-plus-2017); K80 boards "
               "on PCIe 3.0 x16"),
    # This VM: two processes on one host talking gloo over TCP loopback. Both cores compute,
    # so there is no idle core on which gloo could overlap the all-reduce: overlap 0.
    # Measured with `--measure-loopback` on the 2-core AMD EPYC VM, 2026-11-22 13:03 UTC, load
    # average ~0.5 (the machine is shared): 0.83 GB/s, 393 us. Under the load of other users'
    # trainings the same measurement gave 0.18-0.52 GB/s; re-measure with --measure-loopback.
    "cpu-loopback": Hardware(
        "this VM: gloo over TCP loopback", 2,
        intra=Link(0.83 * GB, 393 * US), inter=Link(0.83 * GB, 393 * US), nics_per_node=1,
        overlap=0.0, collective_latency=0.0,
        source="measured on this VM: `--measure-loopback` (gloo all_reduce, 2 processes, "
               "2026-11-22, quiet machine)"),
}


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


# --------------------------------------------------------------------------------------------
# Validation against published scaling tables.
@dataclass(frozen=True)
class Case:
    name: str
    hardware: str
    workload: Workload
    devices: int
    published: float            # img/s, or efficiency (0..1) when metric == "efficiency"
    metric: str = "img_s"
    algo: str = "ring"
    group: str = ""             # key into SOURCES
    note: str = ""
    anchor: bool = False        # the point the single-device speed was taken from
    ps_servers: Optional[int] = None


# Where each group's numbers come from (published value AND the single-device input).
SOURCES = {
    "DLE": "NVIDIA/DeepLearningExamples `PyTorch/Classification/ConvNets/resnet50v1.5/"
           "README.md`, 'Training performance results' (pytorch-21.03 container): the 1-GPU and "
           "8-GPU rows of the same table; per-GPU batch from `ConvNets/configs.yml` (DGXA100 "
           "AMP/TF32 256, DGX1V AMP 256, FP32 112); native AMP since Feb 2021, so fp32 "
           "gradients; torch DDP with its default 25 MiB buckets assumed",
    "HAL": "richardkxu/distributed-pytorch `Throughput_train/run-Feb*_hal*_resnet50_gpux{N}_b208"
           "_cpu20_optO2-tag-Throughput_train.csv` (N = 2..64; per-epoch img/s of the "
           "tutorial's ResNet-50 runs on NCSA HAL, apex O2, 208 images per GPU), mean of epochs "
           "2 to last; no 1-GPU run was published, so the 2-GPU run (one node) is the anchor "
           "(per GPU = half); apex DDP default buckets of 1e7 fp16 elements (20 MB)",
    "Horovod": "horovod/horovod `docs/benchmarks.rst`: '128 servers with 4 Pascal GPUs each "
               "connected by RoCE-capable 25 Gbit/s network ... 90% scaling efficiency for "
               "both Inception V3 and ResNet-101, and 68% ... for VGG-16' (tf_cnn_benchmarks, "
               "batch 64 per GPU); fusion buffer 64 MB (`docs/tensor-fusion.rst`); 1-GPU speed "
               "from tensorflow/tensorflow `tensorflow/docs_src/performance/benchmarks.md`, "
               "DGX-1 P100, synthetic, batch 64 (InceptionV3 142, VGG16 154 img/s); ResNet-101 "
               "is not in that table: 129 img/s interpolated between its ResNet-50 (219) and "
               "ResNet-152 (91.8) rows by block count -- a derived input, not a published one",
    "TF PS": "tensorflow/tensorflow `tensorflow/docs_src/performance/benchmarks.md`, 'Details "
             "for Amazon EC2 Distributed (NVIDIA Tesla K80)': p2.8xlarge, "
             "variable_update=distributed_replicated, parameter servers on the worker "
             "instances (InceptionV3 8 instances / 6 PS, ResNet-152 8 / 4, ResNet-50 equal "
             "numbers), synthetic; 1-GPU and 64-GPU rows of the same table",
}

# HAL: mean per-epoch img/s over epochs 2..last of each CSV (epoch 1 includes start-up).
HAL_PUBLISHED = {2: 1581.9, 4: 3003.7, 8: 5808.5, 16: 11253.1, 32: 19494.9, 64: 33087.5}
# ResNet-101 on one P100, derived: time per image interpolated between ResNet-50 (219 img/s,
# 16 bottleneck blocks) and ResNet-152 (91.8 img/s, 50 blocks) at 33 blocks.
P100_RESNET101_DERIVED = 1 / (1 / 219 + (33 - 16) / (50 - 16) * (1 / 91.8 - 1 / 219))

AMP_NOTE = ("the same table's TF32 (A100) and FP32 (V100) rows -- same GPUs, same fp32 "
            "gradient bytes, 2.6x and 3.3x fewer images per second -- are within 4 %, so this "
            "loss is not gradient communication. A candidate is the host input pipeline "
            "(16.6k and 8.3k JPEGs/s decoded on one host), which the model has no term for "
            "unless one is given (`--host-img-s`)")
HAL_NOTE = ("the tutorial's own `IO/bandwidth_gpux64_cpu20_feb.csv` shows 2.2-3.9 GB/s "
            "(mostly over 3) read from shared storage throughout the 64-GPU run (33k img/s x "
            "~0.1 MB per ImageNet JPEG): the data set is re-read every epoch. Per-node "
            "throughput falls from 3,004 (1 node) to 2,437 (8) and 2,068 img/s (16 nodes) "
            "while the all-reduce model says it should stay flat; shared-storage contention "
            "is not in the model")


def cases() -> List[Case]:
    out = [
        Case("DLE RN50 AMP, DGX A100 80GB", "dgx-a100",
             Workload("resnet50", 256, 2470, "fp32"), 8, 16621, group="DLE", note=AMP_NOTE),
        Case("DLE RN50 TF32, DGX A100 80GB", "dgx-a100",
             Workload("resnet50", 256, 938, "fp32"), 8, 7248, group="DLE"),
        Case("DLE RN50 AMP, DGX-1 V100 16GB", "dgx1-v100",
             Workload("resnet50", 256, 1200, "fp32"), 8, 8322, group="DLE", note=AMP_NOTE),
        Case("DLE RN50 FP32, DGX-1 V100 16GB", "dgx1-v100",
             Workload("resnet50", 112, 367, "fp32"), 8, 2855, group="DLE"),
    ]
    hal = Workload("resnet50", 208, HAL_PUBLISHED[2] / 2, "fp16", bucket_bytes=20e6)
    for n, value in HAL_PUBLISHED.items():
        out.append(Case(f"HAL RN50 apex O2, {n} V100", "hal-v100-edr", hal, n, value,
                        group="HAL", anchor=n == 2, note=HAL_NOTE if n >= 32 else ""))
    hvd = dict(grad_dtype="fp32", bucket_bytes=64 * MIB)  # Horovod fusion buffer: 64 MB
    out += [
        Case("Horovod ResNet-101, 512 P100", "horovod-p100-25g",
             Workload("resnet101", 64, P100_RESNET101_DERIVED, **hvd), 512, 0.90,
             "efficiency", group="Horovod"),
        Case("Horovod Inception V3, 512 P100", "horovod-p100-25g",
             Workload("inception_v3", 64, 142, **hvd), 512, 0.90, "efficiency",
             group="Horovod"),
        Case("Horovod VGG-16, 512 P100", "horovod-p100-25g",
             Workload("vgg16", 64, 154, **hvd), 512, 0.68, "efficiency", group="Horovod"),
    ]
    # TF parameter servers on the worker instances, gradients summed per instance first,
    # one message per variable.
    ps = dict(grad_dtype="fp32", bucket_bytes=None)
    out += [
        Case("TF PS InceptionV3, 64 K80 (8 inst., 6 PS)", "aws-p2.8xlarge",
             Workload("inception_v3", 64, 29.7, **ps), 64, 1783, algo="ps", ps_servers=6,
             group="TF PS"),
        Case("TF PS ResNet-50, 64 K80 (8 inst., 8 PS)", "aws-p2.8xlarge",
             Workload("resnet50", 64, 52.4, **ps), 64, 2744, algo="ps", ps_servers=8,
             group="TF PS"),
        Case("TF PS ResNet-152, 64 K80 (8 inst., 4 PS)", "aws-p2.8xlarge",
             Workload("resnet152", 32, 19.4, **ps), 64, 981, algo="ps", ps_servers=4,
             group="TF PS"),
    ]
    return out


@dataclass
class Row:
    case: Case
    pred: Prediction

    @property
    def predicted(self) -> float:
        return self.pred.efficiency if self.case.metric == "efficiency" else self.pred.img_s

    @property
    def error(self) -> float:
        return self.predicted / self.case.published - 1


def validate(presets: Dict[str, Hardware] = PRESETS) -> List[Row]:
    rows = []
    for c in cases():
        hw = presets[c.hardware]
        rows.append(Row(c, predict(c.workload, hw, c.devices, c.algo, ps_servers=c.ps_servers)))
    return rows


def fmt_value(value: float, metric: str) -> str:
    return f"{value:.0%}" if metric == "efficiency" else f"{value:,.0f}"


def validation_markdown(rows: List[Row], tolerance: float = 0.15) -> str:
    lines = ["| case | devices (nodes) | algo | published | predicted | error | "
             "pred. efficiency | exposed comm / step |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        c, p = r.case, r.pred
        err = "anchor" if c.anchor else (f"{r.error:+.1%}" + ("" if abs(r.error) <= tolerance
                                                               else " **out**"))
        lines.append(f"| {c.name} | {c.devices} ({p.nodes}) | {c.algo} | "
                     f"{fmt_value(c.published, c.metric)} | {fmt_value(r.predicted, c.metric)} "
                     f"| {err} | {p.efficiency:.1%} | {p.exposed * 1e3:.1f} / "
                     f"{p.step_time * 1e3:.0f} ms |")
    return "\n".join(lines)


def presets_markdown(names: Iterable[str]) -> str:
    lines = ["| preset | devices/node | intra GB/s, alpha us | NIC GB/s x count, alpha us | "
             "overlap | source |", "|---|---:|---|---|---:|---|"]
    for name in names:
        hw = PRESETS[name]
        lines.append(f"| `{name}` | {hw.devices_per_node} | {hw.intra.bandwidth / GB:g}, "
                     f"{hw.intra.latency / US:g} | {hw.inter.bandwidth / GB:g} x "
                     f"{hw.nics_per_node}, {hw.inter.latency / US:g} | {hw.overlap:g} | "
                     f"{hw.source} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# This machine: measured runs (JSONL logs) vs the model.
@dataclass
class RunInfo:
    path: Path
    entry: str
    world_size: int
    threads: int
    key: Tuple
    img_s: float
    grad_dtype: str
    host: str
    start: float
    end: float
    workers: int = 0           # devices that train (a PS run's world size counts its server)
    mode: str = ""             # parameter server: sync / async / esync
    beside_twin: bool = False  # an nd run that ran while another nd run ran on the same host


def _median_img_s(records: List[dict]) -> Optional[float]:
    train = [r["img_s"] for r in records if r.get("kind") == "train" and r.get("img_s")]
    steady = train[1:] or train  # the first interval includes warm-up
    if not steady:
        steady = [r["img_s"] for r in records if r.get("kind") == "train_epoch"
                  and r.get("img_s")]
    return statistics.median(steady) if steady else None


def read_run(log: Path) -> Optional[RunInfo]:
    """One run dir's log.jsonl -> RunInfo, or None when it is unreadable or has no throughput."""
    records = []
    try:
        for line in log.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a run killed mid-write leaves a partial last line
    except OSError:
        return None
    runs = [r for r in records if r.get("kind") == "run"]
    img_s = _median_img_s(records)
    if not runs or img_s is None:
        return None
    run = runs[-1]
    cfg = run.get("config") or {}
    prec = run.get("precision") or {}
    hook = cfg.get("ddp_comm_hook", "none")
    if hook == "powersgd":
        return None  # low-rank compression is outside this model
    grad_dtype = {"fp16": "fp16", "bf16": "bf16"}.get(hook, "fp32")
    if cfg.get("fp16_allreduce"):
        grad_dtype = "fp16"
    hw = run.get("hardware") or {}
    threads = int(hw.get("torch_threads") or 0)
    key = (cfg.get("arch"), cfg.get("image_size"), cfg.get("batch_size"),
           f"{prec.get('opt_level')} {prec.get('dtype')}",
           "synthetic" if cfg.get("dummy") or cfg.get("data_backend") == "synthetic" else "data",
           int(cfg.get("grad_accum") or 1))
    # Wall-clock span of the run (every record has `elapsed`; a val record's `time` is a
    # duration, so only the run record's `time` is used as a clock reading).
    start = float(run.get("time", 0.0)) - float(run.get("elapsed", 0.0))
    end = start + max(float(r.get("elapsed", 0.0)) for r in records)
    world = int(run.get("world_size") or 1)
    return RunInfo(log.parent, str(run.get("entry") or run.get("strategy")), world, threads,
                   key, img_s, grad_dtype, str(hw.get("host", "?")), start, end,
                   workers=int(run.get("workers") or world), mode=str(run.get("mode") or ""))


def collect_runs(dirs: Sequence[Path]) -> List[RunInfo]:
    found = []
    for d in dirs:
        logs = [d / "log.jsonl"] if (d / "log.jsonl").is_file() else sorted(d.rglob("log.jsonl"))
        for log in logs:
            info = read_run(log)
            if info is not None and info.path not in {f.path for f in found}:
                found.append(info)
    # On a CPU the "devices" share memory bandwidth and caches: a single-process run made
    # while a twin ran beside it measures the per-core speed that DDP's processes really get.
    solo = [r for r in found if r.entry == "nd" and r.world_size == 1]
    for r in solo:
        r.beside_twin = any(o is not r and o.host == r.host and o.start < r.end
                            and r.start < o.end for o in solo)
    return found


# entry script -> (algorithm, bucket bytes). DDP: 25 MiB buckets; Horovod: 64 MB fusion
# buffer; train/ps.py: rank 0 is a server process beside the workers, each worker pushes every
# gradient tensor to it (sync mode only: async/esync do not wait for each other).
MODELLED_ENTRIES = {"ddp": ("ring", 25 * MIB), "ddp_apex": ("ring", 25 * MIB),
                    "hvd": ("ring", 64 * MIB), "ps": ("ps", None)}


def cpu_comparison(runs: List[RunInfo], hw: Hardware) -> List[dict]:
    """Group runs by (entry, world size, threads, comparable config); predict each multi-process
    group from the single-process (nd) runs with the same config and threads per process:
    runs made alone, and, when present, runs made beside a twin (see collect_runs). The PS
    talks tensorpipe RPC, not gloo; the gloo loopback figures stand in for it."""
    groups: Dict[Tuple, List[RunInfo]] = {}
    for r in runs:
        groups.setdefault((r.entry, r.mode, r.world_size, r.workers, r.threads, r.key,
                           r.grad_dtype), []).append(r)
    out = []
    for (entry, mode, world, workers, threads, key, gdt), members in sorted(groups.items(),
                                                                           key=str):
        if world < 2:
            continue
        measured = statistics.median(m.img_s for m in members)
        row = {"entry": entry + (f" {mode}" if mode else ""), "procs": world,
               "threads": threads, "config": key, "runs": len(members), "measured": measured,
               "note": "", "predicted": {}, "baseline": {}}
        nd = [r for r in runs if r.entry == "nd" and r.world_size == 1 and r.threads == threads
              and r.key == key]
        modelled = entry in MODELLED_ENTRIES and (entry != "ps" or mode == "sync")
        if not modelled:
            row["note"] = f"{row['entry']}: not modelled"
        elif not nd:
            row["note"] = f"no single-process nd run with {threads} thread(s) and this config"
        algo, bucket = MODELLED_ENTRIES.get(entry, ("ring", None))
        for label, base in (("alone", [r.img_s for r in nd if not r.beside_twin]),
                            ("twin", [r.img_s for r in nd if r.beside_twin])):
            if not modelled or not base:
                continue
            arch, _, batch, *_ = key
            wl = Workload(arch, int(batch), statistics.median(base), gdt, bucket_bytes=bucket,
                          accum=key[5])
            # one host: every process is on the same "node"; a PS server is a process of its
            # own that receives every worker's gradient
            p = predict(wl, replace(hw, devices_per_node=workers), workers, algo,
                        ps_servers=1, ps_colocated=False, ps_local_aggregation=False)
            row["baseline"][label] = wl.img_s_1
            row["predicted"][label] = p.img_s
            row["t_comm"] = p.t_comm
        out.append(row)
    return out


def cpu_markdown(rows: List[dict]) -> str:
    if not rows:
        return "(no multi-process runs found)"
    lines = ["| entry | procs x threads | arch, image, batch, precision, data | runs | "
             "measured img/s | model all-reduce | from 1-proc alone: img/s -> predicted (error) "
             "| from 1-proc beside a twin: img/s -> predicted (error) |",
             "|---|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        arch, image, batch, prec, data, _ = r["config"]
        cells = []
        for label in ("alone", "twin"):
            if label in r["predicted"]:
                pred = r["predicted"][label]
                cells.append(f"{r['baseline'][label]:.1f} -> {pred:.1f} "
                             f"({pred / r['measured'] - 1:+.0%})")
            else:
                cells.append("-")
        comm = f"{r['t_comm'] * 1e3:.0f} ms" if "t_comm" in r else "-"
        lines.append(f"| {r['entry']} | {r['procs']}x{r['threads']} | {arch}, {image} px, "
                     f"{batch}, {prec}, {data} | {r['runs']} | {r['measured']:.1f} | {comm} | "
                     f"{cells[0]} | {cells[1] if r['predicted'] else r['note']} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Loopback measurement (gloo, 2 processes on this host).
def _loopback_worker(rank: int, world: int, port: int, plan: List[Tuple[int, int]],
                     out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    times = {}
    for size, repeats in plan:
        t = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(t)
        samples = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            samples.append(time.perf_counter() - t0)
        times[size] = statistics.median(samples)
    if rank == 0:
        Path(out_path).write_text(json.dumps(times))
    dist.destroy_process_group()


def measure_loopback(small: int = 4096, large: int = 32 * MIB, repeats: int = 9) -> Link:
    """Fit alpha and beta of a 2-process gloo all-reduce: t(S) = 2*alpha + S/B (the ring
    formula for p = 2), from the medians of a tiny and a large message (~10 s)."""
    import tempfile

    import torch.multiprocessing as mp

    sys.path.insert(0, str(REPO / "train"))
    from recipe.strategies import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "t.json")
        plan = [(small, 20 * repeats), (large, repeats)]
        mp.spawn(_loopback_worker, args=(2, free_port(), plan, out), nprocs=2, join=True)
        times = {int(k): v for k, v in json.loads(Path(out).read_text()).items()}
    latency = times[small] / 2
    bandwidth = (large - small) / max(times[large] - times[small], 1e-9)
    return Link(bandwidth, latency)


# --------------------------------------------------------------------------------------------
# RESULTS.md block
def replace_block(text: str, block: str) -> str:
    """Put `block` between the markers, or append it under a heading when they are missing.
    Nothing outside the markers changes; applying the same block twice is a no-op."""
    body = f"{BLOCK_START}\n{block.strip()}\n{BLOCK_END}"
    pattern = re.compile(re.escape(BLOCK_START) + ".*?" + re.escape(BLOCK_END), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: body, text, count=1)
    return text.rstrip("\n") + "\n\n## Scaling model\n\n" + body + "\n"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} ({os.cpu_count()} cores)"


def results_block(rows: List[Row], cpu_rows: Optional[List[dict]], loop: Link,
                  loop_note: str, command: str) -> str:
    scored = [r for r in rows if not r.case.anchor]
    ok = [r for r in scored if abs(r.error) <= 0.15]
    used = sorted({r.case.hardware for r in rows})
    notes: Dict[str, List[str]] = {}
    for r in rows:
        if r.case.note:
            notes.setdefault(r.case.note, []).append(r.case.name)
    parts = [
        f"Written by `{command}` at commit {git_commit()} on {machine()}. Published numbers "
        "are quoted from the sources listed under the table; no model input is fitted to a "
        "multi-device result (HAL published no 1-GPU run, so its 2-GPU run is the anchor).",
        "",
        "**Model** (`launch/scaling_model.py`; its comments give the reason for every term). "
        "Step time on N devices = single-device step T1 (from the 1-device number of the same "
        "published table; backward = 2/3 of it) + the part of the gradient communication that "
        "backward cannot hide. Communication is the alpha-beta cost of one collective per "
        "bucket (DDP 25 MiB, apex 20 MB, Horovod 64 MiB, TF PS one message per tensor): flat "
        "ring `2(p-1)/p*S/B + 2(p-1)*alpha`, the slowest hop (NVLink/PCIe inside a node, the "
        "node's NICs between nodes) setting B; hierarchical (reduce-scatter inside the node, "
        "all-reduce across nodes on all NICs or through one leader, all-gather); or a "
        "parameter server sharded over k servers (push, then pull, through the busiest NIC). "
        "All-reduce buckets run while backward runs: exposed = max(T_comm/n_buckets, "
        "T_comm - overlap*T_bwd*(1-1/n_buckets)); a synchronous PS can hide its push but never "
        "its pull. Gradient bytes = torchvision parameter count x gradient dtype.",
        "",
        "**Hardware presets** (bandwidth per direction; alphas are NCCL's own per-step "
        "constants, NVIDIA/nccl `src/graph/tuning.cc`: NVLink 3.4, PCIe 5.7, network 9.6 us):",
        "",
        presets_markdown(used + ["cpu-loopback"]),
        "",
        f"**Predicted vs published**: {len(ok)} of {len(scored)} within +-15 % ('anchor': the "
        "point the single-device speed came from; **out**: outside +-15 %).",
        "",
        validation_markdown(rows),
        "",
        "Sources:",
        "",
    ]
    parts += [f"* {group}: {SOURCES[group]}." for group in dict.fromkeys(r.case.group
                                                                         for r in rows)]
    parts += ["", "What the rows outside +-15 % say:", ""]
    parts += [f"* {'; '.join(names)}: {note}." for note, names in notes.items()]
    parts += ["", f"**This machine** ({machine()}, 2 processes x 1 thread, gloo over "
              f"loopback; {loop_note}: B = {loop.bandwidth / GB:.2f} GB/s, alpha = "
              f"{loop.latency / US:.0f} us; overlap 0: both cores compute, none is free to "
              "hide the all-reduce). img/s are medians over each run's logged intervals, the "
              "first (warm-up) dropped. The 1-process baseline is a `train/nd.py` run with the "
              "same config and threads, made alone or beside an identical twin (two cores "
              "share memory bandwidth and caches, unlike two GPUs):", "",
              cpu_markdown(cpu_rows) if cpu_rows is not None else "(no --runs given)"]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
def check_params() -> List[str]:
    problems = []
    for arch, expected in PARAMS.items():
        got = torchvision_params(arch)
        if got != expected:
            problems.append(f"{arch}: table {expected}, torchvision {got}")
    return problems


def custom_prediction(args) -> str:
    hw = PRESETS[args.preset]
    changes = {}
    if args.devices_per_node:
        changes["devices_per_node"] = args.devices_per_node
    if args.intra_gbs or args.intra_us:
        changes["intra"] = Link((args.intra_gbs or hw.intra.bandwidth / GB) * GB,
                                (args.intra_us if args.intra_us is not None
                                 else hw.intra.latency / US) * US)
    if args.inter_gbs or args.inter_us:
        changes["inter"] = Link((args.inter_gbs or hw.inter.bandwidth / GB) * GB,
                                (args.inter_us if args.inter_us is not None
                                 else hw.inter.latency / US) * US)
    if args.nics:
        changes["nics_per_node"] = args.nics
    if args.overlap is not None:
        changes["overlap"] = args.overlap
    hw = replace(hw, **changes)
    img_s = args.img_s if args.img_s else args.batch / args.step_time
    wl = Workload(args.arch, args.batch, img_s, args.grad_dtype,
                  bucket_bytes=args.bucket_mb * MIB if args.bucket_mb else None,
                  backward_fraction=args.backward_fraction, accum=args.accum)
    lines = [f"{hw.name}; {args.arch}, {params(args.arch)[0] / 1e6:.1f} M params, "
             f"{wl.grad_bytes / 1e6:.0f} MB of {args.grad_dtype} gradients in {wl.n_buckets} "
             f"buckets; batch {args.batch}/device, 1 device {img_s:.1f} img/s "
             f"(step {wl.step_time_1 * 1e3:.1f} ms)", "",
             "| algo | devices | nodes | comm ms | exposed ms | step ms | img/s | efficiency |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for algo in args.algo:
        for n in args.devices:
            p = predict(wl, hw, n, algo, ps_servers=args.ps_servers,
                        ps_colocated=not args.ps_dedicated,
                        host_img_s_per_node=args.host_img_s, storage_img_s=args.storage_img_s)
            lines.append(f"| {algo} | {n} | {p.nodes} | {p.t_comm * 1e3:.1f} | "
                         f"{p.exposed * 1e3:.1f} | {p.step_time * 1e3:.1f} | {p.img_s:,.0f} | "
                         f"{p.efficiency:.1%}{' (' + p.capped_by + ')' if p.capped_by else ''}"
                         " |")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, action="append", default=[],
                    help="folder of run dirs (each with log.jsonl; searched recursively); "
                         "repeatable")
    ap.add_argument("--measure-loopback", action="store_true",
                    help="measure gloo all-reduce bandwidth/latency between 2 local processes")
    ap.add_argument("--loopback-gbs", type=float, help="loopback bandwidth, GB/s")
    ap.add_argument("--loopback-us", type=float, help="loopback latency per step, us")
    ap.add_argument("--update-results", action="store_true",
                    help="rewrite the scaling_model block of RESULTS.md")
    ap.add_argument("--results", type=Path, default=REPO / "RESULTS.md")
    ap.add_argument("--check-params", action="store_true",
                    help="recount the PARAMS table with torchvision")
    ap.add_argument("--json", type=Path, help="also write the tables as JSON here")
    pr = ap.add_argument_group("custom prediction (--predict)")
    pr.add_argument("--predict", action="store_true")
    pr.add_argument("--preset", choices=sorted(PRESETS), default="dgx-a100")
    pr.add_argument("--arch", default="resnet50")
    pr.add_argument("--grad-dtype", choices=sorted(DTYPE_BYTES), default="fp32")
    pr.add_argument("--img-s", type=float, help="single-device images/s")
    pr.add_argument("--step-time", type=float, help="single-device step time, s (with --batch)")
    pr.add_argument("--batch", type=int, default=256, help="images per device per step")
    pr.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    pr.add_argument("--devices-per-node", type=int)
    pr.add_argument("--algo", nargs="+", choices=ALGOS, default=["ring", "hier", "ps"])
    pr.add_argument("--ps-servers", type=int, help="PS shards (default: one per node)")
    pr.add_argument("--ps-dedicated", action="store_true", help="servers on their own nodes")
    pr.add_argument("--bucket-mb", type=float, default=25.0, help="MiB per bucket; 0: per tensor")
    pr.add_argument("--overlap", type=float, help="0..1, share of backward usable for comm")
    pr.add_argument("--backward-fraction", type=float, default=2 / 3)
    pr.add_argument("--accum", type=int, default=1, help="micro-batches per all-reduce")
    pr.add_argument("--intra-gbs", type=float)
    pr.add_argument("--intra-us", type=float)
    pr.add_argument("--inter-gbs", type=float)
    pr.add_argument("--inter-us", type=float)
    pr.add_argument("--nics", type=int)
    pr.add_argument("--host-img-s", type=float, help="input-pipeline ceiling per node, img/s")
    pr.add_argument("--storage-img-s", type=float, help="shared-storage ceiling, img/s")
    args = ap.parse_args(argv)
    if args.predict:
        if not args.img_s and not args.step_time:
            ap.error("--predict needs the single-device speed: --img-s N, or --step-time S "
                     "with --batch")
        if args.overlap is not None and not 0 <= args.overlap <= 1:
            ap.error("--overlap is a fraction between 0 and 1")
        if args.arch not in PARAMS:
            import torchvision

            if not callable(getattr(torchvision.models, args.arch, None)):
                ap.error(f"--arch {args.arch}: not a torchvision model (e.g. resnet50, "
                         "vgg16, inception_v3)")
    for d in args.runs:
        if not d.is_dir():
            ap.error(f"--runs {d}: no such folder (give a folder that holds run dirs with "
                     "log.jsonl files)")
    if args.update_results and not args.results.is_file():
        ap.error(f"--results {args.results}: file not found")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.check_params:
        problems = check_params()
        print("\n".join(problems) if problems else
              f"PARAMS table matches torchvision for {', '.join(PARAMS)}")
        return 1 if problems else 0
    if args.predict:
        print(custom_prediction(args))
        return 0

    rows = validate()
    print(f"Hardware presets\n\n{presets_markdown(sorted({r.case.hardware for r in rows}))}\n")
    print(f"Predicted vs published\n\n{validation_markdown(rows)}\n")
    scored = [r for r in rows if not r.case.anchor]
    print(f"{sum(abs(r.error) <= 0.15 for r in scored)} of {len(scored)} cases within +-15 %; "
          f"worst {max(scored, key=lambda r: abs(r.error)).case.name} "
          f"({max(abs(r.error) for r in scored):.0%}).\n")

    loop = PRESETS["cpu-loopback"].intra
    loop_note = "preset (measured 2026-11-22 on a quiet machine)"
    if args.measure_loopback:
        loop = measure_loopback()
        loop_note = f"measured now ({time.strftime('%Y-%m-%d')})"
    if args.loopback_gbs or args.loopback_us:
        loop = Link((args.loopback_gbs or loop.bandwidth / GB) * GB,
                    (args.loopback_us if args.loopback_us is not None
                     else loop.latency / US) * US)
        loop_note = "given on the command line"
    print(f"Loopback ({loop_note}): {loop.bandwidth / GB:.2f} GB/s, {loop.latency / US:.0f} us")
    cpu_hw = replace(PRESETS["cpu-loopback"], intra=loop, inter=loop)
    cpu_rows = None
    if args.runs:
        runs = collect_runs(args.runs)
        cpu_rows = cpu_comparison(runs, cpu_hw)
        print(f"\nThis machine: {len(runs)} runs with logs under "
              f"{', '.join(map(str, args.runs))}\n\n{cpu_markdown(cpu_rows)}")
    if args.json:
        args.json.write_text(json.dumps({
            "validation": [{"case": r.case.name, "published": r.case.published,
                            "metric": r.case.metric, "predicted": r.predicted,
                            "error": r.error, "anchor": r.case.anchor} for r in rows],
            "cpu": cpu_rows, "loopback": {"bandwidth": loop.bandwidth, "latency": loop.latency},
        }, indent=1, default=str))
    if args.update_results:
        command = "launch/env.sh python launch/scaling_model.py " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:]))
        block = results_block(rows, cpu_rows, loop, loop_note, command.strip())
        args.results.write_text(replace_block(args.results.read_text(), block))
        print(f"\nupdated the scaling_model block of {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
