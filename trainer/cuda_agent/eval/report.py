"""The evaluation report: metrics per level and overall (metrics.py), written as JSON, Markdown and two
plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cuda_agent.eval import metrics
from cuda_agent.eval.models import EvalConfig, EvalReport, LevelSummary, TaskResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def build_report(
    cfg: EvalConfig, rows: Sequence[TaskResult], evaluated: int, wall_s: float, gpus: int | None
) -> EvalReport:
    hours = wall_s / 3600
    per_hour = evaluated / (hours * (gpus or 1)) if evaluated and hours > 0 else None
    precisions = sorted({r.precision for r in rows if r.precision})
    devices = sorted({r.device for r in rows if r.device})
    return EvalReport(
        mode="solutions" if cfg.solutions is not None else "policy",
        tasks=cfg.tasks,
        source=str(cfg.solutions) if cfg.solutions is not None else str(cfg.policy),
        device=",".join(devices) or cfg.device,
        precision=",".join(precisions) or cfg.judge.precision,
        compile_mode=cfg.judge.compile_mode,
        task_scale=_task_scale(),
        margin=cfg.margin,
        fast_p=list(cfg.fast_p),
        levels=metrics.by_level(rows, cfg.fast_p, cfg.margin),
        overall=metrics.summarise("overall", rows, cfg.fast_p, cfg.margin),
        refused_allclose_accepts=metrics.refused_allclose_accepts(rows),
        allclose_checked=sum(1 for r in rows if r.allclose is not None),
        allclose_confined=all(r.allclose.confined for r in rows if r.allclose is not None),
        suspicious=metrics.suspicious(rows, cfg.suspicious_speedup),
        suspicious_speedup=cfg.suspicious_speedup,
        evaluations=evaluated,
        wall_s=round(wall_s, 2),
        gpus=gpus,
        evaluations_per_gpu_hour=round(per_hour, 1) if per_hour is not None else None,
        task_errors=[f"{r.key}: {r.error}" for r in rows if r.status == "task-error"],
    )


def _task_scale() -> str | None:
    import os

    return os.environ.get("CUDA_AGENT_TASK_SCALE")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def level_table(report: EvalReport) -> str:
    """The per-level table (also what the CLI prints last)."""
    columns = ["level", "candidates", "correct", "pass rate", "> eager", "> compile"]
    columns += ["geomean vs eager", "geomean vs compile", "mean reward"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]

    def line(s: LevelSummary, bold: bool = False) -> str:
        name = f"**{s.level}**" if bold else s.level
        cells = [
            name,
            str(s.candidates),
            str(s.correct),
            _pct(s.pass_rate),
            _pct(s.faster_than_eager),
            _pct(s.faster_than_compile),
            _x(s.geomean_speedup_eager),
            _x(s.geomean_speedup_compile),
            f"{s.mean_reward:.2f}",
        ]
        return "| " + " | ".join(cells) + " |"

    lines += [line(s) for s in report.levels]
    lines.append(line(report.overall, bold=True))
    return "\n".join(lines)


def to_markdown(report: EvalReport, rows: Sequence[TaskResult]) -> str:
    out = [
        "# Evaluation report",
        "",
        f"- mode: {report.mode}; tasks: `{report.tasks}`; {report.mode}: `{report.source}`",
        f"- device: {report.device}; precision: {report.precision}; torch.compile mode: {report.compile_mode}"
        + (f"; task scale: {report.task_scale}" if report.task_scale else ""),
        f"- faster means speedup > {1 + report.margin:g}x (the judge's milestone margin); pass rate, "
        "fast_p and the faster-than rates count every candidate (missing and failed ones as failures); "
        "geometric means are over correct candidates only",
        f"- evaluations this run: {report.evaluations} in {report.wall_s:.0f} s"
        + (f" on {report.gpus} GPU(s)" if report.gpus else "")
        + (
            f": {report.evaluations_per_gpu_hour:g} per {'GPU-' if report.gpus else ''}hour"
            if report.evaluations_per_gpu_hour is not None
            else ""
        ),
        "",
        "## Per level",
        "",
        level_table(report),
        "",
        "## fast_p (share of all candidates correct and more than p times faster)",
        "",
    ]
    labels = [metrics.p_label(p) for p in report.fast_p]
    out.append("| level | baseline | " + " | ".join(labels) + " |")
    out.append("|" + "---|" * (len(labels) + 2))
    for s in [*report.levels, report.overall]:
        for baseline, values in (("eager", s.fast_p_eager), ("compile", s.fast_p_compile)):
            cells = " | ".join(_pct(values.get(k)) for k in labels)
            out.append(f"| {s.level} | {baseline} | {cells} |")
    out += [
        "",
        "## Candidates",
        "",
        "| candidate | reward | correct | vs eager | vs compile | judge's reason |",
    ]
    out.append("|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: r.key):
        reason = "" if r.reward > 0 else r.refusal if r.status == "judged" else f"{r.status}: {r.error or ''}"
        reason = reason.replace("|", "\\|").replace("\n", " ")[:200]
        speedups = f"{_x(r.speedup_eager)} | {_x(r.speedup_compile)}"
        out.append(f"| {r.key} | {r.reward} | {r.correct} | {speedups} | {reason} |")
    out += ["", "## Refused by our judge, accepted by a plain allclose harness", ""]
    if report.allclose_checked == 0:
        out.append("Not checked (run with `--compare-allclose`).")
    else:
        where = (
            "as agent commands in sandbox sessions"
            if report.allclose_confined
            else "UNCONFINED on this machine"
        )
        out.append(f"The harness ran {where}.\n")
    if report.allclose_checked and not report.refused_allclose_accepts:
        out.append(f"None of the {report.allclose_checked} refused candidates checked.")
    else:
        out += ["| candidate | why our judge refused it | allclose max abs err |", "|---|---|---|"]
        for f in report.refused_allclose_accepts:
            err = "-" if f.max_abs_err is None else f"{f.max_abs_err:.3g}"
            out.append(f"| {f.key} | {f.reason} | {err} |")
    out += ["", f"## Suspicious speedups (> {report.suspicious_speedup:g}x, correct)", ""]
    if not report.suspicious:
        out.append("None.")
    for f in report.suspicious:
        out.append(
            f"- {f.key}: {f.reason} (vs eager {_x(f.speedup_eager)}, vs compile {_x(f.speedup_compile)})"
        )
    if report.task_errors:
        out += ["", "## Task errors (not the candidate's fault)", ""]
        out += [f"- {e}" for e in report.task_errors]
    return "\n".join(out) + "\n"


def plot(report: EvalReport, rows: Sequence[TaskResult], out_dir: Path) -> list[Path]:
    """levels.png (pass / faster-than-eager / faster-than-compile rates per level) and speedups.png (the
    distribution of correct candidates' speedups against both baselines, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, fig in (("levels.png", levels_figure(report)), ("speedups.png", speedups_figure(rows))):
        written.append(out_dir / name)
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def levels_figure(report: EvalReport) -> Figure:
    """Bars per level of the three rates; the legend sits right of the axes, never over a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = [*report.levels, report.overall]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(summaries)) + 1.2, 3.6), layout="constrained")
    width = 0.27
    for i, (label, attr) in enumerate(
        (("correct", "pass_rate"), ("> eager", "faster_than_eager"), ("> compile", "faster_than_compile"))
    ):
        xs = [j + (i - 1) * width for j in range(len(summaries))]
        ax.bar(xs, [100 * (getattr(s, attr) or 0.0) for s in summaries], width, label=label)
    ax.set_xticks(range(len(summaries)), [s.level for s in summaries])
    ax.set_ylabel("% of candidates")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_title(f"{report.mode}: {plot_label(report.source)} ({report.device})", fontsize=9)
    return fig


def speedups_figure(rows: Sequence[TaskResult]) -> Figure:
    """Histogram of correct candidates' speedups on a log axis ticked "0.5x / 1x / 2x ..."; a line at 1x
    (as fast as the baseline); the legend right of the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(7.2, 3.6), layout="constrained")
    correct = [r for r in rows if r.correct and r.reward > 0]
    series = [
        ("vs eager", [r.speedup_eager for r in correct if r.speedup_eager]),
        ("vs torch.compile", [r.speedup_compile for r in correct if r.speedup_compile]),
    ]
    values = [v for _, vs in series for v in vs if v]
    if values:
        low, high = math.log10(min(values)), math.log10(max(values))
        edges = [10 ** (low + (high - low + 1e-9) * k / 20) for k in range(21)]
        for label, vs in series:
            if vs:
                ax.hist(vs, bins=edges, alpha=0.6, label=f"{label} (n={len(vs)})")
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlim(min(edges[0], 0.9), max(edges[-1], 1.1))  # 1x is always on the axis
        ax.xaxis.set_major_locator(FixedLocator(speedup_ticks(*ax.get_xlim())))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.text(0.5, 0.5, "no correct candidate with a measured speedup", ha="center", transform=ax.transAxes)
    ax.set_xlabel("speedup (log scale)")
    ax.set_ylabel("candidates")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: no 0.2 of a candidate
    return fig


def speedup_ticks(low: float, high: float) -> list[float]:
    """1-2-5 steps per decade between `low` and `high` (0.5, 1, 2, 5, 10, ...), thinned to at most ~10 ticks
    by keeping whole decades only when the range is wide; 1 is always among them."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    steps = (1.0, 2.0, 5.0) if len(decades) <= 4 else (1.0,)
    ticks = [round(m * 10.0**d, 12) for d in decades for m in steps]
    return [t for t in ticks if low <= t <= high]


def plot_label(source: str) -> str:
    """A plot title names what was evaluated, not where it lives on this machine: an absolute local path
    (`/home/me/runs/solutions`, `replay:/tmp/x/script.jsonl`) becomes its last component; URLs and hub ids
    stay as they are."""
    scheme, sep, rest = source.partition(":")
    if not sep or rest.startswith("//") or "/" in scheme:
        scheme, sep, rest = "", "", source
    if rest.startswith(("/", "~")):
        rest = Path(rest).name or rest
    return f"{scheme}{sep}{rest}"
