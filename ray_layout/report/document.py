"""The report as a list of blocks (headings, paragraphs, tables, code, figures), rendered to
Markdown and to one self-contained HTML page, so that both documents say the same thing."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Styled:
    """Inline text in a style; each style is a subclass, so a renderer matches on the type."""

    text: str


class Code(Styled):
    """Inline code (a layout, a path, a flag)."""


class Strong(Styled):
    """Strong emphasis (the pick, a total)."""


Inline = str | Code | Strong
Parts = tuple[Inline, ...]


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    parts: Parts


@dataclass(frozen=True)
class CodeBlock:
    text: str
    language: str = ""


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[Inline | Parts, ...], ...]
    numeric: tuple[bool, ...]  # right-aligned columns


@dataclass(frozen=True)
class Bullets:
    items: tuple[Parts, ...]


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str
    png: Path  # where it was written
    svg: Path


Block = Heading | Para | CodeBlock | Table | Bullets | Figure

_MD_SPECIAL = "\\`*_[]<>|~"


def _md_escape(text: str) -> str:
    """Backslash before every character Markdown could read as markup (``|`` included, for
    tables); an underscore inside a word stays bare, as GFM never reads it as emphasis."""
    text = " ".join(text.splitlines())
    out = []
    for i, c in enumerate(text):
        intraword = 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
        out.append("\\" + c if c in _MD_SPECIAL and not (c == "_" and intraword) else c)
    return "".join(out)


def _parts(cell: Inline | Parts) -> Parts:
    return cell if isinstance(cell, tuple) else (cell,)


def _md_inline(parts: Parts, in_table: bool = False) -> str:
    out = []
    for part in parts:
        if isinstance(part, Code):
            text = " ".join(part.text.splitlines())
            fence = "``" if "`" in text else "`"
            pad = " " if fence == "``" else ""
            if in_table:  # GFM splits cells before code spans: a pipe needs its backslash
                text = text.replace("|", "\\|")
            out.append(f"{fence}{pad}{text}{pad}{fence}")
        elif isinstance(part, Strong):
            out.append(f"**{_md_escape(part.text)}**")
        else:
            out.append(_md_escape(part))
    return "".join(out)


def render_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append("#" * block.level + " " + _md_escape(block.text))
        elif isinstance(block, Para):
            out.append(_md_inline(block.parts))
        elif isinstance(block, CodeBlock):
            fence = "````" if "```" in block.text else "```"
            out.append(f"{fence}{block.language}\n{block.text}\n{fence}")
        elif isinstance(block, Table):
            lines = ["| " + " | ".join(_md_escape(h) for h in block.header) + " |"]
            lines.append("|" + "|".join("---:" if n else "---" for n in block.numeric) + "|")
            for row in block.rows:
                cells = (_md_inline(_parts(cell), in_table=True) for cell in row)
                lines.append("| " + " | ".join(cells) + " |")
            out.append("\n".join(lines))
        elif isinstance(block, Bullets):
            out.append("\n".join("- " + _md_inline(item) for item in block.items))
        elif isinstance(block, Figure):
            png, svg = f"plots/{block.png.name}", f"plots/{block.svg.name}"
            out.append(
                f"![{_md_escape(block.caption)}]({png})\n\n"
                f"{_md_escape(block.caption)} (PNG `{png}`, SVG `{svg}`)"
            )
    return "\n\n".join(out) + "\n"


def _html_inline(parts: Parts) -> str:
    out = []
    for part in parts:
        if isinstance(part, Code):
            out.append(f"<code>{html.escape(part.text)}</code>")
        elif isinstance(part, Strong):
            out.append(f"<strong>{html.escape(part.text)}</strong>")
        else:
            out.append(html.escape(part))
    return "".join(out)


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       max-width: 1180px; margin: 2em auto; padding: 0 1em; line-height: 1.45; }
h1 { border-bottom: 2px solid #4C78A8; padding-bottom: .2em; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: .15em; }
code, pre { font-family: "SFMono-Regular", Menlo, Consolas, monospace; font-size: .92em; }
code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; }
pre { background: #f6f8fa; border: 1px solid #ddd; padding: .8em; overflow-x: auto; }
pre code { background: none; padding: 0; }
table { border-collapse: collapse; margin: .6em 0; font-size: .92em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; vertical-align: top; text-align: left; }
th { background: #f0f3f7; }
td.num, th.num { text-align: right; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: .9em; }
""".strip()


def render_html(blocks: Sequence[Block], title: str) -> str:
    """One self-contained page: inline CSS, figures as base64 PNG, no scripts, no links."""
    body: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            body.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Para):
            body.append(f"<p>{_html_inline(block.parts)}</p>")
        elif isinstance(block, CodeBlock):
            body.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif isinstance(block, Table):
            cls = [' class="num"' if n else "" for n in block.numeric]
            head = "".join(
                f"<th{c}>{html.escape(h)}</th>" for c, h in zip(cls, block.header, strict=True)
            )
            rows = "\n".join(
                "<tr>"
                + "".join(
                    f"<td{c}>{_html_inline(_parts(cell))}</td>"
                    for c, cell in zip(cls, row, strict=True)
                )
                + "</tr>"
                for row in block.rows
            )
            body.append(
                f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>"
            )
        elif isinstance(block, Bullets):
            items = "\n".join(f"<li>{_html_inline(item)}</li>" for item in block.items)
            body.append(f"<ul>\n{items}\n</ul>")
        elif isinstance(block, Figure):
            data = base64.b64encode(block.png.read_bytes()).decode("ascii")
            caption = html.escape(block.caption)
            body.append(
                f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n{CSS}\n</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def figure_or_note(name: str, figures: Mapping[str, Figure], skipped: Mapping[str, str]) -> Block:
    """The plot ``name``, or a line saying why it was skipped."""
    if name in figures:
        return figures[name]
    return Para((f"Plot {name.replace('_', ' ')} skipped: {skipped.get(name, 'no data')}.",))
