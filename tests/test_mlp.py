"""SwiGLU activation and MLP: the Triton kernels against a float64 reference.

Without CUDA the kernels run under the Triton interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before triton is imported); with CUDA they run compiled, plus bf16
checks at Qwen3-8B shapes.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from costmodel.kernels.mlp import SwiGLUMLP, mlp_flops, swiglu_activation, swiglu_mlp  # noqa: E402
from costmodel.kernels.triton_swiglu import (  # noqa: E402
    swiglu,
    swiglu_backward,
    swiglu_forward,
    swiglu_fused,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _ref_fwd_bwd(g: torch.Tensor, u: torch.Tensor, dout: torch.Tensor):
    """float64 reference: out, dgate, dup through torch autograd."""
    g64 = g.detach().double().requires_grad_()
    u64 = u.detach().double().requires_grad_()
    out = F.silu(g64) * u64
    out.backward(dout.double())
    return out.detach(), g64.grad, u64.grad


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = _TOL[dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol)


# Rows/cols chosen to leave partial tiles: BLOCK_N = min(1024, next_pow2(cols)), BLOCK_M =
# 4096 // BLOCK_N; 1100 columns span two column blocks, the second one mostly masked.
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 13), (5, 1100), (33, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_float64_reference_with_poisoned_outputs(rows, cols, dtype):
    gen = torch.Generator().manual_seed(rows * 1000 + cols)
    gate_up = (2 * torch.randn(rows, 2 * cols, generator=gen)).to(DEV, dtype)
    g, u = gate_up[:, :cols], gate_up[:, cols:]  # strided halves, read in place
    dout = torch.randn(rows, cols, generator=gen).to(DEV, dtype)
    ref_out, ref_dg, ref_du = _ref_fwd_bwd(g, u, dout)

    out = torch.full((rows, cols), float("nan"), device=DEV, dtype=dtype)
    swiglu_forward(g, u, out=out)
    _close(out, ref_out, dtype)

    grad = torch.full((rows, 2 * cols), float("nan"), device=DEV, dtype=dtype)
    swiglu_backward(dout, g, u, grad[:, :cols], grad[:, cols:])
    _close(grad[:, :cols], ref_dg, dtype)
    _close(grad[:, cols:], ref_du, dtype)


@pytest.mark.parametrize("shape", [(3, 5, 2 * 70), (17, 2 * 1030)])
def test_fused_autograd_matches_reference(shape):
    torch.manual_seed(sum(shape))
    gate_up = torch.randn(shape, device=DEV, dtype=torch.float32, requires_grad=True)
    out = swiglu_fused(gate_up)
    dout = torch.randn_like(out)
    out.backward(dout)
    f = shape[-1] // 2
    ref_out, ref_dg, ref_du = _ref_fwd_bwd(gate_up[..., :f], gate_up[..., f:], dout)
    assert out.shape == (*shape[:-1], f)
    _close(out, ref_out, torch.float32)
    _close(gate_up.grad, torch.cat([ref_dg, ref_du], dim=-1), torch.float32)


def test_split_autograd_matches_reference():
    torch.manual_seed(1)
    g = torch.randn(9, 77, device=DEV, requires_grad=True)
    u = torch.randn(9, 77, device=DEV, requires_grad=True)
    out = swiglu(g, u)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref_out, ref_dg, ref_du = _ref_fwd_bwd(g, u, dout)
    _close(out, ref_out, torch.float32)
    _close(g.grad, ref_dg, torch.float32)
    _close(u.grad, ref_du, torch.float32)


def test_bad_inputs_raise_value_error():
    g = torch.randn(4, 8, device=DEV)
    with pytest.raises(ValueError, match="dtype"):
        swiglu_forward(g, g.to(torch.bfloat16))
    with pytest.raises(ValueError, match="dtype"):
        swiglu_forward(g.double(), g.double())
    with pytest.raises(ValueError, match="shape"):
        swiglu(g, g[:, :4])
    with pytest.raises(ValueError, match="even"):
        swiglu_fused(torch.randn(4, 7, device=DEV))
    with pytest.raises(ValueError, match="unit stride"):
        swiglu_forward(g.t(), g.t())
    with pytest.raises(ValueError, match="activation"):
        swiglu_activation(g, "gelu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-without-interpreter error")
def test_cpu_without_interpreter_raises_runtime_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    g = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="activation='torch'"):
        swiglu_forward(g, g)


@pytest.mark.parametrize("fused", [True, False])
def test_mlp_triton_and_torch_match_float64_reference(fused):
    torch.manual_seed(2)
    mlp = SwiGLUMLP(24, 40, activation="triton", fused_gate_up=fused, device=DEV,
                    dtype=torch.float32)
    with torch.no_grad():  # O(1) activations so relative checks mean something
        for p in mlp.parameters():
            p.mul_(10)
    x = torch.randn(2, 11, 24, device=DEV, requires_grad=True)
    out = mlp(x)
    out.backward(torch.ones_like(out))
    grads = {n: p.grad.clone() for n, p in mlp.named_parameters()}

    if fused:
        w_gu = mlp.w_gate_up.detach().double()
    else:
        w_gu = torch.cat([mlp.w_gate.detach(), mlp.w_up.detach()]).double()
    w_gu.requires_grad_()
    w_d = mlp.w_down.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    ref = swiglu_mlp(x64, w_gu, w_d, activation="torch")
    ref.backward(torch.ones_like(ref))

    _close(out, ref.detach(), torch.float32)
    _close(x.grad, x64.grad, torch.float32)
    _close(grads["w_down"], w_d.grad, torch.float32)
    got_gu = grads["w_gate_up"] if fused else torch.cat([grads["w_gate"], grads["w_up"]])
    _close(got_gu, w_gu.grad, torch.float32)

    mlp.activation = "torch"
    _close(mlp(x), ref.detach(), torch.float32)


def test_mlp_bad_inputs_raise_value_error():
    mlp = SwiGLUMLP(16, 8, activation="torch", dtype=torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        mlp(torch.randn(3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="hidden size"):
        mlp(torch.randn(3, 12))
    with pytest.raises(ValueError, match="w_down"):
        swiglu_mlp(torch.randn(3, 16), torch.randn(16, 16), torch.randn(16, 4), "torch")
    with pytest.raises(ValueError, match="activation"):
        SwiGLUMLP(16, 8, activation="relu")


def test_weights_are_small_random_not_zero():
    mlp = SwiGLUMLP(64, 128, activation="torch", dtype=torch.float32)
    for p in mlp.parameters():
        assert p.abs().max() > 0
        assert 0.01 < p.std().item() < 0.03


def test_mlp_flops():
    assert mlp_flops(10, 4, 6) == 6 * 10 * 4 * 6
    assert mlp_flops(10, 4, 6, backward=True) == 3 * 6 * 10 * 4 * 6


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [4096, 4099])
def test_gpu_fused_activation_at_qwen3_8b_shapes(tokens):
    ffn = 12288  # Qwen3-8B intermediate size
    torch.manual_seed(0)
    gate_up = torch.randn(tokens, 2 * ffn, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = swiglu_fused(gate_up)
    dout = torch.randn_like(out)
    out.backward(dout)

    ref_in = gate_up.detach().float().requires_grad_()
    g, u = ref_in.chunk(2, dim=-1)
    ref = F.silu(g) * u
    ref.backward(dout.float())

    def rel(a, b):
        return ((a.float() - b).norm() / b.norm()).item()

    assert rel(out, ref) <= 1e-2
    assert rel(gate_up.grad, ref_in.grad) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_mlp_triton_matches_torch_at_qwen3_8b_shapes():
    torch.manual_seed(0)
    mlp = SwiGLUMLP(4096, 12288, activation="triton", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = mlp(x)
    out.backward(torch.ones_like(out))
    gx, gw = x.grad.clone(), mlp.w_gate_up.grad.clone()
    x.grad = None
    mlp.zero_grad()
    mlp.activation = "torch"
    ref = mlp(x)
    ref.backward(torch.ones_like(ref))

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert rel(out, ref) <= 1e-2
    assert rel(gx, x.grad) <= 1e-2
    assert rel(gw, mlp.w_gate_up.grad) <= 1e-2


# ------------------------------------------------------------------------------ benchmark
def test_bench_mlp_plumbing_with_a_fake_timer(load_benchmark):
    bench = load_benchmark("bench_mlp")
    calls = []

    def timer(fn, grad_to_none=None):
        for t in grad_to_none or []:
            t.grad = None
        fn()
        calls.append(fn)
        return 0.5 if len(calls) <= 4 else 1.0  # triton cases come first, then torch

    row = bench.measure(9, 32, 40, device=torch.device(DEV), dtype=torch.float32, timer=timer)
    assert len(calls) == 8 and row["act_rel_err"] < 1e-5
    assert row["act_fwd_speedup"] == 2.0
    assert row["mlp_fwd_tflops"] == mlp_flops(9, 32, 40) / 0.5 / 1e9
    assert "speed-up" in bench.format_table([row])
    assert "act_fwd_gpu_speedup" not in row  # no GPU timer given: "-" in the table

    gpu_calls = []

    def gpu_timer(fn, grad_to_none=None):
        fn()
        gpu_calls.append(fn)
        return 0.1 if len(gpu_calls) <= 2 else 0.3  # triton first, then torch

    row = bench.measure(9, 32, 40, device=torch.device(DEV), dtype=torch.float32, timer=timer,
                        gpu_timer=gpu_timer)
    assert len(gpu_calls) == 4
    assert row["act_fwd_gpu_speedup"] == pytest.approx(3.0)
    assert row["act_fwdbwd_gpu_speedup"] == pytest.approx(3.0)

    def failing(fn, grad_to_none=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    row = bench.measure(9, 32, 40, device=torch.device(DEV), dtype=torch.float32, timer=timer,
                        gpu_timer=failing)
    assert row["act_gpu_error"].startswith("RuntimeError: operation not permitted")
    assert "act_fwd_gpu_speedup" not in row and "act_fwd_speedup" in row


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_mlp_without_gpu_says_so(capsys, load_benchmark):
    assert load_benchmark("bench_mlp").main(["--quick", "--no-json"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_fused_swiglu_edge_shapes_and_double_backward():
    """Zero rows: autograd hands a (0, 0)-strided gradient, which failed the unit-stride
    check. A zero feature dim was a reshape error. A double backward silently dropped the
    term built on the gradient; it is refused now."""
    x = torch.randn(0, 8, device=DEV, requires_grad=True)
    swiglu_fused(x).sum().backward()
    assert x.grad.shape == (0, 8)
    with pytest.raises(ValueError, match="even and positive"):
        swiglu_fused(torch.randn(3, 0, device=DEV))
    x = torch.randn(4, 8, device=DEV, requires_grad=True)
    (plain,) = torch.autograd.grad(swiglu_fused(x).sum(), x)
    (g,) = torch.autograd.grad(swiglu_fused(x).sum(), x, create_graph=True)  # first order: served
    torch.testing.assert_close(g.detach(), plain)
    with pytest.raises(RuntimeError, match="triton swiglu: double backward"):
        torch.autograd.grad(g.sum(), x)
    gate, up = (torch.randn(4, 8, device=DEV, requires_grad=True) for _ in range(2))
    dg, du = torch.autograd.grad(swiglu(gate, up).sum(), (gate, up), create_graph=True)
    with pytest.raises(RuntimeError, match="triton swiglu: double backward"):
        (dg * du).sum().backward()
    # a jvp differentiates with respect to the incoming gradient: it read zeros (a review)
    with pytest.raises(RuntimeError, match="triton swiglu: double backward"):
        torch.autograd.functional.jvp(swiglu_fused, torch.randn(4, 8, device=DEV),
                                      torch.randn(4, 8, device=DEV))


def test_without_torchs_delayed_error_a_double_backward_is_refused_at_once(monkeypatch):
    """DelayedError is private to torch: should a release drop it, create_graph=True is
    refused outright (as before the lazy guard), never answered without a graph."""
    monkeypatch.delattr(torch._C._functions, "DelayedError")
    x = torch.randn(4, 8, device=DEV, requires_grad=True)
    with pytest.raises(RuntimeError, match="triton swiglu: double backward"):
        torch.autograd.grad(swiglu_fused(x).sum(), x, create_graph=True)
    swiglu_fused(x).sum().backward()  # a plain backward does not need it
    assert x.grad is not None


def test_fused_swiglu_first_order_gradient_under_checkpoint_with_create_graph():
    """A non-reentrant checkpoint allows one unpacking of each saved tensor: the guard read
    them a second time, and the first-order gradient failed (a review)."""
    from torch.utils.checkpoint import checkpoint

    w = torch.randn(16, 16, device=DEV, requires_grad=True)
    x = torch.randn(5, 2, 16, device=DEV)
    y = checkpoint(lambda x: swiglu_fused(x @ w), x, use_reentrant=False)
    (g,) = torch.autograd.grad(y.pow(2).sum(), w, create_graph=True)
    (plain,) = torch.autograd.grad(swiglu_fused(x @ w).pow(2).sum(), w)
    torch.testing.assert_close(g.detach(), plain)


# ---------------------------------------------------------- found by a bad-input sweep
def test_mlp_sizes_and_weight_lists_give_clear_errors():
    """SwiGLUMLP('8', 8) was a TypeError on `<`; swiglu_mlp(x, [W], Wd) passed the checks
    and failed as "not enough values to unpack"."""
    with pytest.raises(ValueError, match="hidden_size must be an integer >= 1, got '8'"):
        SwiGLUMLP("8", 8, activation="torch")
    with pytest.raises(ValueError, match="intermediate_size must be an integer >= 1, got 8.5"):
        SwiGLUMLP(8, 8.5, activation="torch")
    x, w, wd = torch.randn(2, 8), torch.randn(16, 8), torch.randn(8, 8)
    for wrapped in ([w], (w,), [w[:8], w[8:], w[:8]]):
        with pytest.raises(ValueError, match="one \\[2F, H\\] tensor or a \\(w_gate, w_up\\) pair"):
            swiglu_mlp(x, wrapped, wd, "torch")
    torch.testing.assert_close(swiglu_mlp(x, [w[:8], w[8:]], wd, "torch"),
                               swiglu_mlp(x, w, wd, "torch"))


def test_bench_mlp_captures_nothing_after_a_failed_capture(load_benchmark, capsys):
    """A failed capture can leave the allocator mid-capture: later rows get no GPU timer, and
    a row that fails outright is recorded without stopping the others."""
    bench = load_benchmark("bench_mlp")
    given = []

    def measure_one(t, gpu):
        given.append((t, gpu))
        if t == 3:
            raise ValueError("too big\nmore")
        return {"tokens": t, **({"act_gpu_error": "RuntimeError: capture"} if t == 2 else {})}

    timer = object()
    rows, errors = bench.measure_rows([1, 2, 3, 4], measure_one, timer)
    assert given == [(1, timer), (2, timer), (3, None), (4, None)]
    assert [r["tokens"] for r in rows] == [1, 2, 4]
    assert errors == [{"tokens": 3, "error": "ValueError: too big"}]
    assert "3 tokens failed" in capsys.readouterr().err


def test_bench_mlp_keeps_its_rows_when_the_step_timeout_interrupts(load_benchmark, capsys):
    """The GPU session's step timeout sends SIGINT: the rows measured so far are kept (and
    written), not lost with the whole benchmark."""
    bench = load_benchmark("bench_mlp")

    def measure_one(t, gpu):
        if t == 3:
            raise KeyboardInterrupt
        return {"tokens": t}

    rows, errors = bench.measure_rows([1, 2, 3, 4], measure_one, None)
    assert [r["tokens"] for r in rows] == [1, 2]
    assert errors == [{"tokens": 3, "error": "interrupted (the step's time ran out)"}]
    assert "keeping 2 rows" in capsys.readouterr().err


# -- from a mutation check: each test fails when the check it names is broken ---------------
def test_launch_grid_limits_are_checked_at_their_edges():
    """A grid one block past CUDA's limit on either axis is a ValueError; the largest that
    fits launches (checked on the launch parameters alone, no kernel runs)."""
    from costmodel.kernels.triton_swiglu import _GRID1_LIMIT, _launch_config

    grid, block_m, block_n = _launch_config(3, _GRID1_LIMIT * 1024)
    assert grid == (1, _GRID1_LIMIT) and (block_m, block_n) == (4, 1024)
    with pytest.raises(ValueError, match="grid; the limit is"):
        _launch_config(3, (_GRID1_LIMIT + 1) * 1024)
    assert _launch_config(4 * (2**31 - 1), 1024)[0] == (2**31 - 1, 1)
    with pytest.raises(ValueError, match="grid; the limit is"):
        _launch_config(4 * (2**31 - 1) + 1, 1024)


def test_given_output_and_gradient_buffers_and_dout_are_checked():
    """The kernels write out/dgate/dup at row stride with unit feature stride and read dout
    with gate's shape: a transposed buffer or a dout of another shape is a ValueError, not
    a silently scrambled result."""
    g = torch.randn(4, 8, device=DEV)
    bad = torch.empty(8, 4, device=DEV).t()  # (4, 8), feature stride 4
    with pytest.raises(ValueError, match="out must be a .4, 8. torch.float32 tensor with unit"):
        swiglu_forward(g, g, out=bad)
    with pytest.raises(ValueError, match="dgate must be"):
        swiglu_backward(g, g, g, dgate=bad)
    with pytest.raises(ValueError, match="dup must be"):
        swiglu_backward(g, g, g, dup=bad)
    with pytest.raises(ValueError, match="dout shape .4, 4. != gate shape .4, 8."):
        swiglu_backward(g[:, :4], g, g)


def test_gate_and_up_on_two_devices_or_without_features_are_value_errors():
    g = torch.randn(4, 8, device=DEV)
    with pytest.raises(ValueError, match="gate and up must be on one device"):
        swiglu_forward(g, g.to("meta"))
    with pytest.raises(ValueError, match="positive feature dim"):
        swiglu(g[:, :0], g[:, :0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-without-interpreter error")
def test_cpu_with_the_interpreter_unset_raises_runtime_error(monkeypatch):
    """Only TRITON_INTERPRET=1 lets the kernel run on CPU tensors; unset is refused too."""
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="activation='torch'"):
        swiglu_forward(torch.randn(4, 8), torch.randn(4, 8))


def test_mlp_weight_shapes_and_devices_are_checked_up_front():
    """An odd number of fused gate/up rows, gate and up weights of different shapes, or a
    weight on another device: ValueErrors naming the weight, not a broadcast error in the
    activation or a device error in the GEMM."""
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="w_gate_up must have 2F rows .gate then up., got 15"):
        swiglu_mlp(x, torch.randn(15, 8), torch.randn(8, 7), "torch")
    with pytest.raises(ValueError, match="w_gate .8, 8. and w_up .6, 8. differ"):
        swiglu_mlp(x, (torch.randn(8, 8), torch.randn(6, 8)), torch.randn(8, 8), "torch")
    with pytest.raises(ValueError, match="weight on meta but input on cpu"):
        swiglu_mlp(x, torch.randn(16, 8, device="meta"), torch.randn(8, 8), "torch")
