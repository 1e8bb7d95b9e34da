"""``report.html``: one self-contained page a person opens instead of reading JSON.

Per model: the headline figures, the reward distribution (a histogram) and the pass@k curve
(inline SVG, no script, nothing fetched), then the slowest items and the failed ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from rollout_sdk.evaluation.metrics import EvalMetrics, ModelMetrics
from rollout_sdk.evaluation.results import ItemResult, by_model

BINS = 10
WIDTH, HEIGHT, PAD = 420, 180, 30
STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}
td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:left}
th{background:#f3f3f3} .charts{display:flex;gap:2rem;flex-wrap:wrap}
svg{background:#fafafa;border:1px solid #ddd} .bar{fill:#4a78c2}
.curve{stroke:#c2574a;fill:none;stroke-width:2}
"""


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
    ks = sorted(pass_at)
    span = max(len(ks) - 1, 1)
    x = [PAD + (WIDTH - 2 * PAD) * i / span for i in range(len(ks))]
    y = [HEIGHT - PAD - (HEIGHT - 2 * PAD) * pass_at[k] for k in ks]
    points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x, y, strict=True))
    labels = "".join(
        f'<text x="{a - 4:.1f}" y="{HEIGHT - 8}">{k}</text>' for a, k in zip(x, ks, strict=True)
    )
    return (
        f'<svg id="pass-at-k" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="pass@k">'
        f'<polyline class="curve" points="{points}"/>{labels}'
        f'<text x="{PAD}" y="16">pass@k, k = 1…{ks[-1] if ks else 0}</text></svg>'
    )


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


def _summary(name: str, figures: ModelMetrics) -> str:
    cells = [
        ("items finished", f"{figures.finished} / {figures.items}"),
        ("mean reward", _figure(figures.mean_reward)),
        ("pass rate", _figure(figures.pass_rate, percent=True)),
        ("pass@1", _figure(figures.pass_at_1, percent=True)),
        ("pass@n", _figure(figures.pass_at_n, percent=True)),
        ("failed", str(figures.failed)),
        ("latency p50 / p99 ms", f"{figures.latency_ms.p50:.0f} / {figures.latency_ms.p99:.0f}"),
        ("tokens", str(figures.tokens.total)),
    ]
    rows = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in cells)
    return f'<table class="summary" data-model="{name}">{rows}</table>'


def render(title: str, metrics: EvalMetrics, results: Sequence[ItemResult]) -> str:
    sections = []
    grouped = by_model(results)
    for name, figures in metrics.models.items():
        mine = grouped.get(name, [])
        slowest = sorted(mine, key=lambda r: r.latency_ms, reverse=True)[:10]
        failed = [r for r in mine if r.status == "failure"][:50]
        sections.append(
            f"<h2>{escape(name)}</h2>{_summary(name, figures)}"
            f'<div class="charts">{_histogram([r.reward or 0.0 for r in mine])}'
            f"{_curve(figures.pass_at_k)}</div>"
            f"{_rows('Slowest items', f'slowest-{name}', slowest)}"
            f"{_rows('Failed items', f'failed-{name}', failed)}"
        )
    state = "complete" if metrics.complete else "incomplete (resume it to finish)"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>n = {metrics.n}, pass threshold {metrics.pass_threshold:g}, {state}</p>"
        f"{''.join(sections)}</body></html>"
    )


__all__ = ["render"]
