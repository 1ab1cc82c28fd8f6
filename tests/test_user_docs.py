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
