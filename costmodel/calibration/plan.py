"""Sweep plans: which micro-batches to time, how often, and how long that will take.

A plan is budgeted by design: every point's time is estimated from the registry
estimate for the GPU (`costmodel.estimate.estimate_cost_model`), multiplied by warm-up +
repeats, plus a fixed per-point cost (allocation, synchronisation, L2 flush). When the
total exceeds the budget (default sweep 75 s so that it ends within 90 s on an H200
with set-up; `--quick` 24 s for 30 s) one repeat is dropped, then the grids are thinned,
coarsest-first, until it fits. The plan size and estimate are logged.

The estimate can be wrong, so the budget is also enforced while measuring: points are
ordered coarse grid first (every 4th length / token count of each curve and its last
one: `essential`, always measured), then the points that refine it. Past
`deadline_s` (1.2 × the budget) the sweep skips the refinements it has not reached;
every curve keeps its full range, at a coarser grid.

Point kinds:
- "attention": the attention core alone on a pack of n equal sequences of length L
  (n from 1 to cap/L), so that fitting t = a(L) + n·b(L) separates the per-call cost a
  from the per-sequence cost b.
- "linear": one layer with the attention core skipped (`attention="none"`) on T tokens:
  projections, norms, rotary, MLP or MoE experts. A fine token grid keeps GEMM steps.
- "head": final norm + LM head + cross-entropy on T tokens.
- "layer": the whole layer on a mixed pack, to measure what a layer costs beyond
  linear(T) + Σ attn(L) (the attention call and glue), i.e. the per-layer overhead.
- "stack": `num_layers` layers + head on a micro-batch (used by `validate`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel.curves import MODES, ModeCurves
from costmodel.spec import ModelSpec

__all__ = [
    "PlanSettings", "SweepPlan", "SweepPoint", "check_sweep_sizes", "coarse_first",
    "estimate_point_ms", "make_plan", "point_ms",
]

logger = logging.getLogger(__name__)

KINDS = ("attention", "linear", "head", "layer", "stack")
SWEEP_KINDS = KINDS[:4]
"""What a calibration sweep measures and fits ("stack" is validate's)."""
PER_POINT_OVERHEAD_S = 0.02
"""Allocation, synchronisation and Python per point (a guess; the log shows the truth)."""
DEADLINE_FACTOR = 1.2
"""The sweep stops refining past this multiple of the budget (see the module docstring)."""


@dataclass(frozen=True)
class SweepPoint:
    """One thing to time: a kind of workload, a pass, and the sequence lengths it runs on."""

    kind: str
    mode: str
    lengths: tuple[int, ...]
    moe: bool = False
    num_layers: int = 1
    """Only for kind "stack"."""

    @property
    def tokens(self) -> int:
        return int(sum(self.lengths))

    @property
    def n(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        """The (first) sequence length: L for attention packs, T for linear/head points."""
        return int(self.lengths[0])

    def describe(self) -> str:
        extra = " moe" if self.moe else ""
        if self.kind == "attention":
            return f"attention {self.mode} L={self.length} n={self.n}"
        if self.kind in ("linear", "head"):
            return f"{self.kind}{extra} {self.mode} T={self.tokens}"
        return f"{self.kind}{extra} {self.mode} {self.n} seqs / {self.tokens} tokens"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "mode": self.mode, "tokens": self.tokens}
        if self.kind == "attention":
            d.update(length=self.length, n=self.n)
        elif self.kind in ("layer", "stack"):
            d["lengths"] = list(self.lengths)
        if self.moe:
            d["moe"] = True
        if self.kind == "stack":
            d["num_layers"] = self.num_layers
        return d


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    attention_per_octave: int = 3
    max_packs: int = 4
    """At most this many pack sizes n per length (1, nmax and geometric between)."""
    token_per_octave: int = 12
    """Geometric token grid density below `linear_step_from` tokens."""
    linear_step_from: int = 1024
    linear_step: int = 256
    """Above `linear_step_from`, the token grid is linear with this step (GEMM steps)."""
    head_per_octave: int = 3
    probes_per_mode: int = 8
    repeats: int = 5
    warmup: int = 2
    min_length: int = 64
    min_tokens: int = 16
    head_max_tokens: int = 16384
    """The LM head's fp32 logits grow as T × vocab; above this the head is extrapolated."""
    retakes: int = 2
    """The whole-layer probes and the token-curve points the monotone fit disagrees with are
    measured this many more times after the sweep, time allowing
    (`costmodel.calibration.retake`); 0: never."""


DEFAULT_SETTINGS = PlanSettings()
QUICK_SETTINGS = PlanSettings(
    attention_per_octave=2, max_packs=3, token_per_octave=6, linear_step=1024,
    head_per_octave=2, probes_per_mode=4, repeats=3, warmup=1,
)


@dataclass(kw_only=True)
class SweepPlan:
    points: list[SweepPoint]
    """In measuring order: the `essential` coarse grid first, then its refinements."""
    essential: int
    """The first `essential` points are always measured; the rest only before the deadline."""
    probe: SweepPoint
    """Timed at the start and at the end: the drift probe."""
    settings: PlanSettings
    estimated_s: float
    budget_s: float
    max_len: int
    max_tokens: int
    notes: list[str] = field(default_factory=list)

    @property
    def deadline_s(self) -> float:
        """Seconds into the sweep after which refinement points are skipped."""
        return DEADLINE_FACTOR * self.budget_s

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for p in self.points:
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
        parts = ", ".join(f"{n} {k}" for k, n in kinds.items())
        return (
            f"{len(self.points)} points ({parts}) x {self.settings.warmup} warm-up + "
            f"{self.settings.repeats} repeats; estimated {self.estimated_s:.0f} s "
            f"(budget {self.budget_s:.0f} s, refinements skipped past {self.deadline_s:.0f} s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "modes": list(dict.fromkeys(p.mode for p in self.points)),
            "points": len(self.points),
            "essential": self.essential,
            "repeats": self.settings.repeats,
            "warmup": self.settings.warmup,
            "estimated_s": round(self.estimated_s, 2),
            "budget_s": self.budget_s,
            "deadline_s": self.deadline_s,
            "max_len": self.max_len,
            "max_tokens": self.max_tokens,
            "settings": {k: getattr(self.settings, k) for k in self.settings.__dataclass_fields__},
            "notes": self.notes,
        }


def _geometric(lo: int, hi: int, per_octave: int, multiple: int = 1) -> list[int]:
    if hi < lo:
        return [hi]
    count = max(2, int(round(np.log2(hi / lo) * per_octave)) + 1)
    raw = np.geomspace(lo, hi, count)
    vals = np.unique(np.maximum(multiple, np.round(raw / multiple) * multiple).astype(int))
    vals = vals[(vals >= lo) & (vals <= hi)]
    return sorted(set(vals.tolist()) | {lo, hi})


def _pack_sizes(nmax: int, max_packs: int) -> list[int]:
    if nmax <= 1:
        return [1]
    sizes = np.unique(np.round(np.geomspace(1, nmax, max_packs)).astype(int))
    return sorted(set(sizes.tolist()) | {1, nmax})


def token_grid(lo: int, hi: int, per_octave: int, step_from: int, step: int) -> list[int]:
    """Geometric up to `step_from`, then every `step` tokens: fine where GEMMs step."""
    lo_part = _geometric(lo, min(step_from, hi), per_octave)
    hi_part = list(range(step_from + step, hi + 1, step)) if hi > step_from else []
    return sorted(set(lo_part + hi_part + [hi]))


def _build(spec: ModelSpec, modes: tuple[str, ...], max_len: int, max_tokens: int,
           s: PlanSettings, rng_seed: int) -> tuple[list[SweepPoint], SweepPoint]:
    lengths = _geometric(min(s.min_length, max_len), max_len, s.attention_per_octave, multiple=8)
    tokens = token_grid(s.min_tokens, max_tokens, s.token_per_octave, s.linear_step_from, s.linear_step)
    head_tokens = _geometric(s.min_tokens, min(max_tokens, s.head_max_tokens), s.head_per_octave)
    kinds_moe = [kind == "moe" for kind in spec.linear_kinds]
    rng = np.random.default_rng(rng_seed)
    points: list[SweepPoint] = []
    for mode in modes:
        for L in lengths:
            for n in _pack_sizes(max_tokens // L, s.max_packs):
                points.append(SweepPoint("attention", mode, (L,) * n))
        for moe in kinds_moe:
            points.extend(SweepPoint("linear", mode, (T,), moe=moe) for T in tokens)
        points.extend(SweepPoint("head", mode, (T,)) for T in head_tokens)
        for moe in kinds_moe:
            for _ in range(s.probes_per_mode):
                points.append(SweepPoint("layer", mode, _random_pack(rng, max_len, max_tokens), moe=moe))
    probe_tokens = min(4096, max_tokens)
    probe = SweepPoint("linear", modes[0], (probe_tokens,), moe=not spec.num_dense_layers)
    return points, probe


def coarse_first(points: list[SweepPoint]) -> tuple[list[SweepPoint], int]:
    """(points reordered coarse grid first, how many are in the coarse grid).

    Within each curve (mode, kind, dense/MoE) the grid positions j = 0, 4, 8, ... and the
    last one form the coarse grid; then j = 2, 6, ...; then the odd ones. An attention
    length moves with all its packs (the per-call/per-sequence fit needs them together).
    """
    groups: dict[tuple, list] = {}
    for p in points:
        units = groups.setdefault((p.mode, p.kind, p.moe), [])
        if p.kind == "attention" and units and units[-1][0].length == p.length:
            units[-1].append(p)
        else:
            units.append([p])
    levels: list[list[SweepPoint]] = [[], [], []]
    for units in groups.values():
        for j, unit in enumerate(units):
            level = 0 if j % 4 == 0 or j == len(units) - 1 else (1 if j % 2 == 0 else 2)
            levels[level].extend(unit)
    return levels[0] + levels[1] + levels[2], len(levels[0])


def rl_lengths(rng: np.random.Generator, n: int, max_len: int) -> np.ndarray:
    """Long-tailed response lengths: lognormal (median ~1.2k tokens) truncated to
    [16, max_len] — drawn below the cut, not clipped to it: clipping made most micro-batches
    of a small cap one sequence of exactly the cap, the same micro-batch over and over."""
    from scipy.special import ndtr, ndtri  # here: `import costmodel` stays free of scipy

    mu, sigma = np.log(1200.0), 1.1
    top = ndtr((np.log(max_len) - mu) / sigma)  # the share of the distribution below the cut
    u = rng.uniform(0.0, top, n)
    lengths = np.exp(mu + sigma * ndtri(u))
    return np.clip(np.round(lengths), 16, max_len).astype(np.int64)


def _random_pack(rng: np.random.Generator, max_len: int, max_tokens: int) -> tuple[int, ...]:
    """RL-like lengths (`rl_lengths`) packed in order up to a random cap: mixes of many
    short or a few long sequences (drawn clipped to the cap, a third of the probes were one
    sequence of exactly the cap)."""
    cap = int(rng.choice([c for c in (512, 1024, 2048, 4096, 8192, 16384, max_tokens) if c <= max_tokens]))
    out: list[int] = []
    while True:
        L = int(rl_lengths(rng, 1, min(max_len, cap))[0])
        if sum(out) + L > cap:
            return tuple(out)  # the first always fits: rl_lengths stays under the cap
        out.append(L)


def point_ms(c: ModeCurves, point: Any, call_ms: float) -> float:
    """Time of one call of `point` (a SweepPoint, or a measured point of the sweep: kind,
    lengths, moe) under the curves `c` of its pass; `call_ms`: an attention call's own cost."""
    L = np.asarray(point.lengths, dtype=np.float64)
    kind = "moe" if point.moe else "dense"
    if point.kind == "attention":
        return call_ms + float(c.attention(L).sum())
    if point.kind == "linear":
        return float(c.linear[kind](point.tokens))
    if point.kind == "head":
        return float(c.head(point.tokens))
    layer = c.layer_overhead_ms + float(c.attention(L).sum()) + float(c.linear[kind](point.tokens))
    if point.kind == "layer":
        return layer
    return point.num_layers * layer + float(c.head(point.tokens))  # a stack


def estimate_point_ms(point: SweepPoint, model) -> float:
    """Estimated time of one call of `point` under `model` (a CostModel, usually an estimate,
    whose per-layer overhead stands in for an attention call's own cost)."""
    c = model.curves[point.mode]
    return point_ms(c, point, call_ms=c.layer_overhead_ms)


def plan_seconds(points: list[SweepPoint], model, s: PlanSettings, timing: str = "eager") -> float:
    """Estimated seconds to time `points`, with the calls `timer.time_cuda` makes of each:
    eagerly its warm-ups and repeats; as a graph at least two warm-ups, the upload replay
    and the repeats. The capture itself (torch.cuda.graph empties the allocator's cache, the
    graph is instantiated) is not counted: never measured yet, and it is offset by the
    replays, which skip the eager launch costs the estimate charges small points. The
    sweep's deadline bounds what either gets wrong."""
    calls = max(2, s.warmup) + 1 + s.repeats if timing == "graph" else max(1, s.warmup) + s.repeats
    work = sum(estimate_point_ms(p, model) for p in points) * calls / 1e3
    return work + PER_POINT_OVERHEAD_S * len(points)


# The longest sequence and the largest micro-batch a sweep measures: 1M tokens is past any
# context window and any token cap of a training step.
_MAX_SWEEP_TOKENS = 1 << 20


def check_sweep_sizes(max_len: Any, max_tokens: Any, *,
                      names: tuple[str, str] = ("max_len", "max_tokens")) -> None:
    """ValueError, naming them as ``names`` says (the CLI's flags, or make_plan's
    arguments), unless the longest sequence and the largest micro-batch are whole numbers of
    tokens in 64.._MAX_SWEEP_TOKENS, the micro-batch (None: the default) at least as large."""
    for name, value in zip(names, (max_len, max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                  or not 64 <= value <= _MAX_SWEEP_TOKENS):
            # 2^31 planned for minutes and estimated a month: refuse, do not warn.
            raise ValueError(f"{name} must be an integer number of tokens in 64.."
                             f"{_MAX_SWEEP_TOKENS:,}, got {value!r}")
    if max_tokens is not None and max_tokens < max_len:
        raise ValueError(f"{names[1]} ({max_tokens}) must be >= {names[0]} ({max_len})")


def make_plan(
    spec: ModelSpec,
    *,
    modes: tuple[str, ...] = MODES,
    max_len: int = 32768,
    max_tokens: int | None = None,
    quick: bool = False,
    gpu: str = "h200",
    budget_s: float | None = None,
    settings: PlanSettings | None = None,
    seed: int = 0,
    timing: str = "graph",
    retakes: int | None = None,
) -> SweepPlan:
    """A sweep for `spec` that fits the time budget on `gpu` (a registry key or name), timed
    as `timing` says (see `plan_seconds`); ``retakes`` overrides the settings' rounds of
    measuring points again (`PlanSettings.retakes`)."""
    from costmodel.estimate import estimate_cost_model
    from costmodel.gpus import lookup_gpu

    if isinstance(modes, str) or not modes or any(m not in MODES for m in modes):
        raise ValueError(f"modes must be a non-empty subset of train, forward; got {modes!r}")
    modes = tuple(dict.fromkeys(modes))  # ("train", "train") measured everything twice
    check_sweep_sizes(max_len, max_tokens)
    max_tokens = int(max_tokens or max(max_len, 16384))
    s = settings or (QUICK_SETTINGS if quick else DEFAULT_SETTINGS)
    if retakes is not None:
        if isinstance(retakes, bool) or not isinstance(retakes, int) or retakes < 0:
            raise ValueError(f"retakes must be a whole number >= 0, got {retakes!r}")
        s = _replace(s, retakes=retakes)
    budget = float(budget_s if budget_s is not None else (24.0 if quick else 75.0))
    if not budget > 0:
        raise ValueError(f"the time budget must be > 0 seconds, got {budget_s}")
    notes: list[str] = []
    try:
        info = lookup_gpu(gpu)
    except ValueError:  # a GPU outside the registry (calibrate --gpu auto finds one)
        info = lookup_gpu("h200")
        notes.append(f"{gpu!r} is not in the GPU registry: the time budget was planned with "
                     "H200 rates")
    model = estimate_cost_model(spec, info)
    # Thin until the plan fits: a repeat, the linear step, density, packs and probes, repeats.
    # One repeat fewer first (a median of 4 instead of 5): it loses less than a coarser
    # token grid, which would smooth the GEMM steps, and a slight overshoot halved the grid.
    thinning = [
        lambda t: _replace(t, repeats=max(3, t.repeats - 1)),
        lambda t: _replace(t, linear_step=t.linear_step * 2),
        lambda t: _replace(t, token_per_octave=max(3, t.token_per_octave // 2),
                           attention_per_octave=max(2, t.attention_per_octave - 1)),
        lambda t: _replace(t, max_packs=max(2, t.max_packs - 1), probes_per_mode=max(3, t.probes_per_mode // 2)),
        lambda t: _replace(t, repeats=max(3, t.repeats - 1), warmup=1),
    ]
    once, again = iter(thinning[:-1]), thinning[-1]  # each once, in order; the last to its floor
    while True:
        points, probe = _build(spec, tuple(modes), max_len, max_tokens, s, seed)
        est = plan_seconds(points + [probe, probe], model, s, timing)
        if est <= budget:
            break
        # The next step that thins anything (a quick plan's repeats are at their floor).
        thinner = next((t for t in (step(s) for step in once) if t != s), again(s))
        if thinner == s:  # nothing left to thin
            break
        s = thinner
        notes.append(f"estimated {est:.1f} s > budget {budget:.1f} s: thinned to {s}")
    if est > budget:
        notes.append(f"could not fit the budget; estimated {est:.0f} s")
        logger.warning("sweep estimated at %.0f s, over the %.0f s budget", est, budget)
    ordered, essential = coarse_first(points)
    plan = SweepPlan(points=ordered, essential=essential, probe=probe, settings=s, estimated_s=est,
                     budget_s=budget, max_len=max_len, max_tokens=max_tokens, notes=notes)
    logger.info("sweep plan for %s on %s: %s", spec.name, info.key, plan.summary())
    return plan


def _replace(s: PlanSettings, **kw: Any) -> PlanSettings:
    from dataclasses import replace

    return replace(s, **kw)
