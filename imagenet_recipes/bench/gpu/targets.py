"""The GPU run's three targets, met or not, from the records tools/gpu_session.sh left in DIR
(gpu_scripts.json, gpu_compile.json); printed, and written to DIR/targets.json:

    python -m imagenet_recipes.bench.gpu.targets DIR

  default command     train/nd.py with the default loader (pytorch-loader) >= 0.98x synthetic
  GPU decoding        the best GPU-decoding backend (gpu-decode, gpu-decode-nvimgcodec,
                      dali-gpu) >= 0.98x synthetic; a row with more than 1 % of its images
                      decoded on the CPU does not count
  compiled            gpu-decode-nvimgcodec-compile >= 6,000 img/s on an H200, >= 5,300 on an
                      H100 (other GPUs: the H200's, said so)
A target whose row was not measured is "not measured", with the row's note where it has one.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from imagenet_recipes.bench.gpu.units import CPU_DECODED_LIMIT

RATIO = 0.98
GPU_DECODING_ROWS = ("gpu-decode", "gpu-decode-nvimgcodec", "dali-gpu")
COMPILED_IMG_S = {"H200": 6000.0, "H100": 5300.0}


def _rows(out: Path) -> Dict[str, dict]:
    rows, gpu = {}, None
    for name in ("gpu_scripts.json", "gpu_compile.json"):
        path = out / name
        if path.is_file():
            record = json.loads(path.read_text())
            gpu = gpu or record.get("environment", {}).get("gpu")
            rows.update({r["name"]: r for r in record["rows"]})
    rows["_gpu"] = {"name": gpu}
    return rows


def _why_not(row: Optional[dict]) -> str:
    if row is None:
        return "its step did not run"
    return f"{row['status']}: {row.get('note') or 'no note'}"


def judge(out: Path) -> List[dict]:
    rows = _rows(out)
    ok = {name: r for name, r in rows.items() if r.get("status") == "ok"}
    found = []

    def verdict(target: str, row: Optional[dict], value: Optional[float], least: float,
                unit: str, why: str = "") -> None:
        found.append({"target": target, "row": row["name"] if row else None, "value": value,
                      "min": least, "unit": unit, "met": None if value is None else value >= least,
                      "note": why})

    default = rows.get("pytorch-loader")
    verdict("default command (pytorch-loader) vs synthetic", default,
            ok["pytorch-loader"]["ratio"] if "pytorch-loader" in ok else None, RATIO, "x",
            "" if "pytorch-loader" in ok else _why_not(default))

    decoding = [r for name, r in ok.items() if name in GPU_DECODING_ROWS and r["ratio"]
                and (r["detail"].get("cpu_decoded_share") or 0) <= CPU_DECODED_LIMIT]
    best = max(decoding, key=lambda r: r["ratio"], default=None)
    counted = {r["name"] for r in decoding}
    left_out = [f"{n}: " + (f"not measured, {_why_not(rows.get(n))}" if n not in ok
                            else "decoded on the CPU") for n in GPU_DECODING_ROWS
                if n not in counted]
    verdict("best GPU-decoding backend vs synthetic", best, best["ratio"] if best else None,
            RATIO, "x", "; ".join(left_out))

    gpu = rows["_gpu"]["name"] or ""
    model = next((m for m in COMPILED_IMG_S if m in gpu), None)
    compiled = rows.get("gpu-decode-nvimgcodec-compile")
    least = COMPILED_IMG_S[model or "H200"]
    note = "" if model else f"{gpu or 'this device'}: the H200's target"
    if compiled is not None and compiled["status"] == "ok":
        verdict(f"compiled, nvImageCodec ({model or 'H200'})", compiled, compiled["img_s"],
                least, "img/s", "; ".join(filter(None, [note, compiled.get("note", "")])))
    else:
        verdict(f"compiled, nvImageCodec ({model or 'H200'})", compiled, None, least, "img/s",
                _why_not(compiled))
    return found


def line(t: dict) -> str:
    state = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
    value = "" if t["value"] is None else (
        f"{t['value']:.3f}x" if t["unit"] == "x" else f"{t['value']:,.0f} img/s")
    need = f">= {t['min']:g}x" if t["unit"] == "x" else f">= {t['min']:,.0f} img/s"
    return (f"target {t['target']} {need}: {state}{' at ' + value if value else ''}"
            f"{' (' + t['row'] + ')' if t['row'] and t['value'] is not None else ''}"
            f"{'; ' + t['note'] if t['note'] else ''}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m imagenet_recipes.bench.gpu.targets DIR (gpu_session.sh's --out)",
              file=sys.stderr)
        return 2
    out = Path(argv[0])
    found = judge(out)
    for t in found:
        print(f"gpu_session: {line(t)}", flush=True)
    (out / "targets.json").write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
