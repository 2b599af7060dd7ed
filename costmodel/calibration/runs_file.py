"""The runs file: measured runs of a model, which `costmodel correct --runs` fits a
correction to (`costmodel.calibration.correct`) and `costmodel.integrations.runs.RunRecorder`
writes from a training loop.

Runs file (JSON lines, one measured run each; blank lines and `#` comments skipped):

    {"mode": "train", "microbatches": [[1200, 350], [4096]], "ms": 812.5}

`ms` is the time of the whole model running those micro-batches one after another (a
rank's compute time in a step); `mode` is "train" (forward+backward, the default) or
"forward".

A module of its own, apart from the fit: a training process that records runs imports this
alone, without scipy's optimize and stats (~1 s to import, measured on the dev machine).
"""

from __future__ import annotations

import codecs
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from costmodel.curves import checked_mode
from costmodel.flops import as_lengths

__all__ = ["Run", "as_microbatches", "read_runs", "run_line"]


@dataclass(frozen=True)
class Run:
    """One measured run: micro-batches run one after another, and their total time."""

    microbatches: tuple[tuple[int, ...], ...]
    ms: float
    mode: str = "train"
    layers: int | None = None
    """None: the whole model (every layer, the head, the micro-batch overhead). A number:
    that many identical layers and the head, as `validate` times a stack."""
    moe: bool = False
    """For a stack: its layers are the MoE layer."""
    head: bool = True
    """For a stack: it ends with the LM head (`bench-schedule` times layers alone)."""

    def __post_init__(self) -> None:
        checked_mode(self.mode)
        try:  # an int past float's range (10**400 in a JSON line) overflows: not a time
            ms = float(self.ms) if isinstance(self.ms, (int, float)) else math.nan
        except OverflowError:
            ms = math.inf
        if isinstance(self.ms, bool) or not (math.isfinite(ms) and ms > 0):
            raise ValueError(f"ms must be a positive number of milliseconds, got {self.ms!r:.40}")
        object.__setattr__(self, "ms", ms)  # frozen; a float, as the field says
        if not self.microbatches or not all(self.microbatches):
            raise ValueError("a run needs at least one micro-batch, each of one sequence or more")


def run_line(microbatches: Sequence[Sequence[int]], ms: float, mode: str = "train") -> str:
    """One measured run as a line of a runs file (what `read_runs` reads back)."""
    # checked here, as `read_runs` checks a line: a bad run fails where it is written
    run = Run(microbatches=as_microbatches(microbatches), ms=ms, mode=mode)
    return json.dumps({"mode": run.mode, "microbatches": [list(mb) for mb in run.microbatches],
                       "ms": run.ms})


def read_runs(path: str | os.PathLike) -> list[Run]:
    """Whole-model runs from a JSON-lines file (the module docstring's format); ValueError
    naming the line of anything else."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory; give the runs file (JSON lines) in it")
    if not os.path.exists(path):  # not "[Errno 2] No such file or directory: 'runs.jsonl'"
        glob = any(c in str(path) for c in "*?[")
        raise FileNotFoundError(f"runs file not found: {path}" + (
            " (a shell pattern that matched no file)" if glob else ""))
    runs = []
    # Bytes, decoded line by line: a text-mode read decodes 8 KiB ahead, so a byte that is
    # not UTF-8 raised while an earlier line was read, and named no line.
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                text = raw.removeprefix(codecs.BOM_UTF8 if number == 1 else b"").decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path} line {number}: not UTF-8 text (byte "
                                 f"{err.object[err.start]:#04x} at column {err.start + 1}); "
                                 "the runs file is JSON lines") from None
            text = text.strip()
            if not text or text.startswith("#"):
                continue
            try:
                runs.append(_run_from_line(json.loads(text)))
            except RecursionError:
                raise ValueError(f"{path} line {number}: JSON nested too deeply to be a "
                                 "run") from None
            except (ValueError, TypeError, OverflowError) as err:
                raise ValueError(f"{path} line {number}: {err}; each line must be like "
                                 '{"mode": "train", "microbatches": [[1200, 350], [4096]], '
                                 '"ms": 812.5}') from None
    if not runs:
        raise ValueError(f"{path} holds no runs")
    return runs


def _run_from_line(doc: Any) -> Run:
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object: {doc!r:.60}")
    unknown = sorted(set(doc) - {"mode", "microbatches", "ms"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    mbs = doc.get("microbatches")
    if not isinstance(mbs, list) or not all(isinstance(mb, list) for mb in mbs):
        raise ValueError("'microbatches' must be a list of lists of sequence lengths")
    ms = doc.get("ms")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise ValueError(f"'ms' must be a number, got {ms!r:.40}")
    return Run(microbatches=as_microbatches(mbs), ms=ms, mode=doc.get("mode", "train"))


def as_microbatches(mbs: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Micro-batches' sequence lengths as tuples of ints; ValueError for a length that is
    not a whole number in 1..MAX_LENGTH."""
    return tuple(tuple(int(x) for x in as_lengths(mb, "a micro-batch's lengths")) for mb in mbs)
