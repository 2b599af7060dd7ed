"""costmodel: measured GPU cost models for variable-length LLM training micro-batches,
and a scheduler that balances predicted time across data-parallel ranks.

Importing this package needs numpy and scipy only; torch and triton load lazily.
"""

from costmodel.estimate import estimate_cost_model
from costmodel.flops import (
    calculate_fwd_flops,
    calculate_train_flops,
    flops_breakdown,
    sequence_fwd_flops,
)
from costmodel.model import CostModel, load_cost_model
from costmodel.scheduler import Schedule, build_schedule, karmarkar_karp
from costmodel.spec import ModelSpec, preset_names

__version__ = "0.1.0"

__all__ = [
    "CostModel",
    "Schedule",
    "build_schedule",
    "karmarkar_karp",
    "ModelSpec",
    "estimate_cost_model",
    "load_cost_model",
    "calculate_fwd_flops",
    "calculate_train_flops",
    "flops_breakdown",
    "preset_names",
    "sequence_fwd_flops",
]
