"""What a user is told when the run is set up in a way that wastes GPUs, when a GPU runs out of
memory, and when training waits for its data: each line names the fix (the script, the flag,
the number).

Plain functions of numbers, so that a machine without a GPU tests them.
"""
from __future__ import annotations

from typing import List, Optional

from .registry import ALL_GPUS, DATA_BACKENDS, GPU_DECODERS, backends_where, provides


def gpu_hints(entry: str, script: str, distributed: bool, device_type: str, visible_gpus: int,
              local_processes: int, opt_level: str, share_gpus: bool) -> List[str]:
    """Start-up notes: GPUs left idle by too few processes, and fp32 on a GPU."""
    if device_type != "cuda":
        return []
    lines = []
    if visible_gpus > local_processes and not share_gpus and not provides(entry, ALL_GPUS):
        fix = (f"torchrun --nproc_per_node={visible_gpus} {script} ..." if distributed else
               f"torchrun --nproc_per_node={visible_gpus} train/ddp_apex.py ... (one process "
               "per GPU)")
        lines.append(f"note: {visible_gpus} GPUs are visible but this node runs "
                     f"{local_processes} process(es) of {script}: {visible_gpus - local_processes} "
                     f"stay idle. To use them all: {fix}; to use one, set "
                     "CUDA_VISIBLE_DEVICES")
    if opt_level == "O0":
        lines.append("note: O0 trains in fp32 on the GPU, without tensor cores' half types: "
                     "--opt-level O2 (or O1, train/ddp_apex.py's default) is usually 2-3x faster "
                     "on Volta and newer GPUs, at the published accuracy")
    return lines


def out_of_memory(first_line: str, batch_size: int, grad_accum: int, global_batch: int,
                  opt_level: str) -> str:
    """The message for a CUDA out-of-memory error: a smaller -b that keeps the global batch."""
    # the largest -b at most half this one that divides it, so the global batch stays exact
    smaller = max(d for d in range(1, max(batch_size // 2, 1) + 1) if batch_size % d == 0)
    text = (f"the GPU ran out of memory at -b {batch_size} per process (global batch "
            f"{global_batch}): {first_line}. Lower -b, and keep the global batch (and so the "
            f"lr and the schedule) with --grad-accum: -b {smaller} --grad-accum "
            f"{grad_accum * batch_size // smaller}")
    if opt_level == "O0":
        text += "; O1/O2 (half-precision activations) also need about half the memory of O0"
    return text + ". Continue from the last checkpoint with --resume auto."


# A fed GPU waits for its next batch a few percent of the time at most; past this share of the
# first epoch the loader, not the model, sets the pace.
DATA_WAIT_SHARE = 0.10


def data_wait_note(share: float, backend: str, workers: int, cores: int,
                   device_type: str, gpu_decoder: str = "torchcodec", cpu_decoded: int = 0
                   ) -> Optional[str]:
    """The note after the first epoch when this process waited for data for `share` of it
    (`workers`: its -j; `cores`: its share of the machine's cores), else None. What it advises
    is what helps that backend: more workers only where workers (or DALI's threads) decode and
    there are cores left; with the `gpu` backend the workers only read files, the GPU decodes
    (`cpu_decoded`: the first epoch's images it decoded on the CPU instead, all ranks)."""
    loader = DATA_BACKENDS[backend]
    if share < DATA_WAIT_SHARE or loader.made_up:
        return None
    cuda = device_type == "cuda"
    fixes = []
    if loader.gpu_decoders and cuda and cpu_decoded:
        fixes.append(f"{cpu_decoded} images were decoded on the CPU in the training process, "
                     f"not by --gpu-decoder {gpu_decoder} (the lines after each epoch say why)")
    if loader.decoding_workers:
        if workers < cores - 1:
            fixes.append(f"raise -j (up to {cores - 1}, every core but one)")
        else:
            fixes.append(f"-j {workers} already uses every core but one")
    if cuda:
        if loader.gpu_decoders and GPU_DECODERS[gpu_decoder].faster:
            fixes.append(GPU_DECODERS[gpu_decoder].faster)
        on_gpu = " or ".join(backends_where("gpu_decoding"))
        fixes.append(loader.faster_on_gpu or f"decode on the GPU: --data-backend {on_gpu}")
    elif loader.faster_on_cpu:
        fixes.append(loader.faster_on_cpu)
    return (f"note: this process waited for data during {share * 100:.0f} % of the first epoch: "
            f"its loader ({backend}, -j {workers} on {cores} cores per process) is slower than "
            f"training. {'; '.join(fixes)}")
