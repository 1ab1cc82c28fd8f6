"""RESULTS.md's prose, in Markdown: each measured block is a Jinja2 template in imagenet_recipes/bench/templates/
(named after the block), filled with the numbers its tool reads from the kept records. A wording
fix is an edit of the template; what a number is and where it comes from stays in the tool.

In a template: `{{ x | f(".1f") }}` formats a number (`f(".1f", "-")`: "-" for None), `{{ values | spread(".1f") }}` gives the
median with the lowest and highest value, `{{ table(header, rows, right_from) }}` a Markdown
table. A paragraph or list item may be wrapped freely: the output joins its lines, as Markdown
reads them, so that a block's text is one line per paragraph whatever the template's wrapping."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import jinja2

from imagenet_recipes.bench.common import markdown_table, spread

TEMPLATES = Path(__file__).parent / "templates"



def _format(value, spec: str, none: str = None) -> str:
    """`format(value, spec)`; `none`: the text for a None (without it, None is an error)."""
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()  # a missing number is an error, not a blank
    if value is None and none is not None:
        return none
    return format(value, spec)


@functools.lru_cache(maxsize=None)
def _environment(folder: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["f"] = _format
    env.filters["spread"] = spread
    env.globals["table"] = markdown_table
    return env


# Lines that start a Markdown block of their own (never the continuation of a paragraph).
_BLOCK_START = re.compile(r"\s*(\||#|!\[|<!--|[*-] |\d+\. |```)")


def unwrap(text: str) -> str:
    """Each paragraph and list item on one line: a line continues the previous one unless
    either is blank, it starts a block (table row, heading, image, list item, ...) or the
    previous one is a table row, heading or image."""
    out: list = []
    for line in text.split("\n"):
        previous = out[-1] if out else ""
        if (line.strip() and previous.strip() and not _BLOCK_START.match(line)
                and not re.match(r"\s*(\||#|!\[|<!--)", previous)):
            out[-1] = f"{previous} {line.strip()}"
        else:
            out.append(line)
    return "\n".join(out)


def render(block: str, templates: Path = TEMPLATES, **numbers) -> str:
    """<templates>/<block>.md filled with `numbers`: RESULTS.md's blocks from
    imagenet_recipes/bench/templates/, another page's (lab/README.md) from its own folder."""
    return unwrap(_environment(Path(templates)).get_template(f"{block}.md").render(**numbers))
