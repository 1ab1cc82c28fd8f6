"""What bench.gpu measures and how it judges it: the units (one measurement each) and their
rows, the groups, the row each row's ratio compares with, and the targets. The other modules of
bench.gpu measure the rows this table names; nothing here measures or imports torch.

A unit whose targets or ratios compare with another unit's rows `needs` that unit: select()
brings it along, so every target of a record is judged within that record."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from imagenet_recipes.bench import step_variants

# The targets, by name (--target NAME=VALUE replaces one: the tests make one impossible).
TARGETS = {"img_s": 3000.0, "engine_bare": 0.97, "o2_o1": 1.0, "dali_synthetic": 0.85,
           "gpu_decode_synthetic": 0.98, "vs_timm": 1.10, "vs_torchvision": 1.10,
           "decode_capacity": 1.5, "compiled_img_s": 6000.0, "gpu_decoded": 0.99}
TARGET_TEXT = {"img_s": "img/s >= {:,.0f}", "engine_bare": "engine/bare >= {:g}",
               "o2_o1": "O2/O1 >= {:g}", "dali_synthetic": "DALI/synthetic >= {:g}",
               "gpu_decode_synthetic": "gpu backend/synthetic >= {:g}",
               "vs_timm": "timm's time/ours end to end >= {:g}",
               "vs_torchvision": "torchvision reference's time/ours end to end >= {:g}",
               "decode_capacity": "decode-only img/s / training img/s (synthetic) >= {:g}",
               "compiled_img_s": "img/s >= {:,.0f} (an H200's target)",
               "gpu_decoded": "share of the images decoded on the GPU >= {:g}"}
# The peers unit's rows: bench.e2e's contender -> row
PEER_ROWS = {"nd fast": "peers-nd-fast", "nd gpu decode": "peers-nd-gpu-decode",
             "nd dali-gpu": "peers-nd-dali-gpu", "timm fast": "peers-timm",
             "torchvision reference": "peers-torchvision"}
# timm's benchmark.py rows -> the hand-written step doing the same work
TIMM_BENCHMARK_REFERENCE = {"timm-benchmark": "step-timm-work",
                            "timm-benchmark-compiled": "step-compiled-timm-work"}
# The decode group's rows: bench.decode's row -> row (the pytorch row: its best -j)
DECODE_ROWS = {"pytorch": "decode-pytorch", "gpu torchcodec": "decode-gpu-torchcodec",
               "gpu nvimgcodec": "decode-gpu-nvimgcodec", "dali-gpu": "decode-dali-gpu",
               "dali-cpu": "decode-dali-cpu"}
# A row of GPU decoding with more than this share of its images decoded on the CPU (the decoder
# refused them) is not GPU decoding: its GPU targets are not judged, a target of its own fails
CPU_DECODED_LIMIT = 0.01
# The loader rows' --data-backend
LOADER_FLAGS = {"pytorch-loader": ["--data-backend", "pytorch"],
                "gpu-decode": ["--data-backend", "gpu"],
                "gpu-decode-nvimgcodec": ["--data-backend", "gpu", "--gpu-decoder", "nvimgcodec"],
                "gpu-decode-nvimgcodec-compile": ["--data-backend", "gpu", "--gpu-decoder",
                                                  "nvimgcodec", "--compile"],
                "dali-gpu": ["--data-backend", "dali-gpu"]}
SHORT = {"float16": "fp16", "bfloat16": "bf16"}
DTYPE = {v: k for k, v in SHORT.items()}
RECORD_TOOL = "bench.gpu"


@dataclass(frozen=True)
class Unit:
    name: str
    group: str
    rows: tuple
    what: str
    needs: tuple = ()  # units whose rows this one's ratios and targets refer to


def _units() -> Dict[str, Unit]:
    units = []
    for dtype in ("float16", "bfloat16"):
        for level in ("O1", "O2"):
            name = f"{level}-{SHORT[dtype]}"
            units.append(Unit(name, "loop", (f"bare-{name}", f"engine-{name}"),
                              f"engine vs bare loop, {level} {dtype}",
                              needs=(f"O1-{SHORT[dtype]}",) if level == "O2" else ()))
    units += [
        Unit("compile", "compile", ("bare-compile", "engine-compile"),
             "engine vs bare loop, O1 --amp-dtype, both torch.compile'd"),
        Unit("nd-synthetic", "scripts", ("nd-synthetic",), "train/nd.py --dummy"),
        Unit("ddp-1rank", "scripts", ("ddp-1rank",),
             "torchrun --nproc_per_node=1 train/ddp.py --dummy (NCCL; gloo on a CPU)",
             needs=("nd-synthetic",)),
        Unit("pytorch-loader", "scripts", ("pytorch-loader",),
             "train/nd.py on generated JPEGs, --data-backend pytorch", needs=("nd-synthetic",)),
        Unit("gpu-decode", "scripts", ("gpu-decode",),
             "train/nd.py on generated JPEGs, --data-backend gpu (when torchcodec is installed)",
             needs=("nd-synthetic",)),
        Unit("gpu-decode-nvimgcodec", "scripts", ("gpu-decode-nvimgcodec",),
             "train/nd.py on generated JPEGs, --data-backend gpu --gpu-decoder nvimgcodec",
             needs=("nd-synthetic",)),
        Unit("gpu-decode-nvimgcodec-compile", "scripts", ("gpu-decode-nvimgcodec-compile",),
             "the same with --compile", needs=("nd-synthetic",)),
        Unit("dali-gpu", "scripts", ("dali-gpu",),
             "train/nd.py on generated JPEGs, --data-backend dali-gpu (when installed)",
             needs=("nd-synthetic",)),
        Unit("decode-only", "decode", tuple(DECODE_ROWS.values()),
             "bench.decode: each backend's input pipeline alone, a batch ready on the device, "
             "against the synthetic training rate", needs=("nd-synthetic",)),
        Unit("peers", "peers", tuple(PEER_ROWS.values()),
             "bench.e2e: train/nd.py against timm's and torchvision's train.py on the same "
             "generated JPEGs"),
        Unit("step-eager", "causes", tuple(v.name for v in step_variants.EAGER),
             "the hand-written step with one thing changed, in turns: no loss scaler, "
             "timm's benchmark work, DDP in a world of one and its options"),
        Unit("step-compiled", "causes", tuple(v.name for v in step_variants.COMPILED),
             "the same, torch.compile'd: no loss scaler, timm's benchmark work"),
        Unit("nd-torchrun", "causes", ("nd-torchrun",),
             "torchrun --nproc_per_node=1 train/nd.py --dummy: the launcher, no DDP",
             needs=("nd-synthetic",)),
        Unit("timm-benchmark", "causes", ("timm-benchmark", "timm-benchmark-compiled"),
             "timm's benchmark.py --bench train --amp --channels-last, eager and "
             "--torchcompile (--timm-benchmark)", needs=("step-eager", "step-compiled")),
    ]
    return {u.name: u for u in units}


UNITS = _units()
GROUPS = list(dict.fromkeys(u.group for u in UNITS.values()))
ROW_ORDER = [row for u in UNITS.values() for row in u.rows]


class Failure(Exception):
    """A unit could not measure (its message says why)."""


class Skip(Exception):
    """A unit cannot run here (DALI missing, a GPU loader on a CPU)."""


def select(groups: Optional[str], only: Optional[str], needs: bool = True) -> List[str]:
    """The units to run, in their canonical order, with the units they need (needs False:
    only those named)."""
    def names(text: Optional[str]) -> List[str]:
        return [w.strip() for w in (text or "").split(",") if w.strip()]

    bad = [g for g in names(groups) if g not in GROUPS]
    if bad:
        raise ValueError(f"--group: unknown {', '.join(bad)} (groups: {', '.join(GROUPS)})")
    bad = [u for u in names(only) if u not in UNITS]
    if bad:
        raise ValueError(f"--only: unknown {', '.join(bad)} (units: {', '.join(UNITS)})")
    wanted = {u.name for u in UNITS.values() if u.group in names(groups)} | set(names(only))
    if not (groups or only):
        wanted = set(UNITS)
    for name in list(wanted) if needs else ():
        wanted |= set(UNITS[name].needs)
    return [name for name in UNITS if name in wanted]


def list_units() -> None:
    """--list: the units by group, with their rows and the units they bring."""
    for group in GROUPS:
        print(f"{group}:")
        for u in UNITS.values():
            if u.group == group:
                needs = f" (brings {', '.join(u.needs)})" if u.needs else ""
                print(f"  {u.name:<15} {u.what}; rows {', '.join(u.rows)}{needs}")


# --- the rows and their targets -----------------------------------------------------------------
def new_row(name: str, unit: str, config: str, img_s: Optional[float] = None,
            repeats: Sequence[float] = (), reference: Optional[str] = None,
            peak_bytes: Optional[int] = None, **detail) -> dict:
    return {"name": name, "unit": unit, "status": "ok", "config": config, "img_s": img_s,
            "repeats": list(repeats), "reference": reference, "ratio": None,
            "peak_bytes": peak_bytes, "targets": [], "note": "", "detail": detail}


def workload(args: argparse.Namespace, level: str, dtype: str) -> str:
    return (f"{args.arch} {args.image_size} px, batch {args.batch_size}, channels_last, "
            f"{level} {dtype}")


def reference_of(row: str) -> Optional[str]:
    """The row a row's ratio compares with (what its method differs from in one thing)."""
    if row.startswith("engine-"):
        return "bare-" + row[len("engine-"):]
    if row in ("ddp-1rank", "dali-gpu", "nd-torchrun", *LOADER_FLAGS):
        return "nd-synthetic"
    if row.startswith("peers-nd-"):
        return "peers-timm"
    if row in DECODE_ROWS.values():
        return "nd-synthetic"
    for variants in step_variants.SETS.values():
        if row in [v.name for v in variants[1:]]:
            return variants[0].name
    return TIMM_BENCHMARK_REFERENCE.get(row)


def target_specs(row: dict, ok: Dict[str, dict]) -> List[tuple]:
    """(target name, the value it judges) for a row: its targets, from its own numbers and
    the other rows of the same record. None: a reference is missing, not assessed."""
    name, specs = row["name"], []
    share = row["detail"].get("cpu_decoded_share")
    if share is not None and share > CPU_DECODED_LIMIT:  # not GPU decoding: judged on that
        return [("gpu_decoded", 1 - share)]
    if name == "engine-O1-fp16":
        specs.append(("img_s", row["img_s"]))
    if name.startswith("engine-"):
        specs.append(("engine_bare", row["ratio"]))
    if name in ("engine-O2-fp16", "engine-O2-bf16"):
        o1 = ok.get(name.replace("O2", "O1"))
        specs.append(("o2_o1", row["img_s"] / o1["img_s"] if o1 else None))
    if name == "dali-gpu":
        specs.append(("dali_synthetic", row["ratio"]))
    if name.startswith("gpu-decode"):
        specs.append(("gpu_decode_synthetic", row["ratio"]))
    if name == "gpu-decode-nvimgcodec-compile":
        specs.append(("compiled_img_s", row["img_s"]))
    if name in DECODE_ROWS.values():
        specs.append(("decode_capacity", row["ratio"]))
    if name.startswith("peers-nd-"):
        end_to_end = row["detail"]["end_to_end"]
        specs += [("vs_timm", end_to_end.get("timm fast")),
                  ("vs_torchvision", end_to_end.get("torchvision reference"))]
    return specs


def assess(rows: List[dict], targets: Dict[str, float]) -> None:
    """Ratios and target verdicts of every row, from the rows' img/s (in place)."""
    ok = {r["name"]: r for r in rows if r["status"] == "ok"}
    for row in rows:
        row["ratio"], row["targets"] = None, []
        if row["status"] != "ok":
            continue
        ref = ok.get(row["reference"])
        if ref:
            row["ratio"] = row["img_s"] / ref["img_s"]
        for name, value in target_specs(row, ok):
            row["targets"].append({"name": name, "text": TARGET_TEXT[name].format(targets[name]),
                                   "min": targets[name], "value": value,
                                   "met": None if value is None else value >= targets[name]})


def missed(rows: List[dict]) -> List[str]:
    return [f"{r['name']}: {t['text']} ({_number(t['value'])})" for r in rows
            for t in r["targets"] if t["met"] is False]


def _number(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3f}"
