"""The page `snakemake --report` opens on: the paper's claims with their verdicts, which
datasets exist and how each was made, then every figure with a caption that says what it
shows, from which dataset (measured or simulated) and the command that rebuilds it.

One self-contained HTML fragment (figures inlined as PNG data URIs, no script): the
workflow description (workflow/report/workflow.rst) includes it, and the report also lists
it as a result of its own. A pure function of its input files.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from xstage_bench.data import origins
from xstage_bench.data.results import atomic_write_text
from xstage_bench.report import products
from xstage_bench.report.claims import verdicts
from xstage_bench.report.claims.counterparts import COUNTERPARTS

PAPER = (
    '"X-Stage: An Overlooked Pipeline Stage for Communication-Computation Overlap in DiT '
    'Inference" (Xian et al., arXiv 2607.23264)'
)

# Snakemake's report shows the workflow description in a narrow column beside the rule
# graph. Scoped to this page (the :has selectors), the first two rules widen that column
# and put the rule graph under it; the rest styles the page itself.
STYLE = """
.prose:has(#xstage-summary) { max-width: min(1280px, 96vw); }
div.flex:has(> div > .prose #xstage-summary) { flex-direction: column; }
div.items-center:has(#xstage-summary) { align-items: flex-start; }
#xstage-summary { font-size: 14px; line-height: 1.45; color: #1f2328; }
#xstage-summary h1 { font-size: 24px; margin: 8px 0; }
#xstage-summary h2 { font-size: 19px; margin: 22px 0 8px; border-bottom: 1px solid #ddd; }
#xstage-summary h3 { font-size: 16px; margin: 16px 0 6px; }
#xstage-summary table { border-collapse: collapse; width: 100%; margin: 6px 0; }
#xstage-summary th, #xstage-summary td {
  border: 1px solid #d0d7de; padding: 4px 6px; vertical-align: top; text-align: left; }
#xstage-summary th { background: #f3f5f7; }
#xstage-summary td.num { white-space: nowrap; }
#xstage-summary td.verdict { font-weight: 600; white-space: nowrap; }
#xstage-summary tr.reproduced td.verdict { background: #dcf5dc; }
#xstage-summary tr.differs td.verdict { background: #fdebc8; }
#xstage-summary tr.not-measured td.verdict { background: #e8e8e8; }
#xstage-summary td.counterpart { background: #f4f0fb; }
#xstage-summary figure { margin: 14px 0 22px; }
#xstage-summary figure img { max-width: 100%; border: 1px solid #d0d7de; }
#xstage-summary figcaption { font-size: 13px; margin-top: 4px; }
#xstage-summary .simulated-badge { background: #6f42c1; color: white; padding: 0 5px;
  border-radius: 3px; font-size: 12px; }
#xstage-summary code { font-size: 12px; background: #f3f5f7; padding: 0 3px; }
#xstage-summary code::before, #xstage-summary code::after { content: none; }
"""


@dataclass(frozen=True)
class Dataset:
    """A dataset on the page: its directory and, for a simulated one, its profile."""

    path: Path
    profile: str | None = None

    @property
    def name(self) -> str:
        return self.path.name


def caption_text(caption_rst: Path) -> str:
    """What a product shows: the first paragraph of its report caption, as plain text."""
    first = caption_rst.read_text().strip().split("\n\n")[0]
    return " ".join(first.replace("``", "").split())


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _verdict_class(verdict: str) -> str:
    return verdict.replace(" ", "-")


def claims_table(frame: pd.DataFrame) -> str:
    """The claims as an HTML table: statement, paper, ours, verdict, why, counterparts."""
    columns = [c.column for c in COUNTERPARTS if c.column in frame.columns]
    head = "".join(
        f"<th>{_e(h)}</th>" for h in ("claim", "paper", "ours", "unit", "verdict", "why")
    )
    head += "".join(f'<th class="counterpart">{_e(c)}</th>' for c in columns)
    body = []
    for row in frame.itertuples(index=False):
        r = row._asdict()
        cells = [
            f"<td><b>{_e(r['statement'])}</b><br><code>{_e(r['claim'])}</code></td>",
            f'<td class="num">{_e(r["paper"])} <small>{_e(r["paper_source"])}</small></td>',
            f'<td class="num">{_e(r["ours"])}</td>',
            f"<td>{_e(r['unit'])}</td>",
            f'<td class="verdict">{_e(r["verdict"])}</td>',
            f"<td>{_e(r['why'])}</td>",
        ]
        values = frame.loc[frame["claim"] == r["claim"]].iloc[0]
        cells += [
            f'<td class="counterpart num" title="{_e(values[f"{c} note"])}">{_e(values[c])}</td>'
            for c in columns
        ]
        body.append(f'<tr class="{_verdict_class(r["verdict"])}">{"".join(cells)}</tr>')
    return (
        '<table class="claims"><thead><tr>'
        + head
        + "</tr></thead><tbody>"
        + "".join(body)
        + "</tbody></table>"
    )


def _tally(frame: pd.DataFrame) -> str:
    counts = frame["verdict"].value_counts()
    return ", ".join(f"{counts.get(v, 0)} {v}" for v in verdicts.VERDICTS)


def datasets_table(found: list[origins.DatasetProvenance]) -> str:
    rows = "".join(
        f"<tr><td><b>{_e(p.name)}</b></td><td>{_e(p.kind)}</td><td>{_e(p.made)}</td>"
        f"<td>{_e(p.when)}</td><td><code>{_e(p.code)}</code></td>"
        f"<td>{'<br>'.join(_e(x) for x in p.experiments)}</td></tr>"
        for p in found
    )
    return (
        '<table class="datasets"><thead><tr><th>dataset</th><th>kind</th><th>how it was made'
        "</th><th>when (UTC)</th><th>harness git sha</th><th>experiments</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _png_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def figure_block(png: Path, what: str, origin: str, simulated: bool) -> str:
    name = png.stem
    badge = ' <span class="simulated-badge">simulated</span>' if simulated else ""
    rebuild = f"snakemake --cores all {png.as_posix()}"
    return (
        f'<figure id="{_e(png.parent.parent.name)}-{_e(name)}">'
        f'<img src="{_png_uri(png)}" alt="{_e(name)} ({_e(origin)})">'
        f"<figcaption><b>{_e(name)}</b>{badge}: {_e(what)}<br>"
        f"Dataset: {_e(origin)}.<br>Rebuild: <code>{_e(rebuild)}</code></figcaption></figure>"
    )


def _origin(p: origins.DatasetProvenance) -> str:
    return f"{p.name}, {p.made}"


def _claims_section(dataset: Dataset, prov: origins.DatasetProvenance) -> str:
    table = dataset.path / "tables" / "tab-claims.csv"
    frame = pd.read_csv(table, dtype=str, keep_default_na=False)
    rebuild = f"snakemake --cores all {table.as_posix()}"
    counterparts = "; ".join(f"'{c.column}' ({c.kind})" for c in COUNTERPARTS)
    return (
        f'<h2 id="claims-{_e(dataset.name)}">Claims: {_e(dataset.name)} ({_e(prov.kind)})</h2>'
        f"<p>{_e(prov.made)}. Verdicts, computed from the data: <b>{_e(_tally(frame))}</b>. "
        "<i>reproduced</i>: within the row's criterion; <i>differs</i>: with the measured "
        "reason; <i>not measured</i>: with why. The what-if columns "
        f"({_e(counterparts)}) answer the same claims from other data; hover a cell for "
        f"how. Rebuild: <code>{_e(rebuild)}</code>.</p>" + claims_table(frame)
    )


def build(datasets: list[Dataset], figures: list[Path], captions: Path) -> str:
    """The summary page as an HTML fragment. `figures` are the PNGs to show (each under
    results/<dataset>/figures/), `captions` the folder of the report captions."""
    found = {d.name: origins.describe(d.path, d.profile) for d in datasets}
    measured = [d for d in datasets if found[d.name].kind == "measured"]
    for_claims = measured or [d for d in datasets if found[d.name].kind != "unknown"]
    parts = [
        f'<div id="xstage-summary"><style>{STYLE}</style>',
        "<h1>X-Stage bench: reproduction summary</h1>",
        f"<p>This harness reproduces {_e(PAPER)}. Below: every quantitative claim of the "
        "paper with our number and a verdict, the datasets and how each was made, then "
        "every figure. Simulated datasets come from the discrete-event X-Stage model and "
        'are marked <span class="simulated-badge">simulated</span>; they are never '
        "measurements. The DAG's rule graph (the report's Workflow view) follows the "
        "figures at the bottom of this page; each figure and table is also a result of its "
        "own in the menu's per-dataset sections.</p>",
    ]
    parts += [_claims_section(d, found[d.name]) for d in for_claims]
    listed = measured + [d for d in datasets if d not in measured]  # measured first
    parts += ['<h2 id="datasets">Datasets</h2>', datasets_table([found[d.name] for d in listed])]
    parts.append('<h2 id="figures">Figures</h2>')
    order = {p.name: i for i, p in enumerate(products.FIGURES)}
    for d in listed:
        pngs = sorted(
            (f for f in figures if f.parent.parent.name == d.name), key=lambda f: order[f.stem]
        )
        if not pngs:
            continue
        prov = found[d.name]
        simulated = prov.kind == "simulated"
        parts.append(f'<h3 id="figures-{_e(d.name)}">{_e(d.name)}: {_e(prov.made)}</h3>')
        parts += [
            figure_block(f, caption_text(captions / f"{f.stem}.rst"), _origin(prov), simulated)
            for f in pngs
        ]
    parts.append("</div>")
    return "\n".join(parts) + "\n"


def write(out: Path, page: str) -> None:
    # ASCII with character references: the page is read as text by docutils and as a
    # data URI by the report, neither of which is told its encoding.
    atomic_write_text(out, page.encode("ascii", "xmlcharrefreplace").decode("ascii"))


def figure_pngs(paths: list[str]) -> list[Path]:
    return [Path(p) for p in paths if re.search(r"/figures/fig-[a-z0-9-]+\.png$", p)]
