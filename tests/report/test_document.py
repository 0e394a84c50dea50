"""The report as blocks rendered to Markdown and to HTML: what each escapes, how code, tables
and figures come out, and that both documents say the same thing."""

from __future__ import annotations

import base64
import dataclasses
import re
from html.parser import HTMLParser

from hypothesis import given
from hypothesis import strategies as st

from ray_layout.report.document import (
    Bullets,
    Code,
    CodeBlock,
    Figure,
    Heading,
    Para,
    Strong,
    Table,
    figure_or_note,
    render_html,
    render_markdown,
)
from ray_layout.report.write import write_report
from tests.helpers.report_summary import markdown_tables


def test_html_escapes_markup_in_reasons(summary, tmp_path):
    arms = (
        dataclasses.replace(summary.arms[0], reason="<b>fast</b> & p < 0.01"),
        *summary.arms[1:],
    )
    files = write_report(dataclasses.replace(summary, arms=arms), tmp_path)
    page = files.html.read_text()
    assert "&lt;b&gt;fast&lt;/b&gt; &amp; p &lt; 0.01" in page and "<b>" not in page
    assert "\\<b\\>fast\\</b\\> & p \\< 0.01" in files.markdown.read_text()


def md(*blocks) -> str:
    return render_markdown(blocks)


def test_markdown_escapes_markup_but_not_an_underscore_inside_a_word():
    text = md(Para(("a_b _x_ *y* [l](u) `c` <t> | ~z~ \\",)))
    assert text == "a_b \\_x\\_ \\*y\\* \\[l\\](u) \\`c\\` \\<t\\> \\| \\~z\\~ \\\\\n"
    assert md(Heading(2, "one\ntwo *x*")) == "## one two \\*x\\*\n"  # a heading stays one line


@given(st.text())
def test_escaped_text_is_one_line_that_reads_back_as_the_text(text):
    out = md(Para((text,)))
    assert out.splitlines() == [out[:-1]]
    assert re.sub(r"\\(.)", r"\1", out[:-1]) == " ".join(text.splitlines())


def test_code_spans_keep_their_text_and_a_fence_longer_than_any_backtick_inside():
    assert md(Para(("Pick ", Code("Et*5|t*6"), "."))) == "Pick `Et*5|t*6`.\n"
    assert md(Para((Code("a`b"),))) == "`` a`b ``\n"
    assert md(Para((Strong("p < 0.01"),))) == "**p \\< 0.01**\n"
    assert md(CodeBlock("x\n```\ny", "bash")) == "````bash\nx\n```\ny\n````\n"
    assert md(CodeBlock("--flag 'a|b'")) == "```\n--flag 'a|b'\n```\n"


def test_a_table_aligns_numbers_right_and_escapes_pipes_in_code_cells():
    table = Table(
        ("Layout", "ms"), ((Code("E|t"), "1.0"), (("a", Strong("b")), "2.0")), (False, True)
    )
    assert md(table) == "| Layout | ms |\n|---|---:|\n| `E\\|t` | 1.0 |\n| a**b** | 2.0 |\n"
    assert md(Bullets((("one",), ("two ", Code("t*2"))))) == "- one\n- two `t*2`\n"


CELLS = st.one_of(st.text(), st.text().map(Code), st.tuples(st.text(), st.text().map(Code)))


@given(
    st.lists(st.text(), min_size=1, max_size=4).flatmap(
        lambda header: st.tuples(
            st.just(tuple(header)),
            st.lists(st.tuples(*[CELLS] * len(header)), max_size=4),
        )
    )
)
def test_every_markdown_row_is_as_wide_as_its_header_whatever_the_cells_hold(table):
    header, rows = table
    text = md(Table(header, tuple(rows), (False,) * len(header)))
    (found,) = markdown_tables(text)
    assert len(found) == 2 + len(rows) and {len(row) for row in found} == {len(header)}


class _Paragraphs(HTMLParser):
    """The text inside a page's paragraphs, markup gone and references resolved."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.inside = False

    def handle_starttag(self, tag, attrs):
        self.inside = self.inside or tag == "p"

    def handle_endtag(self, tag):
        self.inside = self.inside and tag != "p"

    def handle_data(self, data):
        if self.inside:
            self.parts.append(data)


@given(st.text(st.characters(blacklist_categories=("Cs", "Cc"))))
def test_html_shows_any_text_as_it_is(text):
    parser = _Paragraphs()
    parser.feed(render_html([Para((text, Code(text), Strong(text)))], "title"))
    parser.close()
    assert "".join(parser.parts) == text * 3


def test_html_escapes_the_title_headings_and_code_blocks():
    page = render_html([Heading(1, "a <b>"), CodeBlock("x < y && z")], "<t>")
    assert "<title>&lt;t&gt;</title>" in page and "<h1>a &lt;b&gt;</h1>" in page
    assert "<pre><code>x &lt; y &amp;&amp; z</code></pre>" in page


def test_a_figure_is_a_linked_picture_in_markdown_and_embedded_in_html(tmp_path):
    png, svg = tmp_path / "memory.png", tmp_path / "memory.svg"
    png.write_bytes(b"\x89PNG picture")
    figure = Figure("memory", "Peak <memory>", png, svg)
    assert md(figure) == (
        "![Peak \\<memory\\>](plots/memory.png)\n\n"
        "Peak \\<memory\\> (PNG `plots/memory.png`, SVG `plots/memory.svg`)\n"
    )
    data = base64.b64encode(b"\x89PNG picture").decode()
    assert f'<img alt="Peak &lt;memory&gt;" src="data:image/png;base64,{data}">' in render_html(
        [figure], "t"
    )


def test_a_plot_not_drawn_is_a_line_saying_why(tmp_path):
    figure = Figure("ab_traces", "traces", tmp_path / "a.png", tmp_path / "a.svg")
    assert figure_or_note("ab_traces", {"ab_traces": figure}, {}) is figure
    skipped = figure_or_note("ab_traces", {}, {"ab_traces": "no A/B step times were recorded"})
    assert skipped == Para(("Plot ab traces skipped: no A/B step times were recorded.",))
    assert figure_or_note("memory", {}, {}) == Para(("Plot memory skipped: no data.",))
