"""`agree_on_schedule`: one check per step that every data-parallel rank holds the same
schedule.

A training script that calls `build_schedule` on every rank and runs
``schedule.microbatches[rank]`` relies on every rank building the same schedule. The
scheduler is deterministic and prices samples the same to the last bit whatever numpy's CPU
dispatch (`costmodel.portable`), but it cannot see ranks that run other costmodel code
(the version string does not change with every commit: a digest of the package's source is
compared too), another numpy or scipy, another cost model file or other lengths: their
schedules can differ, and then some samples train twice and others never, without an
error. One all-gather of a short record per step (the schedule's digest, a digest of the
lengths, the versions) finds that.

Where only the schedules differ, ``on_mismatch="adopt"`` (the default) gives every rank
the group's first rank's micro-batches (one broadcast of plain lists, rebuilt into a
`Schedule` on each rank) and logs a warning that names the ranks and what differs;
``"raise"`` (on any rank) raises RuntimeError on every rank alike. Other lengths always
raise: the ranks hold other data, which no schedule can fix.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel import __version__
from costmodel.scheduler import Schedule

__all__ = ["agree_on_schedule", "disagreement", "rank_record"]

logger = logging.getLogger(__name__)

ON_MISMATCH = ("adopt", "raise")
# What a rank sends on a mismatch: the fields of a Schedule, as plain lists and numbers
# (a pickled Schedule could fail to load on a rank with other costmodel code, after the
# broadcast, leaving the others waiting at the next collective).
_FIELDS = ("microbatches", "microbatch_costs", "microbatch_tokens", "rank_costs",
           "lower_bound", "max_tokens_per_microbatch", "cost_name")


@functools.cache
def _code_digest() -> str:
    """A digest of this costmodel's Python source (the schedule depends on all of it)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def rank_record(schedule: Schedule, lengths: ArrayLike, *, rank: int = 0,
                on_mismatch: str = "adopt") -> dict[str, Any]:
    """What one rank contributes to the check: its (global) rank and policy, digests of its
    schedule and lengths, and the versions that decide what `build_schedule` computes."""
    import scipy

    lens = np.ascontiguousarray(np.asarray(lengths), dtype=np.int64)
    return {
        "rank": rank,
        "on_mismatch": on_mismatch,
        "schedule": schedule.digest(),
        "lengths": hashlib.sha256(lens.tobytes()).hexdigest(),
        "cost": schedule.cost_name,
        "versions": {"costmodel": f"{__version__} (source {_code_digest()})",
                     "numpy": np.__version__, "scipy": scipy.__version__},
    }


def disagreement(records: list[dict[str, Any]]) -> tuple[str, str] | None:
    """None where every record matches the first one's; else ``(kind, message)``, kind
    ``"lengths"`` (the ranks hold other data) or ``"schedule"`` (only the schedules differ).
    Ranks are named by each record's ``rank``."""
    first = records[0]
    for kind in ("lengths", "schedule"):
        differ = [rec for rec in records if rec[kind] != first[kind]]
        if differ:
            break
    else:
        return None
    ranks = [rec["rank"] for rec in differ]
    if kind == "lengths":
        return kind, (f"rank(s) {ranks} hold other sample lengths than rank {first['rank']} "
                      "this step: every rank must pass the same global batch's lengths (all "
                      "samples, not its own)")
    mine = first["versions"]
    causes = [f"rank {rec['rank']} runs {name} {version} (rank {first['rank']}: "
              f"{mine.get(name, 'unknown')})"
              for rec in differ for name, version in rec["versions"].items()
              if version != mine.get(name)]
    causes += [f"rank {rec['rank']} balances {rec['cost']!r} (rank {first['rank']}: "
               f"{first['cost']!r})" for rec in differ if rec["cost"] != first["cost"]]
    why = "; ".join(causes) if causes else (
        "same code, versions and cost name: check that every rank reads the same cost model "
        "file and passes the same cap, align and group ids")
    return kind, (f"rank(s) {ranks} built another schedule than rank {first['rank']} from the "
                  f"same lengths ({why})")


def agree_on_schedule(schedule: Schedule, lengths: ArrayLike, group: Any = None, *,
                      on_mismatch: str = "adopt") -> Schedule:
    """The schedule every rank of ``group`` runs this step.

    Call it on every rank of ``group`` (default: all processes; pass the data-parallel
    group where tensor or pipeline parallel ranks do not build schedules), after
    `build_schedule`, with the lengths the schedule was built from. Returns ``schedule``
    where all ranks agree (one all-gather of a small record); see the module docstring for a
    mismatch. With NCCL, set each rank's CUDA device first (``torch.cuda.set_device``), as
    for any object collective.
    """
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {ON_MISMATCH}, got {on_mismatch!r}")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("agree_on_schedule needs torch.distributed initialised "
                           "(init_process_group) on every rank of the group")
    if dist.get_rank(group) < 0:
        raise ValueError(f"rank {dist.get_rank()} is not in the group given to "
                         "agree_on_schedule: call it on the group's ranks only")
    records: list[Any] = [None] * dist.get_world_size(group)
    mine = rank_record(schedule, lengths, rank=dist.get_rank(), on_mismatch=on_mismatch)
    dist.all_gather_object(records, mine, group=group)
    found = disagreement(records)
    if found is None:
        return schedule
    kind, message = found
    # Decided from the gathered records alone, so every rank takes the same branch.
    if kind == "lengths" or any(rec["on_mismatch"] == "raise" for rec in records):
        raise RuntimeError(message)
    first = records[0]["rank"]
    box = [{name: getattr(schedule, name) for name in _FIELDS}]
    dist.broadcast_object_list(box, src=first, group=group)
    logger.warning("%s; every rank runs the schedule of rank %d this step", message, first)
    return schedule if dist.get_rank() == first else Schedule(**box[0])
