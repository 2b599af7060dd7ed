"""Synthetic RL-like variable-length batches, and lengths files (numpy only).

The synthetic lengths are the scheduler's built-in ``"rl"`` distribution
(`costmodel.scheduler.generate_lengths`), scaled down so a CPU step stays fast.

A step's lengths depend only on ``(seed, step)`` and a sample's tokens only on
``(seed, step, index)``, so every rank draws the same lengths, builds the same schedule on
its own, and materialises only the samples it was given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costmodel.scheduler.lengths import generate_lengths

__all__ = ["LengthSource", "read_lengths_file", "sample_tokens"]


def read_lengths_file(path: str | Path) -> np.ndarray:
    """Read sequence lengths (tokens) from a file.

    Text (the scheduler's format, `costmodel.scheduler.read_lengths`): positive integers,
    one per line or comma separated; blank lines and ``#`` comment lines are skipped.
    ``.json``: a list of positive integers (or an object with a ``"lengths"`` list).
    ``.npy``: a 1-D integer array. Anything else is a ValueError naming the line (or entry).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lengths file {path} does not exist")
    if path.suffix == ".npy":
        try:
            values = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:  # not .npy, or an object array
            raise ValueError(f"{path}: not a .npy array of lengths ({err})") from None
        if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
            raise ValueError(
                f"{path}: expected a 1-D integer array of lengths, got {values.dtype} "
                f"with shape {values.shape}"
            )
        return _check_lengths(values.astype(np.int64), path)
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        if isinstance(data, dict):
            data = data.get("lengths")
        if not isinstance(data, list):
            raise ValueError(f'{path}: expected a JSON list of lengths or {{"lengths": [...]}}')
        for i, item in enumerate(data):
            if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item < 2**62:
                raise ValueError(
                    f"{path}: entry {i} is {item!r}; every length must be a positive integer"
                )
        return _check_lengths(np.asarray(data, dtype=np.int64), path)
    from costmodel.scheduler.lengths import read_lengths

    return read_lengths(path)


def _check_lengths(values: np.ndarray, path: Path) -> np.ndarray:
    if values.size == 0:
        raise ValueError(f"{path}: no lengths found; write one positive integer per line")
    if (values < 1).any():
        bad = int(np.argmax(values < 1))
        raise ValueError(f"{path}: entry {bad} is {values[bad]}; lengths must be positive")
    return values


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
