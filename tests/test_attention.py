"""Varlen causal GQA attention: the Triton kernel and the adapters against a float64 reference.

Without CUDA the Triton kernels run under TRITON_INTERPRET=1 (set below before the kernel
module is imported) at tiny shapes: fp32 and fp16 (the interpreter's tl.dot mishandles
bf16 operands in triton 3.9, so bf16 is checked on the GPU only). With CUDA the same checks
run compiled, plus bf16 at training shapes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    # tests/conftest.py sets it before triton is first imported; Triton reads it only then.
    raise RuntimeError("no GPU, and TRITON_INTERPRET=1 is not set (run under pytest's conftest)")

pytest.importorskip("triton")
from costmodel.kernels import attention as attn  # noqa: E402
from costmodel.kernels import triton_attention as ta  # noqa: E402
from costmodel.kernels import triton_attention_configs as tac  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (runs on the H200)")

# Small blocks so that tiny lengths still cross several blocks: off-band + on-band stages
# in the forward, masked + unmasked stages in both backward kernels.
SMALL_BLOCKS = {
    "fwd": dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1),
    "dkdv": dict(BLOCK_M=16, BLOCK_N=32, MASK_BLOCK_M=16, num_warps=4, num_stages=1),
    "dq": dict(BLOCK_M=32, BLOCK_N=16, MASK_BLOCK_N=16, num_warps=4, num_stages=1),
}
# The backward variant whose dk/dv kernel also accumulates dq (fp32 atomics, no dq kernel).
FUSED_DQ = {**SMALL_BLOCKS, "dkdv": {**SMALL_BLOCKS["dkdv"], "FUSE_DQ": 1}}
# A dk/dv program per query head (per-query-head fp32 dk/dv, summed over the GQA group),
# alone and with the fused dq.
SPLIT_GROUP = {**SMALL_BLOCKS, "dkdv": {**SMALL_BLOCKS["dkdv"], "SPLIT_GROUP": 1}}
SPLIT_FUSED = {**SMALL_BLOCKS, "dkdv": {**SMALL_BLOCKS["dkdv"], "SPLIT_GROUP": 1, "FUSE_DQ": 1}}
# One pack: a length-1 sequence, lengths that are not multiples of any block, an exact
# multiple (16, 64) and one spanning several 32-blocks; 99 tokens in all.
LENGTHS = [1, 37, 16, 45]


def _cu(lengths: list[int], device=DEVICE) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def _inputs(lengths, num_heads, num_kv_heads, head_dim, dtype, seed, device=DEVICE):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    total = sum(lengths)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    q = rand(total, num_heads, head_dim).requires_grad_()
    k = rand(total, num_kv_heads, head_dim).requires_grad_()
    v = rand(total, num_kv_heads, head_dim).requires_grad_()
    do = rand(total, num_heads, head_dim)
    return q, k, v, do


def _reference(q, k, v, do, cu):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = attn.attention_reference(q64, k64, v64, cu)
    out.backward(do.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got = got.double()
    assert torch.isfinite(got).all(), "non-finite values (an unwritten, NaN-poisoned row?)"
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


@pytest.fixture
def poisoned():
    """Every buffer the Triton launchers allocate starts NaN: unwritten rows fail."""
    with ta.nan_filled_outputs():
        yield


def _run_triton(q, k, v, do, cu, max_seqlen, configs=None):
    q.grad = k.grad = v.grad = None
    out = ta.flash_attn_varlen(q, k, v, cu, max_seqlen, configs=configs)
    out.backward(do)
    return out.detach(), q.grad, k.grad, v.grad


def _check(got, want, tol):
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert g.shape == w.shape, name
        err = _rel_err(g, w)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol:.0e}"


# ------------------------------------------------------------------ Triton, small shapes
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (4, 1), (8, 1)])
@pytest.mark.parametrize("blocks", ["small", "default", "fused-dq", "split-group", "split-fused"])
def test_triton_matches_reference_fp32(poisoned, head_dim, num_heads, num_kv_heads, blocks):
    variants = {"small": SMALL_BLOCKS, "default": None, "fused-dq": FUSED_DQ,
                "split-group": SPLIT_GROUP, "split-fused": SPLIT_FUSED}
    configs = variants[blocks]
    seed = head_dim * 100 + num_heads * 10 + list(variants).index(blocks)
    q, k, v, do = _inputs(LENGTHS, num_heads, num_kv_heads, head_dim, torch.float32, seed)
    cu = _cu(LENGTHS)
    got = _run_triton(q, k, v, do, cu, max(LENGTHS), configs)
    # TF32 tensor cores on GPU; exact fp32 in the interpreter.
    _check(got, _reference(q, k, v, do, cu), 1e-2 if CUDA else 1e-5)


@pytest.mark.parametrize("switch", ["FUSE_DQ", "SPLIT_GROUP"])
def test_a_tuned_first_choice_with_a_backward_switch_can_be_adopted(poisoned, monkeypatch, switch):
    """The GPU session's tuning may pick a FUSE_DQ or SPLIT_GROUP dk/dv config, to go first
    in CONFIGS as it is (a FUSE_DQ one was passed to the kernel twice, a TypeError, and
    never got its fp32 dq buffer): the first choice's switch decides the buffers and grid,
    for its fallbacks too. Fused: no dq kernel runs; split: a dk/dv program per query head."""
    first = [dict(SMALL_BLOCKS["dkdv"], **{switch: 1}), dict(SMALL_BLOCKS["dkdv"])]
    monkeypatch.setitem(tac.CONFIGS["dkdv"], 64, first)
    monkeypatch.setattr(tac, "_chosen", {})
    q, k, v, do = _inputs(LENGTHS, 8, 2, 64, torch.float32, seed=7)
    cu = _cu(LENGTHS)
    dq_launches, dkdv_grids = [], []
    kernel = ta.attn_bwd_dkdv

    class Recording:
        def __getitem__(self, grid):
            dkdv_grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(ta, "attn_bwd_dkdv", Recording())
    if switch == "FUSE_DQ":
        monkeypatch.setattr(ta, "attn_bwd_dq", _Refuse(dq_launches))
    got = _run_triton(q, k, v, do, cu, max(LENGTHS))
    _check(got, _reference(q, k, v, do, cu), 1e-2 if CUDA else 1e-5)
    assert not dq_launches
    assert dkdv_grids[0][1] == (8 if switch == "SPLIT_GROUP" else 2)  # query or K/V heads


@pytest.mark.parametrize(("first", "fallback"), [
    ({"SPLIT_GROUP": 1}, {}), ({}, {"SPLIT_GROUP": 1}), ({"SPLIT_GROUP": 1, "FUSE_DQ": 1}, {})])
def test_a_dkdv_fallback_runs_and_reports_the_first_choices_switches(poisoned, monkeypatch,
                                                                      first, fallback):
    """Buffers and grid are set before `launch` finds which config fits, so a fallback
    runs with the first choice's FUSE_DQ/SPLIT_GROUP, and chosen_configs (the benchmark's
    record of what ran) says so: it gave the fallback's own switches."""
    from triton.runtime.errors import OutOfResources

    base = dict(BLOCK_M=16, BLOCK_N=64, MASK_BLOCK_M=16, num_warps=4, num_stages=1)
    configs = [dict(base, **first), dict(base, BLOCK_N=32, **fallback)]
    monkeypatch.setitem(tac.CONFIGS["dkdv"], 64, configs)
    monkeypatch.setattr(tac, "_chosen", {})
    kernel, grids = ta.attn_bwd_dkdv, []

    class TooBigFirst:  # the first choice "does not fit"
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if kwargs["BLOCK_N"] == 64:
                    raise OutOfResources(300_000, 232_448, "shared memory")
                grids.append(grid)
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(ta, "attn_bwd_dkdv", TooBigFirst())
    q, k, v, do = _inputs(LENGTHS, 8, 2, 64, torch.float32, seed=23)
    cu = _cu(LENGTHS)
    got = _run_triton(q, k, v, do, cu, max(LENGTHS))
    _check(got, _reference(q, k, v, do, cu), 1e-2 if CUDA else 1e-5)
    assert grids[0][1] == (8 if first.get("SPLIT_GROUP") else 2)  # query or K/V heads
    ran = [c for key, c in ta.chosen_configs().items() if key.startswith("dkdv/d64/")]
    assert ran == [dict(base, BLOCK_N=32, **first)]


class _Refuse:
    """A stand-in kernel that records being launched."""

    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(grid)

        return launch


def test_blocks_under_16_are_refused_before_a_gpu_build_fails():
    q, k, v, _ = _inputs([9], 2, 2, 64, torch.float32, seed=0)
    with pytest.raises(ValueError, match="'BLOCK_N' must be at least 16"):
        ta.flash_attn_varlen(q, k, v, _cu([9]), 9, configs={"dq": dict(SMALL_BLOCKS["dq"], BLOCK_N=8)})


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("configs", [SMALL_BLOCKS, FUSED_DQ, SPLIT_GROUP],
                         ids=["split", "fused-dq", "split-group"])
def test_triton_fp16_small(poisoned, head_dim, configs):
    lengths = [5, 1, 50, 33]
    q, k, v, do = _inputs(lengths, 8, 2, head_dim, torch.float16, seed=7 + head_dim)
    cu = _cu(lengths)
    got = _run_triton(q, k, v, do, cu, max(lengths), configs)
    _check(got, _reference(q, k, v, do, cu), 5e-3)


def test_triton_single_token_sequences(poisoned):
    lengths = [1, 1, 1]
    q, k, v, do = _inputs(lengths, 4, 2, 64, torch.float32, seed=3)
    cu = _cu(lengths)
    out, dq, dk, dv = _run_triton(q, k, v, do, cu, 1)
    ref_out, _, _, ref_dv = _reference(q, k, v, do, cu)
    _check((out, dv), (ref_out, ref_dv), 1e-2 if CUDA else 1e-5)
    # one key per query: the output is v itself and dq, dk vanish (up to rounding)
    torch.testing.assert_close(out, v.detach().repeat_interleave(2, dim=1))
    for grad in (dq, dk):
        assert torch.isfinite(grad).all() and grad.abs().max() < 1e-5


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN arithmetic, on purpose
def test_triton_sequences_are_isolated(poisoned):
    """NaNs in one sequence's q/k/v/do must not reach another's outputs or gradients.

    A kernel reading one key or query past its sequence's end (a missing load mask) would
    turn 0·NaN into NaN even where the score is masked.
    """
    lengths = [37, 16, 45]
    q, k, v, do = _inputs(lengths, 4, 2, 64, torch.float32, seed=11)
    cu = _cu(lengths)
    mid = slice(37, 53)
    with torch.no_grad():
        for t in (q, k, v):
            t[mid] = float("nan")
    do[mid] = float("nan")
    out, dq, dk, dv = _run_triton(q, k, v, do, cu, max(lengths), SMALL_BLOCKS)
    keep = torch.ones(sum(lengths), dtype=torch.bool, device=q.device)
    keep[mid] = False
    for t in (out, dq, dk, dv):
        assert torch.isfinite(t[keep]).all()
    sub = [0, 37, 82]  # the two clean sequences alone
    cu2 = torch.tensor(sub, dtype=torch.int32, device=q.device)
    want = _reference(*(t.detach()[keep] for t in (q, k, v, do)), cu2)
    _check([t[keep] for t in (out, dq, dk, dv)], want, 1e-2 if CUDA else 1e-5)


def test_triton_strided_views(poisoned):
    """q, k, v as views into one fused qkv projection (token stride != heads·head_dim)."""
    lengths = [20, 3, 31]
    total, h, hkv, d = sum(lengths), 4, 2, 64
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(total, (h + 2 * hkv) * d, generator=gen).to(DEVICE).requires_grad_()
    q = qkv[:, : h * d].view(total, h, d)
    k = qkv[:, h * d : (h + hkv) * d].view(total, hkv, d)
    v = qkv[:, (h + hkv) * d :].view(total, hkv, d)
    do = torch.randn(total, h, d, generator=gen).to(DEVICE)
    cu = _cu(lengths)
    out = ta.flash_attn_varlen(q, k, v, cu, max(lengths), configs=SMALL_BLOCKS)
    (grad,) = torch.autograd.grad(out, qkv, do)
    q64 = qkv.detach().double().requires_grad_()
    ref = attn.attention_reference(
        q64[:, : h * d].view(total, h, d),
        q64[:, h * d : (h + hkv) * d].view(total, hkv, d),
        q64[:, (h + hkv) * d :].view(total, hkv, d),
        cu,
    )
    (grad_ref,) = torch.autograd.grad(ref, q64, do.double())
    tol = 1e-2 if CUDA else 1e-5
    assert _rel_err(out.detach(), ref.detach()) < tol
    assert _rel_err(grad, grad_ref) < tol


def test_triton_adapter_validates_and_runs(poisoned):
    fn = attn.get_attention("triton")
    q, k, v, _ = _inputs([9, 4], 4, 1, 64, torch.float32, seed=2)
    cu = _cu([9, 4])
    out = fn(q, k, v, cu, 9)
    assert _rel_err(out.detach(), attn.attention_reference(q, k, v, cu)) < (1e-2 if CUDA else 1e-5)
    with pytest.raises(ValueError, match="head_dim 96"):
        fn(*(t[..., :48].repeat(1, 1, 2) for t in (q, k, v)), cu, 9)


def test_kernel_configs_are_consistent():
    for head_dim in attn.TRITON_HEAD_DIMS:
        for kernel, configs in ta.kernel_configs(head_dim).items():
            for cfg in configs:
                tac.check_config(kernel, cfg)
    with pytest.raises(ValueError, match="head_dim 96"):
        ta.kernel_configs(96)


def test_too_many_sequences_is_a_clear_error():
    n = 65536
    cu = torch.arange(n + 1, dtype=torch.int32)
    q = torch.zeros(n, 1, 64)
    with pytest.raises(ValueError, match="65536 sequences.*65535"):
        ta.flash_attn_varlen(q, q, q, cu, 1)


# ---------------------------------------------------------------------------- adapters
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (8, 2)])
def test_sdpa_adapter_matches_reference(num_heads, num_kv_heads):
    fn = attn.get_attention("sdpa")
    q, k, v, do = _inputs(LENGTHS, num_heads, num_kv_heads, 64, torch.float32, seed=13)
    cu = _cu(LENGTHS)
    out = fn(q, k, v, cu, max(LENGTHS))
    out.backward(do)
    got = (out.detach(), q.grad, k.grad, v.grad)
    _check(got, _reference(q, k, v, do, cu), 1e-2 if CUDA else 1e-5)


def test_reference_matches_dense_formula():
    """The reference itself, against softmax(QKᵀ/√d + causal)V written out for one sequence."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 1, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out = attn.attention_reference(q, k, v, torch.tensor([0, 6], dtype=torch.int32))
    scores = (q[:, 0] @ k[:, 0].T) / math.sqrt(8)
    scores = scores + torch.full((6, 6), float("-inf"), dtype=torch.float64).triu(1)
    torch.testing.assert_close(out[:, 0], scores.softmax(-1) @ v[:, 0])


def test_backend_names_and_availability():
    available = attn.available_attention_backends()
    assert "sdpa" in available
    assert "triton" in available  # compiled on GPU, interpreted on CPU (set above)
    assert set(available) <= set(attn.ATTENTION_BACKENDS)
    with pytest.raises(ValueError, match="known:.*torch-varlen"):
        attn.get_attention("flashinfer")


@pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is not None, reason="flash-attn installed"
)
def test_missing_flash_attn_says_how_to_install():
    with pytest.raises(RuntimeError, match="pip install flash-attn"):
        attn.get_attention("flash-attn")


@pytest.mark.skipif(CUDA, reason="checks the CPU-only message")
def test_torch_varlen_without_gpu_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="torch-varlen"):
        attn.get_attention("torch-varlen")


def test_a_cpu_device_on_a_gpu_machine_refuses_cuda_only_backends(monkeypatch):
    """get_attention(name, "cpu") answers for the CPU even where CUDA is present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attn, "_varlen_call_style", lambda: "is_causal")  # as if installed
    monkeypatch.setattr(attn, "_flash_attn_import_error", lambda: None)
    monkeypatch.setattr(attn.importlib.util, "find_spec", lambda name: object())
    assert attn.get_attention("torch-varlen", "cuda") is attn._ADAPTERS["torch-varlen"]
    with pytest.raises(RuntimeError, match="runs only on CUDA.*the device is cpu"):
        attn.get_attention("torch-varlen", "cpu")
    with pytest.raises(RuntimeError, match="flash-attn runs only on CUDA; the device is cpu"):
        attn.get_attention("flash-attn", "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # unset on GPU machines
    with pytest.raises(RuntimeError, match="need a CUDA GPU .the device is cpu.*TRITON_INTERPRET=1"):
        attn.get_attention("triton", "cpu")
    assert attn.get_attention("triton", "cuda") is attn._ADAPTERS["triton"]
    assert attn.get_attention("sdpa", "cpu") is attn._ADAPTERS["sdpa"]
    with pytest.raises(ValueError, match="device must be 'cuda' or 'cpu'"):
        attn.get_attention("sdpa", "tpu")


# -------------------------------------------------------------------------- validation
def _valid(device="cpu"):
    q = torch.randn(10, 4, 64, device=device)
    k = torch.randn(10, 2, 64, device=device)
    return q, k, k.clone(), torch.tensor([0, 3, 10], dtype=torch.int32, device=device), 7


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (
            lambda a: {**a, "cu": torch.tensor([0, 3, 3, 10], dtype=torch.int32)},
            "strictly increasing",
        ),
        (
            lambda a: {**a, "cu": torch.tensor([0, 7, 3, 10], dtype=torch.int32)},
            "strictly increasing",
        ),
        (lambda a: {**a, "cu": torch.tensor([1, 3, 10], dtype=torch.int32)}, "start at 0"),
        (
            lambda a: {**a, "cu": torch.tensor([0, 3, 9], dtype=torch.int32)},
            "end at total_tokens=10",
        ),
        (lambda a: {**a, "cu": torch.tensor([0, 3, 10], dtype=torch.int64)}, "int32"),
        (lambda a: {**a, "max_seqlen": 5}, "max_seqlen=5"),
        (lambda a: {**a, "k": a["k"].half(), "v": a["v"].half()}, "share a dtype"),
        (
            lambda a: {**a, "q": a["q"].double(), "k": a["k"].double(), "v": a["v"].double()},
            "dtype",
        ),
        (
            lambda a: {**a, "k": a["k"][:, :1].repeat(1, 3, 1), "v": a["v"][:, :1].repeat(1, 3, 1)},
            "multiple of num_kv_heads",
        ),
        (lambda a: {**a, "k": a["k"][:9], "v": a["v"][:9]}, "tokens"),
        (lambda a: {**a, "k": a["k"][..., :32], "v": a["v"][..., :32]}, "head_dim"),
        (lambda a: {**a, "q": a["q"][0]}, "3-D"),
    ],
)
@pytest.mark.parametrize("backend", ["sdpa", "triton"])
def test_bad_inputs_raise_value_error(backend, mutate, match):
    q, k, v, cu, max_seqlen = _valid()
    a = mutate({"q": q, "k": k, "v": v, "cu": cu, "max_seqlen": max_seqlen})
    if CUDA:
        a = {n: t.cuda() if isinstance(t, torch.Tensor) else t for n, t in a.items()}
    with pytest.raises(ValueError, match=match):
        attn.get_attention(backend)(a["q"], a["k"], a["v"], a["cu"], a["max_seqlen"])


def test_triton_rejects_unsupported_head_dim():
    q = torch.randn(10, 4, 96, device=DEVICE)
    cu = torch.tensor([0, 10], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"head_dim 96 not supported; allowed: \[64, 128\]"):
        attn.get_attention("triton")(q, q, q, cu, 10)


# ------------------------------------------------------------------- GPU, training shapes
GPU_LENGTHS = [1, 127, 1000, 2048, 4133, 63]


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(32, 8, 128), (16, 16, 128), (16, 2, 64)]
)
def test_gpu_triton_bf16_training_shapes(poisoned, num_heads, num_kv_heads, head_dim):
    q, k, v, do = _inputs(GPU_LENGTHS, num_heads, num_kv_heads, head_dim, torch.bfloat16, seed=1)
    cu = _cu(GPU_LENGTHS)
    want = _reference(q, k, v, do, cu)
    _check(_run_triton(q, k, v, do, cu, max(GPU_LENGTHS)), want, 1e-2)
    first = ta.kernel_configs(head_dim)["dkdv"][0]
    # the tuning's other backward paths
    for switches in ({"FUSE_DQ": 1}, {"SPLIT_GROUP": 1}, {"SPLIT_GROUP": 1, "FUSE_DQ": 1}):
        configs = {"dkdv": {**first, **switches}}
        _check(_run_triton(q, k, v, do, cu, max(GPU_LENGTHS), configs), want, 1e-2)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("backend", attn.ATTENTION_BACKENDS)
def test_gpu_every_adapter_bf16(backend):
    if backend not in attn.available_attention_backends():
        pytest.skip(f"{backend} unavailable here")
    q, k, v, do = _inputs(GPU_LENGTHS, 32, 8, 128, torch.bfloat16, seed=2)
    cu = _cu(GPU_LENGTHS)
    out = attn.get_attention(backend)(q, k, v, cu, max(GPU_LENGTHS))
    out.backward(do)
    _check((out.detach(), q.grad, k.grad, v.grad), _reference(q, k, v, do, cu), 1e-2)


# --------------------------------------------------------------------------- benchmark
def test_bench_flops_convention(load_benchmark):
    bench = load_benchmark("bench_attention")
    lengths = [4096] * 8
    fwd = 8 * (4096 * 4097 // 2) * 4 * 128 * 32  # pairs × 4·d FLOPs × heads
    assert bench.attention_flops(lengths, 32, 8, 128, "fwd") == fwd
    assert bench.attention_flops(lengths, 32, 8, 128, "fwd+bwd") == 3.5 * fwd


@pytest.mark.skipif(CUDA, reason="checks the no-GPU exit")
@pytest.mark.parametrize("flags", [["--quick"], ["--tune-first", "--quick"], ["--tune"]])
def test_bench_without_gpu_exits_2(capsys, load_benchmark, flags):
    assert load_benchmark("bench_attention").main(flags) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_bench_table_shows_speedup_and_missing_baselines(load_benchmark):
    bench = load_benchmark("bench_attention")
    rows = [
        {"L": 4096, "num_seqs": 8, "backend": b, "mode": "fwd", "ms": ms, "tflops": 1.0}
        for b, ms in (("torch-varlen", 2.0), ("triton", 1.6))
    ]
    table = bench._table({"rows": rows, "unavailable": {"flash-attn": "not installed"}})
    assert "1.25x" in table
    assert "flash-attn: not measured: not installed" in table


def _fake_gpu_table(bench, monkeypatch, interrupt_above: int):
    """bench_attention's table on a pretend GPU: each length times one row, and the step's
    timeout (SIGINT) arrives past ``interrupt_above``."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "_provenance", lambda argv: {"gpu": "fake", "torch": "-",
                                                            "triton": "-", "date": "-"})

    def time_length(rows, errors, args, backends, length, device, do_bench):
        if length > interrupt_above:
            raise KeyboardInterrupt
        rows.append({"L": length, "num_seqs": 1, "backend": "torch-varlen", "mode": "fwd",
                     "ms": 1.0, "tflops": 1.0})

    monkeypatch.setattr(bench, "_time_length", time_length)


def test_an_interrupted_table_keeps_the_rows_timed(load_benchmark, monkeypatch):
    """A review found: the step's timeout during the table lost every row timed."""
    bench = load_benchmark("bench_attention")
    _fake_gpu_table(bench, monkeypatch, interrupt_above=1024)
    args = bench._parse(["--lengths", "512", "1024", "2048", "--backends", "torch-varlen"])
    result = bench.run(args, [])
    assert result["interrupted"] and [r["L"] for r in result["rows"]] == [512, 1024]


def test_first_choices_that_fail_to_build_still_leave_the_table(load_benchmark, monkeypatch,
                                                                tmp_path):
    """A review found: a compile error of the first-choice configs (a triton
    CompilationError, no RuntimeError) escaped main(), and nothing was written."""
    bench = load_benchmark("bench_attention")
    _fake_gpu_table(bench, monkeypatch, interrupt_above=10**9)

    class CompilationError(Exception):
        pass

    def broken(*args):
        raise CompilationError("at 12:4: unsupported")

    monkeypatch.setattr(bench, "_gate_inputs", broken)
    out = tmp_path / "bench.json"
    flags = ["--tune-first", "--quick", "--lengths", "512", "--backends", "torch-varlen",
             "--json", str(out)]
    assert bench.main(flags) == 0
    result = json.loads(out.read_text())
    assert result["tune_error"] == "CompilationError: at 12:4: unsupported"
    assert [r["L"] for r in result["rows"]] == [512] and "interrupted" not in result
    # --tune alone: the tuning is the whole result, so its failure is the exit code's
    assert bench.main(["--tune", "--quick", "--json", str(out)]) == 1
    assert json.loads(out.read_text())["tune_error"].startswith("CompilationError")


def test_tuning_keeps_the_fastest_backward(load_benchmark):
    bench = load_benchmark("bench_attention")
    split, fused, dq = (32, 64, 8, 2), (32, 64, 8, 2, 1), (64, 64, 4, 2)
    rows = [
        {"L": 8192, "kernel": "dkdv", "config": split, "ms": 10.0},
        {"L": 8192, "kernel": "dkdv", "config": fused, "ms": 8.0},
        {"L": 8192, "kernel": "dkdv", "config": (16, 128, 8, 2), "error": "OutOfResources"},
        {"L": 8192, "kernel": "dq", "config": dq, "ms": 9.0},
    ]
    best = bench.choose_best(rows)
    assert best["dkdv"]["FUSE_DQ"] == 1  # the fused dk/dv alone beats the others
    rows.append({"L": 8192, "kernel": "dkdv+dq", "config": [list(split), list(dq)], "ms": 7.5})
    best = bench.choose_best(rows)
    assert "FUSE_DQ" not in best["dkdv"] and best["dq"]["BLOCK_M"] == 64  # the tuned pair wins


def test_tune_candidates_are_valid_configs(load_benchmark):
    bench = load_benchmark("bench_attention")
    for kernel, by_dim in bench.TUNE_CANDIDATES.items():
        for cands in by_dim.values():
            for cand in cands:
                tac.check_config(kernel, bench._config(kernel, cand))
    assert bench._config("dkdv", (64, 128, 8, 1, 0, 32))["MASK_BLOCK_M"] == 32
    assert bench._config("dq", (64, 64, 4, 2))["MASK_BLOCK_N"] == 16


def test_tuning_error_of_a_nan_result_is_infinite(load_benchmark):
    bench = load_benchmark("bench_attention")
    want = torch.ones(4)
    assert bench._rel_err(torch.full((4,), 1.001), want) == pytest.approx(1e-3, rel=1e-3)
    assert bench._rel_err(torch.tensor([1.0, float("nan"), 1.0, 1.0]), want) == math.inf


def test_aot_report_reads_wgmma_widths(load_benchmark):
    ttgir = (
        "#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 2], "
        "instrShape = [16, 16, 16]}>\n"
        "#mma1 = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 1], "
        "instrShape = [16, 128, 16]}>\n"
        "#mma2 = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [8, 1], "
        "instrShape = [16, 8]}>\n"
    )
    shapes = load_benchmark("bench_attention")._dot_shapes(ttgir)
    assert shapes == {"wgmma_n": [16, 128], "mma_v2": True}


@pytest.mark.parametrize(
    "cand", [(64, 128, 8, 1, 0, 64), (32, 128, 8, 1, 0, 32), (64, 128, 8, 1, 1, 64)],
    ids=["64x128", "32x128", "64x128-fused-dq"],
)
def test_wide_backward_candidates_match_reference(poisoned, load_benchmark, cand):
    """The tuning candidates' widest tiles and diagonal steps, across several blocks: 300
    tokens cross three 128-row K/V blocks and the 64-row query steps (d=128, GQA 4)."""
    bench = load_benchmark("bench_attention")
    lengths = [1, 300, 64, 129]
    q, k, v, do = _inputs(lengths, 4, 1, 128, torch.float32, seed=sum(cand))
    cu = _cu(lengths)
    configs = {"dkdv": bench._config("dkdv", cand), "dq": bench._config("dq", (128, 64, 8, 2, 0, 64))}
    got = _run_triton(q, k, v, do, cu, max(lengths), configs)
    _check(got, _reference(q, k, v, do, cu), 1e-2 if CUDA else 1e-5)


def test_tutorial_shaped_dq_candidate_matches_reference(poisoned, load_benchmark):
    """The 128 x 32 dq tile (the Triton tutorial's backward shape) across several blocks."""
    bench = load_benchmark("bench_attention")
    lengths = [1, 300, 64, 129]
    q, k, v, do = _inputs(lengths, 4, 1, 128, torch.float32, seed=7)
    cu = _cu(lengths)
    configs = {"dq": bench._config("dq", (128, 32, 8, 3, 0, 32))}
    got = _run_triton(q, k, v, do, cu, max(lengths), configs)
    _check(got, _reference(q, k, v, do, cu), 1e-2 if CUDA else 1e-5)


# ---------------------------------------------------------- found by a bad-input sweep
def test_strided_cu_seqlens_is_refused_or_made_dense():
    """A strided cu_seqlens view passed validation (values read through the strides) and the
    kernel read the memory under it: rows of 1e37 and NaN, or an abort."""
    q, k, v, _ = _inputs([5, 1, 9], 2, 1, 64, torch.float32, seed=4)
    cu = torch.tensor([0, 0, 5, 5, 6, 6, 15], dtype=torch.int32, device=DEVICE)[::2]
    for backend in ("triton", "sdpa"):
        with pytest.raises(ValueError, match="cu_seqlens must be contiguous"):
            attn.get_attention(backend)(q, k, v, cu, 9)
    out = ta.flash_attn_varlen(q, k, v, cu, 9)  # the kernel entry point makes it dense
    assert _rel_err(out.detach(), attn.attention_reference(q, k, v, cu.contiguous())) < 1e-2


def test_future_keys_never_leak_into_the_causal_softmax():
    """The mask was an additive -1e6: a future score above 1e6 won the max (out[0] = -5,
    not 1), and a NaN future key made every earlier row NaN."""
    q, k, v = (torch.zeros(2, 1, 64, device=DEVICE) for _ in range(3))
    q[0, 0, 0] = k[1, 0, 0] = 3000.0
    v[0], v[1] = 1.0, -5.0
    cu = _cu([2])
    assert ta.flash_attn_varlen(q, k, v, cu, 2)[0, 0, 0].item() == pytest.approx(1.0)
    q, k, v, _ = _inputs([40], 2, 1, 64, torch.float32, seed=6)
    k = k.detach().clone()
    k[35] = float("nan")
    with torch.no_grad():
        out = ta.flash_attn_varlen(q, k, v, _cu([40]), 40, configs=SMALL_BLOCKS)
    assert torch.isfinite(out[:35]).all() and not torch.isfinite(out[35:]).all()


def test_double_backward_is_refused_not_silently_zero():
    """With create_graph=True the returned dq had no graph: a gradient penalty on it was
    silently dropped (45% off against float64). Now the gradient itself is served (a
    caller may need the graph for something else) and differentiating it raises."""
    q, k, v, _ = _inputs([9], 2, 1, 64, torch.float32, seed=8)
    out = ta.flash_attn_varlen(q, k, v, _cu([9]), 9)
    (plain,) = torch.autograd.grad(out.sum(), q, retain_graph=True)
    (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    torch.testing.assert_close(dq.detach(), plain)
    with pytest.raises(RuntimeError, match="triton attention: double backward"):
        (dq**2).sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="triton attention: double backward"):
        torch.autograd.grad((dq**2).sum(), (q, k))


@pytest.mark.parametrize(("call", "says"), [
    (lambda q, k, v, cu: attn.get_attention("sdpa")(q, k, v, [0, 9], 9), "cu_seqlens must be a"),
    (lambda q, k, v, cu: attn.get_attention("sdpa")(q, k, v, cu, None), "max_seqlen must be"),
    (lambda q, k, v, cu: attn.get_attention("sdpa")(q, k, v, cu, float("inf")), "max_seqlen"),
    (lambda q, k, v, cu: attn.attention_reference(q, k, v, cu[:2] * 0 + cu[1] - 1), "start at 0"),
    (lambda q, k, v, cu: attn.attention_reference(q, k, v, cu - 1), "start at 0"),
])
def test_unclear_errors_became_value_errors(call, says):
    q, k, v, _ = _inputs([9], 2, 1, 64, torch.float32, seed=9)
    with pytest.raises(ValueError, match=says):
        call(q, k, v, _cu([9]))


@pytest.mark.parametrize(("configs", "says"), [
    ({"fwd": dict(BLOCK_M=32)}, "fwd config is missing 'BLOCK_N'"),
    ({"fwd": dict(BLOCK_M=0, BLOCK_N=16)}, "fwd config key 'BLOCK_M' must be an int power of 2"),
    ({"fwd": dict(BLOCK_M=48, BLOCK_N=16)}, "fwd config key 'BLOCK_M' must be an int power of 2"),
    ({"fwd": dict(BLOCK_M=32, BLOCK_N=16.0)}, "fwd config key 'BLOCK_N' must be an int power of 2"),
    ({"fw": dict(BLOCK_M=32, BLOCK_N=16)}, "unknown kernel 'fw'"),
    ({"fwd": dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16)}, "fwd config has an unknown key 'BLOCK_K'"),
    ({"dq": dict(SMALL_BLOCKS["dq"], FUSE_DQ=1)}, "dq config has an unknown key 'FUSE_DQ'"),
    ({"dkdv": dict(SMALL_BLOCKS["dkdv"], FUSE_DQ=2)}, "dkdv config key 'FUSE_DQ' must be 0 or 1"),
    ({"dkdv": dict(SMALL_BLOCKS["dkdv"], SPLIT_GROUP=-1)}, "'SPLIT_GROUP' must be 0 or 1"),
    ({"dq": dict(SMALL_BLOCKS["dq"], SPLIT_GROUP=1)}, "dq config has an unknown key 'SPLIT_GROUP'"),
    ({"dkdv": dict(SMALL_BLOCKS["dkdv"], num_warps=3)}, "dkdv config key 'num_warps'"),
    ({"dq": dict(SMALL_BLOCKS["dq"], num_stages=0)}, "dq config key 'num_stages'"),
    ({"dq": [32, 16, 16]}, "dq config must be a dict"),
])
def test_config_overrides_are_checked_before_any_launch(configs, says):
    """A missing key was KeyError 'BLOCK_N', BLOCK_M=0 a ZeroDivisionError, a block of 48
    an InterpreterError from tl.arange, an unknown kernel name or key silently ignored; a
    bad backward override surfaced only at backward. Each is a ValueError at the call now."""
    q, k, v, _ = _inputs([9], 2, 1, 64, torch.float32, seed=10)
    with pytest.raises(ValueError, match=says):
        ta.flash_attn_varlen(q, k, v, _cu([9]), 9, configs=configs)


def test_tuning_gate_pack_shares_the_timed_packs_compile(load_benchmark):
    """Triton specialises integer arguments on divisibility by 16: the gate pack's token
    count divisible as the timed pack's (32k) is, each candidate compiles once, not twice;
    its lengths still end mid-block."""
    bench = load_benchmark("bench_attention")
    assert sum(bench.GATE_LENGTHS) % 16 == 0
    assert all(L % 16 for L in bench.GATE_LENGTHS) and 1 in bench.GATE_LENGTHS


@pytest.fixture
def tune_first(load_benchmark, monkeypatch, tmp_path):
    """bench_attention set up to run `--tune-first` at a tiny length on CPU (the
    interpreter, a fake timer whose later calls are "faster"): (module, argv, json path,
    the list each timing appends to)."""
    import triton.testing

    bench = load_benchmark("bench_attention")
    monkeypatch.setattr(bench, "TUNE_LENGTHS", {"quick": [150], "full": [150]})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "_provenance", lambda argv: dict.fromkeys(
        ("gpu", "torch", "triton", "date"), "fake"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    def packed(L, total, h, hkv, d, device):
        q, k, v, do = _inputs([L, 40], h, hkv, d, torch.float32, seed=L)
        return [L, 40], _cu([L, 40]), q, k, v, do

    monkeypatch.setattr(bench, "_packed", packed)
    monkeypatch.setattr(bench, "_TUNE_DEVICE", "cpu")
    monkeypatch.setattr(bench, "GATE_LENGTHS", [1, 37, 16, 45])
    timed: list[int] = []

    def fake_do_bench(fn, warmup, rep, return_mode):
        fn()
        timed.append(1)
        return 10.0 - 0.01 * len(timed)  # later candidates "faster"

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    out = tmp_path / "bench_attention.json"
    # The --tune-first command as the GPU session runs it: tuning, then the table and JSON.
    argv = ["--quick", "--tune-first", "--lengths", "150", "--num-heads", "4", "--num-kv-heads",
            "1", "--backends", "triton", "sdpa", "--json", str(out)]
    return bench, argv, out, timed


@pytest.mark.slow
def test_tuning_runs_every_backward_candidate_and_checks_it(tune_first):
    """`--tune-first` end to end: every backward candidate computes the first choices'
    results, so none is refused as wrong, and the fastest of the fake times wins. A crash
    here would cost a GPU session its tuning step."""
    bench, argv, out, _ = tune_first
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    rows = doc["tune_rows"]
    assert not [r for r in rows if "error" in r], [r["error"] for r in rows if "error" in r]
    cands = bench.TUNE_CANDIDATES
    assert len(rows) == len(cands["dkdv"][128]) + len(cands["dq"][128]) + 1  # + the pair
    assert all(r["rel_err"] < 1e-5 and r["gate_row_err"] < 1e-4 for r in rows)
    assert doc["gate_row_err_first_choice"] < 1e-4
    assert set(doc["tuned_configs"]) <= {"dkdv", "dq"} and "dkdv" in doc["tuned_configs"]
    assert {(r["backend"], r["mode"]) for r in doc["rows"]} == {
        (b, m) for b in ("triton", "sdpa") for m in ("fwd", "fwd+bwd")}


@pytest.mark.slow
def test_tuning_cut_short_keeps_what_it_timed_and_refuses_a_wrong_candidate(tune_first,
                                                                           monkeypatch):
    """A step timeout (SIGINT) during the table keeps the tuning in the JSON, one during
    the tuning keeps the candidates timed so far; a candidate that leaves a row unwritten
    is refused, whatever its time. (Two candidates per kernel: this is about the cuts; the
    test above runs them all. Apart from it, so that the two run in parallel.)"""
    import triton.testing

    bench, argv, out, timed = tune_first
    argv[argv.index("--num-heads") + 1] = "2"  # half the interpreter's work; GQA group 2
    few = {kernel: {d: cands[:2] for d, cands in by_dim.items()}
           for kernel, by_dim in bench.TUNE_CANDIDATES.items()}
    monkeypatch.setattr(bench, "TUNE_CANDIDATES", few)
    fake_do_bench = triton.testing.do_bench

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "run", interrupted)
    assert bench.main(argv) == 0
    cut = json.loads(out.read_text())
    assert cut["interrupted"] and cut["tuned_configs"] and not cut["rows"]
    assert len(cut["tune_rows"]) == 2 + 2 + 1  # dkdv, dq and the pair

    # ... and during the tuning itself: the candidates timed so far, no table.
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("no table after a cut"))
    timed.clear()

    def cut_at_third(fn, warmup, rep, return_mode):
        if len(timed) == 2:
            raise KeyboardInterrupt
        return fake_do_bench(fn, warmup, rep, return_mode)

    monkeypatch.setattr(triton.testing, "do_bench", cut_at_third)
    assert bench.main(argv) == 0
    cut = json.loads(out.read_text())
    assert cut["interrupted"] and len(cut["tune_rows"]) == 2 and cut["tuned_configs"]

    # A candidate that leaves a row unwritten is refused by the varlen gate, whatever its
    # time (the training-shape pack has only full blocks).
    real = ta.flash_attn_varlen
    bad = bench._config("dq", bench.TUNE_CANDIDATES["dq"][128][1])

    def skips_a_row(q, k, v, cu, max_seqlen, configs=None):
        out = real(q, k, v, cu, max_seqlen, configs=configs)
        if configs == {"dq": bad}:
            out = out * (torch.arange(out.shape[0]) != 1).to(out.dtype)[:, None, None]
        return out

    monkeypatch.setattr(ta, "flash_attn_varlen", skips_a_row)
    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    tuning = bench.tune(bench._parse(argv), argv, ("dq",))
    (refused,) = [r for r in tuning["tune_rows"] if "error" in r]
    assert refused["config"] == bench.TUNE_CANDIDATES["dq"][128][1]
    assert "row error 1.0e+00 against float64 on a varlen pack" in refused["error"]


def test_launch_limits_cover_head_strides_and_the_outputs():
    """In-kernel offsets are int32: a head-major view (head stride tokens × dim) and the
    dense outputs' token stride are checked too, not only the inputs' token strides."""
    def meta(shape, stride):
        return torch.empty_strided(shape, stride, device="meta")

    t, h, d = 1 << 20, 32, 128
    head_major = meta((t, h, d), (d, t * d, 1))
    kv = meta((t, 8, d), (8 * d, d, 1))
    with pytest.raises(ValueError, match="32 heads × q head stride 134217728 .*token-major"):
        ta._check_launch_limits(head_major, kv, kv, 1, 4096)
    q = meta((t, h, d), (h * d, d, 1))
    narrow = meta((t, h, d), (d, d, 1))  # an odd input view whose own strides fit
    ta._check_launch_limits(q, kv, kv, 1, 4096)
    with pytest.raises(ValueError, match="the output token stride 4096"):
        ta._check_launch_limits(narrow, kv, kv, 1, 600_000)


def test_every_shipped_config_is_valid_and_names_its_warps_and_stages():
    """Launching takes num_warps and num_stages from each shipped config (an override may
    leave them to the defaults, 4 and 2): every entry of CONFIGS states both."""
    for kernel, by_dim in tac.CONFIGS.items():
        for head_dim, configs in by_dim.items():
            for cfg in configs:
                tac.check_config(kernel, cfg)
                assert {"num_warps", "num_stages"} <= set(cfg), (kernel, head_dim, cfg)


@pytest.mark.parametrize("gqa_aware", [True, False])
def test_varlen_given_kv_heads_as_they_are_is_timed_only_where_it_matches(load_benchmark, gqa_aware):
    """On a torch without enable_gqa the benchmark asks whether varlen_attn handles fewer KV
    heads by itself (then its rows show what the adapter's expansion costs) and stops at
    the first length where it does not. Here a CPU stand-in for varlen_attn, GQA-aware or
    pairing heads the wrong way."""
    import argparse

    bench = load_benchmark("bench_attention")

    def varlen(q, k, v, cu, L, *, check_values=True, kv_as_given=False):
        group = q.shape[1] // k.shape[1]
        if kv_as_given and not gqa_aware:  # KV heads tiled, not repeated: wrong pairing
            k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)
        return attn.attention_reference(q, k, v, cu).to(q.dtype)

    args = argparse.Namespace(num_heads=4, num_kv_heads=2, head_dim=16, lengths=[40, 96],
                              total_tokens=200, modes=["fwd", "fwd+bwd"], warmup=1, rep=1)
    rows, errors = [], []
    check = bench._kv_as_given(args, varlen, "cpu", rows, errors, lambda *a, **k: 1.0)
    assert not errors
    if gqa_aware:
        assert check["same_as_expanded"] is True and check["max_rel_err"] < 1e-2
        assert {(r["L"], r["mode"]) for r in rows} == {(L, m) for L in (40, 96) for m in args.modes}
        assert {r["backend"] for r in rows} == {bench.KV_AS_GIVEN}
    else:
        assert check["same_as_expanded"] is False and check["L"] == 40 and not rows


def test_a_backward_that_fails_keeps_the_forwards_row(load_benchmark):
    """Rows are kept as each mode is timed: an out-of-memory backward (or a tuned backward
    config that does not build) lost the forward's row too, and its ratio with it."""
    import argparse

    bench = load_benchmark("bench_attention")

    def forward_only(q, k, v, cu, L, *, check_values=True):
        if torch.is_grad_enabled():
            raise RuntimeError("CUDA out of memory (backward)")
        return q

    args = argparse.Namespace(num_heads=2, num_kv_heads=1, head_dim=16, modes=["fwd", "fwd+bwd"],
                              warmup=1, rep=1)
    q = torch.zeros(8, 2, 16)
    rows = []
    with pytest.raises(RuntimeError, match="backward"):
        bench._time_modes(rows, args, "triton", forward_only, (q, q[:, :1], q[:, :1], None, 8),
                          None, [8], lambda step, **kw: step() or 1.0)
    assert [r["mode"] for r in rows] == ["fwd"]


# -- from a mutation check: each test fails when the code it names is broken ---------------


def _qkv():
    import torch

    q = torch.randn(10, 4, 64)
    k = torch.randn(10, 2, 64)
    return q, k, k.clone(), torch.tensor([0, 3, 10], dtype=torch.int32)


def test_v_of_another_dtype_is_a_value_error():
    """q, k and v must share a dtype: here only v differs."""
    import torch

    from costmodel.kernels import attention as attn

    q, k, v, cu = _qkv()
    for backend in ("sdpa", "triton"):
        with pytest.raises(ValueError, match="share a dtype"):
            attn.get_attention(backend)(q, k, v.to(torch.float16), cu, 7)


def test_max_seqlen_one_short_is_a_value_error():
    """the longest sequence is 7 tokens; max_seqlen 6 is refused."""
    from costmodel.kernels import attention as attn

    q, k, v, cu = _qkv()
    with pytest.raises(ValueError, match="max_seqlen=6 < longest sequence .7."):
        attn.get_attention("sdpa")(q, k, v, cu, 6)


# -- from a second mutation check (adapters without their GPU, validation corners) ----------


def test_misshapen_inputs_are_value_errors_naming_the_problem():
    """Each check of validate_attention_inputs, where the call would otherwise go on: sdpa
    takes a v of another head dim (a silently different output), zero KV heads was a
    ZeroDivisionError, a one-offset cu_seqlens "min() arg is an empty sequence", max_seqlen
    True read as 1, and cu_seqlens on another device reached the host read."""
    q, k, v, cu = _qkv()
    sdpa = attn.get_attention("sdpa")
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        sdpa(q, k, v[..., :32], cu, 7)
    with pytest.raises(ValueError, match="positive multiple of num_kv_heads"):
        sdpa(q, k[:, :0], v[:, :0], cu, 7)
    with pytest.raises(ValueError, match="at least 2 offsets"):
        sdpa(q[:0], k[:0], v[:0], cu[:1], 7)
    with pytest.raises(ValueError, match="max_seqlen must be a positive Python int"):
        sdpa(q, k, v, cu, True)
    with pytest.raises(ValueError, match="must be on one device"):
        sdpa(q, k, v, cu.to("meta"), 7)


def test_sdpa_without_enable_gqa_repeats_each_kv_head_for_its_group():
    """On a torch whose sdpa lacks enable_gqa the adapter expands KV heads itself: query head
    h reads KV head h // group (repeat_interleave), not h % num_kv_heads (repeat)."""
    from unittest import mock

    q, k, v, do = _inputs(LENGTHS, 8, 2, 64, torch.float32, seed=14)
    cu = _cu(LENGTHS)
    with mock.patch.object(attn, "_sdpa_supports_gqa", lambda: False):
        out = attn.get_attention("sdpa")(q, k, v, cu, max(LENGTHS))
    out.backward(do)
    _check((out.detach(), q.grad, k.grad, v.grad), _reference(q, k, v, do, cu),
           1e-2 if CUDA else 1e-5)


def _fake_varlen(new_style: bool):
    """A CPU stand-in for torch's varlen_attn with the signature of torch >= 2.12 (causal as
    window_size=(-1, 0), a tuple; enable_gqa) or of 2.10 (is_causal, no GQA)."""
    calls = []

    if new_style:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None,
                        window_size=(-1, -1), enable_gqa=False):
            assert window_size == (-1, 0), f"not causal: window_size={window_size!r}"
            assert enable_gqa == (key.shape[1] != query.shape[1])
            calls.append(key.shape[1])
            return attn.attention_reference(query, key, value, cu_seq_q, max_q).to(query.dtype)
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False):
            assert is_causal is True
            calls.append(key.shape[1])
            return attn.attention_reference(query, key, value, cu_seq_q, max_q).to(query.dtype)
    return varlen_attn, calls


@pytest.mark.parametrize("new_style", [True, False], ids=["window_size+gqa", "is_causal"])
def test_torch_varlen_adapter_asks_for_causal_gqa_as_its_torch_can(monkeypatch, new_style):
    """The adapter reads varlen_attn's signature: causal as window_size=(-1, 0) (a tuple:
    torch compares it with ==) or is_causal=True; enable_gqa where it exists, else the KV
    heads expanded per group (kv_as_given passes them as they are)."""
    fake, calls = _fake_varlen(new_style)
    monkeypatch.setattr(attn, "_varlen_attn_fn", lambda: fake)
    attn._varlen_call_style.cache_clear()
    try:
        assert attn.torch_varlen_gqa_mode() == ("native" if new_style else "expanded")
        q, k, v, _ = _inputs(LENGTHS, 8, 2, 64, torch.float32, seed=15)
        cu = _cu(LENGTHS)
        out = attn._torch_varlen_attention(q, k, v, cu, max(LENGTHS))
        assert _rel_err(out.detach(), attn.attention_reference(q, k, v, cu)) < 1e-5
        attn._torch_varlen_attention(q, k, v, cu, max(LENGTHS), kv_as_given=True)
        assert calls == ([2, 2] if new_style else [8, 2])  # KV heads varlen_attn was given
    finally:
        attn._varlen_call_style.cache_clear()


def test_flash_attn_adapter_asks_for_causal_and_takes_half_precision_only(monkeypatch):
    """flash_attn_varlen_func is non-causal by default: the adapter must pass causal=True.
    Its kernels take fp16/bf16 only, refused up front for fp32. (A stand-in module.)"""
    import sys
    import types

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0,
                               softmax_scale=None, causal=False):
        assert causal is True and max_q == max_k == 9
        return attn.attention_reference(q, k, v, cu_q, max_q).to(q.dtype)

    monkeypatch.setitem(sys.modules, "flash_attn",
                        types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func))
    q, k, v, _ = _inputs([9, 4], 4, 2, 64, torch.float16, seed=16)
    cu = _cu([9, 4])
    out = attn._flash_attn_attention(q, k, v, cu, 9)
    assert out.dtype == torch.float16
    assert _rel_err(out.detach(), attn.attention_reference(q, k, v, cu)) < 1e-3
    with pytest.raises(ValueError, match="dtype torch.float32 not supported"):
        attn._flash_attn_attention(q.float(), k.float(), v.float(), cu, 9)


def test_a_flash_attn_that_does_not_import_is_unavailable_not_a_crash(monkeypatch):
    """flash-attn installed but built against another torch fails at import: on a GPU
    machine get_attention says so (RuntimeError with the reinstall command) instead of
    handing out an adapter that crashes at its first call."""
    import sys

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attn.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # `from flash_attn import` raises
    attn._flash_attn_import_error.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="does not import.*pip install flash-attn"):
            attn.get_attention("flash-attn", "cuda")
    finally:
        attn._flash_attn_import_error.cache_clear()


def test_missing_triton_says_how_to_install(monkeypatch):
    real = attn.importlib.util.find_spec
    monkeypatch.setattr(attn.importlib.util, "find_spec",
                        lambda name: None if name == "triton" else real(name))
    with pytest.raises(RuntimeError, match="triton package is not installed; pip install triton"):
        attn.get_attention("triton")


def test_launch_limits_at_their_edges():
    """65535 sequences fit the grid (65536 do not, above); 65536 query heads do not; nor
    heads × tokens past int32 (the logsumexp offsets)."""
    def meta(*shape):
        return torch.empty(shape, device="meta")

    q, kv = meta(8, 2, 64), meta(8, 1, 64)
    ta._check_launch_limits(q, kv, kv, 65535, 8)
    with pytest.raises(ValueError, match="65536 query heads exceed the launch limit of 65535"):
        ta._check_launch_limits(meta(8, 65536, 64), kv, kv, 1, 8)
    tokens = 2**25 + 1
    with pytest.raises(ValueError, match="64 heads × 33554433 tokens .* logsumexp"):
        ta._check_launch_limits(meta(tokens, 64, 64), meta(tokens, 8, 64), meta(tokens, 8, 64), 1, 8)


@pytest.mark.parametrize(("configs", "says"), [
    ({"fwd": dict(BLOCK_M=16, BLOCK_N=32)}, "fwd config needs BLOCK_M % BLOCK_N == 0"),
    ({"dkdv": dict(BLOCK_M=16, BLOCK_N=16, MASK_BLOCK_M=32)}, "dkdv config needs BLOCK_N % MASK"),
    ({"dq": dict(BLOCK_M=32, BLOCK_N=16, MASK_BLOCK_N=64)}, "dq config needs BLOCK_M divisible"),
    ([("fwd", dict(BLOCK_M=32, BLOCK_N=16))], "configs must be a dict of kernel name"),
])
def test_block_sizes_that_do_not_nest_are_refused(configs, says):
    """Each kernel steps its inner loop by the smaller block inside the larger one."""
    q, k, v, _ = _inputs([9], 2, 1, 64, torch.float32, seed=10)
    with pytest.raises(ValueError, match=says):
        ta.flash_attn_varlen(q, k, v, _cu([9]), 9, configs=configs)


def test_kernel_configs_are_copies(monkeypatch):
    """kernel_configs hands out copies: editing them leaves the shipped configs alone."""
    import copy

    monkeypatch.setattr(tac, "CONFIGS", copy.deepcopy(tac.CONFIGS))
    shipped = copy.deepcopy(tac.CONFIGS)
    got = ta.kernel_configs(64)
    got["fwd"][0]["BLOCK_M"] = 16
    got["dq"].clear()
    assert shipped == tac.CONFIGS


def test_num_stages_must_be_an_int():
    q, k, v, _ = _inputs([9], 2, 1, 64, torch.float32, seed=10)
    with pytest.raises(ValueError, match="'num_stages' must be an int >= 1, got 1.5"):
        ta.flash_attn_varlen(q, k, v, _cu([9]), 9,
                             configs={"dq": dict(SMALL_BLOCKS["dq"], num_stages=1.5)})


# Future keys' exp2 overflows to inf on the diagonal block before the causal where() drops it
# (the interpreter warns; the result is exact): large scores on purpose.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")
def test_fp16_backward_keeps_the_logsumexp_in_float32(poisoned):
    """The backward recomputes P = exp2(s - lse) from the saved logsumexp: stored in fp16,
    large scores (lse above 64 in base 2, where fp16 steps are 1/16 or coarser) put ~1%
    errors into dq, dk and dv (here 1e-2 against 1.6e-3 with the float32 buffer)."""
    lengths = [40, 23]
    q, k, v, do = _inputs(lengths, 4, 2, 64, torch.float16, seed=20)
    q = (q.detach() * 40).requires_grad_()
    cu = _cu(lengths)
    got = _run_triton(q, k, v, do, cu, max(lengths), SMALL_BLOCKS)
    _check(got, _reference(q, k, v, do, cu), 5e-3)


def test_a_caller_editing_its_configs_after_the_forward_does_not_change_the_backward(poisoned):
    """The backward launches with the configs the forward checked (a copy): an edit made
    in between (here a block that is not a power of 2) must not reach it."""
    q, k, v, do = _inputs([9, 4], 2, 1, 64, torch.float32, seed=17)
    configs = {kernel: dict(cfg) for kernel, cfg in SMALL_BLOCKS.items()}
    cu = _cu([9, 4])
    out = ta.flash_attn_varlen(q, k, v, cu, 9, configs=configs)
    configs["dkdv"]["BLOCK_N"] = 48
    configs["dq"] = {"BLOCK_M": 48}
    out.backward(do)
    _check((out.detach(), q.grad, k.grad, v.grad), _reference(q, k, v, do, cu),
           1e-2 if CUDA else 1e-5)


def test_custom_scale_odd_strides_and_a_strided_gradient(poisoned):
    """sm_scale reaches the forward and the backward; q whose head dim is not unit-stride
    is made so (the kernels assume it), and so is a strided incoming gradient."""
    lengths = [9, 20]
    total, h, hkv, d = sum(lengths), 4, 2, 64
    gen = torch.Generator().manual_seed(18)
    q = torch.randn(total, d, h, generator=gen).to(DEVICE).transpose(1, 2).requires_grad_()
    k = torch.randn(total, hkv, d, generator=gen).to(DEVICE).requires_grad_()
    v = torch.randn(total, hkv, d, generator=gen).to(DEVICE).requires_grad_()
    do = torch.randn(total, h, 2 * d, generator=gen).to(DEVICE)[..., ::2]
    assert q.stride(-1) != 1 and do.stride(-1) != 1
    cu = _cu(lengths)
    out = ta.flash_attn_varlen(q, k, v, cu, max(lengths), sm_scale=0.3, configs=SMALL_BLOCKS)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attn.attention_reference(q64, k64, v64, cu, scale=0.3)
    ref.backward(do.double())
    _check((out.detach(), q.grad, k.grad, v.grad), (ref.detach(), q64.grad, k64.grad, v64.grad),
           1e-2 if CUDA else 1e-5)


def test_no_config_that_fits_is_a_runtime_error(monkeypatch):
    """Every config of a kernel out of resources: a RuntimeError naming the kernel and the
    smallest config, not a silently skipped launch (an unwritten output)."""
    from triton.runtime.errors import OutOfResources

    class NeverFits:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise OutOfResources(300_000, 232_448, "shared memory")
            return launch

    monkeypatch.setattr(ta, "attn_fwd", NeverFits())
    monkeypatch.setattr(tac, "_chosen", {})
    q, k, v, _ = _inputs([9], 2, 1, 64, torch.float32, seed=19)
    with pytest.raises(RuntimeError, match="fwd kernel: no config fits this GPU for head_dim=64"):
        ta.flash_attn_varlen(q, k, v, _cu([9]), 9)
