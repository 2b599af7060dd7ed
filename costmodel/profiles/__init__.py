"""Shipped cost models: `costmodel/profiles/<gpu key>/<model preset>.json` (one GPU's whole
layer), `<model preset>-tp<N>.json` for one rank's shard at tensor parallelism N
(`-tp<N>-etp<M>` where a MoE model's experts split M ways instead).

Measured profiles carry their provenance (device, versions, command, validation). Load
them by name with `costmodel.model.load_cost_model("h200/qwen3-8b")`; a name with no file
here falls back to the registry estimate (labelled as such).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PROFILES_DIR", "profile_for_shape", "profile_path", "shipped_profiles"]

PROFILES_DIR = Path(__file__).resolve().parent


def profile_path(gpu_key: str, model: str) -> Path | None:
    """The shipped file for this GPU key and model preset, or None when there is none."""
    path = PROFILES_DIR / gpu_key.lower() / f"{model.lower()}.json"
    return path if path.is_file() else None


def shipped_profiles() -> list[str]:
    """Names ("h200/qwen3-8b") of every shipped measured profile."""
    return sorted(
        f"{p.parent.name}/{p.stem}" for p in PROFILES_DIR.glob("*/*.json") if p.is_file()
    )


def profile_for_shape(gpu_key: str, shape_key: str) -> Path | None:
    """The shipped file for this GPU key whose model has this shape (`ModelSpec.shape_key`),
    or None: a model given as a config.json under another name still gets the measured
    profile of its shape. Only profiles of the whole layer (tensor parallelism 1) count: a
    shard's is taken by its name."""
    from costmodel.spec import ModelSpec

    for path in sorted((PROFILES_DIR / gpu_key.lower()).glob("*.json")):
        try:
            with path.open(encoding="utf-8") as f:
                doc = json.load(f)
            stored = ModelSpec.from_dict(doc["spec"]).shape_key()
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            continue  # a broken file is reported when it is loaded by name, not here
        tp = doc.get("tensor_parallel", 1)
        if stored == shape_key and tp == doc.get("expert_tensor_parallel", tp) == 1:
            return path
    return None
