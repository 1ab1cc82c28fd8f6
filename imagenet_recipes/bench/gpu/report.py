"""What bench.gpu writes: a row's console line, the JSON record (--json), and RESULTS.md's `gpu`
block, which bench.regenerate renders from the records kept in results/gpu/*.json (a row measured
in several records: from the latest)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

from imagenet_recipes.bench.common import shown_commit
from imagenet_recipes.bench.gpu.units import RECORD_TOOL, ROW_ORDER, UNITS
from imagenet_recipes.bench.render import render


# --- the console and the record -----------------------------------------------------------------
def _memory(peak: Optional[int]) -> str:
    return "n/a" if peak is None else f"{peak / 2**30:.1f} GiB"


def verdicts(row: dict) -> str:
    marks = {True: "met", False: "MISSED", None: "not assessed (reference not measured)"}
    return "; ".join(f"{t['text']}: {marks[t['met']]}" for t in row["targets"])


def print_row(row: dict) -> None:
    if row["status"] != "ok":
        print(f"{row['name']:<16} {row['status'].upper()}: {row['note']}", flush=True)
        return
    text = f"{row['name']:<16} {row['img_s']:>9,.1f} img/s"
    if row["ratio"] is not None:
        text += f"  {row['ratio']:.3f}x {row['reference']}"
    text += f"  peak {_memory(row['peak_bytes'])}"
    if row["targets"]:
        text += f"  [{verdicts(row)}]"
    print(text, flush=True)


def write_record(path: Path, record: dict) -> None:
    """Whole or not at all: a kill while writing leaves the previous version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps(record, indent=2) + "\n")
    scratch.replace(path)


# --- RESULTS.md ---------------------------------------------------------------------------------
def records(folder: Path) -> List[tuple]:
    """(file name, record) of the bench.gpu records in `folder`, oldest first."""
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = json.loads(path.read_text())
        if isinstance(record, dict) and record.get("tool") == RECORD_TOOL:
            found.append((path.name, record))
    return sorted(found, key=lambda item: (item[1]["date"], item[0]))


def _cells(i: int, row: dict) -> list:
    """A measured row's cells in the table; i: the record it comes from."""
    ratio = (f"{row['ratio']:.3f}x {row['reference']}" if row["ratio"] is not None
             else "")
    marks = {True: "met", False: "**MISSED**", None: "not assessed"}
    targets = "; ".join(f"{t['text']}: {marks[t['met']]}" for t in row["targets"])
    spread = (f"{min(row['repeats']):,.0f}-{max(row['repeats']):,.0f}" if row["repeats"]
              else "")
    return [f"{row['name']} [{i}]", row["config"], targets or "-", f"{row['img_s']:,.1f}",
            ratio, _memory(row["peak_bytes"]), spread]


def _measurement(row: dict) -> tuple:
    return row["name"], row["img_s"], tuple(row["repeats"])


def _copied(row: dict) -> bool:
    """A row a record brought along from another (`--reuse`: bench/gpu/run.py marks it)."""
    return "reused_from" in (row.get("detail") or {})


def _measured(kept: List[tuple]) -> List[List[dict]]:
    """Each record's rows, less the copies of a measurement that a kept record holds as its
    own."""
    own = {_measurement(row) for _, record in kept for row in record["rows"] if not _copied(row)}
    return [[row for row in record["rows"] if not _copied(row) or _measurement(row) not in own]
            for _, record in kept]


def block(folder: Path, figures: Optional[Path] = None) -> str:
    """RESULTS.md's `gpu` block from the records in `folder` (results/gpu/): every row once,
    from the latest record that measured it, then the earlier measurements of the rows measured
    again (a row a record only copied from another kept record, `--reuse`, is that record's);
    or, without a record, a plain statement that none exists."""
    kept = records(folder)
    if not kept:
        return render("gpu", records=None)
    measured = _measured(kept)
    latest: Dict[str, tuple] = {}
    for i, rows in enumerate(measured, 1):
        for row in rows:
            latest[row["name"]] = (i, row)
    order = {name: n for n, name in enumerate(ROW_ORDER)}
    shown = sorted(latest.values(), key=lambda item: order.get(item[1]["name"], len(order)))
    # a row measured again later: its earlier measurements stay on the page, below the table
    earlier = [(i, row) for i, rows in enumerate(measured, 1) for row in rows
               if latest[row["name"]][0] != i and row["status"] == "ok"]
    used = []  # the records some row comes from: (number, file name, record, versions)
    for i in sorted({i for i, _ in shown + earlier}):
        name, record = kept[i - 1]
        env = record["environment"]
        used.append((i, name, record, ", ".join(
            f"{k} {env[k]}" for k in ("torch", "cuda", "cudnn", "nccl", "nvidia-dali")
            if env.get(k))))
    table = []
    for i, row in shown:
        name = f"{row['name']} [{i}]"  # [i]: the record it comes from, listed above
        if row["status"] != "ok":
            table.append([name, row["config"], f"{row['status']}: {row['note']}".replace(
                "|", "/"), "", "", "", ""])
            continue
        table.append(_cells(i, row))
    causes = any(UNITS.get(row["unit"]) and UNITS[row["unit"]].group == "causes"
                 for _, row in shown)
    return render("gpu", records=used, rows=table, causes=causes,
                  earlier=[_cells(i, row) for i, row in earlier],
                  met=sum(t["met"] is True for _, r in shown for t in r["targets"]),
                  missed=sum(t["met"] is False for _, r in shown for t in r["targets"]),
                  shown_commit=shown_commit)
