"""`kdrl simulate --html`: the report as one self-contained HTML page.

The comparison table, the run's configuration, the decision timings and the plots (PNG,
embedded as data URIs), so the page can be mailed or attached to an issue and opened offline.
Every string from the report is escaped.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulator import report

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem 2rem; color: #1b1f24; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { padding: 0.25rem 0.6rem; border-bottom: 1px solid #eaeef2; text-align: right; }
th { background: #f6f8fa; } td.name { text-align: left; }
img { max-width: 100%; border: 1px solid #eaeef2; margin: 0.5rem 0; }
pre { background: #f6f8fa; padding: 0.8rem; overflow-x: auto; font-size: 0.85rem; }
.note { color: #57606a; max-width: 60rem; }
"""


def render(result: dict[str, Any], timings: dict[str, Any], plots: Sequence[Path]) -> str:
    """The page for one `compare` result (without its timings) and the plot files written."""
    invocations = max((r["invocations"] for r in result["results"]), default=0)
    title = (
        f"kdrl simulate: {result['functions']} functions, {invocations:,} invocations, "
        f"{result['config']['mode']} mode"
    )
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_text(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_text(title)}</h1>",
        '<p class="note">Cold-start % per function, then percentiles over functions; wasted memory '
        "normalised to a fixed 10-minute keep-alive = 100. Field definitions: report.json and "
        "docs/simulator-fidelity.md.</p>",
        "<h2>Results</h2>",
        _table(result["results"]),
        *_timings(timings),
        "<h2>Plots</h2>",
        *(_image(path) for path in plots if path.is_file()),
        "<h2>Configuration</h2>",
        f"<pre>{_text(json.dumps(result['config'], indent=1, sort_keys=True))}</pre>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _table(results: list[dict[str, Any]]) -> str:
    shown = [c for c in report.TABLE_COLUMNS if any(c[1] in r for r in results)]
    names = {"placement", "keepalive"}
    head = "".join(f"<th>{_text(title)}</th>" for title, _ in shown)
    rows = []
    for entry in results:
        cells = "".join(
            f"<td{' class=name' if key in names else ''}>{_text(report.cell(entry.get(key)))}</td>"
            for _, key in shown
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _timings(timings: dict[str, Any]) -> list[str]:
    rows = [(label, t) for label, t in timings.items() if t and t.get("decisions")]
    if not rows:
        return []
    body = "".join(
        f"<tr><td class=name>{_text(label)}</td><td>{t['decisions']:,}</td>"
        f"<td>{t['p50']:.0f}</td><td>{t['p99']:.0f}</td></tr>"
        for label, t in rows
    )
    return [
        "<h2>Policy decision time (wall clock, this machine)</h2>",
        "<table><thead><tr><th>policy</th><th>decisions</th><th>p50 µs</th><th>p99 µs</th></tr></thead>"
        f"<tbody>{body}</tbody></table>",
    ]


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{_text(path.stem)}" src="data:image/png;base64,{data}"></figure>'


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)
