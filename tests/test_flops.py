"""Exact analytic FLOPs: hand-derived counts, a FlopCounterMode cross-check, properties."""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.flops import (
    as_lengths,
    attention_projection_flops_per_token,
    calculate_fwd_flops,
    calculate_train_flops,
    causal_pairs,
    flops_breakdown,
    sequence_fwd_flops,
)
from costmodel.spec import ModelSpec, preset_names


# ---- hand-derived counts, arithmetic shown ---------------------------------------------
def test_qwen3_8b_by_hand():
    spec = ModelSpec.from_preset("qwen3-8b")
    L = 4096
    # h=4096, 32 q heads, 8 kv heads, d=128, f=12288, V=151936, 36 layers
    q = 2 * 4096 * (32 * 128)  # 33_554_432
    kv = 2 * (2 * 4096 * (8 * 128))  # 16_777_216
    o = 2 * (32 * 128) * 4096  # 33_554_432
    mlp = 6 * 4096 * 12288  # 301_989_888
    head = 2 * 4096 * 151936  # 1_244_659_712
    pairs = L * (L + 1) // 2  # 8_390_656, not L²/2 = 8_388_608
    core_per_pair = 2 * 32 * (128 + 128)  # QKᵀ + AV = 16_384
    expected = 36 * L * (q + kv + o + mlp) + L * head + 36 * pairs * core_per_pair
    assert q + kv + o == 83_886_080 and mlp == 301_989_888
    assert calculate_fwd_flops([L], spec) == expected == 66_946_863_202_304
    assert calculate_train_flops([L], spec) == 3 * expected


def test_qwen3_30b_a3b_by_hand():
    spec = ModelSpec.from_preset("qwen3-30b-a3b")
    L = 1000
    # h=2048, 32 q heads x d=128 = 4096 wide (so o-proj is 4096->2048, not hidden²), 4 kv heads
    proj = 2 * 2048 * 4096 + 2 * (2 * 2048 * 512) + 2 * 4096 * 2048  # 37_748_736
    router = 2 * 2048 * 128  # 524_288: the term the usual approximation drops
    experts = 8 * 6 * 2048 * 768  # top-8 of 128, each 768 wide: 75_497_472
    head = 2 * 2048 * 151936
    pairs = 1000 * 1001 // 2
    expected = 48 * L * (proj + router + experts) + L * head + 48 * pairs * 2 * 32 * 256
    b = flops_breakdown([L], spec)
    assert proj == 37_748_736 and experts == 75_497_472
    assert b["moe_router"] == 48 * L * router
    assert b["dense_mlp"] == 0 and b["moe_shared_experts"] == 0
    assert calculate_fwd_flops([L], spec) == expected


def test_deepseek_v3_by_hand():
    spec = ModelSpec.from_preset("deepseek-v3")
    L = 1000
    # MLA: h=7168, 128 heads, q rank 1536, kv rank 512, nope 128 + rope 64, v 128
    q = 2 * 7168 * 1536 + 2 * 1536 * 128 * (128 + 64)  # 22_020_096 + 75_497_472
    kv_down = 2 * 7168 * (512 + 64)  # 8_257_536 (the shared rope key rides along)
    kv_up = 2 * 512 * 128 * (128 + 128)  # 33_554_432
    o = 2 * 128 * 128 * 7168  # 234_881_024
    proj = q + kv_down + kv_up + o
    dense = 6 * 7168 * 18432  # first 3 layers
    moe = 2 * 7168 * 256 + 8 * 6 * 7168 * 2048 + 6 * 7168 * 2048  # router + top-8 + 1 shared
    head = 2 * 7168 * 129280
    core = 2 * 128 * (192 + 128) * (1000 * 1001 // 2)  # QKᵀ at d=192, AV at d=128
    expected = L * (61 * proj + 3 * dense + 58 * moe + head) + 61 * core
    assert proj == 374_210_560
    assert calculate_fwd_flops([L], spec) == expected


def test_sliding_window_pairs():
    # Each query sees at most W keys (itself included).
    assert causal_pairs([3], window=4).tolist() == [6]
    assert causal_pairs([10], window=4).tolist() == [4 * 5 // 2 + 6 * 4]
    brute = sum(min(i + 1, 4) for i in range(10))
    assert causal_pairs([10], window=4)[0] == brute
    spec = ModelSpec(
        name="swa", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
        intermediate_size=128, vocab_size=100, sliding_window=8, sliding_window_layers=3,
    )
    b = flops_breakdown([20], spec)
    per_pair = 2 * 4 * 32
    assert b["attention_core"] == per_pair * (1 * 210 + 3 * (36 + 12 * 8))


def test_every_preset_counts_and_is_consistent():
    lengths = np.array([1, 7, 512, 4096])
    for name in preset_names():
        spec = ModelSpec.from_preset(name)
        total = calculate_fwd_flops(lengths, spec)
        assert total > 0
        assert np.isclose(sequence_fwd_flops(lengths, spec).sum(), total, rtol=1e-12)


# ---- cross-check against torch's FlopCounterMode on a tiny real model -------------------
torch = pytest.importorskip("torch")
F = torch.nn.functional


def _tiny_forward(spec: ModelSpec, lengths: list[int]) -> None:
    """A real forward pass of `spec` built from F.linear and SDPA, one sequence at a time."""
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=g) * 0.1
    h, nh = spec.hidden_size, spec.num_heads
    for L in lengths:
        x = rand(L, h)
        for layer in range(spec.num_layers):
            if spec.is_mla:
                dq, dn, dr, dv, r = (spec.qk_head_dim, spec.qk_nope_head_dim,
                                     spec.qk_rope_head_dim, spec.v_head_dim, spec.kv_lora_rank)
                cq = F.linear(x, rand(spec.q_lora_rank, h))
                q = F.linear(cq, rand(nh * dq, spec.q_lora_rank)).view(L, nh, dq)
                ckv = F.linear(x, rand(r + dr, h))
                kv = F.linear(ckv[:, :r], rand(nh * (dn + dv), r)).view(L, nh, dn + dv)
                k = torch.cat([kv[..., :dn], ckv[:, None, r:].expand(L, nh, dr)], -1)
                v = kv[..., dn:]
            else:
                d, nkv = spec.head_dim, spec.num_kv_heads
                q = F.linear(x, rand(nh * d, h)).view(L, nh, d)
                k = F.linear(x, rand(nkv * d, h)).view(L, nkv, d).repeat_interleave(nh // nkv, 1)
                v = F.linear(x, rand(nkv * d, h)).view(L, nkv, d).repeat_interleave(nh // nkv, 1)
                dv = d
            a = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
            )
            x = x + F.linear(a.transpose(0, 1).reshape(L, nh * dv), rand(h, nh * dv))
            if layer in spec.moe_layer_ids():
                logits = F.linear(x, rand(spec.num_experts, h))
                top = logits.topk(spec.num_experts_per_tok, dim=-1).indices
                out = torch.zeros_like(x)
                for e in range(spec.num_experts):
                    rows = (top == e).any(-1).nonzero().flatten()
                    out[rows] += _swiglu(x[rows], spec.moe_intermediate_size, rand)
                if spec.shared_expert_intermediate_size:
                    out += _swiglu(x, spec.shared_expert_intermediate_size, rand)
                x = x + out
            else:
                x = x + _swiglu(x, spec.intermediate_size, rand)
        F.linear(x, rand(spec.vocab_size, h))


def _swiglu(x, width, rand):
    h = x.shape[-1]
    gate, up = F.linear(x, rand(2 * width, h)).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, rand(h, width))


TINY_SPECS = {
    "gqa": ModelSpec(name="gqa", num_layers=2, hidden_size=48, num_heads=4, num_kv_heads=2,
                     head_dim=16, intermediate_size=80, vocab_size=97),
    "moe": ModelSpec(name="moe", num_layers=3, hidden_size=32, num_heads=4, num_kv_heads=1,
                     head_dim=8, intermediate_size=64, vocab_size=50, num_experts=6,
                     num_experts_per_tok=2, moe_intermediate_size=24,
                     shared_expert_intermediate_size=16, first_k_dense_layers=1),
    "mla": ModelSpec(name="mla", num_layers=2, hidden_size=40, num_heads=4, num_kv_heads=4,
                     head_dim=0, intermediate_size=56, vocab_size=31, q_lora_rank=12,
                     kv_lora_rank=10, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6),
}


@pytest.mark.parametrize("kind", sorted(TINY_SPECS))
def test_matches_torch_flop_counter(kind):
    from torch.utils.flop_counter import FlopCounterMode

    spec = TINY_SPECS[kind]
    lengths = [5, 1, 9]
    with FlopCounterMode(display=False) as counter:
        _tiny_forward(spec, lengths)
    counted = counter.get_total_flops()
    ours = flops_breakdown(lengths, spec)
    # The counter charges SDPA for the full L² square even when is_causal=True.
    square = 2 * spec.num_heads * (spec.qk_head_dim + spec.value_head_dim)
    square *= spec.num_layers * sum(L * L for L in lengths)
    assert counted == sum(ours.values()) - ours["attention_core"] + square


# ---- properties ----------------------------------------------------------------------------
lengths_st = st.lists(st.integers(1, 200_000), min_size=1, max_size=40)
spec_st = st.sampled_from([ModelSpec.from_preset(n) for n in preset_names()] + list(TINY_SPECS.values()))


@settings(max_examples=60, deadline=None)
@given(a=lengths_st, b=lengths_st, spec=spec_st)
def test_additive_over_sequences(a, b, spec):
    assert calculate_fwd_flops(a + b, spec) == calculate_fwd_flops(a, spec) + calculate_fwd_flops(b, spec)


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 100_000), spec=spec_st)
def test_quadratic_term_and_monotone(L, spec):
    f = lambda n: calculate_fwd_flops([n], spec)
    # Second difference of a + b·L + c·L(L+1)/2 is exactly c (no sliding windows here).
    c = spec.num_layers * 2 * spec.num_heads * (spec.qk_head_dim + spec.value_head_dim)
    assert f(L + 2) - 2 * f(L + 1) + f(L) == c
    assert f(L + 1) > f(L)


@pytest.mark.parametrize(("bad", "says"), [
    ([0], r"must be positive \(>= 1 token\), got 0 at index 0"),
    ([-3], r"must be positive \(>= 1 token\), got -3 at index 0"),
    ([1.5], r"must be whole numbers of tokens, got 1\.5 at index 0"),
    ([float("nan")], r"must be whole numbers of tokens, got nan at index 0"),
    ([[1, 2]], r"must be a 1-D list of integers, got shape \(1, 2\)"),
    (["a"], r"must be integers, got dtype <U1"),
    # an object list: the first entry that is no integer, named ("got dtype object" before)
    ([3, None], r"must be integers, got None \(NoneType\) at index 1"),
    ([Fraction(3)], r"must be integers, got Fraction\(3, 1\) \(Fraction\) at index 0"),
    # a whole float is a length ([2.0, 3] is taken), not the entry to blame
    ([2.0, None], r"must be integers, got None \(NoneType\) at index 1"),
    ([4.0, 2**70], r"must be at most 2,147,483,647 tokens .* at index 1"),
    # numpy's own ValueError ("inhomogeneous shape") passed a bare pytest.raises(ValueError)
    ([[1, 2], [3]], r"must be a flat list of integers, got nested lists of different lengths"),
])
def test_bad_lengths_rejected(bad, says):
    with pytest.raises(ValueError, match=r"^sequence lengths " + says):
        calculate_fwd_flops(bad, ModelSpec.from_preset("qwen3-0.6b"))


@pytest.mark.parametrize("flagged", [[True, 2], (3, np.True_), [5, 6, False]])
def test_a_bool_among_lengths_is_refused_not_read_as_a_token(flagged):
    """numpy reads [True, 2] as [1, 2]; an all-bool list or array is refused by its dtype."""
    i = next(i for i, x in enumerate(flagged) if isinstance(x, (bool, np.bool_)))
    with pytest.raises(ValueError, match=rf"must be integers, got (np\.)?{flagged[i]}_? at index {i}"):
        as_lengths(flagged)


@pytest.mark.parametrize("values", [[1.0, 2.0], [1, 2.0], [3, 10**6], [1.5, 2], [True, 2], [None, 1],
                                    ["a", 1], [0, 5], [2**31, 1]])
def test_an_object_array_of_lengths_reads_as_the_list_of_its_values(values):
    """The same answer, or the same refusal, for the array as for the list (an object array
    of whole floats said "must be integers, got dtype object" where the list passed)."""
    try:
        expected = as_lengths(values)
    except ValueError as err:
        with pytest.raises(ValueError, match=re.escape(str(err))):
            as_lengths(np.array(values, dtype=object))
    else:
        np.testing.assert_array_equal(as_lengths(np.array(values, dtype=object)), expected)


@pytest.mark.parametrize("too_long", [[2**31], [10**10], [1e20], [10**26, 5]])
def test_lengths_past_2_31_are_refused_not_wrapped(too_long):
    # L(L+1)/2 of 1e10 overflows int64: it printed a wrong (or negative) count before.
    with pytest.raises(ValueError, match=r"at most 2,147,483,647 tokens"):
        calculate_fwd_flops(too_long, ModelSpec.from_preset("qwen3-0.6b"))
    # An object array of ordinary ints is fine (it raised a bare StopIteration).
    assert calculate_fwd_flops(np.array([5, 6], dtype=object), "qwen3-0.6b") == calculate_fwd_flops(
        [5, 6], "qwen3-0.6b")
    longest = calculate_fwd_flops([2**31 - 1], ModelSpec.from_preset("qwen3-0.6b"))
    assert longest > calculate_fwd_flops([2**31 - 2], ModelSpec.from_preset("qwen3-0.6b")) > 0


def test_million_lengths_vectorised():
    # Speed is measured in benchmarks/bench_flops.py; here, that the per-sequence and the
    # exact totals agree at a million lengths.
    lengths = np.random.default_rng(0).integers(1, 32768, 1_000_000)
    spec = ModelSpec.from_preset("deepseek-v3")
    total = calculate_fwd_flops(lengths, spec)
    per_seq = sequence_fwd_flops(lengths, spec)
    assert np.isclose(per_seq.sum(), total, rtol=1e-9)


def test_exact_beyond_int64():
    # 2**21 sequences of 2**21 tokens: Σ L(L+1)/2 ≈ 2**62 would overflow an int64 sum.
    spec = ModelSpec.from_preset("qwen3-0.6b")
    lengths = np.full(1 << 21, 1 << 21)
    one = calculate_fwd_flops([1 << 21], spec)
    assert calculate_fwd_flops(lengths, spec) == (1 << 21) * one


def test_spec_by_name_and_a_clear_error_for_anything_else():
    from costmodel.model import load_cost_model

    assert calculate_fwd_flops([1000], "qwen3-8b") == calculate_fwd_flops(
        [1000], ModelSpec.from_preset("qwen3-8b"))
    for bad in (None, 5):
        with pytest.raises(ValueError, match="spec must be a ModelSpec, a preset name"):
            calculate_fwd_flops([1000], bad)
    with pytest.raises(ValueError, match="made for model 'qwen3-8b'"):
        load_cost_model("h200/qwen3-8b", spec="llama-3.1-8b")


def test_megatron_args_as_the_model_as_slime_calls_it():
    """slime's own calculate_fwd_flops(seqlens, args) takes Megatron's namespace: so does
    this one (and so does every spec= argument)."""
    import argparse

    args = argparse.Namespace(num_layers=36, hidden_size=4096, num_attention_heads=32,
                              group_query_attention=True, num_query_groups=8, kv_channels=128,
                              ffn_hidden_size=12288, vocab_size=151936, qk_layernorm=True,
                              untie_embeddings_and_output_weights=True)
    assert calculate_fwd_flops([512, 4096], args) == calculate_fwd_flops([512, 4096], "qwen3-8b")
    for partial in (argparse.Namespace(num_layers=2), argparse.Namespace(hidden_size=64)):
        with pytest.raises(ValueError, match="spec must be a ModelSpec.*or Megatron args"):
            calculate_fwd_flops([512], partial)


# -- edges a mutation run found untested ------------------------------------------------
SWA = dict(name="swa", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
           intermediate_size=128, vocab_size=100)


def test_per_sequence_flops_cap_sliding_window_layers_too():
    """The scheduler's per-sequence FLOPs window the window layers as the total does."""
    spec = ModelSpec(**SWA, sliding_window=8, sliding_window_layers=3)
    lengths = [20, 5, 8, 9, 1000]
    per_seq = sequence_fwd_flops(lengths, spec)
    assert per_seq.sum() == calculate_fwd_flops(lengths, spec)
    assert per_seq[0] == calculate_fwd_flops([20], spec)


def test_sum_past_int64_stays_exact():
    """Eight sequences of 2^31 - 1 tokens: ~2^61 pairs each, past int64 once summed."""
    spec = ModelSpec.from_preset("qwen3-0.6b")
    longest = 2**31 - 1  # L(L+1)/2 ~ 2**61: eight of them overflow an int64 sum
    assert calculate_fwd_flops([longest] * 8, spec) == 8 * calculate_fwd_flops([longest], spec)


def test_mla_without_query_compression_by_hand():
    """q_lora_rank = 0 (DeepSeek-V2-Lite): one direct query projection, nope + rope dims."""
    spec = ModelSpec(name="mla", num_layers=2, hidden_size=40, num_heads=4, num_kv_heads=4,
                     head_dim=0, intermediate_size=56, vocab_size=31, q_lora_rank=0,
                     kv_lora_rank=10, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    h, nh = 40, 4
    q = 2 * h * nh * (8 + 4)  # one direct projection to nope + rope
    kv = 2 * h * (10 + 4) + 2 * 10 * nh * (8 + 6)
    o = 2 * nh * 6 * h
    assert attention_projection_flops_per_token(spec) == q + kv + o == 8000


def test_masked_lengths_are_refused_not_read_through_the_mask():
    from costmodel.flops import as_lengths

    with pytest.raises(ValueError, match="has masked entries"):
        as_lengths(np.ma.masked_array([5, 6, 7], mask=[0, 1, 0]))
    assert as_lengths(np.ma.masked_array([5, 6, 7])).tolist() == [5, 6, 7]  # nothing masked


def test_an_object_array_is_refused_under_the_callers_name():
    """An object array is read as its list under the name the caller gave: its refusals name
    that, not "sequence lengths" (the array and list answers compared above use the default)."""
    for values in ([1.5, 2], [0, 5], [None, 1]):
        with pytest.raises(ValueError, match="^prompt lengths "):
            as_lengths(np.array(values, dtype=object), what="prompt lengths")


def test_part_flops_are_the_parts_a_cost_model_times():
    """One sequence's attention core, one layer's linear part, the LM head: what the
    calibration's FLOPs check and the load-time peak check both count."""
    from costmodel.flops import (
        attention_core_flops,
        layer_linear_flops,
        lm_head_flops_per_token,
        part_flops,
    )

    spec = ModelSpec.from_preset("qwen3-30b-a3b")
    sizes = [1, 100, 4096]
    assert part_flops("attention", sizes, spec).tolist() == attention_core_flops(sizes, spec).tolist()
    for moe in (False, True):
        assert (part_flops("linear", sizes, spec, moe=moe).tolist()
                == layer_linear_flops(sizes, spec, moe=moe).tolist())
    assert part_flops("head", sizes, spec).tolist() == [
        float(n * lm_head_flops_per_token(spec)) for n in sizes]
    with pytest.raises(ValueError, match="no FLOPs count for part 'mlp'; parts: attention"):
        part_flops("mlp", sizes, spec)
