"""Record a training run's steps as the runs `costmodel correct --runs` fits a model to.

Each rank, around the forward and backward passes of its micro-batches in a step:

    from costmodel.integrations.runs import RunRecorder

    recorder = RunRecorder(f"runs.rank{rank}.jsonl")
    for step in ...:
        with recorder.step(my_microbatch_lengths):  # e.g. [[1200, 350], [4096]]
            for mb in my_microbatches:
                forward_backward(mb)
        all_reduce_gradients()  # outside: the runs are compute time, as the model predicts

then `costmodel correct calibrated.json --runs runs.rank*.jsonl -o corrected.json`.

The clock is the host's, after the device has finished its queued work on both sides
(`torch.cuda.synchronize` when torch has CUDA initialised, nothing otherwise): two
synchronisations a step, where the step's all-reduce waits anyway. A step that raises is
not recorded. Lines are appended and flushed one step at a time, so a run stopped between
steps leaves whole lines behind. Steps do not nest: each line is one step's compute time.
Where gradients are reduced during the backward (DDP's buckets, FSDP, Megatron's overlapped
grad reduce), the last micro-batch's backward waits for them: time the step with those
hooks off (DDP's `no_sync` for every micro-batch) or the runs include communication,
which the model does not price. Appending suits a resumed run; start a new file for
another model, GPU or stack.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from costmodel.calibration.runs_file import as_microbatches, run_line
from costmodel.curves import checked_mode
from costmodel.model_file import check_output_path

__all__ = ["RunRecorder"]


def _device_synchronize() -> None:
    torch = sys.modules.get("torch")  # never imported here: a CPU-only job has no need
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class RunRecorder:
    """Appends this rank's timed steps to a runs file (JSON lines)."""

    def __init__(self, path: str | os.PathLike, *, mode: str = "train",
                 synchronize: Callable[[], None] | None = None) -> None:
        self.mode = checked_mode(mode)
        self.path = check_output_path(path, "runs file")  # before the first step, not at it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.synchronize = synchronize or _device_synchronize
        self.steps = 0
        self._in_step = False

    @contextlib.contextmanager
    def step(self, microbatches: Sequence[Sequence[int]], *,
             mode: str | None = None) -> Iterator[None]:
        """Time the block as one run of `microbatches` (their sequence lengths, in the order
        they run) and append it when the block ends without an exception."""
        if self._in_step:  # the outer step's time would hold the inner one's: two lines, one time
            raise RuntimeError("RunRecorder.step inside another step of the same recorder: "
                               "steps do not nest; time each step once")
        mode = mode or self.mode
        # Copied and checked before the work: the block may consume or empty the caller's
        # lists (a loop that pops its micro-batches), and a bad length must not fail the
        # step after it ran.
        lengths = as_microbatches(microbatches)
        run_line(lengths, 1.0, mode)
        self._in_step = True
        try:
            self.synchronize()
            start = time.perf_counter()
            yield
            self.synchronize()
            ms = (time.perf_counter() - start) * 1e3
        finally:
            self._in_step = False
        line = run_line(lengths, max(ms, 1e-6), mode)  # a coarse clock's 0
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
        self.steps += 1
