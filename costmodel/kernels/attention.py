"""Causal varlen attention backends behind one signature, and their float64 reference.

Every backend is a callable ``fn(q, k, v, cu_seqlens, max_seqlen) -> out`` over packed
sequences:

- ``q``: (total_tokens, num_heads, head_dim); ``k``, ``v``: (total_tokens, num_kv_heads,
  head_dim), ``num_heads`` a multiple of ``num_kv_heads`` (grouped-query attention: query
  head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``);
- ``cu_seqlens``: int32 (n + 1,), ``0 = c_0 < c_1 < ... < c_n = total_tokens``; sequence
  ``i`` is tokens ``c_i .. c_{i+1} - 1``;
- ``max_seqlen``: a Python int, at least the longest sequence;
- attention is causal inside each sequence and never crosses sequences; the softmax scale
  is ``1 / sqrt(head_dim)``; ``out`` has q's shape and dtype.

Names: ``"triton"`` (ours, costmodel/kernels/triton_attention.py), ``"torch-varlen"``
(``torch.nn.attention.varlen.varlen_attn``), ``"sdpa"`` (per-sequence
``scaled_dot_product_attention``) and ``"flash-attn"`` (``flash_attn_varlen_func``).
``get_attention(name)`` returns the callable or raises RuntimeError saying why the backend
is unavailable here and how to get it. Every backend also takes a keyword
``check_values=True``: checking the *values* of ``cu_seqlens`` (starts at 0, strictly
increasing, ends at total_tokens, max_seqlen large enough) reads them on the host, a device
sync when they live on the GPU; timed loops that already validated their inputs pass
``check_values=False``. Shape, dtype and device checks are free and always run.

Nothing here touches CUDA or imports triton at import time.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import os
from collections.abc import Callable

import numpy as np
import torch

from costmodel.kernels import ATTENTION_BACKENDS  # the names, torch-free

__all__ = [
    "ATTENTION_BACKENDS",
    "BACKEND_DTYPES",
    "TRITON_HEAD_DIMS",
    "AttentionFn",
    "attention_reference",
    "available_attention_backends",
    "get_attention",
    "torch_varlen_gqa_mode",
    "validate_attention_inputs",
]

AttentionFn = Callable[..., torch.Tensor]

#: Head dims the Triton kernel is compiled and tuned for.
TRITON_HEAD_DIMS: tuple[int, ...] = (64, 128)

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: Input dtypes each backend's adapter accepts (what a layer checks at construction).
BACKEND_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "triton": _FLOAT_DTYPES,
    "torch-varlen": (torch.float16, torch.bfloat16),  # its flash and cuDNN kernels, both
    "sdpa": _FLOAT_DTYPES,
    "flash-attn": (torch.float16, torch.bfloat16),
}


# --------------------------------------------------------------------------- validation
def validate_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    head_dims: tuple[int, ...] | None = None,
    dtypes: tuple[torch.dtype, ...] = _FLOAT_DTYPES,
    check_values: bool = True,
) -> None:
    """Raise ValueError naming what is wrong with a packed varlen attention call.

    ``head_dims`` restricts the head dim (None: any); ``dtypes`` the allowed input dtypes.
    ``check_values`` also checks the contents of ``cu_seqlens`` (a host read).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(
                f"{name} must be 3-D (total_tokens, heads, head_dim), got shape {tuple(t.shape)}"
            )
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"cu_seqlens must be a torch.Tensor of int32 offsets, got "
                         f"{type(cu_seqlens).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in dtypes:
        raise ValueError(f"dtype {q.dtype} not supported; allowed: {[str(d) for d in dtypes]}")
    if not (q.device == k.device == v.device == cu_seqlens.device):
        raise ValueError(
            f"q, k, v, cu_seqlens must be on one device, got {q.device}, {k.device}, "
            f"{v.device}, {cu_seqlens.device}"
        )
    total, num_heads, head_dim = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[0] != total:
        raise ValueError(f"q has {total} tokens but k/v have {k.shape[0]} (self-attention packs)")
    if k.shape[2] != head_dim:
        raise ValueError(f"q head_dim {head_dim} != k/v head_dim {k.shape[2]}")
    if head_dims is not None and head_dim not in head_dims:
        raise ValueError(f"head_dim {head_dim} not supported; allowed: {list(head_dims)}")
    num_kv_heads = k.shape[1]
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
        )
    validate_cu_seqlens(cu_seqlens, max_seqlen, total, check_values=check_values)


def validate_cu_seqlens(
    cu_seqlens: torch.Tensor, max_seqlen: int, total: int, *, check_values: bool = True
) -> None:
    """Raise ValueError unless `cu_seqlens` are int32 offsets 0 < ... = `total` of non-empty
    sequences none longer than `max_seqlen`. ``check_values`` reads the offsets on the host
    (a device sync on GPU), so timed loops pass False.
    """
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        raise ValueError("cu_seqlens must be a 1-D tensor of n + 1 offsets")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens must hold at least 2 offsets (one sequence)")
    # Kernels read the offsets as a dense array: a strided view would be read as the memory
    # under it (garbage rows, or a crash), whatever its values say.
    if not cu_seqlens.is_contiguous():
        raise ValueError("cu_seqlens must be contiguous (a strided view was given): pass "
                         "cu_seqlens.contiguous()")
    if (not isinstance(max_seqlen, (int, np.integer)) or isinstance(max_seqlen, bool)
            or max_seqlen < 1):
        raise ValueError(f"max_seqlen must be a positive Python int, got {max_seqlen!r}")
    if not check_values:
        return
    offsets = cu_seqlens.tolist()
    if offsets[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {offsets[0]}")
    if offsets[-1] != total:
        raise ValueError(f"cu_seqlens must end at total_tokens={total}, got {offsets[-1]}")
    lengths = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    if min(lengths) <= 0:
        bad = next(i for i, n in enumerate(lengths) if n <= 0)
        raise ValueError(
            f"cu_seqlens must be strictly increasing (no empty sequences); "
            f"cu_seqlens[{bad}]={offsets[bad]} >= cu_seqlens[{bad + 1}]={offsets[bad + 1]}"
        )
    if max(lengths) > max_seqlen:
        raise ValueError(f"max_seqlen={max_seqlen} < longest sequence ({max(lengths)})")


# ---------------------------------------------------------------------------- reference
def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None = None,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Plain-PyTorch causal GQA varlen attention in float64 (differentiable).

    Inputs of any float dtype are promoted to float64; the result is float64. Explicit
    per-sequence softmax(QKᵀ·scale + causal mask)·V, with KV heads expanded per group.
    """
    total = q.shape[0]
    validate_cu_seqlens(cu_seqlens, total if max_seqlen is None else max_seqlen, total)
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    q64, k64, v64 = q.double(), k.double(), v.double()
    outs = []
    offsets = cu_seqlens.tolist()
    for start, end in zip(offsets[:-1], offsets[1:]):
        qs = q64[start:end].transpose(0, 1)  # (H, L, D)
        ks = k64[start:end].transpose(0, 1).repeat_interleave(group, dim=0)
        vs = v64[start:end].transpose(0, 1).repeat_interleave(group, dim=0)
        scores = qs @ ks.transpose(1, 2) * scale
        n = end - start
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        outs.append((scores.softmax(dim=-1) @ vs).transpose(0, 1))
    return torch.cat(outs, dim=0)


# ----------------------------------------------------------------------------- adapters
def _triton_attention(q, k, v, cu_seqlens, max_seqlen, *, check_values: bool = True,
                      configs: dict | None = None):
    """``configs``: per-kernel config overrides (see triton_attention.flash_attn_varlen)."""
    validate_attention_inputs(
        q, k, v, cu_seqlens, max_seqlen, head_dims=TRITON_HEAD_DIMS, check_values=check_values
    )
    from costmodel.kernels.triton_attention import flash_attn_varlen

    return flash_attn_varlen(q, k, v, cu_seqlens, int(max_seqlen), configs=configs)


def _varlen_attn_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise RuntimeError(
            f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn "
            "(added in torch 2.10); upgrade torch (pip install 'torch>=2.10') or use "
            "another backend"
        ) from exc
    return varlen_attn


@functools.cache
def _varlen_call_style() -> tuple[tuple[tuple[str, object], ...], bool]:
    """How to ask this torch's varlen_attn for causal attention, and whether it has GQA.

    Feature detection on the signature, not the version: causal is `is_causal=True` in the
    first release (2.10) and `window_size=(-1, 0)` later (a *tuple*: the function compares
    ``window_size == (-1, 0)``); `enable_gqa` exists from 2.12 on. Cached: inspect.signature
    costs ~30 us of host time per call, which a launch-bound timing loop would otherwise
    measure as attention cost. Raises RuntimeError if neither causal switch is found.
    """
    varlen_attn = _varlen_attn_fn()
    try:
        params = inspect.signature(varlen_attn).parameters
    except (TypeError, ValueError) as exc:
        raise RuntimeError(
            f"cannot inspect torch {torch.__version__} varlen_attn's signature ({exc})"
        ) from exc
    if "window_size" in params:
        causal: tuple[tuple[str, object], ...] = (("window_size", (-1, 0)),)
    elif "is_causal" in params:
        causal = (("is_causal", True),)
    else:
        raise RuntimeError(
            f"torch {torch.__version__} varlen_attn has neither `window_size` nor `is_causal`; "
            "cannot request causal attention from it; use another backend"
        )
    return causal, "enable_gqa" in params


def torch_varlen_gqa_mode() -> str:
    """"native" if this torch's varlen_attn takes `enable_gqa`, else "expanded" (the adapter
    materialises the repeated KV heads, which costs time and memory: benchmarks record it)."""
    return "native" if _varlen_call_style()[1] else "expanded"


def _torch_varlen_attention(q, k, v, cu_seqlens, max_seqlen, *, check_values: bool = True,
                            kv_as_given: bool = False):
    """``kv_as_given``: pass fewer KV heads even to a varlen_attn without `enable_gqa`
    (benchmarks check whether it computes GQA by itself, and what the expansion costs)."""
    validate_attention_inputs(q, k, v, cu_seqlens, max_seqlen, check_values=check_values)
    varlen_attn = _varlen_attn_fn()
    causal, has_gqa = _varlen_call_style()
    kwargs: dict = dict(causal)
    if k.shape[1] != q.shape[1]:
        if has_gqa:
            kwargs["enable_gqa"] = True
        elif not kv_as_given:  # torch 2.10/2.11: no GQA switch, materialise the repeated KV heads
            group = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
    max_seqlen = int(max_seqlen)
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)


@functools.cache
def _sdpa_supports_gqa() -> bool:
    try:
        return (
            "enable_gqa"
            in inspect.signature(torch.nn.functional.scaled_dot_product_attention).parameters
        )
    except (TypeError, ValueError):  # builtins without a signature: enable_gqa since 2.5
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
        return (major, minor) >= (2, 5)


def _sdpa_attention(q, k, v, cu_seqlens, max_seqlen, *, check_values: bool = True):
    validate_attention_inputs(q, k, v, cu_seqlens, max_seqlen, check_values=check_values)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    group = q.shape[1] // k.shape[1]
    kwargs: dict = {}
    if group > 1:
        if _sdpa_supports_gqa():
            kwargs["enable_gqa"] = True
        else:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
    offsets = cu_seqlens.tolist()  # one host read: the loop needs the lengths
    outs = []
    for start, end in zip(offsets[:-1], offsets[1:]):
        qs = q[start:end].transpose(0, 1).unsqueeze(0)  # (1, H, L, D)
        ks = k[start:end].transpose(0, 1).unsqueeze(0)
        vs = v[start:end].transpose(0, 1).unsqueeze(0)
        out = sdpa(qs, ks, vs, is_causal=True, **kwargs)
        outs.append(out.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


def _flash_attn_attention(q, k, v, cu_seqlens, max_seqlen, *, check_values: bool = True):
    validate_attention_inputs(
        q,
        k,
        v,
        cu_seqlens,
        max_seqlen,
        dtypes=BACKEND_DTYPES["flash-attn"],
        check_values=check_values,
    )
    from flash_attn import flash_attn_varlen_func

    max_seqlen = int(max_seqlen)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True
    )


@functools.cache
def _flash_attn_import_error() -> str | None:
    """None if `flash_attn_varlen_func` imports, else why not: an installed flash-attn built
    against another torch fails at import (undefined symbol), which must read as
    "unavailable", not crash a benchmark or test half-way."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception as exc:  # ImportError, OSError (bad .so), RuntimeError (CUDA init)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"flash-attn is installed but does not import ({type(exc).__name__}: {first}); "
            "reinstall it for this torch: pip install flash-attn --no-build-isolation"
        )
    return None


_ADAPTERS: dict[str, AttentionFn] = {
    "triton": _triton_attention,
    "torch-varlen": _torch_varlen_attention,
    "sdpa": _sdpa_attention,
    "flash-attn": _flash_attn_attention,
}


# ------------------------------------------------------------------------ availability
def _unavailable_reason(name: str, device: str | None = None) -> str | None:
    """Why backend `name` cannot run on `device` here (with how to fix it), or None if it
    can. `device` is "cuda" or "cpu"; None means this process's default (CUDA if present):
    a GPU machine that runs on its CPU still cannot use a CUDA-only backend."""
    cuda = torch.cuda.is_available()
    if device not in (None, "cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    on_cpu = device == "cpu" or not cuda
    where = "the device is cpu" if device == "cpu" and cuda else "no GPU here"
    if name == "triton":
        if importlib.util.find_spec("triton") is None:
            return "the triton package is not installed; pip install triton"
        if on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
            return (
                f"Triton kernels need a CUDA GPU ({where}); on CPU set TRITON_INTERPRET=1 "
                "before triton is imported (slow; for tests only)"
            )
        return None
    if name == "torch-varlen":
        try:
            _varlen_call_style()
        except RuntimeError as exc:
            return str(exc)
        if on_cpu:
            return f"torch varlen_attn runs only on CUDA (flash-attention kernels); {where}"
        return None
    if name == "sdpa":
        return None
    if name == "flash-attn":
        if importlib.util.find_spec("flash_attn") is None:
            return "the flash-attn package is not installed; pip install flash-attn --no-build-isolation"
        if on_cpu:
            return f"flash-attn runs only on CUDA; {where}"
        return _flash_attn_import_error()
    raise ValueError(f"unknown attention backend {name!r}; known: {list(ATTENTION_BACKENDS)}")


def available_attention_backends() -> list[str]:
    """Names of the backends that can run in this process, in ATTENTION_BACKENDS order."""
    return [name for name in ATTENTION_BACKENDS if _unavailable_reason(name) is None]


def get_attention(name: str, device: str | None = None) -> AttentionFn:
    """The backend `name` as ``fn(q, k, v, cu_seqlens, max_seqlen) -> out``.

    Raises ValueError for an unknown name (listing the known ones) and RuntimeError, with
    the reason and the fix, for a backend that cannot run here on `device` ("cuda" or
    "cpu"; None: CUDA when this machine has it).
    """
    if name not in _ADAPTERS:
        raise ValueError(f"unknown attention backend {name!r}; known: {list(ATTENTION_BACKENDS)}")
    reason = _unavailable_reason(name, device)
    if reason is not None:
        raise RuntimeError(f"attention backend {name!r} is unavailable: {reason}")
    return _ADAPTERS[name]
