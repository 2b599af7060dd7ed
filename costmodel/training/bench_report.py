"""The table, target checks and provenance that `costmodel bench-schedule` prints and
writes."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.training.bench import PolicyRun

__all__ = ["format_report", "provenance", "target_checks", "token_makespans"]


def token_makespans(runs: Sequence[PolicyRun]) -> dict[int, float]:
    return {r.dp_size: r.makespan for r in runs if r.policy == "tokens"}


def format_report(runs: Sequence[PolicyRun], *, per_rank: bool = False, mode: str = "train") -> str:
    """The table `bench-schedule` prints (``mode``: the pass its micro-batches were timed in)."""
    base = token_makespans(runs)
    lines = [
        f"{'dp':>4} {'policy':<11} {'mb/rank':>7} {'makespan ms':>11} {'max/mean':>8} "
        f"{'speed-up':>8} {'pred max/mean':>13} {'rank err %':>10}",
    ]
    for r in runs:
        speed = f"{base[r.dp_size] / r.makespan:.3f}x" if r.dp_size in base else "-"
        mb = len(r.schedule[0]) if r.schedule else 0
        err = "-"
        if r.predicted_ms is not None:
            e = np.abs(np.asarray(r.predicted_ms) / np.asarray(r.measured_ms) - 1) * 100
            err = f"{e.mean():.1f}/{e.max():.1f}"
        lines.append(
            f"{r.dp_size:>4} {r.policy:<11} {mb:>7} {r.makespan:>11.2f} {r.imbalance:>8.3f} "
            f"{speed:>8} {r.predicted_imbalance:>13.3f} {err:>10}"
        )
    lines.append(
        f"makespan: slowest rank's Σ of one layer's {'fwd+bwd' if mode == 'train' else 'forward'} "
        "time over its micro-batches; "
        "speed-up: token balance's makespan / this one's; pred max/mean: by the policy's own "
        "cost; rank err %: |cost-model prediction / measured - 1| per rank, mean/worst"
    )
    # (a noise floor is computed from the timing noise: where one is set, so is the other)
    floors = {r.dp_size: (r.timing_noise, r.noise_floor) for r in runs
              if r.policy == "calibrated" and r.noise_floor and r.timing_noise is not None}
    for dp, (noise, floor) in sorted(floors.items()):
        lines.append(
            f"dp {dp}: timing noise ~{100 * noise:.1f}% per micro-batch; a perfectly "
            f"balanced schedule of the calibrated policy's micro-batches would measure max/mean "
            f"~{floor:.3f}"
        )
    ratios = [r.slowest_rank_direct_ms / r.makespan for r in runs if r.slowest_rank_direct_ms]
    if ratios:
        lines.append(
            f"slowest rank timed end to end / sum of its micro-batches: {min(ratios):.3f} to "
            f"{max(ratios):.3f} over {len(ratios)} schedules"
        )
    if per_rank:
        for r in runs:
            if r.predicted_ms is None:
                continue
            lines.append(f"dp {r.dp_size} {r.policy}: rank predicted ms / measured ms")
            lines.extend(
                f"  rank {i:>3}: {p:9.2f} / {m:9.2f}  ({(p / m - 1) * 100:+.1f}%)"
                for i, (p, m) in enumerate(zip(r.predicted_ms, r.measured_ms))
            )
    return "\n".join(lines)


def target_checks(runs: Sequence[PolicyRun]) -> list[dict[str, Any]]:
    """The issue's targets per DP size: calibrated ≥10% below tokens, ≤ flops, max/mean < 1.03."""
    by = {(r.dp_size, r.policy): r for r in runs}
    out = []
    for dp in sorted({r.dp_size for r in runs}):
        cal, tok, flo = by.get((dp, "calibrated")), by.get((dp, "tokens")), by.get((dp, "flops"))
        if cal is None:
            continue
        row: dict[str, Any] = {"dp_size": dp, "calibrated_max_over_mean": cal.imbalance,
                               "max_over_mean_below_1.03": cal.imbalance < 1.03,
                               "noise_floor_max_over_mean": cal.noise_floor}
        if tok is not None:
            cut = 1 - cal.makespan / tok.makespan
            row["makespan_cut_vs_tokens"] = cut
            row["cut_at_least_10pct"] = cut >= 0.10
            # What a perfect balance of token balance's own work would cut: a policy goes
            # past it only by running less work in all (fewer or cheaper micro-batches).
            # Where it is under 10%, so is the target's reach by balance alone.
            row["tokens_balance_headroom"] = 1 - 1 / tok.imbalance
        if flo is not None:
            row["no_worse_than_flops"] = cal.makespan <= flo.makespan
        out.append(row)
    return out


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Who ran what, where and when (no GPU query here; the measurer adds its own)."""
    import costmodel

    commit = None
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                timeout=5, check=False,
            ).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": " ".join(["costmodel", *(argv if argv is not None else sys.argv[1:])]),
        "costmodel": getattr(costmodel, "__version__", None),
        "git_commit": commit,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
    }
