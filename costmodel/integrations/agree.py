"""`agree_on_schedule`: one check per step that every data-parallel rank holds the same
schedule.

A training script that calls `build_schedule` on every rank and runs
``schedule.microbatches[rank]`` relies on every rank building the same schedule. The
scheduler is deterministic and prices samples the same to the last bit on any CPU
(`costmodel.portable`), but it cannot see ranks that run another costmodel, numpy or scipy
version, another cost model file or other lengths: their schedules can differ, and then
some samples train twice and others never, without an error. One all-gather of a short
record per step (the schedule's digest, a digest of the lengths, the versions) finds that.

Where only the schedules differ, ``on_mismatch="adopt"`` (the default) gives every rank
the group's first rank's schedule (one broadcast) and logs a warning that names the ranks
and the versions that differ; ``"raise"`` raises RuntimeError on every rank alike. Other
lengths always raise: the ranks hold other data, which no schedule can fix.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel import __version__
from costmodel.scheduler import Schedule

__all__ = ["agree_on_schedule", "disagreement", "rank_record"]

logger = logging.getLogger(__name__)

ON_MISMATCH = ("adopt", "raise")


def rank_record(schedule: Schedule, lengths: ArrayLike) -> dict[str, Any]:
    """What one rank contributes to the check: digests of its schedule and lengths, and the
    versions that decide what `build_schedule` computes."""
    import scipy

    lens = np.ascontiguousarray(np.asarray(lengths), dtype=np.int64)
    return {
        "schedule": schedule.digest(),
        "lengths": hashlib.sha256(lens.tobytes()).hexdigest(),
        "cost": schedule.cost_name,
        "versions": {"costmodel": __version__, "numpy": np.__version__,
                     "scipy": scipy.__version__},
    }


def disagreement(records: list[dict[str, Any]]) -> tuple[str, str] | None:
    """None where every rank's record matches the first rank's; else ``(kind, message)``,
    kind ``"lengths"`` (the ranks hold other data) or ``"schedule"`` (only the schedules
    differ). Ranks are the positions in ``records`` (ranks of the group)."""
    first = records[0]
    for kind in ("lengths", "schedule"):
        differ = [r for r, rec in enumerate(records) if rec[kind] != first[kind]]
        if differ:
            break
    else:
        return None
    if kind == "lengths":
        return kind, (f"rank(s) {differ} hold other sample lengths than rank 0 this step: every "
                      "rank must pass the same global batch's lengths (all samples, not its own)")
    causes = [f"rank {r} runs {name} {version} (rank 0: {first['versions'][name]})"
              for r in differ for name, version in records[r]["versions"].items()
              if version != first["versions"][name]]
    causes += [f"rank {r} balances {records[r]['cost']!r} (rank 0: {first['cost']!r})"
               for r in differ if records[r]["cost"] != first["cost"]]
    why = "; ".join(causes) if causes else (
        "same versions and cost name: check that every rank reads the same cost model file "
        "and passes the same cap, align and group ids")
    return kind, f"rank(s) {differ} built another schedule than rank 0 from the same lengths ({why})"


def agree_on_schedule(schedule: Schedule, lengths: ArrayLike, group: Any = None, *,
                      on_mismatch: str = "adopt") -> Schedule:
    """The schedule every rank of ``group`` (default: all processes) runs this step.

    Call it on every rank of the group, after `build_schedule`, with the lengths the
    schedule was built from. Returns ``schedule`` where all ranks agree (one all-gather of a
    small record); see the module docstring for a mismatch. With NCCL, set each rank's CUDA
    device first (``torch.cuda.set_device``), as for any object collective.
    """
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, got {on_mismatch!r}")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("agree_on_schedule needs torch.distributed initialised "
                           "(init_process_group) on every rank of the group")
    records: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(records, rank_record(schedule, lengths), group=group)
    found = disagreement(records)
    if found is None:
        return schedule
    kind, message = found
    if kind == "lengths" or on_mismatch == "raise":
        raise RuntimeError(message)
    first = 0 if group is None else dist.get_global_rank(group, 0)
    box = [schedule]
    dist.broadcast_object_list(box, src=first, group=group)
    logger.warning("%s; every rank runs the schedule of global rank %d this step", message, first)
    return box[0]
