"""One vectorised cost for the scheduler, whatever the caller passed as ``cost``.

The scheduler never evaluates a cost one micro-batch at a time in a Python loop (at 64k
samples that alone would blow the time budget). Every cost becomes a `Cost` with

- ``microbatch_costs(lengths, offsets)``: the cost of many micro-batches at once, laid out
  CSR-style (``lengths`` concatenated, micro-batch k = ``lengths[offsets[k]:offsets[k+1]]``);
- ``marginal_costs(lengths, fill_tokens)``: the cost each sample adds to a micro-batch of
  about ``fill_tokens`` tokens, the weight the greedy packer balances before the true
  micro-batch costs take over (exact for additive costs: their ``sample_costs``).

Accepted ``cost`` values (see `as_cost`):

- ``"tokens"``: Σ L per micro-batch;
- ``"flops"``: exact analytic FLOPs of ``spec`` (`costmodel.flops.sequence_fwd_flops`, × 3 in
  ``mode="train"``); additive over sequences, no fixed cost;
- a cost-model object (`costmodel.model.CostModel` or anything with ``microbatch_cost`` /
  ``sample_cost``; ``microbatch_costs(lengths, offsets)`` is used when it has one);
- a plain callable on one micro-batch's lengths (a 1-D int64 array) returning a number.
  This is the one slow path: the callable runs once per micro-batch evaluated.

Every value is checked: NaN, infinite or negative costs raise ValueError naming the
micro-batch that produced them.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel.checks import did_you_mean
from costmodel.curves import checked_mode

logger = logging.getLogger(__name__)

__all__ = [
    "AdditiveCost",
    "CallableCost",
    "Cost",
    "ModelCost",
    "as_cost",
    "builtin_hint",
    "quantise",
]


def _segment_ids(offsets: np.ndarray) -> np.ndarray:
    """For CSR ``offsets`` of K segments, the segment id of every element."""
    counts = np.diff(offsets)
    return np.repeat(np.arange(counts.size, dtype=np.int64), counts)


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    # bincount adds element by element in index order: the same sum in every process, and
    # empty segments come out as 0 (np.add.reduceat would return a neighbour instead).
    k = offsets.size - 1
    if values.size == 0:
        return np.zeros(k, dtype=np.float64)
    return np.bincount(_segment_ids(offsets), weights=values, minlength=k)


class CostError(ValueError):
    """A cost failed on the lengths it was given (raised once, with the cost's name)."""


# What a cost raises on lengths it cannot price. Not RuntimeError or MemoryError: a missing
# GPU or package, or a machine out of memory, is not bad input and keeps its type.
_INPUT_ERRORS = (TypeError, ValueError, ArithmeticError, LookupError, AttributeError)


class Cost:
    """Base class: a vectorised micro-batch cost. Subclasses set ``name`` and ``additive``."""

    name: str = "cost"
    #: True when a micro-batch costs ``fixed + Σ sample_costs`` exactly.
    additive: bool = False
    #: True when a non-empty micro-batch costs exactly ``fixed_cost() +
    #: Σ sequence_costs(Lᵢ) + token_costs(Σ Lᵢ)`` (a calibrated model: attention per
    #: sequence, GEMMs by token count): the local search then prices a move exactly, in bulk.
    separable: bool = False

    def fixed_cost(self) -> float:
        """What every non-empty micro-batch pays on top of its samples: an additive cost's
        ``fixed`` attribute (0 without one); a separable cost says its own."""
        if self.additive:
            return float(getattr(self, "fixed", 0.0))
        raise NotImplementedError(f"{type(self).__name__} is separable: implement fixed_cost()")

    def sequence_costs(self, lengths: np.ndarray) -> np.ndarray:
        """A separable cost's per-sequence part, one value per length (attention)."""
        raise NotImplementedError

    def token_costs(self, tokens: np.ndarray) -> np.ndarray:
        """A separable cost's part by a micro-batch's token count, one value per count."""
        raise NotImplementedError

    def microbatch_costs(self, lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Each micro-batch's cost: micro-batch k holds ``lengths[offsets[k]:offsets[k+1]]``."""
        raise NotImplementedError

    def sample_costs(self, lengths: np.ndarray) -> np.ndarray:
        """Each sample's cost (additive costs only: a micro-batch costs ``fixed`` + their sum)."""
        raise NotImplementedError(f"{type(self).__name__} is not additive: it has no cost per "
                                  "sample; use marginal_costs(lengths, fill_tokens)")

    def microbatch_cost(self, lengths: ArrayLike) -> float:
        """One micro-batch, for convenience (tests, reports)."""
        arr = np.asarray(lengths, dtype=np.int64).reshape(-1)
        return float(self.evaluate(arr, np.array([0, arr.size], dtype=np.int64))[0])

    # -- checked entry points used by the scheduler ------------------------------------
    def evaluate(self, lengths: np.ndarray, offsets: np.ndarray, *,
                 what: str = "a micro-batch") -> np.ndarray:
        """`microbatch_costs`, converted to float64 and checked (finite, >= 0); ``what`` names
        the micro-batches in an error."""
        k = offsets.size - 1
        try:
            out = np.asarray(self.microbatch_costs(lengths, offsets), dtype=np.float64).reshape(-1)
        except CostError:
            raise
        except _INPUT_ERRORS as err:  # a user's cost failing on these lengths: bad input here
            raise CostError(f"cost {self.name!r} failed on micro-batches ({type(err).__name__}: "
                            f"{err})") from err
        if out.size != k:
            raise ValueError(f"cost {self.name!r} returned {out.size} values for {k} micro-batches")
        _check_values(out, self.name, lengths, offsets, what)
        return out

    def marginal_costs(self, lengths: np.ndarray, fill_tokens: int, *,
                       around: bool = False) -> np.ndarray:
        """The cost a sample adds to a micro-batch that ends up ``fill_tokens`` long.

        Exact for additive costs. Otherwise measured on the cost itself: the cost of a
        micro-batch ``[F, L]`` minus that of ``[F]``, with a filler ``F = fill − L`` (at least
        1), so a fixed per-micro-batch cost and the attention of the filler cancel and what
        remains is the sample's attention plus its token-linear share at that fill level.
        Evaluated once per distinct length.

        ``around``, for a separable cost: the sample's attention plus its tokens at the token
        curve's slope around the fill (the secant over [fill / 2, 3 fill / 2], as
        `CostModel.sample_cost`), not its rise from fill − L to fill, exact for that one
        fill only. Whole groups are spread over ranks by these weights before anything is
        packed, so fills land all around it; on a measured curve, jagged by the noise
        between its points (the H200 profile's forward pass: 5.2%), the exact rise weighed
        samples of near lengths far apart, and RL prompts in groups of 8 ended 3.3-4.8%
        longer (16,384 samples, dp 64, forward, seeds 0-2). Single samples keep the exact
        rise: there the local search prices every move exactly, and the weights changed
        little either way (28 of the 48 bench_scheduler batches moved, by -0.10% to +0.56%).
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        if self.additive or (around and self.separable):
            if self.additive:
                values = np.asarray(self.sample_costs(lengths), dtype=np.float64).reshape(-1)
            else:
                low, high = self.token_costs(np.array([0.5, 1.5]) * float(fill_tokens))
                slope = max(float(high - low), 0.0) / float(fill_tokens)
                values = self.sequence_costs(lengths) + lengths * slope
            _check_values(values, self.name, lengths, np.arange(lengths.size + 1))
            return values
        uniq, inverse = _distinct(lengths)
        filler = np.maximum(int(fill_tokens) - uniq, 1)
        u = uniq.size
        pair_lengths = np.empty(2 * u, dtype=np.int64)
        pair_lengths[0::2] = filler
        pair_lengths[1::2] = uniq
        probe = "a probe micro-batch (a filler, then the sample whose marginal cost it measures)"
        with_sample = self.evaluate(pair_lengths, np.arange(0, 2 * u + 1, 2, dtype=np.int64),
                                    what=probe)
        alone = self.evaluate(filler, np.arange(u + 1, dtype=np.int64), what=probe)
        marginal = np.maximum(with_sample - alone, 0.0)
        return marginal[inverse]


def _distinct(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(lengths, return_inverse=True)``, by a table of the lengths present where
    the longest is short beside the count (np.unique sorts: 4-5 ms at 65,536 samples of up
    to 16k tokens, against 0.16 ms so; 0.35-0.45 against 0.07 ms at 8,192)."""
    if lengths.size == 0 or int(lengths.min()) < 0:
        return np.unique(lengths, return_inverse=True)
    top = int(lengths.max())
    if top > max(1 << 16, 8 * lengths.size):
        return np.unique(lengths, return_inverse=True)
    present = np.zeros(top + 1, dtype=bool)
    present[lengths] = True
    index = np.cumsum(present) - 1  # each present length's place among them
    return np.flatnonzero(present), index[lengths]


def _check_values(values: np.ndarray, name: str, lengths: np.ndarray, offsets: np.ndarray,
                  what: str = "a micro-batch") -> None:
    bad = ~np.isfinite(values) | (values < 0)
    if not bad.any():
        return
    k = int(np.flatnonzero(bad)[0])
    members = np.asarray(lengths[offsets[k] : offsets[k + 1]]).tolist()
    shown = members if len(members) <= 8 else members[:8] + ["..."]
    raise ValueError(
        f"cost {name!r} returned {float(values[k])!r} for {what} with lengths {shown}: "
        "costs must be finite and non-negative"
    )


# Quantised costs stay below 2**62 so that sums of a few of them fit int64.
_QUANT_LIMIT = float(2**62)


def quantise(values: np.ndarray, scale: float, name: str) -> np.ndarray:
    """Costs times the scheduler's power-of-two scale, as int64; ValueError where one does not
    fit. The scale leaves room for a micro-batch of ~500,000 times the batch's summed sample
    costs: only a cost that explodes with micro-batch size gets past it (it wrapped to a
    negative weight before)."""
    scaled = np.asarray(values, dtype=np.float64) * scale
    if not (scaled < _QUANT_LIMIT).all():
        worst = float(np.max(values))
        raise ValueError(
            f"cost {name!r}: a micro-batch costs {worst:.3g}, over 500,000 times what the batch's "
            "samples cost one by one: a cost that grows this steeply with micro-batch size "
            "cannot be balanced; check the cost function (milliseconds or FLOPs of a micro-batch)"
        )
    return np.rint(scaled).astype(np.int64)


def additive_bin_costs(cost: Cost, q: np.ndarray, bin_of: np.ndarray, k: int,
                       scale: float) -> np.ndarray:
    """Quantised cost of each of ``k`` micro-batches under an additive cost: its samples'
    quantised costs plus the fixed cost (one rounding of it, shared by every micro-batch)."""
    fixed_q = int(np.rint(cost.fixed_cost() * scale))
    return np.bincount(bin_of, weights=q, minlength=k).astype(np.int64) + fixed_q


class AdditiveCost(Cost):
    """``fixed + Σ per_sample(L)`` per micro-batch (tokens, analytic FLOPs, ``a·L + L²``)."""

    additive = True

    def __init__(
        self, name: str, per_sample: Callable[[np.ndarray], np.ndarray], fixed: float = 0.0
    ) -> None:
        if not np.isfinite(fixed) or fixed < 0:
            raise ValueError(f"fixed cost per micro-batch must be finite and >= 0, got {fixed}")
        self.name = name
        self._per_sample = per_sample
        self.fixed = float(fixed)

    def sample_costs(self, lengths: np.ndarray) -> np.ndarray:
        return np.asarray(self._per_sample(np.asarray(lengths, dtype=np.int64)), dtype=np.float64)

    def microbatch_costs(self, lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        per = self.sample_costs(lengths)
        _check_values(per, self.name, lengths, np.arange(lengths.size + 1))
        return _segment_sums(per, offsets) + self.fixed


def _accepts_mode(fn: Callable) -> bool:
    # Cached by the plain function under a bound method (a method is bound anew on every
    # access, and reading a signature costs ~40 µs, five times per schedule). Other
    # callables are read each time: a cache would keep them, and what they hold, alive.
    fn = getattr(fn, "__func__", fn)
    if isinstance(fn, types.FunctionType):
        return _takes_mode_cached(fn)
    return _takes_mode(fn)


@functools.lru_cache(maxsize=256)
def _takes_mode_cached(fn: Callable) -> bool:
    return _takes_mode(fn)


def _takes_mode(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "mode" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class ModelCost(Cost):
    """A cost-model object: `costmodel.model.CostModel` or anything shaped like it."""

    def __init__(self, model: Any, mode: str = "train") -> None:
        self.model = model
        self.mode = mode
        gpu = getattr(model, "gpu", None)
        spec = getattr(model, "spec", None)
        spec_name = getattr(spec, "name", None)
        label = "/".join(str(p) for p in (gpu, spec_name) if p)
        # " at TP 4" and the like: one rank's shard, or one GPU of a split micro-batch
        label += str(getattr(model, "parallel_label", "") or "")
        self.name = f"cost model {label}" if label else f"cost model {type(model).__name__}"
        modes = getattr(model, "modes", None)
        if isinstance(modes, (list, tuple)) and mode not in modes:  # said here, not per batch
            raise ValueError(f"{self.name} has curves for {', '.join(modes)} only, not mode "
                             f"{mode!r}: schedule with mode {modes[0]!r} (--mode {modes[0]}), "
                             "or calibrate that pass too")
        batched = getattr(model, "microbatch_costs", None)
        single = getattr(model, "microbatch_cost", None)
        if batched is None and single is None:
            raise ValueError(
                f"{type(model).__name__} is not a cost model: it needs microbatch_cost(lengths) "
                "or microbatch_costs(lengths, offsets)"
            )
        self._batched = batched
        self._single = single
        self._batched_mode = batched is not None and _accepts_mode(batched)
        self._single_mode = single is not None and _accepts_mode(single)
        parts = [getattr(model, n, None) for n in ("fixed_cost", "sequence_costs", "token_costs")]
        self.separable = all(p is not None and _accepts_mode(p) for p in parts)
        if batched is None:
            logger.info(
                "%s has no vectorised microbatch_costs(lengths, offsets); evaluating one "
                "micro-batch at a time (slow at large batch sizes)",
                type(model).__name__,
            )

    def microbatch_costs(self, lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        if self._batched is not None:
            if self._batched_mode:
                return self._batched(lengths, offsets, mode=self.mode)
            return self._batched(lengths, offsets)
        single = self._single
        assert single is not None  # __init__ refuses a model with neither method
        kw = {"mode": self.mode} if self._single_mode else {}
        return np.array(
            [
                float(single(lengths[offsets[k] : offsets[k + 1]], **kw))
                for k in range(offsets.size - 1)
            ],
            dtype=np.float64,
        )

    def fixed_cost(self) -> float:
        return float(self.model.fixed_cost(mode=self.mode))

    def sequence_costs(self, lengths: np.ndarray) -> np.ndarray:
        return np.asarray(self.model.sequence_costs(lengths, mode=self.mode), dtype=np.float64)

    def token_costs(self, tokens: np.ndarray) -> np.ndarray:
        return np.asarray(self.model.token_costs(tokens, mode=self.mode), dtype=np.float64)


class CallableCost(Cost):
    """A plain function of one micro-batch's lengths. Called once per micro-batch."""

    def __init__(self, fn: Callable[[np.ndarray], float]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def microbatch_costs(self, lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        out = np.empty(offsets.size - 1, dtype=np.float64)
        for k in range(out.size):
            try:
                value = self.fn(lengths[offsets[k] : offsets[k + 1]])
                if isinstance(value, (str, bytes, bool, np.bool_)):  # float() would take them
                    raise TypeError(f"it returned {value!r:.40}, not a number")
                out[k] = float(value)
            except _INPUT_ERRORS as err:
                raise CostError(f"cost {self.name!r} failed on a micro-batch "
                                f"({type(err).__name__}: {err})") from err
        return out


def tokens_cost() -> AdditiveCost:
    return AdditiveCost("tokens", lambda lengths: lengths.astype(np.float64))


def flops_cost(spec: Any, mode: str = "train", fixed: float = 0.0) -> AdditiveCost:
    """Exact analytic FLOPs of ``spec`` per sample (× 3 for training), plus ``fixed``."""
    from costmodel.flops import pass_factor, sequence_fwd_flops
    from costmodel.spec import ModelSpec

    if spec is None:
        raise ValueError('cost="flops" needs spec= (a ModelSpec or a preset name)')
    if not isinstance(spec, ModelSpec):
        spec = ModelSpec.from_any(spec)
    scale = pass_factor(mode)

    def per_sample(lengths: np.ndarray) -> np.ndarray:
        return sequence_fwd_flops(lengths, spec) * scale

    return AdditiveCost(f"flops ({spec.name})", per_sample, fixed=fixed)


def _check_shape(model: Any, spec: Any) -> None:
    """A cost model object with a ``spec`` of another model shape is refused, as a cost model
    named by path or name is, unless it was loaded with allow_other_shape for that spec."""
    model_spec: Any = getattr(model, "spec", None)  # any object with shape_key() (duck-typed)
    if spec is None or not hasattr(model_spec, "shape_key"):
        return
    from costmodel.spec import as_spec

    spec = as_spec(spec)
    wanted = spec.shape_key()
    if wanted == model_spec.shape_key() or wanted in getattr(model, "accepted_shapes", ()):
        return
    raise ValueError(
        f"cost model for {model_spec.name!r} (shape {model_spec.fingerprint()}) given with "
        f"spec {spec.name!r} (shape {spec.fingerprint()}): give the cost model of the model being "
        f"scheduled, or load this one with load_cost_model(..., spec=spec, "
        f"allow_other_shape=True) to use its curves anyway"
    )


def builtin_hint(name: str) -> str:
    """" (did you mean 'tokens'?)" for a near miss of a built-in cost name, else "".

    A typo such as "token" is otherwise looked up as a cost model file and as a GPU name,
    and the error that says so lists every known GPU before the fix shows.
    """
    hint = did_you_mean(name, ("tokens", "flops"))
    return f" ({hint.strip()})" if hint else ""


def as_cost(cost: Any = "tokens", spec: Any = None, mode: str = "train") -> Cost:
    """Turn what a caller passed as ``cost`` into a `Cost` (see the module docstring).

    A string other than "tokens"/"flops" is loaded as a cost model (a file path or a
    shipped name such as "h200/qwen3-8b") with `costmodel.model.cached_cost_model`: once
    per file version, not on every call (training steps name it every time).
    """
    checked_mode(mode)
    if isinstance(cost, Cost):
        return cost
    if isinstance(cost, os.PathLike):  # a cost model file given as a Path
        cost = os.fspath(cost)
    if isinstance(cost, str):
        if cost == "tokens":
            return tokens_cost()
        if cost == "flops":
            return flops_cost(spec, mode)
        try:
            from costmodel.model import cached_cost_model
            from costmodel.model_file import is_unknown_name
        except ImportError as err:  # pragma: no cover - model.py ships with the package
            raise ValueError(
                f"cost {cost!r} is not 'tokens' or 'flops', and cost models cannot be "
                f"loaded here ({err})"
            ) from err
        try:
            model = cached_cost_model(cost, spec=spec)
        except (FileNotFoundError, ValueError) as err:
            if not is_unknown_name(err):
                raise  # a cost model that is there but does not load says why itself
            raise ValueError(
                f"cost {cost!r} is not 'tokens' or 'flops'{builtin_hint(cost)}, and {err}"
            ) from None
        return ModelCost(model, mode)
    if hasattr(cost, "microbatch_costs") or hasattr(cost, "microbatch_cost"):
        _check_shape(cost, spec)
        return ModelCost(cost, mode)
    if callable(cost):
        return CallableCost(cost)
    raise ValueError(
        f"cost must be 'tokens', 'flops', a cost model (path, name or object) or a callable "
        f"on a micro-batch's lengths; got {type(cost).__name__}"
    )
