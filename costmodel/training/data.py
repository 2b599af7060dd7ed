"""Synthetic RL-like variable-length batches (numpy only); lengths files are read by
`costmodel.scheduler.read_lengths`.

The synthetic lengths are the scheduler's built-in ``"rl"`` distribution
(`costmodel.scheduler.generate_lengths`), scaled down so a CPU step stays fast.

A step's lengths depend only on ``(seed, step)`` and a sample's tokens only on
``(seed, step, index)``, so every rank draws the same lengths, builds the same schedule on
its own, and materialises only the samples it was given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.scheduler.lengths import generate_lengths

__all__ = ["LengthSource", "sample_tokens"]


def sample_tokens(seed: int, step: int, index: int, length: int, vocab_size: int) -> np.ndarray:
    """The tokens of sample ``index`` of ``step``: an arithmetic sequence modulo the vocab.

    ``x_t = (start + stride * t) mod vocab`` with a random start and a stride in 1..4: easy
    to learn (two tokens fix the rule), so a few steps of a tiny model visibly lower the loss.
    """
    rng = np.random.default_rng([seed, step, index])
    start = int(rng.integers(0, vocab_size))
    stride = int(rng.integers(1, 5))
    return (start + stride * np.arange(length, dtype=np.int64)) % vocab_size


@dataclass(frozen=True, kw_only=True)
class LengthSource:
    """Where a step's lengths come from: a synthetic RL-like draw, or a lengths file.

    With a file, step ``s`` takes the ``samples_per_step`` lengths starting at
    ``s * samples_per_step``, wrapping around the file.
    """

    samples_per_step: int
    """Samples in one global step (over all DP ranks)."""
    seed: int = 0
    """Seed of the synthetic draw (the same on every rank)."""
    scale: float = 1.0
    """Multiplies every synthetic length (e.g. 1/32 for a fast CPU run); at least 1 token.
    Lengths from a file are used as they are."""
    max_len: int = 0
    """Clip lengths (synthetic or from the file) to this many tokens (0: no clip)."""
    file_lengths: tuple[int, ...] = ()
    """Lengths read from a file (empty: synthetic)."""

    def lengths(self, step: int) -> np.ndarray:
        n = self.samples_per_step
        if self.file_lengths:
            pool = np.asarray(self.file_lengths, dtype=np.int64)
            idx = (step * n + np.arange(n)) % pool.size
            out = pool[idx]
        else:
            # One seed per (seed, step), the same on every rank.
            step_seed = int(np.random.SeedSequence([self.seed, step]).generate_state(1)[0])
            out = generate_lengths(n, "rl", seed=step_seed)
            out = np.maximum(1, np.rint(out * self.scale)).astype(np.int64)
        if self.max_len > 0:
            out = np.minimum(out, self.max_len)
        return out
