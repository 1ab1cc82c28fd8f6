"""What the scaling model is given and checked against: hardware presets, and published
multi-device results with the single-device speed of the same table.

Hardware inputs come only from published figures (see PRESETS below, each with its source); the
single-device throughput of each validation case comes from the same published table as the
multi-device result it is compared with. Nothing here is fitted to a multi-device result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from imagenet_recipes.bench.scaling.model import GB, GBIT, MIB, US, Hardware, Link, Prediction, Workload, predict

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
