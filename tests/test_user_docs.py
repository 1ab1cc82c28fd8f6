"""What a user reads, held to what the project has.

* One set of commands: README's hardware table gives the 1-GPU, 8-GPU, 8-GPU-with-DALI and
  N-node commands; docs/recipes.md, the entry scripts' `-h` and the multi-node batch script's
  header give the same ones, and no 8-GPU ImageNet command anywhere in the user docs hand-sets a
  recipe: each names a preset, by name, and an N-node one keeps its published global batch.
* Every number README's GPU statements quote, and every figure of a thousand or more in
  RESULTS.md's GPU sections, is one a rendered block of RESULTS.md shows (those are written
  from the kept records, `bench.regenerate --check`), at the precision quoted, or a preset's
  published figure (its `[reference]` table).
"""
from __future__ import annotations

import re
import tomllib

import pytest

from conftest import REPO

PRESETS = sorted(p.stem for p in (REPO / "recipes").glob("*.toml"))
README = (REPO / "README.md").read_text()


def section(text: str, heading: str) -> str:
    """The text under a `## heading`, up to the next `## `."""
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 3)
    return text[start:end if end > 0 else None]


def hardware_table() -> dict:
    """README's "Which command for my hardware": {hardware: (command, what to expect)}."""
    rows = {}
    for line in section(README, "Which command for my hardware").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`"):
            rows[cells[0]] = (cells[1].strip("`"), cells[2])
    return rows


def commands() -> dict:
    table = hardware_table()
    return {"1 GPU": table["1 GPU"][0], "8 GPUs": table["one 8-GPU node"][0],
            "8 GPUs, DALI": table["the same, GPU decoding"][0],
            "N nodes": table["N nodes, SLURM"][0]}


def entry_help(entry: str, capsys) -> str:
    import importlib

    module = importlib.import_module(f"imagenet_recipes.train.{entry}")
    with pytest.raises(SystemExit):
        module.main(["-h"])
    return capsys.readouterr().out


def test_the_hardware_tables_commands_are_the_ones_users_meet_elsewhere(capsys):
    cmd = commands()
    assert cmd["1 GPU"] == "python train/nd.py --config nvidia_rn50_amp /data/imagenet"
    recipes_doc = (REPO / "docs/recipes.md").read_text()
    assert [name for name, c in cmd.items() if c not in recipes_doc] == []
    assert cmd["1 GPU"] in entry_help("nd", capsys)
    apex_help = entry_help("ddp_apex", capsys)
    assert cmd["8 GPUs"] in apex_help and cmd["8 GPUs, DALI"] in apex_help
    header = (REPO / "launch/slurm/ddp_amp_multi_node.sbatch").read_text()
    assert f"#   {cmd['N nodes']}\n" in header


# the forms an 8-GPU-per-node ImageNet command may take: a preset by name, and on several nodes
# its published global batch; options may follow the preset (a visible change to it)
_ENTRY = r"(?:train/\w+\.py|-m imagenet_recipes\.train\.\w+)"
_PRESET = r"--config (?P<preset>\w+)(?: --?[\w-]+(?: [\w.-]+)?)*"  # options may follow it
EIGHT_GPU_FORMS = [
    re.compile(rf"torchrun --nproc_per_node=8 {_ENTRY} {_PRESET} /data/imagenet"),
    re.compile(rf"torchrun --nnodes=\d+ --nproc_per_node=8 (?:--rdzv[\w-]*=\S+ )*{_ENTRY} "
               rf"{_PRESET} --global-batch published /data/imagenet"),
    re.compile(rf"sbatch --gpus-per-node=8 launch/slurm/ddp_amp_single_node\.sbatch "
               rf"/data/imagenet {_PRESET}"),
    re.compile(rf"sbatch --nodes=\d+ --gpus-per-node=8 (?:--partition=P --account=A )?"
               rf"launch/slurm/ddp_amp_multi_node\.sbatch /data/imagenet {_PRESET} "
               rf"--global-batch published"),
]
_COMMAND = re.compile(r"(?:torchrun|sbatch)\s[^`|#\n]*/data/imagenet[^`|#\n]*")


def user_docs() -> list:
    files = [REPO / "README.md", REPO / "launch/README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "launch").rglob("*.sh")), *sorted((REPO / "launch").rglob("*.sbatch")),
             *sorted((REPO / "recipes").glob("*.toml")),
             *sorted((REPO / "imagenet_recipes/train").glob("*.py"))]
    return [p for p in files if p.name != "testing.md"]  # the maintainers' page


def eight_gpu_commands(text: str) -> list:
    """The commands in `text` that start 8 processes per node on /data/imagenet (a `\\`
    continuation joined, in a comment or not)."""
    joined = re.sub(r"\\+\n#?\s*", " ", text)
    found = [re.sub(r"\s+", " ", m.group(0)).strip() for m in _COMMAND.finditer(joined)]
    return [c for c in found if "--nproc_per_node=8 " in c or "--gpus-per-node=8 " in c]


def off_the_recipe(command: str) -> bool:
    match = next((m for form in EIGHT_GPU_FORMS if (m := form.fullmatch(command))), None)
    return match is None or match["preset"] not in PRESETS


def test_no_user_doc_gives_an_eight_gpu_command_of_its_own():
    seen = {str(path.relative_to(REPO)): eight_gpu_commands(path.read_text())
            for path in user_docs()}
    assert sum(map(len, seen.values())) >= 10, seen
    assert [f"{path}: {c}" for path, found in seen.items() for c in found
            if off_the_recipe(c)] == []
    # what the docs gave before: a hand-set recipe, a preset by path, 4x the recipe's batch
    for planted in ("torchrun --nproc_per_node=8 train/ddp_apex.py -a resnet50 -b 208 "
                    "--opt-level O2 /data/imagenet",
                    "torchrun --nproc_per_node=8 train/ddp_apex.py --config "
                    "recipes/torchvision_v2.toml /data/imagenet",
                    "sbatch --nodes=4 --gpus-per-node=8 launch/slurm/ddp_amp_multi_node.sbatch "
                    "/data/imagenet --config nvidia_rn50_amp"):
        assert eight_gpu_commands(f"`{planted}`") == [planted]
        assert off_the_recipe(planted), planted


# --- numbers ---------------------------------------------------------------------------------
_NUMBER = re.compile(r"(?<![\w.,-])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d{3,})(?![\w.]\d)")


def quoted_numbers(text: str) -> list:
    """Numbers of 3 digits or more, or with a decimal point, outside `code` spans."""
    return _NUMBER.findall(re.sub(r"`[^`]*`", "", text))


def rendered_numbers() -> list:
    """Every number in RESULTS.md's rendered blocks (written from the kept records)."""
    results = (REPO / "RESULTS.md").read_text()
    blocks = re.findall(r"<!-- (\w+):start -->(.*?)<!-- \1:end -->", results, re.S)
    return [float(n.replace(",", "")) for _, block in blocks for n in _NUMBER.findall(block)]


def published_numbers() -> list:
    values = []
    for name in PRESETS:
        reference = tomllib.loads((REPO / "recipes" / f"{name}.toml").read_text())["reference"]
        values += [float(v) for v in reference.values() if isinstance(v, (int, float))]
    return values


def unfounded(quoted: list, known: list) -> list:
    """The quoted numbers no known number rounds to (at the quoted number's decimals)."""
    def decimals(n: str) -> int:
        return len(n.split(".")[1]) if "." in n else 0
    return [n for n in quoted if not any(
        round(k, decimals(n)) == float(n.replace(",", "")) for k in known)]


def test_readme_quotes_only_numbers_from_records_or_the_presets_sources():
    intro = README[README.index("```\n", README.index("```bash")) + 4:README.index("\n## ")]
    table = " ".join(expect for _, expect in hardware_table().values())
    status = section(README, "Which command for my hardware")
    status = status[status.index("**What has run where.**"):]
    quoted = quoted_numbers(intro + table + status)
    assert len(quoted) >= 10, quoted
    known = rendered_numbers() + published_numbers()
    assert unfounded(quoted, known) == []
    # the estimates README gave before were none of them
    assert unfounded(quoted_numbers("about 4,420 img/s; 18.4 min"), known) == ["4,420", "18.4"]


def test_results_gpu_prose_quotes_no_figure_that_its_blocks_do_not_show():
    """RESULTS.md's summary table and its GPU sections' prose: each figure of a thousand or
    more, and each with decimals in the summary, is one the rendered blocks show."""
    results = (REPO / "RESULTS.md").read_text()
    prose = "".join(re.sub(r"<!-- (\w+):start -->.*?<!-- \1:end -->", "",
                           section(results, heading), flags=re.S)
                    for heading in ("GPU throughput (`imagenet_recipes/bench/gpu/`)",
                                    "GPU tier (`launch/gpu_check.sh`)"))
    summary = section(results, "What to expect")
    quoted = [n for n in quoted_numbers(prose) if "," in n] + [
        n for n in quoted_numbers(summary) if "," in n or "." in n]
    assert len(quoted) >= 20, quoted
    assert unfounded(quoted, rendered_numbers()) == []


# --- docs/*.md: each measured figure names its record row ------------------------------------
_FIG = r"(?<![\w.,-])(?P<fig>{n}(?:-{n})?)".format(
    n=r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)")
_RATE = r"\s+(?:training\s+)?(?:img/s|images\s+per\s+second)"
MEASURED = [  # what counts as a measured figure (test_every_measured_figure_in_docs_names...)
    re.compile(_FIG + _RATE),                                              # 1,028 img/s
    re.compile(r"(?<![\w.,-])(?P<fig>\d+\.\d+(?:-\d+\.\d+)?)x\b"),         # 0.97x, 0.7-0.8x
    re.compile(_FIG + r"\s*%\s+(?:of\s+(?:its\s+time|the\s+rate|the\s+throughput)"
               r"|slower|faster)"),                                        # 16 % of its time
]
_CITED = re.compile(_FIG + r"(?P<unit>x\b|\s*%|" + _RATE + r")?"
                    r"(?P<comment><!--)\s*(?P<ref>.*?)\s*-->", re.S)
_SOURCE = re.compile(r"^((?:results|tests)/[\w./-]+?):?\s+(.*)$|^((?:results|tests)/[\w./-]+)$")


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def prose(text: str) -> str:
    """`text` with fenced blocks and `code` spans blanked out (offsets kept)."""
    text = re.sub(r"^ *```.*?^ *```", _blank, text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", _blank, text)


def _row(record, path: str):
    """The row at `path` ("a/b": keys, or the `name` of a row in a list; a record's "rows"
    list or "results" dict may be left out of the path)."""
    node = record
    for key in filter(None, path.split("/")):
        for place in (node, node.get("rows") if isinstance(node, dict) else None,
                      node.get("results") if isinstance(node, dict) else None):
            if isinstance(place, dict) and key in place:
                node = place[key]
                break
            if isinstance(place, list):
                named = [r for r in place if isinstance(r, dict) and r.get("name") == key]
                if len(named) == 1:
                    node = named[0]
                    break
        else:
            raise KeyError(f"no row {path!r}")
    return node


def _record(source: str):
    """A kept record: a tool's JSON file, or a folder of kept runs (`runs.jsonl`), whose rows
    are `bench.sweep_stats`'s, by run name."""
    import json

    path = REPO / source
    if source.endswith(".json") and path.is_file():
        return json.loads(path.read_text())
    if (path / "runs.jsonl").is_file():
        from imagenet_recipes.bench import sweep_stats

        return {r["run"]: r for r in sweep_stats.analyze(sweep_stats.load_sweep(path))}
    raise FileNotFoundError(f"no record {source}")


def _value(ref: str) -> float:
    """`SOURCE: ROW FIELD ÷ [SOURCE: ]ROW FIELD ÷ NUMBER ...`, evaluated."""
    value, source = None, None
    for operand in (o.strip() for o in ref.split("÷")):
        if re.fullmatch(r"\d+(?:\.\d+)?", operand):
            number = float(operand)
        else:
            named = _SOURCE.match(operand)
            if named:
                source, operand = named[1] or named[3], named[2] or ""
            if source is None or not source.startswith("results/"):
                raise ValueError(f"{ref!r}: no results/ record named")
            path, _, field = operand.rpartition(" ")
            number = float(_row(_record(source), path)[field])
        value = number if value is None else value / number
    return value


def figure_problems(text: str) -> tuple:
    """(cited figures, problems): each measured figure without a citation, each citation
    whose record, row or field is missing or whose value, at the figure's decimals, is not
    the figure."""
    text = prose(text)
    cited, problems = {}, []
    for m in _CITED.finditer(text):
        fig, unit, ref = m["fig"], (m["unit"] or "").strip(), m["ref"]
        cited[m.start("fig")] = fig
        where = f"{fig}{unit} <!-- {ref} -->"
        ends, refs = fig.split("-") if "-" in fig.replace(",", "") else [fig], ref.split(";")
        if ref.startswith("tests/"):  # a bound or a count a test computes, not a measurement
            test = REPO / ref.split()[0]
            if not (test.is_file() and f"{fig}{unit}" in test.read_text()):
                problems.append(f"{where}: that test does not state {fig}{unit}")
            continue
        if len(refs) != len(ends):
            problems.append(f"{where}: {len(ends)} figure(s), {len(refs)} row(s)")
            continue
        for end, one in zip(ends, refs):
            try:
                value = _value(one) * (100 if unit == "%" else 1)
            except (KeyError, ValueError, TypeError, FileNotFoundError) as error:
                problems.append(f"{where}: {error}")
                continue
            decimals = len(end.split(".")[1]) if "." in end else 0
            if round(value, decimals) != float(end.replace(",", "")):
                problems.append(f"{where}: the record gives {value:.4g}")
    attached = {c.start("comment") for c in _CITED.finditer(text)}
    for m in re.finditer(r"<!--\s*(?:results|tests)/.*?-->", text, re.S):
        if m.start() not in attached:
            problems.append(f"{m.group(0)}: follows no figure (or its unit)")
    blanked = re.sub(r"<!--.*?-->", _blank, text, flags=re.S)
    for pattern in MEASURED:
        for m in pattern.finditer(blanked):
            if m.start("fig") not in cited:
                line = blanked.count("\n", 0, m.start()) + 1
                problems.append(f"line {line}: {m.group(0)!r} names no record")
    return cited, problems


def test_every_measured_figure_in_docs_names_its_record_row_and_equals_it():
    """docs/*.md: every measured figure names the kept record and row it comes from, in an
    HTML comment right after it (or after its unit), and is that row's value at the figure's
    precision ("4,943" is round(4943.2); "0.877x" is round(0.87734, 3); "65 %" is 100x the
    value).

    Measured figures, in the prose (not in code): a rate (a number or range followed by
    `img/s` or `(training) images per second`), a ratio with a decimal point followed by `x`
    (`0.97x`, `0.7-0.8x`; an integer factor such as "2x slower" or "within 3x" is a setting or
    a bound), and a share of time or rate (`N %` followed by "of its time", "of the rate", "of
    the throughput", "slower" or "faster"). Counts, sizes, settings, accuracies and seconds are
    not detected; a citation may still be given for any figure, and then it is checked too.

    A citation: `<!-- SOURCE: ROW FIELD -->`, SOURCE a record under results/ (a tool's JSON
    file, or a folder of kept runs, whose rows are `bench.sweep_stats`'s by run name), ROW the
    row's name (or its path of keys, `alone/threads, 1`), FIELD its last word (`img_s`,
    `ratio`, ...). `A ÷ B [÷ C]` divides rows (B may name a source of its own, else it is A's)
    or numbers (`÷ 60`: seconds to minutes); a range `a-b` gives one such citation per end,
    separated by `;`. A figure a test asserts or computes (not a measurement) names the test
    file, `<!-- tests/test_x.py -->`, and that file must state the figure.
    """
    counts, problems = {}, []
    for path in sorted((REPO / "docs").glob("*.md")):
        cited, found = figure_problems(path.read_text())
        counts[path.name] = len(cited)
        problems += [f"docs/{path.name}: {p}" for p in found]
    assert problems == []
    assert sum(counts.values()) >= 30 and counts["data.md"] >= 20, counts
    # planted: a made-up figure citing a real row, figures citing none, a row that is not
    # there, a ratio of the wrong rows, a figure its test does not state, a citation after a
    # unit it does not know; true figures, a range among them, pass
    good = ("5,634 img/s<!-- results/gpu/h200_scripts.json: nd-synthetic img_s --> and "
            "4,648-4,670<!-- results/gpu/gpu_loader.json: nd-synthetic img_s; "
            "results/gpu/gpu_scripts.json: nd-synthetic img_s --> img/s")
    assert figure_problems(good) == ({0: "5,634", 74: "4,648-4,670"}, [])
    for planted in ("5,700 img/s<!-- results/gpu/h200_scripts.json: nd-synthetic img_s -->",
                    "fed 4,943 img/s (0.877x)",
                    "4,943 img/s<!-- results/gpu/h200_scripts.json: pytorch-loaders img_s -->",
                    "0.877x<!-- results/gpu/h200_scripts.json: nd-synthetic img_s ÷ "
                    "pytorch-loader img_s -->",
                    "6.9x<!-- tests/test_gpu_decode.py -->",
                    "(29 s<!-- results/gpu/h200_scripts.json: nd-synthetic seconds -->)"):
        assert figure_problems(planted)[1] != [], planted
    assert len(figure_problems("fed 4,943 img/s (0.877x), 16 % slower")[1]) == 3
