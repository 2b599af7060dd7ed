"""Sample lengths: built-in RL-like distributions and a lengths-file reader.

Distributions (all seeded; `numpy.random.default_rng(seed)`, so the same seed gives the
same lengths everywhere):

- ``"rl"``: a prompt of 200–1500 tokens (uniform) plus a response drawn from a lognormal
  with median 1500 and σ = 1, clipped to [1, max_response]. The long tail is what RL
  rollouts look like: most responses are short, a few run to the length limit.
- ``"bimodal"``: 90% short (prompt 200–1500 plus a lognormal response, median 400, σ = 0.6)
  and 10% very long (a response uniform in [0.75, 1] × max_response).

``max_response`` defaults to 16384 − 1500, so that prompt + response never exceeds 16384.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import numpy as np

from costmodel.checks import MAX_DIGITS, positive_int, signed_digits
from costmodel.flops import MAX_LENGTH

__all__ = ["DISTRIBUTIONS", "generate_lengths", "read_lengths", "parse_lengths"]

DISTRIBUTIONS = ("rl", "bimodal")
DEFAULT_MAX_RESPONSE = 16384 - 1500
# Generated batches: far above any training step, far below exhausting memory.
MAX_GENERATED = 10_000_000


def generate_lengths(
    n: int, dist: str = "rl", *, seed: int = 0, max_response: int = DEFAULT_MAX_RESPONSE
) -> np.ndarray:
    """``n`` (at most `MAX_GENERATED`) sample lengths (prompt + response tokens) from a
    built-in distribution."""
    if positive_int(n, "n") > MAX_GENERATED:
        raise ValueError(f"n must be at most {MAX_GENERATED:,} (a step of an RL run has "
                         f"thousands to tens of thousands of samples), got {n!r}")
    if max_response < 1:
        raise ValueError(f"max_response must be >= 1, got {max_response}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    rng = np.random.default_rng(seed)
    prompt = rng.integers(200, 1501, size=n)
    # math.log, not np.log: the same bits on every CPU (see costmodel.portable).
    if dist == "rl":
        response = rng.lognormal(mean=math.log(1500.0), sigma=1.0, size=n)
    elif dist == "bimodal":
        short = rng.lognormal(mean=math.log(400.0), sigma=0.6, size=n)
        long_ = rng.uniform(0.75 * max_response, max_response, size=n)
        is_long = rng.random(n) < 0.10
        response = np.where(is_long, long_, short)
    else:
        raise ValueError(f"unknown length distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
    response = np.clip(np.rint(response), 1, max_response).astype(np.int64)
    return prompt.astype(np.int64) + response


# A sign is read, then checked ("-5" is below 1); "4096.0", as pandas writes whole lengths
# from a float column, is a whole number too ("4096.5" is not).
_ZERO_FRACTION = re.compile(r"(\.0*)?")


def parse_lengths(text: str, source: str = "lengths") -> np.ndarray:
    """Lengths from text: one integer per line, or separated by commas or spaces (or both).

    ``#`` starts a comment, to the end of its line; blank lines are skipped. Anything else
    that is not a positive whole number is a ValueError naming the line.
    """
    values: list[int] = []
    text = text.removeprefix("\ufeff")  # a byte-order mark from some editors
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split(",")
        for i, field in enumerate(fields):
            tokens = field.split()
            if not tokens:
                if i == len(fields) - 1 and i > 0:
                    continue  # trailing comma
                raise ValueError(f"{source}: line {lineno}: empty field in {line!r}")
            for token in tokens:
                values.append(_length(token, source, lineno))
    if not values:
        raise ValueError(f"{source}: no lengths found")
    return np.array(values, dtype=np.int64)


def _length(token: str, source: str, lineno: int) -> int:
    whole, dot, fraction = token.partition(".")
    parts = signed_digits(whole) if _ZERO_FRACTION.fullmatch(dot + fraction) else None
    if parts is None:
        raise ValueError(f"{source}: line {lineno}: {token!r} is not a whole number of tokens")
    sign, digits = parts
    if len(digits) > MAX_DIGITS:
        beyond = "below 1" if sign else "too large: beyond any context window"
        raise ValueError(f"{source}: line {lineno}: length {sign}{digits[:12]}... ({len(digits)} "
                         f"digits) is {beyond} (lengths are 1..{MAX_LENGTH:,} tokens)")
    value = int(sign + digits)
    if value < 1:
        raise ValueError(f"{source}: line {lineno}: length {value} must be >= 1")
    if value > MAX_LENGTH:
        raise ValueError(
            f"{source}: line {lineno}: length {value} is too large: beyond any context window "
            f"(at most {MAX_LENGTH:,} tokens)"
        )
    return value


def read_lengths(path: str | Path) -> np.ndarray:
    """Read a lengths file: text (see `parse_lengths`); ``.json``, a list of positive
    integers or an object with a ``"lengths"`` list; ``.npy``, a 1-D integer array. Anything
    else is a ValueError naming the file and the line or entry."""
    if not str(path).strip():  # Path("") is the current folder: "'.' is a folder" misled
        raise ValueError(f"the lengths file name is empty ({str(path)!r}); give a file of "
                         "lengths (one per line, or .json/.npy)")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p} is a folder; give a lengths file (one length per line)")
    if not p.exists():  # a pipe or /dev/stdin is read as text, as `<(...)` in a shell gives
        raise FileNotFoundError(f"lengths file not found: {p}")
    suffix = p.suffix.lower()  # LENGTHS.JSON too: read as text, it was "'[100' is not a whole number"
    if suffix == ".npy":
        return _read_npy(p)
    if suffix == ".json":
        return _read_json(p)
    try:
        text = p.read_text()
    except UnicodeDecodeError as err:
        raise ValueError(f"{p}: not a text file of lengths ({err})") from err
    return parse_lengths(text, str(p))


_NPY_MAGIC = b"\x93NUMPY"


def _read_npy(p: Path) -> np.ndarray:
    try:
        data = p.read_bytes()  # read once: a named pipe cannot be opened twice
        # numpy calls any other file "pickled data" and suggests allow_pickle: not that.
        if not data.startswith(_NPY_MAGIC):
            raise ValueError("not a .npy file")
        values = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:  # not .npy, truncated, an object array
        reason = "an array of Python objects" if "pickle" in str(err) else str(err)
        raise ValueError(f"{p}: not a .npy array of lengths ({reason}); save an integer array "
                         "with numpy.save, or give the lengths as a text file (one per line)") from None
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{p}: expected a 1-D integer array of lengths, got {values.dtype} "
                         f"with shape {values.shape}")
    if values.size and np.issubdtype(values.dtype, np.unsignedinteger) and values.max() > MAX_LENGTH:
        raise ValueError(f"{p}: a length of {int(values.max())} is too large")
    return _checked(values.astype(np.int64), p)


def _read_json(p: Path) -> np.ndarray:
    try:
        data = json.loads(p.read_text())
    except RecursionError:  # a RuntimeError: the CLI said only "maximum recursion depth exceeded"
        raise ValueError(f"{p}: JSON nested too deeply to be a list of lengths") from None
    except ValueError as err:  # bad JSON, not UTF-8, or a number past Python's digit limit
        raise ValueError(f"{p}: not valid JSON ({err})") from None
    if isinstance(data, dict):
        data = data.get("lengths")
    if not isinstance(data, list):
        raise ValueError(f'{p}: expected a JSON list of lengths or {{"lengths": [...]}}')
    for i, item in enumerate(data):
        if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= MAX_LENGTH:
            raise ValueError(f"{p}: the entry at index {i} is {item!r}; every length must be a "
                             f"positive integer up to {MAX_LENGTH}")
    return _checked(np.asarray(data, dtype=np.int64), p)


def _checked(values: np.ndarray, p: Path) -> np.ndarray:
    if values.size == 0:
        raise ValueError(f"{p}: no lengths found; write one positive integer per line")
    if (values < 1).any() or (values > MAX_LENGTH).any():
        bad = int(np.argmax((values < 1) | (values > MAX_LENGTH)))
        raise ValueError(f"{p}: the entry at index {bad} is {values[bad]}; lengths must be in "
                         f"1..{MAX_LENGTH}")
    return values
