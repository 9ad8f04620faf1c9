"""The report as a reader opens it: headless Chromium loads the `snakemake --report` built
from the datasets on disk and the test reads what the page renders: the summary, its claims
table with a verdict in every row, every figure as an image, and each rule once in the
rule graph.

It needs a finished DAG run and Chromium, so it runs only when XSTAGE_BROWSER_TEST names
the config file that run used (CI sets it after the smoke run). XSTAGE_SCREENSHOTS=<dir>
keeps screenshots of the landing page and of the whole summary.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from xstage_bench.report.claims import verdicts

ROOT = Path(__file__).parent.parent
CONFIG = os.environ.get("XSTAGE_BROWSER_TEST")
pytestmark = pytest.mark.skipif(
    not CONFIG, reason="set XSTAGE_BROWSER_TEST=<config file of the finished DAG run>"
)
CHROMIUM = ("chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars")


class Summary(HTMLParser):
    """What the rendered DOM holds inside the summary: verdict cells and figure images."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0  # > 0 inside <div id="xstage-summary">
        self.claims_tables = 0
        self.verdicts: list[str] = []
        self.images: list[str] = []
        self._in_verdict = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and (attrs.get("id") == "xstage-summary" or self.depth):
            self.depth += 1
        if not self.depth:
            return
        if tag == "table" and attrs.get("class") == "claims":
            self.claims_tables += 1
        elif tag == "td" and attrs.get("class") == "verdict":
            self._in_verdict = True
            self.verdicts.append("")
        elif tag == "img" and (attrs.get("src") or "").startswith("data:image/png;base64,"):
            self.images.append(attrs.get("alt", ""))

    def handle_endtag(self, tag):
        if tag == "div" and self.depth:
            self.depth -= 1
        elif tag == "td":
            self._in_verdict = False

    def handle_data(self, data):
        if self._in_verdict:
            self.verdicts[-1] += data.strip()


def _chromium(*args: str) -> str:
    if shutil.which(CHROMIUM[0]) is None:
        pytest.fail("chromium is not installed (Debian: apt-get install chromium)")
    run = subprocess.run([*CHROMIUM, *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    snakemake = Path(sys.executable).parent / "snakemake"
    subprocess.run(
        [str(snakemake), "--report", str(out), "--configfile", CONFIG], cwd=ROOT, check=True
    )
    return out


@pytest.fixture(scope="module")
def dom(report) -> Summary:
    page = Summary()
    page.feed(_chromium("--virtual-time-budget=20000", "--dump-dom", report.as_uri()))
    return page


def expected_figures() -> list[Path]:
    datasets = yaml.safe_load((ROOT / CONFIG).read_text())["datasets"]
    names = list(datasets["reference"]) + list(datasets["simulated"])
    return sorted(p for n in names for p in (ROOT / "results" / n / "figures").glob("fig-*.png"))


def test_the_report_opens_on_the_summary_with_the_claims(dom):
    assert dom.claims_tables >= 1


def test_no_verdict_cell_is_empty(dom):
    assert len(dom.verdicts) >= 21 * dom.claims_tables
    assert all(dom.verdicts), dom.verdicts
    assert set(dom.verdicts) <= set(verdicts.VERDICTS)


def test_every_figure_is_an_image_on_the_summary(dom):
    expected = expected_figures()
    assert expected, "no figure PNG on disk: run the DAG first"
    shown = {alt.split(" ")[0] for alt in dom.images}
    assert {p.stem for p in expected} <= shown
    assert len(dom.images) == len(expected)


# Run in the page: each summary figure's shown and natural width, as attributes that
# --dump-dom keeps (the report is an app that renders the summary after it loads).
MEASURE_FIGURES = """<script>setInterval(() => {
  for (const fig of document.querySelectorAll('#xstage-summary figure')) {
    const img = fig.querySelector('img');
    if (img && img.naturalWidth) {
      fig.setAttribute('data-shown-width', img.getBoundingClientRect().width);
      fig.setAttribute('data-natural-width', img.naturalWidth);
    }
  }
}, 100);</script>"""
REPORT_WINDOW = "1400,1000"  # a laptop browser; the summary column is at most 1280 px


def shown_widths(report: Path, tmp_path: Path) -> dict[str, tuple[float, int]]:
    """figure id ('<dataset>-<fig-name>') -> (shown width in CSS px, the PNG's width)."""
    page = tmp_path / "measured-report.html"
    html = report.read_text()
    end = html.rindex("</body>")  # the page's own (the report's scripts hold others)
    page.write_text(html[:end] + MEASURE_FIGURES + html[end:])
    dom = _chromium(
        f"--window-size={REPORT_WINDOW}", "--virtual-time-budget=20000", "--dump-dom", page.as_uri()
    )
    found = {}
    for tag in re.findall(r"<figure [^>]*>", dom):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        if "data-shown-width" in attrs:
            shown, natural = attrs["data-shown-width"], attrs["data-natural-width"]
            found[attrs["id"]] = (float(shown), int(natural))
    return found


def test_every_figure_is_shown_with_its_text_at_8_pt_or_more(report, tmp_path):
    """Issue 27: the rendered sizes, in the browser. Each figure's smallest text, scaled as
    the page shows its PNG, is at least 8 pt (fig-ulysses once was 12 panels at 2765 px)."""
    from xstage_bench.report import render
    from xstage_bench.report.figures import common

    widths = shown_widths(report, tmp_path)
    expected = expected_figures()
    assert {f"{p.parent.parent.name}-{p.stem}" for p in expected} <= set(widths)
    small = []
    for png in expected:
        shown, natural = widths[f"{png.parent.parent.name}-{png.stem}"]
        fig = render.FIGURES[png.stem](png.parent.parent)
        fig.canvas.draw()
        texts = [
            a.get_fontsize()
            for a in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))
            if a.get_visible() and a.get_text().strip()
        ]
        # a point of text is DPI/72 PNG pixels, shown at shown/natural CSS px, 96/72 per pt
        smallest_pt = min(texts) * common.DPI / 72 * (shown / natural) * 72 / 96
        if smallest_pt < 8.0:
            small.append(f"{png}: {smallest_pt:.1f} pt at {shown:.0f} of {natural} px")
    assert not small, small


def test_the_rule_graph_lists_each_rule_once(report):
    spec = re.search(r"var rulegraph_spec = (.*?);\n\s*</script>", report.read_text(), re.S)
    nodes = [n["rule"] for n in json.loads(spec.group(1))["data"][0]["values"]]
    assert len(nodes) == len(set(nodes)), sorted(nodes)


def test_screenshots(report):
    """The landing page and the whole summary, for a person to look at."""
    folder = os.environ.get("XSTAGE_SCREENSHOTS")
    if not folder:
        pytest.skip("set XSTAGE_SCREENSHOTS=<dir> to keep screenshots")
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, size in (("landing", "1400,1000"), ("summary-full", "1400,16000")):
        shot = Path(folder) / f"report-{name}.png"
        _chromium(
            f"--window-size={size}",
            "--virtual-time-budget=20000",
            f"--screenshot={shot}",
            report.as_uri(),
        )
        assert shot.stat().st_size > 10_000
