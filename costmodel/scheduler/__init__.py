"""Cost-balanced, cap-safe micro-batch packing and DP assignment.

`build_schedule` packs samples into micro-batches under a token cap and spreads them over
data-parallel ranks so the slowest rank finishes as early as the cost allows;
`karmarkar_karp` is the largest-differencing partition on its own. Numpy only.
"""

from costmodel.scheduler.baselines import baseline_microbatches
from costmodel.scheduler.bounds import lower_bound
from costmodel.scheduler.costs import Cost, as_cost
from costmodel.scheduler.evaluate import evaluate_schedule
from costmodel.scheduler.lengths import generate_lengths, parse_lengths, read_lengths
from costmodel.scheduler.partition import karmarkar_karp, lpt_partition
from costmodel.scheduler.schedule import Schedule, build_schedule

__all__ = [
    "Cost",
    "Schedule",
    "as_cost",
    "baseline_microbatches",
    "build_schedule",
    "evaluate_schedule",
    "generate_lengths",
    "karmarkar_karp",
    "lower_bound",
    "lpt_partition",
    "parse_lengths",
    "read_lengths",
]
