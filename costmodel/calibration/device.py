"""The device being calibrated: is there one, what is it, and is it the one asked for.

`require_cuda()` raises RuntimeError saying what is missing (torch, a CUDA build of
torch, a visible GPU) and how to fix it. `device_fingerprint()` records what makes
timings comparable: name, SM count, compute capability, L2 size, clocks, memory, driver,
torch/triton/CUDA versions. `resolve_gpu(requested, fingerprint)` checks `--gpu` against
the device (`--gpu h100` on an H200 is an error naming what was found; `auto` takes it).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

import costmodel
from costmodel.calibration.software import flash_attn_version
from costmodel.checks import import_torch
from costmodel.gpus import GPUS, GpuInfo, find_gpu_by_device_name, gpu_keys, lookup_gpu

__all__ = ["device_fingerprint", "require_cuda", "resolve_gpu", "settle_gpu"]

logger = logging.getLogger(__name__)


def current_gpu_name(start_cuda: bool = True) -> str | None:
    """The name of the CUDA device in use, or None without torch or a GPU (never raises).
    Without ``start_cuda``, None too where this process has not started CUDA yet: asking
    would (a process that forks workers afterwards cannot use CUDA in them). That is checked
    first: ``torch.cuda.is_available()`` itself initialises the CUDA driver (``cuInit``,
    through ``cudaGetDeviceCount``), which already breaks CUDA in forked workers."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return None
    if not (start_cuda or torch.cuda.is_initialized()) or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


def require_cuda():
    """Import torch and check that a CUDA GPU is usable; return the torch module."""
    torch = import_torch("timing kernels")
    if getattr(torch.version, "cuda", None) is None:
        raise RuntimeError(
            f"timing kernels needs a CUDA GPU, and torch {torch.__version__} is a CPU-only build "
            "(torch.version.cuda is None): install a CUDA build of torch and run on a machine "
            "with an NVIDIA GPU"
        )
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise RuntimeError(
            f"timing kernels needs a CUDA GPU, and torch {torch.__version__} (CUDA "
            f"{torch.version.cuda}) sees none{hint}: check `nvidia-smi`, the driver, and "
            "CUDA_VISIBLE_DEVICES"
        )
    return torch


def _nvidia_smi(index: int) -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    fields = "driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit"
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", f"--id={index}"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    vals = [v.strip() for v in out.split(",")]
    if len(vals) != 5:
        return {}
    num = lambda v: float(v) if re.fullmatch(r"[0-9.]+", v) else None
    return {
        "driver": vals[0],
        "max_sm_clock_mhz": num(vals[1]),
        "max_mem_clock_mhz": num(vals[2]),
        "sm_clock_mhz": num(vals[3]),
        "power_limit_w": num(vals[4]),
    }


def device_fingerprint(index: int | None = None) -> dict[str, Any]:
    """What was timed: device properties and software versions (needs CUDA)."""
    torch = require_cuda()
    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    fp: dict[str, Any] = {
        "name": torch.cuda.get_device_name(index),
        "index": index,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "total_memory_bytes": int(props.total_memory),
        "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "clock_rate_khz": getattr(props, "clock_rate", None),
        "memory_clock_rate_khz": getattr(props, "memory_clock_rate", None),
        "memory_bus_width": getattr(props, "memory_bus_width", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": triton_version,
        "flash_attn": flash_attn_version(),  # timed only by --attention flash-attn
        "driver": None,
        "costmodel": costmodel.__version__,  # whose kernels and sweep were timed
    }
    fp.update({k: v for k, v in _nvidia_smi(index).items() if v is not None})
    return fp


def resolve_gpu(requested: str, fingerprint: Mapping[str, Any]) -> tuple[str, GpuInfo | None]:
    """(registry key, entry) for `--gpu requested` on the device described by `fingerprint`.

    `auto` takes the device as found (an unregistered GPU gets a key derived from its name,
    never a registry key, and no entry: the FLOPs check then has no peak). A key or name must match the device.
    A device name that is a registered name plus words (a memory-size suffix) counts as
    that GPU, with a warning.
    """
    found = str(fingerprint.get("name", ""))
    found_info = find_gpu_by_device_name(found, allow_suffix=True)
    if found_info is not None and find_gpu_by_device_name(found) is None:
        logger.warning("GPU %r is not in the registry by its exact name; taking it as %s (%s)",
                       found, found_info.key, found_info.name)
    if requested.strip().lower() == "auto":
        if found_info is not None:
            return found_info.key, found_info
        key = re.sub(r"[^a-z0-9]+", "-", found.lower().replace("nvidia", "")).strip("-") or "gpu"
        while key in GPUS:  # "NVIDIA H100" is no registered GPU, so its key is not "h100":
            key += "-unregistered"  # refit, report and profiles read a key as the registry's
        logger.warning("GPU %r is not in the registry: no peak FLOP/s to check against", found)
        return key, None
    info = lookup_gpu(requested)  # ValueError listing the known GPUs
    if found_info is None or found_info.key != info.key:
        what = f"{found!r} (registry key {found_info.key})" if found_info else f"{found!r} (not in the registry)"
        suggestion = f"--gpu {found_info.key} or --gpu auto" if found_info else "--gpu auto"
        raise ValueError(
            f"--gpu {requested} means {' / '.join(repr(n) for n in info.names)}, but this "
            f"machine's GPU is {what}; pass {suggestion}. Known GPUs: {', '.join(gpu_keys())}"
        )
    return info.key, info


def settle_gpu(seconds: float) -> float | None:
    """Run large bf16 matrix products for `seconds` on the current GPU; return their TFLOP/s.

    A GPU that was idle runs its first seconds of heavy work at boost clocks and then
    settles lower as power and temperature rise (on an H200 a sweep's drift probe read
    +11% slower at the end than at the start). Training runs at the settled clocks, so
    measurements start there. Returns None (and does nothing) for seconds <= 0.
    """
    if seconds <= 0:
        return None
    import time

    torch = require_cuda()
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            torch.mm(a, b)
        torch.cuda.synchronize()
        done += 10
    elapsed = time.perf_counter() - t0
    del a, b
    torch.cuda.empty_cache()
    tflops = done * 2 * n**3 / elapsed / 1e12
    logger.info("settled the GPU: %.1f s of bf16 matrix products at %.0f TFLOP/s", elapsed, tflops)
    return tflops
