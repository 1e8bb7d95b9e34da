"""``report.html``: one self-contained page a person opens instead of reading JSON.

Per model: the headline figures with the failures by category (and the first error of each),
the reward distribution (a histogram) and the pass@k curve (inline SVG with values on both
axes; no script, nothing fetched), then every row — prompt, label, answer, reward, verdict,
latency — wrong answers first, then failures, then passes; then the slowest items.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from rollout_sdk.evaluation.metrics import EvalMetrics, ModelMetrics
from rollout_sdk.evaluation.results import ItemResult, by_model, verdict, worst_first

BINS = 10
WIDTH, HEIGHT, PAD = 420, 180, 30
STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}
td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:left}
th{background:#f3f3f3} .charts{display:flex;gap:2rem;flex-wrap:wrap}
svg{background:#fafafa;border:1px solid #ddd} .bar{fill:#4a78c2}
.curve{stroke:#c2574a;fill:none;stroke-width:2} .point{fill:#c2574a}
.axis{stroke:#888} .grid{stroke:#e2e2e2} .tick{font-size:11px;fill:#555}
tr.wrong td.verdict{color:#a36a00;font-weight:600} tr.failed td.verdict{color:#b3261e}
tr.passed td.verdict{color:#1e7a34} td.text{max-width:28rem;overflow-wrap:anywhere}
"""
Y_TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _figure(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:.1%}" if percent else f"{value:.3f}"


def _histogram(rewards: Sequence[float]) -> str:
    """Rewards in BINS equal bins between min(0, lowest) and max(1, highest)."""
    low, high = min([0.0, *rewards]), max([1.0, *rewards])
    counts = [0] * BINS
    for reward in rewards:
        counts[min(BINS - 1, int((reward - low) / (high - low) * BINS))] += 1
    tallest = max(counts) or 1
    width = (WIDTH - 2 * PAD) / BINS
    bars = []
    for index, count in enumerate(counts):
        height = (HEIGHT - 2 * PAD) * count / tallest
        x, y = PAD + index * width, HEIGHT - PAD - height
        edge = low + (high - low) * index / BINS
        bars.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{width - 2:.1f}" '
            f'height="{height:.1f}"><title>{edge:.2f}+: {count}</title></rect>'
        )
    return (
        f'<svg id="reward-histogram" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="reward distribution">{"".join(bars)}'
        f'<text x="{PAD}" y="{HEIGHT - 8}">{low:g}</text>'
        f'<text x="{WIDTH - PAD - 10}" y="{HEIGHT - 8}">{high:g}</text>'
        f'<text x="{PAD}" y="16">reward distribution ({len(rewards)} items)</text></svg>'
    )


def _curve(pass_at: dict[int, float]) -> str:
    """pass@k against k: k's values under the x axis, 0–100 % beside the y axis."""
    ks = sorted(pass_at)
    left, bottom, top = PAD + 14, HEIGHT - PAD, PAD
    span = max(len(ks) - 1, 1)
    x = [left + (WIDTH - PAD - left) * i / span for i in range(len(ks))]
    y = [bottom - (bottom - top) * pass_at[k] for k in ks]
    points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x, y, strict=True))
    marks = "".join(
        f'<circle class="point" cx="{a:.1f}" cy="{b:.1f}" r="3">'
        f"<title>pass@{k} = {pass_at[k]:.1%}</title></circle>"
        for a, b, k in zip(x, y, ks, strict=True)
    )
    y_ticks = "".join(
        f'<line class="grid" x1="{left}" x2="{WIDTH - PAD}" y1="{level:.1f}" y2="{level:.1f}"/>'
        f'<text class="tick y-tick" x="{left - 4}" y="{level + 4:.1f}" text-anchor="end">'
        f"{share:.0%}</text>"
        for share in Y_TICKS
        for level in [bottom - (bottom - top) * share]
    )
    x_ticks = "".join(
        f'<text class="tick x-tick" x="{a:.1f}" y="{bottom + 14}" text-anchor="middle">{k}</text>'
        for a, k in zip(x, ks, strict=True)
    )
    axes = (
        f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{bottom}"/>'
        f'<line class="axis" x1="{left}" x2="{WIDTH - PAD}" y1="{bottom}" y2="{bottom}"/>'
    )
    return (
        f'<svg id="pass-at-k" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="pass@k">'
        f'{y_ticks}{axes}<polyline class="curve" points="{points}"/>{marks}{x_ticks}'
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - 2}" text-anchor="end" class="tick">k</text>'
        f'<text x="{left}" y="16">pass@k, k = 1…{ks[-1] if ks else 0}</text></svg>'
    )


def _text(value: str | None) -> str:
    return f'<td class="text">{escape(value or "")}</td>'


def _error(result: ItemResult) -> str | None:
    if result.error_category is None:
        return None
    return f"{result.error_category}: {(result.error or '')[:300]}"


def _rows(title: str, element_id: str, results: Sequence[ItemResult]) -> str:
    if not results:
        return f"<h3>{title}</h3><p>none</p>"
    lines = "".join(
        f"<tr><td>{r.row}</td><td>{r.sample}</td><td>{r.status}</td><td>{_figure(r.reward)}</td>"
        f"<td>{r.latency_ms:.0f}</td><td>{escape(r.error_category or '')}</td>"
        f"<td>{escape((r.error or '')[:300])}</td></tr>"
        for r in results
    )
    return (
        f'<h3>{title}</h3><table id="{element_id}"><tr><th>row</th><th>sample</th><th>status</th>'
        f"<th>reward</th><th>latency ms</th><th>category</th><th>error</th></tr>{lines}</table>"
    )


def _all_rows(element_id: str, results: Sequence[ItemResult]) -> str:
    """Every row of one model, wrong answers first."""
    if not results:
        return "<h3>Rows</h3><p>none</p>"
    lines = "".join(
        f'<tr class="{verdict(r)}"><td>{r.row}</td><td>{r.sample}</td>'
        f'<td class="verdict">{verdict(r)}</td><td>{_figure(r.reward)}</td>'
        f"<td>{escape(r.status)}</td><td>{r.latency_ms:.0f}</td>"
        f"{_text(r.prompt)}{_text(r.label)}{_text(r.answer)}"
        f"{_text(_error(r))}</tr>"
        for r in worst_first(results)
    )
    head = "".join(
        f"<th>{name}</th>"
        for name in (
            "row", "sample", "verdict", "reward", "status", "latency ms",
            "prompt", "label", "answer", "error",
        )
    )  # fmt: skip
    return (
        f"<h3>Rows (wrong answers first)</h3>"
        f'<table id="{element_id}" class="rows"><thead><tr>{head}</tr></thead>'
        f"<tbody>{lines}</tbody></table>"
    )


def _summary(name: str, figures: ModelMetrics) -> str:
    cells = [
        ("items finished", f"{figures.finished} / {figures.items}"),
        ("completed", str(figures.succeeded)),
        ("passed (reward ≥ threshold)", str(figures.finished - figures.failed - figures.wrong)),
        ("wrong (completed, below)", str(figures.wrong)),
        ("failed (did not complete)", str(figures.failed)),
        ("mean reward", _figure(figures.mean_reward)),
        ("pass rate", _figure(figures.pass_rate, percent=True)),
        ("pass@1", _figure(figures.pass_at_1, percent=True)),
        ("pass@n", _figure(figures.pass_at_n, percent=True)),
        ("latency p50 / p99 ms", f"{figures.latency_ms.p50:.0f} / {figures.latency_ms.p99:.0f}"),
        ("tokens", str(figures.tokens.total)),
    ]
    cells += [
        (f"failures: {category} × {count}", escape(figures.first_errors.get(category, "")))
        for category, count in sorted(figures.failures_by_category.items())
    ]
    rows = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in cells)
    return f'<table class="summary" data-model="{escape(name)}">{rows}</table>'


def render(title: str, metrics: EvalMetrics, results: Sequence[ItemResult]) -> str:
    sections = []
    grouped = by_model(results)
    for name, figures in metrics.models.items():
        mine = grouped.get(name, [])
        slowest = sorted(mine, key=lambda r: r.latency_ms, reverse=True)[:10]
        sections.append(
            f"<h2>{escape(name)}</h2>{_summary(name, figures)}"
            f'<div class="charts">{_histogram([r.reward or 0.0 for r in mine])}'
            f"{_curve(figures.pass_at_k)}</div>"
            f"{_all_rows(f'rows-{name}', mine)}"
            f"{_rows('Slowest items', f'slowest-{name}', slowest)}"
        )
    state = "complete" if metrics.complete else "incomplete (resume it to finish)"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>n = {metrics.n}, pass threshold {metrics.pass_threshold:g}, {state}</p>"
        f"{''.join(sections)}</body></html>"
    )


__all__ = ["render"]
