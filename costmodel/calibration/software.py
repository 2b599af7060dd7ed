"""Whether this process runs the software a cost model was timed under.

A cost model is a measurement of kernels, and a kernel's speed belongs to the software that
built it as much as to the GPU: torch ships its own attention and GEMM dispatch, the CUDA
toolkit its cuBLAS, triton its code generation, flash-attn its kernels. A minor release of
any of them can retune a kernel (a patch release rarely does), so versions are compared at
major.minor, and only those whose kernels the cost model timed: triton's for the ``triton``
attention backend, flash-attn's for ``flash-attn``. A difference is a reason to check the
file (`costmodel validate`), not an error: the schedule stays within the cap either way.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["calibrate_again", "drift_note", "flash_attn_version", "model_drift", "running_software",
           "software_drift"]

# (fingerprint key, the name shown, the attention backend it matters for; None: always)
_VERSIONED = (
    ("torch", "torch", None),
    ("cuda", "CUDA", None),
    ("triton", "triton", "triton"),
    ("flash_attn", "flash-attn", "flash-attn"),
)


def _installed(module: str) -> str | None:
    """The version of the package that provides ``module``, or None: the module's own
    ``__version__`` where it is imported already (what `device_fingerprint` records), else
    its distribution's metadata (no import: importing flash-attn loads its CUDA extension).
    A distribution's name need not be its module's: torch's nightlies install triton as
    ``pytorch-triton`` (``pytorch-triton-rocm`` on ROCm)."""
    version = getattr(sys.modules.get(module), "__version__", None)
    if version:
        return str(version)
    try:
        names = list(importlib.metadata.packages_distributions().get(module) or [])
    except Exception:  # an unreadable installation: the module's own name still works
        names = []
    for name in [*names, module.replace("_", "-")]:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def flash_attn_version() -> str | None:
    """The installed flash-attn's version, or None."""
    return _installed("flash_attn")


def running_software() -> dict[str, str | None]:
    """This process's versions under the fingerprint's keys (None where absent). Imports torch
    if it is installed (CUDA's version is torch's build's); never raises."""
    return dict(_running_software())


@functools.cache  # the slime drop-in asks every step; a process's versions stay put
def _running_software() -> dict[str, str | None]:
    found: dict[str, str | None] = {"torch": None, "cuda": None, "triton": _installed("triton"),
                                    "flash_attn": flash_attn_version()}
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return found
    found["torch"] = str(torch.__version__)
    cuda = getattr(torch.version, "cuda", None)
    found["cuda"] = str(cuda) if cuda else None
    return found


def _major_minor(version: Any) -> str | None:
    """"2.11" from "2.11.0+cu130"; None for a missing or unreadable version."""
    match = re.match(r"\s*(\d+)\.(\d+)", str(version)) if version else None
    return f"{match.group(1)}.{match.group(2)}" if match else None


def software_drift(recorded: Mapping[str, Any] | None, running: Mapping[str, Any],
                   attention: str | None) -> list[str]:
    """What differs at major.minor between the versions a cost model recorded (its device
    fingerprint) and ``running`` (`running_software`), e.g. ``["torch 2.11 -> 2.13"]``.
    Versions the file does not record (an estimate, an older file) or this process lacks
    are not compared; triton's and flash-attn's only for their attention backend."""
    if not recorded:
        return []
    drift = []
    for key, shown, backend in _VERSIONED:
        if backend is not None and backend != attention:
            continue
        then, now = _major_minor(recorded.get(key)), _major_minor(running.get(key))
        if then and now and then != now:
            drift.append(f"{shown} {then} -> {now}")
    return drift


def drift_note(model: Any) -> str | None:
    """Why ``model``'s (a `CostModel`) times may be stale in this process, as the rest of a
    sentence that starts with the file's name, or None: other torch, CUDA or kernel versions
    than it was timed under (`software_drift`)."""
    drift = model_drift(model)
    if not drift:
        return None
    return (f"was timed under other software than this process runs ({', '.join(drift)}): "
            "kernel times may have moved; on the GPU, `costmodel validate FILE --no-save` "
            f"measures by how much, and `{calibrate_again(model)}` times them again")


def model_drift(model: Any) -> list[str]:
    """`software_drift` between ``model``'s recorded versions and this process's."""
    extra = getattr(model, "extra", None) or {}
    attention = (extra.get("kernels") or {}).get("attention")
    return software_drift(extra.get("device"), running_software(), attention)


def calibrate_again(model: Any) -> str:
    """The `costmodel calibrate` command that times ``model``'s kernels again on the GPU in
    use: its model (a preset's name, else its config.json), attention backend, dtype, the
    passes, longest length and pack size its sweep planned, eager timing where it chose
    that, and its tensor-parallel shard."""
    from costmodel.spec import model_flag

    spec = model.spec
    kernels = (getattr(model, "extra", None) or {}).get("kernels") or {}
    words = ["costmodel calibrate --gpu auto --model", model_flag(spec),
             "--attention", str(kernels.get("attention") or "torch-varlen")]
    if kernels.get("dtype"):
        words += ["--dtype", str(kernels["dtype"])]
    plan = (getattr(model, "provenance", None) or {}).get("plan") or {}
    if plan.get("modes"):
        words += ["--modes", ",".join(str(m) for m in plan["modes"])]
    if plan.get("max_len"):
        words += ["--max-len", str(plan["max_len"])]
        # calibrate's own default pack size (`plan.make_plan`): only another one is a choice
        if plan.get("max_tokens") and plan["max_tokens"] != max(int(plan["max_len"]), 16384):
            words += ["--max-tokens", str(plan["max_tokens"])]
    if kernels.get("timing") == "eager":  # a file without the key predates the choice
        words += ["--timing", "eager"]
    tp = int(getattr(model, "tensor_parallel", 1) or 1)
    etp = int(getattr(model, "expert_tensor_parallel", tp) or tp)
    if tp > 1:
        words += ["--tensor-parallel", str(tp)]
    if spec.num_moe_layers and etp != tp:
        words += ["--expert-tensor-parallel", str(etp)]
    return " ".join([*words, "-o calibrated.json"])
