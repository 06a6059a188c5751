"""The report's metrics as small pure functions over judged rows.

KernelBench's fast_p: the fraction of *all* tasks whose candidate is correct and more than p times faster
than the baseline (p = 0 is the plain correctness rate). Geometric means are over correct candidates with a
measured speedup only. "Faster than X" uses the judge's milestone margin: speedup > 1 + margin.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from cuda_agent.eval.models import Flagged, LevelSummary, TaskResult


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values; None when there are none (a zero or negative is a caller bug)."""
    logs = []
    for value in values:
        if not value > 0 or not math.isfinite(value):
            raise ValueError(f"geometric mean of a non-positive or non-finite value: {value}")
        logs.append(math.log(value))
    return math.exp(sum(logs) / len(logs)) if logs else None


def fast_p(outcomes: Sequence[tuple[bool, float | None]], p: float) -> float:
    """Share of all outcomes (correct, speedup) that are correct with speedup > p; 0.0 for no outcomes."""
    if not outcomes:
        return 0.0
    hits = sum(1 for correct, speedup in outcomes if correct and speedup is not None and speedup > p)
    return hits / len(outcomes)


def rate(count: int, total: int) -> float:
    return count / total if total else 0.0


def p_label(p: float) -> str:
    """fast_p keys as KernelBench writes them: fast_0, fast_1, fast_1.5."""
    return f"fast_{p:g}"


def summarise(level: str, rows: Sequence[TaskResult], ps: Sequence[float], margin: float) -> LevelSummary:
    correct = [r for r in rows if r.correct and r.reward > 0]
    eager = [(r.correct and r.reward > 0, r.speedup_eager) for r in rows]
    compiled = [(r.correct and r.reward > 0, r.speedup_compile) for r in rows]
    # No torch.compile timing anywhere (--compile-mode none): its rates are unknown, not zero.
    timed = any(s is not None for _, s in compiled)
    return LevelSummary(
        level=level,
        candidates=len(rows),
        judged=sum(1 for r in rows if r.status == "judged"),
        correct=len(correct),
        pass_rate=rate(len(correct), len(rows)),
        faster_than_eager=fast_p(eager, 1.0 + margin),
        faster_than_compile=fast_p(compiled, 1.0 + margin) if timed else None,
        geomean_speedup_eager=geomean(r.speedup_eager for r in correct if r.speedup_eager),
        geomean_speedup_compile=geomean(r.speedup_compile for r in correct if r.speedup_compile),
        fast_p_eager={p_label(p): fast_p(eager, p) for p in ps},
        fast_p_compile={p_label(p): fast_p(compiled, p) for p in ps} if timed else {},
        mean_reward=sum(r.reward for r in rows) / len(rows) if rows else 0.0,
        rewards={str(k): v for k, v in sorted(Counter(r.reward for r in rows).items())},
    )


def by_level(rows: Sequence[TaskResult], ps: Sequence[float], margin: float) -> list[LevelSummary]:
    levels = sorted({r.level for r in rows})
    return [summarise(level, [r for r in rows if r.level == level], ps, margin) for level in levels]


def suspicious(rows: Sequence[TaskResult], threshold: float) -> list[Flagged]:
    """Correct rows with a speedup above `threshold` against either baseline: worth a human look."""
    flagged = []
    for r in rows:
        high = [s for s in (r.speedup_eager, r.speedup_compile) if s is not None and s > threshold]
        if r.correct and r.reward > 0 and high:
            flagged.append(
                Flagged(
                    key=r.key,
                    reason=f"speedup {max(high):.1f}x > {threshold:g}x",
                    speedup_eager=r.speedup_eager,
                    speedup_compile=r.speedup_compile,
                )
            )
    return flagged


def refused_allclose_accepts(rows: Sequence[TaskResult]) -> list[Flagged]:
    """Rows our judge refused (not for a build failure) that a plain allclose harness accepted."""
    return [
        Flagged(key=r.key, reason=r.refusal, max_abs_err=r.allclose.max_abs_err)
        for r in rows
        if r.allclose is not None and r.allclose.accepted and r.refused_not_build
    ]
