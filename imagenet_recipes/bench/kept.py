"""What results/ keeps of a measurement: its runs' logs, compacted into one `runs.jsonl` per
folder, holding what RESULTS.md's blocks read and nothing else.

A run's full log.jsonl stays where the measurement ran (runs/...): per-interval worker
records, checkpoint records and the same run record from every rank. `bench.regenerate
--archive` keeps, per run:

* every record of the kinds the blocks read (`KINDS`), and the per-interval `train` records
  only for the folders whose blocks read them (throughput medians, loss curves: `INTERVALS`);
* of the other records, the fields the blocks read (not `UNREAD`);
* the first and the last `run` record (what the readers take), and the record that ends the
  run's wall-clock span, whatever its kind;
* the parameter server's per-interval `worker` records merged, per worker, into two: the
  intervals of the first logged step (start-up, which the sweep leaves out) and the rest.
  Counts and times add up, running totals keep their last value, and per-interval means
  (`local_steps`, `staleness`) keep their mean with the number of intervals it is over
  (`intervals`), so every total and mean a block computes is the same.

The `config` of a run record is written as its differences from the first run's of the
folder (most options are the same throughout a study), and measured values to 8 significant
digits (clock readings, above a million, as they are): the tables print 4 at most. `load` gives back each run's log as
`read_log` gives a run folder's.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

Log = Dict[str, List[dict]]

KEPT = "runs.jsonl"
KINDS = ("run", "train_epoch", "val", "val_ema", "end", "worker", "check")
# results/ folders whose blocks read the per-interval `train` records
INTERVALS = frozenset({"quickstart", "cpu", "sweep", "ps-servers"})

# Fields of the records other than `run` that no block reads (nor their clock reading, `time`):
# left out.
UNREAD = frozenset({"time", "samples_seen", "img_s_per_proc", "bytes_pulled_per_server",
                    "staleness_max", "loss_scale", "overflows", "live_workers",
                    "evaluate_command", "best_model"})

# `worker` record fields: added up over the merged intervals / running totals (the last value) /
# per-interval values whose mean the readers take
_SUMS = ("samples", "steps", "seconds", "compute_time", "comm_time", "wait_time", "data_time")
_MEANS = ("local_steps", "staleness")


def merged_workers(workers: List[dict], first_step) -> List[dict]:
    """Per worker, its records at `first_step` merged into one and the others into another."""
    groups: Dict[Tuple, List[dict]] = {}
    for w in workers:
        groups.setdefault((w["worker"], w["step"] == first_step), []).append(w)
    merged = []
    for records in groups.values():
        m = dict(records[-1])  # running totals, step and clock: the last interval's
        for key in _SUMS:
            values = [r[key] for r in records if r.get(key) is not None]
            if values:
                m[key] = sum(values)
        for key in _MEANS:  # (mean, intervals): a record merged before counts as many
            values = [(r[key], r.get(f"{key}_intervals", 1)) for r in records
                      if r.get(key) is not None]
            if values:
                count = sum(n for _, n in values)
                m[key], m[f"{key}_intervals"] = sum(v * n for v, n in values) / count, count
        merged.append(m)
    return merged


def compact(log: Log, intervals: bool) -> List[dict]:
    """The records of one run's log that results/ keeps, in the log's order of kinds."""
    runs = log.get("run", [])
    kept = runs[:1] + runs[-1:] if len(runs) > 1 else list(runs)
    for kind in KINDS[1:]:
        if kind == "worker":
            train = log.get("train", [])
            kept += merged_workers(log.get(kind, []), train[0]["step"] if train else None)
        else:
            kept += log.get(kind, [])
    if intervals:
        kept += log.get("train", [])
    every = [r for records in log.values() for r in records]
    last = max(every, key=lambda r: r.get("elapsed", 0.0), default=None)
    if last is not None and not any(r is last for r in kept):
        kept.append(last)
    return kept


def write(runs: Iterable[Tuple[str, Log]], target: Path, intervals: bool) -> Path:
    """`target`/runs.jsonl: a line per (name, log), config as changes from the first run's."""
    target.mkdir(parents=True, exist_ok=True)
    base = None
    lines = []
    for name, log in runs:
        records = []
        for r in compact(log, intervals):
            if r.get("kind") == "run" and isinstance(r.get("config"), dict):
                base = r["config"] if base is None else base
                changes = {k: v for k, v in r["config"].items() if base.get(k, _ABSENT) != v}
                gone = sorted(k for k in base if k not in r["config"])
                r = {**{k: v for k, v in r.items() if k != "config"}, "config_changes": changes,
                     **({"config_absent": gone} if gone else {})}
            elif r.get("kind") != "run":
                r = {k: v for k, v in r.items() if k not in UNREAD}
            records.append(_rounded(r))
        lines.append(json.dumps({"name": name, "records": records}))
    header = json.dumps({"kept": KEPT, "base_config": base or {}})
    (target / KEPT).write_text("\n".join([header, *lines]) + "\n")
    return target / KEPT


_ABSENT = object()


def _rounded(value):
    """Floats below a million to 8 significant digits, in lists and dicts too."""
    if isinstance(value, float) and abs(value) < 1e6:
        return float(f"{value:.8g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def load(path: Path) -> List[Tuple[str, Log]]:
    """(name, log) of each run in a runs.jsonl, the logs as read_log groups them."""
    header, *lines = path.read_text().splitlines()
    base = json.loads(header)["base_config"]
    runs = []
    for line in lines:
        entry = json.loads(line)
        log: Log = {}
        for r in entry["records"]:
            if "config_changes" in r:
                config = {k: v for k, v in base.items() if k not in r.get("config_absent", ())}
                config.update(r["config_changes"])
                r = {k: v for k, v in r.items() if k not in ("config_changes", "config_absent")}
                r["config"] = config
            log.setdefault(r.get("kind"), []).append(r)
        runs.append((entry["name"], log))
    return runs
