"""Predicted vs measured on random packed micro-batches, next to the simple baselines.

Micro-batches: RL-like long-tailed lengths (lognormal, median ~1.2k tokens, drawn below
the calibrated range's end: `rl_lengths`) packed in order under several token caps
(`DEFAULT_CAPS`, 768 .. 16k), so both
launch-bound small micro-batches and attention-heavy long ones appear. Each runs through
`num_layers` distinct real layers + the LM head (a "stack" point; same timer as the
sweep), and is compared with:

- the cost model's `stack_cost` as is (no rescaling: the model predicts milliseconds);
- tokens (Σ L) × the best single scale factor;
- analytic FLOPs of the stack × the best single scale factor.

"Best" minimises the mean absolute percentage error, which is a weighted median of the
ratios (measured / predictor) with weights predictor / measured; it is fitted separately
for each split (all, ≥ 1k tokens), the most favourable choice for the baselines. Figures:
MAPE, worst relative error, Spearman rank correlation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from costmodel import flops
from costmodel.calibration.plan import SweepPoint, rl_lengths
from costmodel.calibration.timer import Timer
from costmodel.model import CostModel
from costmodel.model_file import utc_timestamp

__all__ = [
    "MAX_COUNT", "best_scale", "error_metrics", "random_microbatches", "revalidate", "run_validation",
    "summarize",
]

logger = logging.getLogger(__name__)

DEFAULT_CAPS = (768, 2048, 4096, 8192, 16384)
SPLIT_TOKENS = 1024


def random_microbatches(
    rng: np.random.Generator, *, count: int, caps: Sequence[int], max_len: int,
    sampler: Callable[[np.random.Generator, int, int], np.ndarray] | None = None,
) -> list[tuple[int, ...]]:
    """`count` micro-batches, an equal share per cap, each packed in order up to its cap;
    lengths from `sampler` (default `rl_lengths`)."""
    sampler = sampler or rl_lengths
    bad = [c for c in (*caps, max_len) if not (isinstance(c, (int, np.integer)) and c >= 16)]
    if bad or not caps:  # a cap of 0 (or NaN) never closes a micro-batch: an endless loop
        raise ValueError(f"caps and max_len must be integers >= 16 tokens, got caps={list(caps)} "
                         f"and max_len={max_len!r}")
    out: list[tuple[int, ...]] = []
    per_cap = [count // len(caps) + (i < count % len(caps)) for i in range(len(caps))]
    for cap, want in zip(caps, per_cap):
        current: list[int] = []
        made = 0
        while made < want:
            L = int(sampler(rng, 1, min(max_len, cap))[0])
            if current and sum(current) + L > cap:
                out.append(tuple(current))
                made += 1
                current = []
            current.append(L)
        # the partly filled last one is dropped: every cap contributes exactly `want`
    return out


def best_scale(x: np.ndarray, y: np.ndarray) -> float:
    """The s minimising mean |s·x − y| / y: the weighted median of y/x, weights x/y."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    r = y / x
    w = x / y
    order = np.argsort(r)
    cw = np.cumsum(w[order])
    return float(r[order][np.searchsorted(cw, 0.5 * cw[-1])])


def error_metrics(pred: np.ndarray, measured: np.ndarray) -> dict[str, float | None]:
    rel = np.asarray(pred) / np.asarray(measured) - 1.0
    rho = spearmanr(pred, measured).statistic if len(rel) > 2 else float("nan")
    return {
        "mape": float(np.mean(np.abs(rel))),
        "worst": float(np.max(np.abs(rel))),
        # None when undefined (a constant predictor, or under 3 points): not a 0 that reads
        # as "no correlation".
        "spearman": float(rho) if np.isfinite(rho) else None,
        "count": int(len(rel)),
    }


def summarize(
    measured: np.ndarray, predictors: dict[str, np.ndarray], tokens: np.ndarray,
    *, rescale: Sequence[str] = ("tokens", "flops"),
) -> dict[str, Any]:
    """Metrics per predictor for all micro-batches and for those of >= 1k tokens."""
    splits = {"all": np.ones(len(measured), bool), f">={SPLIT_TOKENS}": tokens >= SPLIT_TOKENS}
    out: dict[str, Any] = {}
    for split, mask in splits.items():
        if mask.sum() < 2:
            continue
        out[split] = {}
        for name, pred in predictors.items():
            p, m = pred[mask], measured[mask]
            scale = best_scale(p, m) if name in rescale else 1.0
            out[split][name] = {**error_metrics(scale * p, m), "scale": scale}
    return out


def stack_flops(lengths: Sequence[int], spec, *, num_layers: int, moe: bool) -> float:
    L = np.asarray(lengths, dtype=np.int64)
    T = int(L.sum())
    layer = float(flops.attention_core_flops(L, spec).sum() + flops.layer_linear_flops(T, spec, moe=moe))
    return num_layers * layer + T * flops.lm_head_flops_per_token(spec)


def run_validation(
    model: CostModel,
    timer: Timer,
    *,
    count: int = 150,
    caps: Sequence[int] | None = None,
    modes: Sequence[str] | None = None,
    num_layers: int = 4,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    time_limit_s: float | None = None,
    progress: Callable[[int, int, SweepPoint, float], None] | None = None,
) -> dict[str, Any]:
    """Time `count` random micro-batches in every mode and compare; returns the validation block.

    Micro-batches run in random order (caps mixed), each in every mode before the next, so
    that stopping at `time_limit_s` leaves a fair sample of the same micro-batches per mode.
    A KeyboardInterrupt (Ctrl-C; SIGTERM within `signals_interrupt`) stops it the same way,
    recorded under "interrupted", once 4 micro-batches are measured in every mode; before
    that it propagates.
    """
    import time

    spec = model.rank_spec  # what one GPU runs (a tensor-parallel rank's shard)
    if isinstance(count, bool) or not isinstance(count, int) or not 4 <= count <= MAX_COUNT:
        # As `validate --count`: a block asking for more is one `revalidate` drops
        raise ValueError(f"validation needs count >= 4 micro-batches (at most {MAX_COUNT:,}), "
                         f"got {count!r}")
    check_stack_layers(model, num_layers)
    if isinstance(modes, str):  # "train" would be read letter by letter
        modes = [modes]
    modes = list(modes or model.modes)
    for mode in modes:
        model._mode(mode)  # ValueError for a mode the model lacks
    max_len = _longest_calibrated(model)
    caps = [c for c in (caps or DEFAULT_CAPS) if c >= 64]
    if not caps:
        raise ValueError("validation needs at least one token cap >= 64")
    moe = spec.num_moe_layers > 0
    rng = np.random.default_rng(seed)
    batches = random_microbatches(rng, count=count, caps=caps, max_len=max_len)
    batches = [batches[i] for i in rng.permutation(len(batches))]
    t0 = time.perf_counter()
    total = len(batches) * len(modes)
    measured: dict[str, list[float]] = {m: [] for m in modes}
    done, stopped, interrupted = 0, False, None
    try:
        for lengths in batches:
            if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                stopped = True
                logger.warning("validation stopped at its time limit of %.0f s after %d of %d "
                               "micro-batches", time_limit_s, len(measured[modes[0]]), len(batches))
                break
            for mode in modes:
                point = SweepPoint("stack", mode, lengths, moe=moe, num_layers=num_layers)
                measured[mode].append(timer.measure(point, repeats=repeats, warmup=warmup).median_ms)
                done += 1
                if progress is not None:
                    progress(done, total, point, time.perf_counter() - t0)
    except KeyboardInterrupt as err:
        # Ctrl-C or a job's time limit (SIGTERM, see `signals_interrupt`): minutes of GPU
        # time already measured are reported, as at --time-limit-s, when they are enough.
        if _measured_in_every_mode(measured) < 4:
            raise
        interrupted = str(err) or "KeyboardInterrupt"
    kept = _measured_in_every_mode(measured)
    if interrupted:
        logger.warning("validation interrupted (%s) after %d of %d micro-batches; reporting "
                       "those", interrupted, kept, len(batches))
    batches = batches[:kept]
    if len(batches) < 4:
        raise RuntimeError(f"validation measured only {len(batches)} micro-batches before its "
                           f"time limit of {time_limit_s} s; raise the limit or lower --count")
    result: dict[str, Any] = {
        "created": utc_timestamp(),
        "device": timer.device_fingerprint(),
        "num_layers": num_layers,
        "moe_layers": moe,
        "caps": list(caps),
        "count": len(batches),
        "requested_count": count,
        "stopped_at_time_limit": stopped,
        "interrupted": interrupted,
        "seed": seed,
        "repeats": repeats,
        "modes": {},
    }
    for mode in modes:
        result["modes"][mode] = _compare(model, batches, np.array(measured[mode][:kept]), mode,
                                         num_layers=num_layers, moe=moe)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def _measured_in_every_mode(measured: dict[str, list[float]]) -> int:
    """How many micro-batches every mode has measured: one that a stop caught between its
    modes is left out, so that every mode judges the same micro-batches."""
    return min(len(v) for v in measured.values())


def check_stack_layers(model: CostModel, num_layers: Any, what: str = "num_layers") -> int:
    """``num_layers`` where a stack of that many layers is one `revalidate` (for `correct`
    and a refit) judges again: 1 .. the model's layers; else a ValueError naming ``what``."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) \
            or not 1 <= num_layers <= model.spec.num_layers:
        raise ValueError(f"{what} must be between 1 and the model's {model.spec.num_layers}, "
                         f"got {num_layers!r}")
    return num_layers


def largest_calibrated(model: CostModel) -> int:
    """The largest micro-batch (tokens) every pass's token-linear curves measured."""
    return int(min(c.tokens[-1] for m in model.curves.values() for c in m.linear.values()))


def _longest_calibrated(model: CostModel) -> int:
    """The longest length every pass measured: what validation draws lengths up to."""
    return int(min(c.attention.lengths[-1] for c in model.curves.values()))


def _compare(model: CostModel, batches: list[tuple[int, ...]], m: np.ndarray, mode: str, *,
             num_layers: int, moe: bool) -> dict[str, Any]:
    """One mode's summary and points: the model's predictions of measured times ``m``."""
    toks = np.array([sum(b) for b in batches], dtype=np.float64)
    fl = np.array([stack_flops(b, model.rank_spec, num_layers=num_layers, moe=moe) for b in batches])
    predicted = np.array([model.stack_cost(b, mode, num_layers=num_layers, moe=moe) for b in batches])
    summary = summarize(m, {"cost_model": predicted, "tokens": toks, "flops": fl}, toks)
    return {
        "summary": summary,
        "points": [
            {"tokens": int(t), "n": len(b), "lengths": [int(L) for L in b],
             "measured_ms": float(ms), "predicted_ms": float(p)}
            for b, t, ms, p in zip(batches, toks, m, predicted)
        ],
    }


def revalidate(model: CostModel, block: Any) -> dict[str, Any] | None:
    """A stored validation block judged again by ``model``'s curves (after a refit): the
    measured times are the GPU's and do not change; the predictions and figures do. The
    micro-batches' lengths are read from the points, or, for files that did not store them,
    drawn again from the block's seed (now or with the sampler of before 90e548f) and kept
    only when every point's token count and size match. None, with a warning, when the
    block cannot be judged again."""
    try:
        modes = {mode: list(res["points"]) for mode, res in block["modes"].items()}
        num_layers, moe = int(block["num_layers"]), bool(block["moe_layers"])
        if not 1 <= num_layers <= model.spec.num_layers:  # 1e300 judged every point NaN
            raise ValueError(f"num_layers {num_layers} is not between 1 and the model's "
                             f"{model.spec.num_layers}")
        first = next(iter(modes.values()))
        if all(isinstance(p.get("lengths"), list) for p in first):
            batches = [tuple(int(x) for x in p["lengths"]) for p in first]
        else:
            batches = _drawn_again(model, block, first)
        sizes = [(sum(b), len(b)) for b in batches]
        out = {k: v for k, v in block.items() if k != "modes"}
        out["modes"] = {}
        for mode, points in modes.items():
            if mode not in model.modes:
                continue
            if [(int(p["tokens"]), int(p["n"])) for p in points] != sizes:
                raise ValueError(f"the {mode} points are not the micro-batches of the others")
            measured = np.array([_measured_ms(p, mode, i) for i, p in enumerate(points)])
            out["modes"][mode] = _compare(model, batches, measured, mode,
                                          num_layers=num_layers, moe=moe)
        if not out["modes"]:
            raise ValueError(f"it validated {', '.join(modes)}, which the model lacks")
    except (AttributeError, KeyError, TypeError, ValueError, StopIteration) as err:
        logger.warning("the stored validation cannot be judged again (%s: %s); it is dropped",
                       type(err).__name__, err)
        return None
    return out


def _measured_ms(point: Any, mode: str, i: int) -> float:
    """A stored point's measured time; ValueError for anything no GPU measured (a negative
    time failed deep in the summary with an IndexError, 0 gave an infinite error)."""
    ms = point["measured_ms"]
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 1e-9 <= ms <= 1e9:
        raise ValueError(f"its {mode} point {i} has measured_ms {ms!r:.40}, not a time a GPU "
                         "measured (1e-9..1e9 ms)")
    return float(ms)


def _legacy_rl_lengths(rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
    """`rl_lengths` before 90e548f (clipped, not truncated): files validated then stored no
    lengths, only the seed that drew them."""
    return np.clip(np.round(rng.lognormal(np.log(1200), 1.1, n)), 16, max_len).astype(np.int64)


# The most micro-batches a validation runs per mode (`validate --count`) and `_drawn_again`
# draws (~0.7 s with the default caps): 66x the default --count, hours of GPU time.
MAX_COUNT = 10_000


def _drawn_again(model: CostModel, block: Any, points: list[Any]) -> list[tuple[int, ...]]:
    """The micro-batches of a block without stored lengths, drawn again from its seed."""
    want = [(int(p["tokens"]), int(p["n"])) for p in points]
    max_len = _longest_calibrated(model)
    count, caps = int(block["requested_count"]), [int(c) for c in block["caps"]]
    # Bounds a validate run keeps, checked before the draw: a block edited to
    # requested_count 10**9, or to a cap of 2**31 tokens, drew for hours (`calibrate --refit`
    # and `correct` hung).
    if not len(want) <= count <= MAX_COUNT:
        raise ValueError(f"its requested_count {count} is not between its {len(want)} points "
                         f"and {MAX_COUNT:,}")
    largest = largest_calibrated(model)
    if any(c > largest for c in caps):
        raise ValueError(f"its caps {caps[:6]} go past the {largest:,} tokens the model measured")
    for sampler in (rl_lengths, _legacy_rl_lengths):
        rng = np.random.default_rng(int(block["seed"]))
        batches = random_microbatches(rng, count=count, caps=caps, max_len=max_len,
                                      sampler=sampler)
        batches = [batches[i] for i in rng.permutation(len(batches))][: len(want)]
        if [(sum(b), len(b)) for b in batches] == want:
            return batches
    raise ValueError("its points store no lengths, and drawing them again from its seed "
                     "gives other micro-batches")


def format_validation(block: dict[str, Any]) -> str:
    """A table of the validation block (also used by `report`)."""
    # Its results first: a block without them (hand-edited: {"train": "x"}) printed "None
    # random micro-batches per mode through None layers" and an empty table; now a
    # KeyError or TypeError, which `report` names as a malformed field.
    modes = block["modes"]
    if not isinstance(modes, dict):
        raise TypeError(f"'modes' is {type(modes).__name__}, not an object of passes")
    stopped = (f"; stopped at the time limit, {block.get('requested_count')} requested"
               if block.get("stopped_at_time_limit") else "")
    if block.get("interrupted"):
        stopped += f"; interrupted ({block['interrupted']}), {block.get('requested_count')} requested"
    if block.get("revalidated"):
        by = block["revalidated"].get("by", "refitted") if isinstance(block["revalidated"], dict) else "refitted"
        stopped += f"; times as measured, predictions of the {by} curves"
    lines = [
        f"validation: {block.get('count')} random micro-batches per mode through "
        f"{block.get('num_layers')} layers + head (caps {block.get('caps')}{stopped})",
        f"  {'mode':8} {'split':7} {'predictor':11} {'MAPE':>7} {'worst':>7} {'Spearman':>9} {'scale':>10}",
    ]
    for mode, res in modes.items():
        for split, preds in res["summary"].items():
            for name, m in preds.items():
                scale = "-" if name == "cost_model" else f"{m['scale']:.3g}"
                rho = "-" if m.get("spearman") is None else f"{m['spearman']:.4f}"
                lines.append(
                    f"  {mode:8} {split:7} {name:11} {m['mape']:7.2%} {m['worst']:7.2%} "
                    f"{rho:>9} {scale:>10}"
                )
    lines += _error_by_size(block)
    lines += _repeat_scatter(block)
    return "\n".join(lines)


def _repeat_scatter(block: dict[str, Any]) -> list[str]:
    """How far identical micro-batches (the same lengths, drawn more than once: single
    samples at a cap) measured at different moments land apart, per mode, below and from
    SPLIT_TOKENS tokens: the pooled coefficient of variation, and the mean error it alone
    gives a model that knows each mean exactly (sqrt(2 / pi) of it, for normal noise). The
    shipped H200 validation (eager): 7.2% at 768 tokens in training (15 of them), 2-3% at
    2k-4k, 0.4% at 16k: its "all sizes" target of 4% sits below what the small ones'
    noise allows."""
    lines = []
    for mode, res in block.get("modes", {}).items():
        groups: dict[tuple[int, ...], list[float]] = {}
        try:
            for i, p in enumerate(res["points"]):
                # a time no GPU measured (hand-edited: 0 ms printed "nan%", a negative one a
                # scatter) skips the mode, as does a point that is not an object (an
                # AttributeError hid the whole validation from `report`)
                ms = _measured_ms(p, mode, i)
                # files validated before 2026-11-30 keep no lengths: a single sample's are its tokens
                lengths = p.get("lengths") or ([p["tokens"]] if p["n"] == 1 else None)
                if lengths:
                    groups.setdefault(tuple(int(x) for x in lengths), []).append(ms)
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
        cells = []
        for name, small in ((f"< {SPLIT_TOKENS // 1024}k", True), (f">= {SPLIT_TOKENS // 1024}k", False)):
            same = [np.array(ms) for lengths, ms in groups.items()
                    if len(ms) >= 2 and (sum(lengths) < SPLIT_TOKENS) == small]
            if not same:
                continue
            dof = sum(ms.size - 1 for ms in same)
            cv = float(np.sqrt(sum((ms.size - 1) * ms.var(ddof=1) / ms.mean() ** 2
                                   for ms in same) / dof))
            cells.append(f"{name} {cv:.1%} ({sum(ms.size for ms in same)} in {len(same)} "
                         f"group{'s' * (len(same) > 1)}; alone, ~{cv * math.sqrt(2 / math.pi):.1%}"
                         " error)")
        if cells:
            lines.append(f"  {mode}: identical micro-batches measured apart scatter: "
                         + " | ".join(cells))
    return lines


# Where a cost model's error sits: the fixed and launch costs of small micro-batches, or
# the curves a token cap's full micro-batches run on.
_SIZE_EDGES = (1024, 2048, 4096, 8192)


def _error_by_size(block: dict[str, Any]) -> list[str]:
    """The cost model's mean error per micro-batch size range, one line a mode (from the
    stored points; nothing for a block whose points lack the figures)."""
    lines = []
    for mode, res in block.get("modes", {}).items():
        try:
            tokens = np.array([float(p["tokens"]) for p in res["points"]])
            error = np.array([abs(float(p["predicted_ms"]) / float(p["measured_ms"]) - 1)
                              for p in res["points"]])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
        bins = np.digitize(tokens, _SIZE_EDGES)
        names = [f"< {_SIZE_EDGES[0] // 1024}k"] + [
            f"{lo // 1024}k-{hi // 1024}k" for lo, hi in zip(_SIZE_EDGES, _SIZE_EDGES[1:])
        ] + [f">= {_SIZE_EDGES[-1] // 1024}k"]
        cells = [f"{name} {error[bins == i].mean():.1%} ({int((bins == i).sum())})"
                 for i, name in enumerate(names) if (bins == i).any()]
        if cells:
            lines.append(f"  {mode}: cost model error by micro-batch tokens: " + " | ".join(cells))
    return lines
