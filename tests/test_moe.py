"""MoE expert MLP: routing, grouping, grouped GEMM and the whole layer against a dense loop."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from costmodel.kernels.moe import (  # noqa: E402
    MoEMLP,
    group_by_expert,
    grouped_gemm_available,
    grouped_linear,
    moe_reference,
    route,
)

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs the triton package")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _moe(dtype, *, activation="torch", impl="auto", shared=0, norm=True, seed=0):
    torch.manual_seed(seed)
    moe = MoEMLP(32, 8, 3, 24, shared_intermediate_size=shared, norm_topk_prob=norm,
                 activation=activation, grouped_gemm=impl, device=DEV, dtype=dtype)
    with torch.no_grad():  # O(1) values, and a router sharp enough to avoid near-ties
        for p in moe.parameters():
            p.mul_(10)
    return moe


def test_route_normalised_topk():
    torch.manual_seed(0)
    x, w = torch.randn(50, 16), torch.randn(6, 16)
    weights, ids = route(x, w, 2, norm_topk_prob=True)
    probs = (x @ w.T).softmax(-1)
    assert weights.dtype == torch.float32 and ids.shape == (50, 2)
    torch.testing.assert_close(weights.sum(-1), torch.ones(50))
    assert torch.equal(ids, probs.topk(2, dim=-1).indices)
    raw, _ = route(x, w, 2, norm_topk_prob=False)
    torch.testing.assert_close(raw, probs.topk(2, dim=-1).values)


def test_group_by_expert():
    ids = torch.tensor([[2, 0], [0, 3], [2, 1], [3, 0]])
    order, counts, offsets = group_by_expert(ids, 5)
    assert counts.tolist() == [3, 1, 2, 2, 0]
    assert offsets.dtype == torch.int32 and offsets.tolist() == [3, 4, 6, 8, 8]
    flat = ids.reshape(-1)
    assert flat[order].tolist() == sorted(flat.tolist())
    assert (order // 2).tolist() == [0, 1, 3, 2, 0, 2, 1, 3]  # stable within an expert


@pytest.mark.parametrize("impl", ["loop", "auto"])
def test_grouped_linear_matches_per_expert_matmul(impl):
    torch.manual_seed(3)
    counts = [4, 0, 7, 1, 0]  # empty experts, including the last one
    x = torch.randn(sum(counts), 16, device=DEV)
    w = torch.randn(len(counts), 8, 16, device=DEV)
    offsets = torch.tensor(counts, device=DEV).cumsum(0).to(torch.int32)
    out = grouped_linear(x, w, offsets, impl=impl)
    ref, start = [], 0
    for e, n in enumerate(counts):
        ref.append(x[start:start + n].double() @ w[e].double().T)
        start += n
    torch.testing.assert_close(out.double(), torch.cat(ref), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not grouped_gemm_available(DEV, torch.float32),
                    reason="torch grouped GEMM unavailable for float32 here")
def test_grouped_mm_and_loop_agree_forward_and_backward():
    offsets = torch.tensor([5, 5, 12], dtype=torch.int32, device=DEV)
    results = []
    for impl in ("grouped_mm", "loop"):
        torch.manual_seed(4)
        x = torch.randn(12, 16, device=DEV, requires_grad=True)
        w = torch.randn(3, 8, 16, device=DEV, requires_grad=True)
        out = grouped_linear(x, w, offsets, impl=impl)
        out.backward(torch.linspace(-1, 1, out.numel(), device=DEV).view_as(out))
        results.append((out.detach(), x.grad, w.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "activation,impl,shared,norm",
    [
        ("torch", "loop", 0, True),
        pytest.param("triton", "auto", 40, True, marks=needs_triton),
        ("torch", "auto", 0, False),
    ],
)
def test_moe_matches_dense_per_token_reference(activation, impl, shared, norm):
    moe = _moe(torch.float32, activation=activation, impl=impl, shared=shared, norm=norm)
    x = torch.randn(21, 32, device=DEV, requires_grad=True)
    out = moe(x)
    ref = moe_reference(moe, x.detach(), torch.float64)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    out.backward(torch.randn_like(out))
    missing = [n for n, p in moe.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_moe_gradients_match_reference_in_float64():
    moe = _moe(torch.float64, activation="torch", impl="loop", shared=16)
    x = torch.randn(13, 32, device=DEV, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(13, 32, device=DEV, dtype=torch.float64)
    moe(x).backward(dout)
    got = [x.grad.clone()] + [p.grad.clone() for p in moe.parameters()]
    x.grad = None
    moe.zero_grad()
    moe_reference(moe, x, torch.float64).backward(dout)
    want = [x.grad] + [p.grad for p in moe.parameters()]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_random_routing_is_balanced_ish():
    torch.manual_seed(5)
    moe = MoEMLP(64, 16, 2, 8, activation="torch", device=DEV, dtype=torch.float32)
    x = torch.randn(4096, 64, device=DEV)
    with torch.no_grad():
        moe(x)
    counts = moe.last_counts.double()
    assert counts.sum().item() == 4096 * 2
    assert counts.max().item() / counts.mean().item() < 1.6
    assert counts.min().item() > 0


def test_moe_bad_inputs_raise_value_error():
    moe = MoEMLP(16, 4, 2, 8, activation="torch", dtype=torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        moe(torch.randn(3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="hidden size"):
        moe(torch.randn(3, 8))
    with pytest.raises(ValueError, match="top_k"):
        MoEMLP(16, 4, 5, 8)
    with pytest.raises(ValueError, match="impl"):
        grouped_linear(torch.randn(3, 16), torch.randn(2, 8, 16),
                       torch.tensor([1, 3], dtype=torch.int32), impl="cutlass")


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_moe_grouped_mm_matches_loop_at_qwen3_30b_a3b_shape():
    torch.manual_seed(0)
    kw = {"device": "cuda", "dtype": torch.bfloat16, "activation": "triton"}
    a = MoEMLP(2048, 128, 8, 768, grouped_gemm="auto", **kw)
    b = MoEMLP(2048, 128, 8, 768, grouped_gemm="loop", **kw)
    b.load_state_dict(a.state_dict())
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out_a = a(x)
    out_a.backward(torch.ones_like(out_a))
    gx = x.grad.clone()
    x.grad = None
    out_b = b(x)
    out_b.backward(torch.ones_like(out_b))

    def rel(u, v):
        return ((u.float() - v.float()).norm() / v.float().norm()).item()

    assert rel(out_a, out_b) <= 1e-2
    assert rel(gx, x.grad) <= 1e-2
    assert rel(a.w_gate_up.grad, b.w_gate_up.grad) <= 1e-2
    counts = a.last_counts.double()
    assert counts.max().item() / counts.mean().item() < 2.0


def test_grouped_gemm_probe_is_not_fooled_by_no_grad(monkeypatch):
    import costmodel.kernels.moe as moe_mod

    monkeypatch.setattr(moe_mod, "_GROUPED_MM_OK", {})
    with torch.no_grad():
        under_no_grad = grouped_gemm_available("cpu", torch.float32)
    monkeypatch.setattr(moe_mod, "_GROUPED_MM_OK", {})
    with torch.inference_mode():
        under_inference = grouped_gemm_available("cpu", torch.float32)
    monkeypatch.setattr(moe_mod, "_GROUPED_MM_OK", {})
    assert under_no_grad == under_inference == grouped_gemm_available("cpu", torch.float32)


@pytest.mark.parametrize("offsets", [[4, 6, 10], [8, 4, 12], [-2, 6, 12]])
def test_grouped_linear_refuses_offsets_that_do_not_tile_the_rows(offsets):
    """The loop and grouped-GEMM paths read such offsets differently (10, 16 or 6 rows
    against 12): refused now."""
    x, w = torch.randn(12, 8, device=DEV), torch.randn(3, 4, 8, device=DEV)
    with pytest.raises(ValueError, match="non-decreasing row ends from 0 to the 12 rows"):
        grouped_linear(x, w, torch.tensor(offsets, dtype=torch.int32, device=DEV), impl="loop")
    with pytest.raises(ValueError, match="int32 or int64"):
        grouped_linear(x, w, torch.tensor(offsets, dtype=torch.float32, device=DEV), impl="loop")


# ---------------------------------------------------------- found by a bad-input sweep
def test_route_refuses_more_experts_per_token_than_experts():
    """top_k > num_experts was torch's "selected index k out of range"; top_k=2.5 ran."""
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with pytest.raises(ValueError, match="top_k=4 > num_experts=3"):
        route(x, w, 4)
    with pytest.raises(ValueError, match="top_k must be an integer"):
        route(x, w, 2.5)


def test_group_by_expert_takes_int32_ids_and_refuses_out_of_range_ids():
    """int32 ids (what many routers emit) raised a raw scatter dtype error; an id outside
    [0, num_experts) a raw out-of-bounds RuntimeError."""
    ids = torch.tensor([[2, 0], [0, 3], [2, 1], [3, 0]])
    want = group_by_expert(ids, 5)
    got = group_by_expert(ids.int(), 5)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    for bad in ([[0, 5]], [[-1, 0]]):
        with pytest.raises(ValueError, match=r"expert_ids must lie in \[0, num_experts=5\)"):
            group_by_expert(torch.tensor(bad), 5)
    with pytest.raises(ValueError, match="int64 or int32"):
        group_by_expert(ids.float(), 5)
    with pytest.raises(ValueError, match="num_experts must be an integer"):
        group_by_expert(ids, 5.0)


@pytest.mark.parametrize(("args", "kw", "says"), [
    ((-1, 4, 2, 8), {}, "hidden_size must be an integer >= 1, got -1"),
    ((8, 4.0, 2, 8), {}, "num_experts must be an integer >= 1, got 4.0"),
    ((8, 4, 2.5, 8), {}, "top_k must be an integer >= 1, got 2.5"),
    ((8, 4, 2, "8"), {}, "moe_intermediate_size must be an integer"),
    ((8, 4, 2, 8), {"shared_intermediate_size": -1}, "shared_intermediate_size"),
])
def test_moe_integer_arguments_are_checked(args, kw, says):
    """-1 was a raw RuntimeError (negative dimension), 4.0 a TypeError deep in torch.empty,
    and top_k=2.5 was silently truncated to 2."""
    with pytest.raises(ValueError, match=says):
        MoEMLP(*args, activation="torch", dtype=torch.float32, **kw)


# -- from a mutation check: each test fails when the code it names is broken ---------------
def test_route_may_pick_every_expert_and_softmaxes_in_float32():
    """top_k == num_experts is allowed (each token uses all experts, weights summing to 1),
    and a bf16 router's softmax and weights are float32, as documented."""
    torch.manual_seed(1)
    x, w = torch.randn(5, 8), torch.randn(3, 8)
    weights, ids = route(x, w, 3)
    assert sorted(ids[0].tolist()) == [0, 1, 2]
    torch.testing.assert_close(weights.sum(-1), torch.ones(5))
    weights, _ = route(x.bfloat16(), w.bfloat16(), 2)
    assert weights.dtype == torch.float32
    MoEMLP(8, 3, 3, 4, activation="torch", dtype=torch.float32)  # top_k == num_experts


def test_group_by_expert_is_stable_at_sizes_where_a_plain_argsort_is_not():
    """Rows of one expert keep token order (``order // k`` stays ascending within each
    group): torch's default argsort reorders ties from ~100 elements on."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (60, 2), generator=gen)
    order, counts, offsets = group_by_expert(ids, 4)
    start = 0
    for expert, end in enumerate(offsets.tolist()):
        group = order[start:end]
        assert (ids.reshape(-1)[group] == expert).all()
        assert torch.equal(group, group.sort().values), f"expert {expert}: {group.tolist()}"
        start = end


def test_grouped_linear_with_no_rows_and_its_grouped_mm_refusal():
    """No rows at all (every expert empty) gives (0, out) rows; impl="grouped_mm" where it
    cannot run (here: in-features 3, not 16-byte aligned) is a RuntimeError naming the
    fallback, never a silent loop."""
    w = torch.randn(3, 4, 8, device=DEV)
    out = grouped_linear(torch.randn(0, 8, device=DEV), w,
                         torch.zeros(3, dtype=torch.int32, device=DEV), impl="loop")
    assert out.shape == (0, 4)
    with pytest.raises(RuntimeError, match="use impl='loop'"):
        grouped_linear(torch.randn(6, 3, device=DEV), torch.randn(3, 4, 3, device=DEV),
                       torch.tensor([2, 4, 6], dtype=torch.int32, device=DEV), impl="grouped_mm")


def test_grouped_linear_takes_int64_offsets_on_every_path():
    torch.manual_seed(7)
    x, w = torch.randn(12, 16, device=DEV), torch.randn(3, 8, 16, device=DEV)
    offsets = torch.tensor([5, 5, 12], device=DEV)  # int64
    want = grouped_linear(x, w, offsets, impl="loop")
    torch.testing.assert_close(grouped_linear(x, w, offsets, impl="auto"), want)


def test_grouped_gemm_probe_accepts_a_correct_op_and_refuses_a_wrong_one(monkeypatch):
    """The probe compares the op with per-group matmuls, per (device, dtype): a correct op
    passes, one that is wrong only for float64 is refused for float64 alone."""
    import costmodel.kernels.moe as moe_mod

    def grouped(a, b, offs):  # b: (E, in, out); rows offs[e-1]:offs[e] of a times b[e]
        ends = offs.tolist()
        starts = [0, *ends[:-1]]
        out = torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip(starts, ends))])
        return out * (1.5 if a.dtype == torch.float64 else 1.0)

    monkeypatch.setattr(moe_mod, "_GROUPED_MM_OK", {})
    monkeypatch.setattr(moe_mod, "_grouped_mm_fn", lambda: grouped)
    assert grouped_gemm_available("cpu", torch.float32)
    assert not grouped_gemm_available("cpu", torch.float64)


def test_moe_input_device_and_shared_width_are_checked():
    moe = MoEMLP(16, 4, 2, 8, activation="torch", dtype=torch.float32)
    with pytest.raises(ValueError, match="x on meta but MoE weights on cpu"):
        moe(torch.randn(3, 16, device="meta"))
    for width in (0.0, False):
        with pytest.raises(ValueError, match="shared_intermediate_size"):
            MoEMLP(16, 4, 2, 8, shared_intermediate_size=width, activation="torch")


def test_auto_grouped_gemm_is_used_only_for_16_byte_aligned_dims(monkeypatch):
    """cuBLAS's grouped GEMM needs every row stride 16-byte aligned, the weight's out dim
    included: "auto" falls back to the loop for an out dim of 6 floats (24 bytes)."""
    import costmodel.kernels.moe as moe_mod

    calls = []

    def grouped(a, b, offs):
        calls.append(tuple(b.shape))
        return moe_mod.grouped_linear(a, b.transpose(-2, -1), offs, impl="loop")

    monkeypatch.setattr(moe_mod, "_GROUPED_MM_OK", {("cpu", None, torch.float32): True})
    monkeypatch.setattr(moe_mod, "_grouped_mm_fn", lambda: grouped)
    x, offsets = torch.randn(6, 16), torch.tensor([2, 4, 6], dtype=torch.int32)
    grouped_linear(x, torch.randn(3, 8, 16), offsets)
    assert calls == [(3, 16, 8)]
    grouped_linear(x, torch.randn(3, 6, 16), offsets)
    assert calls == [(3, 16, 8)]  # the loop ran
