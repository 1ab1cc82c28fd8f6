"""bench.render: RESULTS.md's blocks from Markdown templates (prose) and the tools' numbers."""
from __future__ import annotations

import jinja2
import pytest

from conftest import REPO

from imagenet_recipes.bench import render


def test_wrapped_paragraphs_and_list_items_come_out_on_one_line_and_tables_as_they_are():
    text = "\n".join([
        "A paragraph wrapped", "  over three", "lines.", "",
        "| a | b |", "|---|---:|", "| 1 | 2 |", "",
        "* an item", "  continued", "* another", "",
        "![figure](figures/x.png)", "<!-- kept -->", "## heading", "next paragraph"])
    assert render.unwrap(text).split("\n") == [
        "A paragraph wrapped over three lines.", "",
        "| a | b |", "|---|---:|", "| 1 | 2 |", "",
        "* an item continued", "* another", "",
        "![figure](figures/x.png)", "<!-- kept -->", "## heading", "next paragraph"]


def test_a_template_missing_a_number_fails_instead_of_leaving_a_blank(tmp_path):
    (tmp_path / "t.md").write_text("top-1 {{ top1 | f('.1f') }} %, {{ values | spread('.0f') }}\n")
    assert render.render("t", tmp_path, top1=75.25, values=[3, 1, 2]) == "top-1 75.2 %, 2 (1-3)\n"
    with pytest.raises(jinja2.UndefinedError):
        render.render("t", tmp_path, values=[1])


def test_a_spread_is_the_median_and_its_range_and_signed_ranges_say_to():
    from imagenet_recipes.bench.common import spread

    assert spread([], ".1f") == "-" and spread([2.0, 2.01], ".1f") == "2.0"
    assert spread([3.0, 1.0, 2.0], ".1f") == "2.0 (1.0-3.0)"
    assert spread([-48.0, -46.5, -40.5], "+.1f") == "-46.5 (-48.0 to -40.5)"


@pytest.mark.parametrize("templates", [render.TEMPLATES, REPO / "lab" / "templates"],
                         ids=["tools", "lab"])
def test_every_template_is_used_by_a_tool(templates):
    """A template nobody renders is prose that no longer reaches RESULTS.md (or the lab's
    page): each is rendered by a script beside its folder."""
    import subprocess

    names = sorted(p.stem for p in templates.glob("*.md"))
    assert names
    sources = subprocess.run(["git", "grep", "-h", "render(", "--", "*.py"],
                             cwd=templates.parent, capture_output=True,
                             text=True).stdout
    for name in names:
        assert f'render("{name}"' in sources or f"render('{name}'" in sources, name
