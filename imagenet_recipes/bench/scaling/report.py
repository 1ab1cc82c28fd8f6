"""The scaling model's tables: printed, and written into RESULTS.md's scaling_model block."""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, Iterable, List, Optional

from imagenet_recipes.bench.scaling.cases import PRESETS, SOURCES, Row
from imagenet_recipes.bench.render import render
from imagenet_recipes.bench.scaling.model import GB, MIB, US, Link, Workload, params, predict


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


def cpu_markdown(rows: List[dict]) -> str:
    if not rows:
        return "(no multi-process runs found)"
    lines = ["| entry | procs x threads | arch, image, batch, precision, data, communicated | "
             "runs | measured img/s | model all-reduce | from 1-proc alone: img/s -> "
             "predicted (error) | from 1-proc beside a twin: img/s -> predicted (error) |",
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
                     f"{batch}, {prec}, {data}, {r['grad_dtype']} gradients | {r['runs']} | "
                     f"{r['measured']:.1f} | {comm} | "
                     f"{cells[0]} | {cells[1] if r['predicted'] else r['note']} |")
    return "\n".join(lines)


def results_block(rows: List[Row], cpu_rows: Optional[List[dict]], loop: Link,
                  loop_note: str, origin: str, host: str) -> str:
    """The RESULTS.md block. `origin`: the sentence that says what wrote it, from what; `host`:
    the machine the measured runs were made on."""
    scored = [r for r in rows if not r.case.anchor]
    ok = [r for r in scored if abs(r.error) <= 0.15]
    used = sorted({r.case.hardware for r in rows})
    notes: Dict[str, List[str]] = {}
    for r in rows:
        if r.case.note:
            notes.setdefault(r.case.note, []).append(r.case.name)
    return render("scaling_model", origin=origin,
                  presets=presets_markdown(used + ["cpu-loopback"]),
                  ok=len(ok), scored=len(scored), validation=validation_markdown(rows),
                  sources=[(group, SOURCES[group])
                           for group in dict.fromkeys(r.case.group for r in rows)],
                  notes=[("; ".join(names), note) for note, names in notes.items()],
                  host=host, loop_note=loop_note, bandwidth=loop.bandwidth / GB,
                  latency=loop.latency / US,
                  cpu=cpu_markdown(cpu_rows) if cpu_rows is not None else None).rstrip("\n")


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
