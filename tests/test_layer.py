"""TransformerLayer, LMHead and packed_inputs: tiny specs on CPU, real shapes on a GPU."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from costmodel.kernels.attention import available_attention_backends  # noqa: E402
from costmodel.kernels.layer import LMHead, TransformerLayer, packed_inputs  # noqa: E402
from costmodel.kernels.rotary import (  # noqa: E402
    apply_rotary,
    positions_from_cu_seqlens,
    rotary_cos_sin,
)
from costmodel.spec import ModelSpec  # noqa: E402

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs the triton package")

_BASE = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=101, qk_norm=True)
SPECS = {
    "dense": ModelSpec(name="tiny-dense", **_BASE),
    "moe": ModelSpec(name="tiny-moe", **{**_BASE, "num_experts": 8, "num_experts_per_tok": 2,
                                         "moe_intermediate_size": 32,
                                         "shared_expert_intermediate_size": 48}),
    "mla": ModelSpec(name="tiny-mla", **{**_BASE, "num_kv_heads": 4, "qk_norm": False,
                                         "head_dim": 0, "q_lora_rank": 32, "kv_lora_rank": 24,
                                         "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                                         "v_head_dim": 12}),
}
LENGTHS = [5, 1, 9]


def _layer(kind: str, attention: str = "sdpa", seed: int = 0, **kw) -> TransformerLayer:
    torch.manual_seed(seed)
    layer = TransformerLayer(SPECS[kind], attention=attention, dtype=torch.float32, **kw)
    with torch.no_grad():  # larger weights than 0.02 so the sublayers visibly matter
        for p in layer.parameters():
            if p.dim() > 1:
                p.mul_(5)
    return layer


@pytest.mark.parametrize("kind", list(SPECS))
def test_forward_backward_shapes_and_gradients_reach_every_parameter(kind):
    layer = _layer(kind)
    x, cu, max_len = packed_inputs(LENGTHS, SPECS[kind], dtype=torch.float32,
                                   requires_grad=True, seed=1)
    out = layer(x, cu, max_len)
    assert out.shape == x.shape and out.dtype == torch.float32
    out.square().mean().backward()
    missing = [n for n, p in layer.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    zero = [n for n, p in layer.named_parameters() if not p.grad.abs().sum() > 0]
    assert not zero, f"all-zero gradient for {zero}"
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("kind", list(SPECS))
def test_packing_is_equivalent_to_each_sequence_alone(kind):
    layer = _layer(kind)
    x, cu, max_len = packed_inputs(LENGTHS, SPECS[kind], dtype=torch.float32, seed=2)
    with torch.no_grad():
        packed = layer(x, cu, max_len)
        start = 0
        for n in LENGTHS:
            alone = layer(x[start:start + n], torch.tensor([0, n], dtype=torch.int32), n)
            torch.testing.assert_close(packed[start:start + n], alone, rtol=1e-5, atol=1e-5)
            start += n


def test_no_cross_sequence_leakage():
    """Changing one sequence changes no other sequence's output."""
    layer = _layer("dense")
    x, cu, max_len = packed_inputs(LENGTHS, SPECS["dense"], dtype=torch.float32, seed=3)
    with torch.no_grad():
        before = layer(x, cu, max_len)
        x2 = x.clone()
        x2[5:6] += 1.0  # the 1-token sequence
        after = layer(x2, cu, max_len)
    assert torch.equal(before[:5], after[:5]) and torch.equal(before[6:], after[6:])
    assert not torch.allclose(before[5:6], after[5:6])


def test_positions_restart_per_sequence():
    cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    assert positions_from_cu_seqlens(cu, 8).tolist() == [0, 1, 2, 0, 0, 1, 2, 3]


@pytest.mark.parametrize("kind", ["dense", "mla"])
def test_rotary_positions_restart_in_the_layer(kind):
    """Rotary scores only see relative positions, so the layer output cannot show absolute
    ones: compare the rotated q and k directly, packed against each sequence alone."""
    layer = _layer(kind)
    x, cu, _ = packed_inputs(LENGTHS, SPECS[kind], dtype=torch.float32, seed=4)
    with torch.no_grad():
        q, k, _ = layer.project_qkv(x, positions_from_cu_seqlens(cu, x.shape[0]))
        start = 0
        for n in LENGTHS:
            qa, ka, _ = layer.project_qkv(x[start:start + n], torch.arange(n))
            torch.testing.assert_close(q[start:start + n], qa)
            torch.testing.assert_close(k[start:start + n], ka)
            start += n
        # and running positions (no restart) would differ for the later sequences
        q_run, _, _ = layer.project_qkv(x, torch.arange(x.shape[0]))
        assert not torch.allclose(q_run[6:], q[6:])


def test_rotary_is_identity_at_position_zero_and_preserves_norms():
    x = torch.randn(4, 3, 16, dtype=torch.float64)
    cos, sin = rotary_cos_sin(torch.tensor([0, 1, 7, 1000]), 16, dtype=torch.float64)
    y = apply_rotary(x, cos, sin)
    torch.testing.assert_close(y[0], x[0])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_attention_none_skips_the_core_and_still_trains():
    for kind in SPECS:
        layer = _layer(kind, attention="none")
        x, cu, max_len = packed_inputs(LENGTHS, SPECS[kind], dtype=torch.float32,
                                       requires_grad=True, seed=5)
        out = layer(x, cu, max_len)
        out.sum().backward()
        assert out.shape == x.shape and layer.w_o.grad is not None
        # token-local: no mixing, so token 6 (position 0 of the third sequence) alone gives
        # the same output as in the pack
        with torch.no_grad():
            single = layer(x[6:7], torch.tensor([0, 1], dtype=torch.int32), 1)
        torch.testing.assert_close(out[6:7].detach(), single, rtol=1e-5, atol=1e-5)


@needs_triton
def test_triton_activation_in_the_layer_matches_torch():
    torch.manual_seed(6)
    a = TransformerLayer(SPECS["dense"], attention="sdpa", activation="triton",
                         dtype=torch.float32)
    b = TransformerLayer(SPECS["dense"], attention="sdpa", activation="torch",
                         dtype=torch.float32)
    b.load_state_dict(a.state_dict())
    x, cu, max_len = packed_inputs(LENGTHS, SPECS["dense"], dtype=torch.float32, seed=6)
    with torch.no_grad():
        torch.testing.assert_close(a(x, cu, max_len), b(x, cu, max_len), rtol=1e-5, atol=1e-5)


def test_moe_flag_and_dense_layer_of_moe_model():
    layer = TransformerLayer(SPECS["moe"], attention="sdpa", moe=False, dtype=torch.float32)
    assert not layer.is_moe and layer.mlp.intermediate_size == 96
    assert TransformerLayer(SPECS["moe"], attention="sdpa", dtype=torch.float32).is_moe
    with pytest.raises(ValueError, match="no experts"):
        TransformerLayer(SPECS["dense"], attention="sdpa", moe=True)


def test_bad_inputs_raise_value_error():
    layer = _layer("dense")
    x, cu, max_len = packed_inputs(LENGTHS, SPECS["dense"], dtype=torch.float32, seed=7)
    with pytest.raises(ValueError, match="dtype"):
        layer(x.double(), cu, max_len)
    with pytest.raises(ValueError, match="hidden size"):
        layer(x[:, :32], cu, max_len)
    with pytest.raises(ValueError, match="int32"):
        layer(x, cu.long(), max_len)
    with pytest.raises(ValueError, match="total_tokens"):
        layer(x[:-1], cu, max_len)
    with pytest.raises(ValueError, match="max_seqlen"):
        layer(x, cu, 4)
    with pytest.raises(ValueError, match="unknown attention"):
        TransformerLayer(SPECS["dense"], attention="xformers")
    with pytest.raises(ValueError, match="positive ints"):
        packed_inputs([3, 0], SPECS["dense"])
    with pytest.raises(ValueError, match="positive ints"):
        packed_inputs([2.5], SPECS["dense"])


def test_packed_inputs():
    x, cu, max_len = packed_inputs([3, 7, 2], SPECS["dense"], dtype=torch.float32, seed=0)
    assert x.shape == (12, 64) and not x.requires_grad
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 10, 12] and max_len == 7
    x2, _, _ = packed_inputs([3, 7, 2], SPECS["dense"], dtype=torch.float32, seed=0)
    assert torch.equal(x, x2) and x.std() > 0.5


def test_lm_head_cross_entropy():
    torch.manual_seed(8)
    head = LMHead(SPECS["dense"], dtype=torch.float32)
    x = torch.randn(10, 64, requires_grad=True)
    targets = head.random_targets(10, seed=1)
    loss = head(x, targets)
    h = F.rms_norm(x.detach().double(), (64,), head.norm.detach().double(), 1e-6)
    ref = F.cross_entropy(h @ head.weight.detach().double().T, targets)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    loss.backward()
    assert head.weight.grad is not None and x.grad is not None
    with pytest.raises(ValueError, match="targets"):
        head(x, targets[:5])
    with pytest.raises(ValueError, match="int64"):
        head(x, targets.int())
    with pytest.raises(ValueError, match="hidden size"):
        head(x[:, :8], targets)


# ---------------------------------------------------------- found by a bad-input sweep
def test_apply_rotary_refuses_shapes_that_broadcast_wrongly():
    """Nothing was checked: a 2-D x (5, 16) came back (5, 5, 16), an odd head dim paired the
    wrong halves, and a one-row table rotated every token by position 0's angles."""
    cos, sin = rotary_cos_sin(torch.arange(5), 16)
    x = torch.randn(5, 2, 16)
    with pytest.raises(ValueError, match="x must be \\(tokens, heads, head_dim\\)"):
        apply_rotary(x[:, 0], cos, sin)
    with pytest.raises(ValueError, match="even head_dim"):
        apply_rotary(x[..., :15], cos[:, :15], sin[:, :15])
    with pytest.raises(ValueError, match="cos and sin must be \\(tokens, head_dim\\) = \\(5, 8\\)"):
        apply_rotary(x[..., :8], cos, sin)
    with pytest.raises(ValueError, match="one row per token"):
        apply_rotary(x, cos[:1], sin[:1])
    with pytest.raises(ValueError, match="one row per token"):
        apply_rotary(x, cos, sin[:4])
    assert apply_rotary(x, cos, sin).shape == x.shape


@pytest.mark.parametrize(("kw", "says"), [
    ({"attention": "sdpa", "dtype": torch.float64}, "'sdpa' does not take torch.float64"),
    ({"attention": "triton", "dtype": torch.float32}, "head dims \\[64, 128\\].*is 16"),
])
def test_layer_refuses_an_unusable_attention_at_construction(kw, says):
    """float64, or a head dim the Triton kernel lacks, built fine and failed only at the
    first forward."""
    if kw["attention"] == "triton":
        pytest.importorskip("triton")
    with pytest.raises(ValueError, match=says):
        TransformerLayer(SPECS["dense"], **kw)
    layer = TransformerLayer(SPECS["dense"], attention="none", dtype=torch.float64)
    x, cu, max_len = packed_inputs([3, 2], SPECS["dense"], dtype=torch.float64, seed=0)
    assert layer(x, cu, max_len).dtype == torch.float64  # no attention core: any dtype


def test_torch_varlen_is_refused_in_float32():
    """varlen_attn's flash and cuDNN kernels take fp16/bf16 only: fp32 failed at the first
    forward on a GPU (here, without one, the backend's availability is checked first)."""
    from costmodel.kernels.layer import check_attention_support

    with pytest.raises(ValueError, match="'torch-varlen' does not take torch.float32"):
        check_attention_support("torch-varlen", torch.float32, 128)
    check_attention_support("torch-varlen", torch.bfloat16, 128)


def test_layer_and_head_take_a_preset_name():
    """TransformerLayer("qwen3-8b") failed as "'str' object has no attribute 'is_moe'"."""
    layer = TransformerLayer("qwen3-8b", attention="none", device="meta")
    assert layer.spec == ModelSpec.from_preset("qwen3-8b") and layer.hidden_size == 4096
    assert LMHead("qwen3-8b", device="meta").vocab_size == ModelSpec.from_preset("qwen3-8b").vocab_size
    with pytest.raises(ValueError, match="neither a model preset"):
        TransformerLayer("no-such-model", attention="none")


def test_bad_cu_seqlens_without_value_checks_is_a_value_error():
    """With check_values=False, offsets whose lengths do not add up to the tokens of x failed
    as torch's "allocated size does not match required size"."""
    layer = _layer("dense")
    layer.check_values = False
    x, _, _ = packed_inputs([3, 2], SPECS["dense"], dtype=torch.float32, seed=0)
    for bad in ([0, 3, 7], [0, 3, 2]):
        with pytest.raises(ValueError, match="cu_seqlens must increase from 0 to total_tokens=5"):
            layer(x, torch.tensor(bad, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="1-D tensor"):
        positions_from_cu_seqlens(torch.tensor([5], dtype=torch.int32), 5)


def test_lm_head_target_range_and_all_ignored_targets():
    """A target outside the vocab was an IndexError; with every target -100 the loss was NaN
    (mean over no tokens), which would poison a whole step's accumulated gradients."""
    torch.manual_seed(9)
    head = LMHead(SPECS["dense"], dtype=torch.float32)
    x = torch.randn(4, 64, requires_grad=True)
    for bad in (101, -5):
        with pytest.raises(ValueError, match="targets\\[1\\] = " + str(bad)):
            head(x, torch.tensor([0, bad, 2, 3]))
    loss = head(x, torch.full((4,), -100))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    targets = torch.tensor([5, -100, 100, -100])
    h = F.rms_norm(x.detach().double(), (64,), head.norm.detach().double(), 1e-6)
    ref = F.cross_entropy(h @ head.weight.detach().double().T, targets)  # mean of the kept
    torch.testing.assert_close(head(x, targets).double(), ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ GPU
_GPU_BACKENDS = available_attention_backends() if torch.cuda.is_available() else []


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", _GPU_BACKENDS)
def test_gpu_layer_qwen3_8b_forward_backward(backend):
    spec = ModelSpec.from_preset("qwen3-8b")
    torch.manual_seed(0)
    ref_layer = TransformerLayer(spec, attention="sdpa", device="cuda")
    layer = TransformerLayer(spec, attention=backend, device="cuda")
    layer.load_state_dict(ref_layer.state_dict())
    x, cu, max_len = packed_inputs([1000, 77, 2048, 1], spec, device="cuda",
                                   dtype=torch.bfloat16, requires_grad=True, seed=0)
    out = layer(x, cu, max_len)
    dout = torch.randn_like(out)
    out.backward(dout)
    gx, gqkv = x.grad.clone(), layer.w_qkv.grad.clone()
    x.grad = None
    ref = ref_layer(x, cu, max_len)
    ref.backward(dout)
    assert torch.isfinite(out).all() and torch.isfinite(gx).all()
    assert _rel(out, ref) <= 1e-2
    assert _rel(gx, x.grad) <= 1e-2
    assert _rel(gqkv, ref_layer.w_qkv.grad) <= 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["qwen3-30b-a3b", "deepseek-v3-dense"])
def test_gpu_moe_and_mla_layers_forward_backward(kind):
    if kind == "deepseek-v3-dense":  # MLA with a dense MLP (the 256-expert layer is 22 GB)
        spec, moe = ModelSpec.from_preset("deepseek-v3"), False
    else:
        spec, moe = ModelSpec.from_preset(kind), None
    backend = "torch-varlen" if "torch-varlen" in _GPU_BACKENDS else "sdpa"
    torch.manual_seed(0)
    layer = TransformerLayer(spec, attention=backend, moe=moe, device="cuda")
    x, cu, max_len = packed_inputs([700, 1300, 3], spec, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True, seed=0)
    out = layer(x, cu, max_len)
    out.float().square().mean().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in layer.parameters())


# -- from a mutation check: the layer against a float64 formula written out -----------------
def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()


def _rope(x, positions, theta=1e6):
    """Rotate-half rotary written out: dims i and i + d/2 turn by position · theta^(-2i/d)."""
    d = x.shape[-1]
    angle = positions.double()[:, None] * theta ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _layer_reference(layer, x, lengths):
    """h = x + W_o·attn(rope(q), rope(k), v) from RMSNorm(x); out = h + MLP(RMSNorm(h))."""
    from costmodel.kernels.attention import attention_reference
    from costmodel.kernels.moe import moe_reference

    p = {n: t.detach().double() for n, t in layer.named_parameters()}
    s, t, heads = layer.spec, x.shape[0], layer.num_heads
    x = x.double()
    pos = torch.cat([torch.arange(n) for n in lengths])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    h = _rms(x, p["input_norm"])
    if layer.is_mla:
        nope, rope = s.qk_nope_head_dim, s.qk_rope_head_dim
        q = _rms(h @ p["w_q_a"].T, p["q_a_norm"]) @ p["w_q_b"].T
        q = q.view(t, heads, nope + rope)
        ckv_pe = h @ p["w_kv_a"].T
        ckv, k_pe = ckv_pe[:, : s.kv_lora_rank], ckv_pe[:, s.kv_lora_rank:]
        kv = (_rms(ckv, p["kv_a_norm"]) @ p["w_kv_b"].T).view(t, heads, nope + s.v_head_dim)
        k_pe = _rope(k_pe[:, None, :], pos).expand(t, heads, rope)
        q = torch.cat([q[..., :nope], _rope(q[..., nope:], pos)], dim=-1)
        k, v = torch.cat([kv[..., :nope], k_pe], dim=-1), kv[..., nope:]
    else:
        d, kv_heads = s.head_dim, s.num_kv_heads
        qkv = h @ p["w_qkv"].T
        q = qkv[:, : heads * d].view(t, heads, d)
        k = qkv[:, heads * d: (heads + kv_heads) * d].view(t, kv_heads, d)
        v = qkv[:, (heads + kv_heads) * d:].view(t, kv_heads, d)
        q, k = _rope(_rms(q, p["q_norm"]), pos), _rope(_rms(k, p["k_norm"]), pos)
    x = x + attention_reference(q, k, v, cu).reshape(t, -1) @ p["w_o"].T
    h = _rms(x, p["post_attention_norm"])
    if layer.is_moe:
        return x + moe_reference(layer.mlp, h, torch.float64)
    gate_up = h @ p["mlp.w_gate_up"].T
    f = gate_up.shape[-1] // 2
    return x + (F.silu(gate_up[:, :f]) * gate_up[:, f:]) @ p["mlp.w_down"].T


@pytest.mark.parametrize("kind", list(SPECS))
def test_layer_matches_its_formula_in_float64(kind):
    """Every piece at its place: the norms (and their eps), the QKV split order, rotary on q
    and k (rotate-half, base 1e6, positions restarting per sequence), GQA or MLA heads (v
    padded and sliced back), both residuals and the MLP or experts."""
    layer = _layer(kind, seed=10)
    with torch.no_grad():  # non-trivial norm weights, so swapping two norms shows
        for p in layer.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    x, cu, max_len = packed_inputs(LENGTHS, SPECS[kind], dtype=torch.float32, seed=11)
    with torch.no_grad():
        out = layer(x, cu, max_len)
    torch.testing.assert_close(out.double(), _layer_reference(layer, x, LENGTHS),
                               rtol=1e-4, atol=1e-4)


def test_layer_default_activation_is_torch_off_cuda():
    """activation=None picks the Triton kernel on CUDA only: on CPU it would need the
    interpreter, so the default there (and for device=None, torch's default CPU) is torch's."""
    from costmodel.kernels.layer import _default_activation

    for device in (None, "cpu", "meta"):
        assert TransformerLayer(SPECS["dense"], attention="none", device=device).activation == "torch"
    assert _default_activation("cuda") == _default_activation(torch.device("cuda", 1)) == "triton"


def test_rotary_tables_need_an_even_dim_and_one_device():
    """An odd rotary dim built a table one column wider than asked; cos/sin on another
    device than x failed inside the multiply with torch's words."""
    with pytest.raises(ValueError, match="rotary_dim must be even and >= 2, got 5"):
        rotary_cos_sin(torch.arange(4), 5)
    cos, sin = rotary_cos_sin(torch.arange(4), 8)
    with pytest.raises(ValueError, match="x, cos, sin must be on one device"):
        apply_rotary(torch.randn(4, 2, 8), cos.to("meta"), sin.to("meta"))


def test_cu_seqlens_on_another_device_than_x_is_a_value_error():
    layer = _layer("dense")
    x, cu, max_len = packed_inputs(LENGTHS, SPECS["dense"], dtype=torch.float32, seed=12)
    with pytest.raises(ValueError, match="cu_seqlens on meta but x on cpu"):
        layer(x, cu.to("meta"), max_len)


def test_mla_with_v_wider_than_qk_is_refused_at_construction():
    """The layer pads MLA's v to the qk head dim; a spec with a wider v (accepted by
    ModelSpec) built fine and every forward failed as "mat1 and mat2 shapes cannot be
    multiplied", with or without an attention core."""
    spec = ModelSpec(name="tiny-mla-wide-v", **{**_BASE, "num_kv_heads": 4, "qk_norm": False,
                                               "head_dim": 0, "q_lora_rank": 32,
                                               "kv_lora_rank": 24, "qk_nope_head_dim": 8,
                                               "qk_rope_head_dim": 8, "v_head_dim": 24})
    for attention in ("sdpa", "none"):
        with pytest.raises(ValueError, match="v_head_dim=24 > qk head dim 16"):
            TransformerLayer(spec, attention=attention, dtype=torch.float32)


def test_mla_stand_in_without_attention_still_trains_the_key_projection():
    """attention="none" times the token-linear part: for MLA the stand-in takes the first
    v_head_dim columns of k too, so the kv up-projection's key rows (k_nope) get gradients
    and their backward is timed, as with an attention core."""
    layer = _layer("mla", attention="none")
    spec = SPECS["mla"]
    x, cu, max_len = packed_inputs(LENGTHS, spec, dtype=torch.float32, seed=13)
    layer(x, cu, max_len).square().sum().backward()
    used = min(spec.qk_nope_head_dim, spec.v_head_dim)
    rows = layer.w_kv_b.grad.view(spec.num_heads, spec.qk_nope_head_dim + spec.v_head_dim, -1)
    assert rows[:, :used].abs().sum(-1).min() > 0


def test_packed_inputs_refuse_more_tokens_than_int32_offsets_hold():
    with pytest.raises(ValueError, match="2147483648 tokens overflow int32 cu_seqlens"):
        packed_inputs([2**30, 2**30], SPECS["dense"], device="meta")
