"""ModelSpec: presets, HF config.json, Megatron args, and rejection of bad shapes."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from costmodel.spec import PRESETS, ModelSpec, preset_names

REQUIRED_PRESETS = [
    "qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b",
    "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "deepseek-v3",
]


def test_required_presets_exist():
    assert set(REQUIRED_PRESETS) <= set(preset_names())


def test_unknown_preset_lists_known():
    with pytest.raises(ValueError, match="qwen3-8b"):
        ModelSpec.from_preset("gpt-5")


def test_round_trip_and_fingerprint():
    for spec in PRESETS.values():
        again = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
        assert again == spec and again.fingerprint() == spec.fingerprint()
    fps = {s.fingerprint() for s in PRESETS.values()}
    assert len(fps) == len(PRESETS)
    assert len({s.shape_key() for s in PRESETS.values()}) == len(PRESETS)
    renamed = ModelSpec.from_dict({**PRESETS["qwen3-8b"].to_dict(), "name": "other"})
    assert renamed.fingerprint() == PRESETS["qwen3-8b"].fingerprint()


def test_from_dict_rejects_unknown_and_missing():
    with pytest.raises(ValueError, match="unknown ModelSpec fields"):
        ModelSpec.from_dict({**PRESETS["qwen3-8b"].to_dict(), "bogus": 1})
    d = PRESETS["qwen3-8b"].to_dict()
    del d["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        ModelSpec.from_dict(d)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_kv_heads": 5}, "not a multiple"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 4}, "num_experts_per_tok"),
        ({"num_experts": 8, "num_experts_per_tok": 2}, "moe_intermediate_size"),
        ({"kv_lora_rank": 8}, "qk_nope_head_dim"),
        ({"sliding_window_layers": 2}, "sliding_window"),
        ({"dtype": "int4"}, "dtype"),
        ({"num_layers": 2.5}, "num_layers"),
    ],
)
def test_inconsistent_shapes_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_dict({**PRESETS["qwen3-0.6b"].to_dict(), **change})


def _write(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


QWEN3_8B_HF = {
    "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 12288, "vocab_size": 151936, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "sliding_window": None,
}


def test_hf_qwen3_matches_preset(tmp_path):
    spec = ModelSpec.from_hf_config(_write(tmp_path, QWEN3_8B_HF))
    assert spec.fingerprint() == PRESETS["qwen3-8b"].fingerprint()
    assert ModelSpec.from_any(tmp_path / "config.json") == spec


def test_a_config_under_another_name_gets_the_measured_profile_of_its_shape(tmp_path):
    from costmodel.model import load_cost_model

    path = tmp_path / "my-finetune.json"
    path.write_text(json.dumps(QWEN3_8B_HF))
    spec = ModelSpec.from_any(path)
    assert spec.name != "qwen3-8b"
    model = load_cost_model("h200", spec=spec)
    assert not model.is_estimate and model.spec.name == "qwen3-8b"
    assert load_cost_model(f"h200/{spec.name}", spec=spec).extra["source"] == model.extra["source"]
    # another shape under its own name still gets the registry estimate, and so does one
    # that happens to carry a shipped profile's name (a folder called qwen3-8b)
    other = ModelSpec.from_dict({**PRESETS["qwen3-8b"].to_dict(), "name": "mine", "num_layers": 30})
    assert load_cost_model("h200", spec=other).is_estimate
    misnamed = ModelSpec.from_dict({**other.to_dict(), "name": "qwen3-8b"})
    assert load_cost_model("h200", spec=misnamed).is_estimate
    with pytest.raises(ValueError, match="made for model 'qwen3-8b'"):
        load_cost_model("h200/qwen3-8b", spec=misnamed)  # asked for by name: the shape is checked


def test_hf_sliding_window_with_null_max_window_layers(tmp_path):
    # A TypeError before; null means no layer past the full-attention ones.
    cfg = {**QWEN3_8B_HF, "use_sliding_window": True, "sliding_window": 4096,
           "max_window_layers": None}
    assert ModelSpec.from_hf_config(_write(tmp_path, cfg)).sliding_window_layers == 0


def test_hf_llama_defaults_head_dim(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256}
    spec = ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert spec.fingerprint() == PRESETS["llama-3.1-8b"].fingerprint()


def test_hf_mistral_sliding_window(tmp_path):
    cfg = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 32000, "sliding_window": 4096}
    spec = ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert (spec.sliding_window, spec.sliding_window_layers) == (4096, 32)


def test_hf_qwen2_window_layers(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
           "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
           "vocab_size": 152064, "use_sliding_window": True, "sliding_window": 4096,
           "max_window_layers": 21}
    spec = ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert (spec.sliding_window, spec.sliding_window_layers) == (4096, 7)


def test_hf_qwen3_moe(tmp_path):
    cfg = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
           "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
           "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
           "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "vocab_size": 151936}
    spec = ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert spec.fingerprint() == PRESETS["qwen3-30b-a3b"].fingerprint()
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[1])
    sparse = ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert sparse.moe_layer_ids() == tuple(range(3, 48, 2))


def test_hf_deepseek_v3(tmp_path):
    cfg = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
           "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
           "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
           "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280}
    spec = ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert spec.fingerprint() == PRESETS["deepseek-v3"].fingerprint()


def test_hf_errors(tmp_path):
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        ModelSpec.from_hf_config(_write(tmp_path, {"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="'num_hidden_layers'"):
        ModelSpec.from_hf_config(_write(tmp_path, {**QWEN3_8B_HF, "num_hidden_layers": None}))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelSpec.from_hf_config(tmp_path)
    with pytest.raises(FileNotFoundError):
        ModelSpec.from_hf_config(tmp_path / "missing")


def _megatron(**kw):
    base = dict(num_layers=36, hidden_size=4096, num_attention_heads=32,
                group_query_attention=True, num_query_groups=8, kv_channels=128,
                ffn_hidden_size=12288, vocab_size=151936, swiglu=True, qk_layernorm=True,
                untie_embeddings_and_output_weights=True)
    return argparse.Namespace(**{**base, **kw})


def test_megatron_dense_matches_preset():
    spec = ModelSpec.from_megatron_args(_megatron())
    assert spec.fingerprint() == PRESETS["qwen3-8b"].fingerprint()


def test_megatron_window_counts_the_query_itself():
    """Megatron's window_size=(left, 0) is inclusive (keys i-left..i, as in flash-attn and
    Transformer Engine): left + 1 keys, where ModelSpec.sliding_window counts the keys a
    query sees, itself included (HF's convention). It was stored as left: one key short."""
    from costmodel.flops import causal_pairs

    spec = ModelSpec.from_megatron_args(_megatron(window_size=(4, 0)))
    assert (spec.sliding_window, spec.sliding_window_layers) == (5, 36)
    # 8 tokens, keys i-4..i each: 1+2+3+4+5+5+5+5 = 30 pairs.
    assert causal_pairs([8], spec.sliding_window).tolist() == [30]


def test_megatron_default_ffn_is_megatrons_swiglu_default():
    # ffn_hidden_size None is filled by Megatron as int(4h·2/3 / 64)·64 for SwiGLU; 4h
    # overcounted dense-MLP FLOPs 1.5x.
    assert ModelSpec.from_megatron_args(_megatron(ffn_hidden_size=None)).intermediate_size == 10880
    for bad in (dict(num_attention_heads=0), dict(hidden_size="4096"), dict(window_size=4096.7)):
        with pytest.raises(ValueError, match="Megatron args: "):
            ModelSpec.from_megatron_args(_megatron(**bad))


def test_megatron_moe_layer_patterns():
    moe = dict(num_layers=94, num_attention_heads=64, num_query_groups=4, num_experts=128,
               moe_ffn_hidden_size=1536, moe_router_topk=8)
    listed = ModelSpec.from_megatron_args(_megatron(**moe, moe_layer_freq=[1] * 94))
    assert listed.fingerprint() == PRESETS["qwen3-235b-a22b"].fingerprint()
    expr = ModelSpec.from_megatron_args(_megatron(**moe, moe_layer_freq="([0]*3+[1]*91)"))
    assert expr.num_dense_layers == 3 and expr.moe_layer_ids()[0] == 3
    every_other = ModelSpec.from_megatron_args(_megatron(**moe, moe_layer_freq=2))
    assert every_other.num_moe_layers == 47
    for bad in ("__import__('os')", "[0]+1", "[0]*100000000000"):  # code; TypeError; MemoryError
        with pytest.raises(ValueError, match="a pattern of lists of 0/1 per layer"):
            ModelSpec.from_megatron_args(_megatron(**moe, moe_layer_freq=bad))
    with pytest.raises(ValueError, match="moe_layer_freq must be an int"):
        ModelSpec.from_megatron_args(_megatron(**moe, moe_layer_freq=1.5))
    with pytest.raises(ValueError, match="each of the 94 layers"):
        ModelSpec.from_megatron_args(_megatron(**moe, moe_layer_freq=[1] * 3))


@pytest.mark.parametrize("qk_layernorm", [False, True])
def test_megatron_mla(qk_layernorm):
    """DeepSeek-V3 trains with --qk-layernorm, which for MLA norms the q/kv latents: the
    shape is the preset's either way (it read as qk_norm and missed the profile)."""
    args = _megatron(num_layers=61, hidden_size=7168, num_attention_heads=128,
                     num_query_groups=None, ffn_hidden_size=18432, vocab_size=129280,
                     multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512,
                     qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, num_experts=256,
                     moe_ffn_hidden_size=2048, moe_router_topk=8,
                     moe_shared_expert_intermediate_size=2048,
                     moe_layer_freq="[0]*3+[1]*58", qk_layernorm=qk_layernorm)
    spec = ModelSpec.from_megatron_args(args)
    assert spec.fingerprint() == PRESETS["deepseek-v3"].fingerprint()


def test_megatron_huge_layer_count_is_refused_before_listing_layers():
    args = _megatron()
    args.num_layers, args.num_experts, args.moe_router_topk = 10**9, 8, 2
    with pytest.raises(ValueError, match="num_layers is 1,000,000,000, past the largest"):
        ModelSpec.from_megatron_args(args)


def test_megatron_missing_field():
    args = _megatron()
    del args.hidden_size
    with pytest.raises(ValueError, match="hidden_size"):
        ModelSpec.from_megatron_args(args)


@pytest.mark.parametrize("field, value, message", [
    ("num_attention_heads", 0, "'num_attention_heads' must be a positive integer, got 0"),
    ("hidden_size", "big", "'hidden_size' must be a positive integer, got 'big'"),
    ("num_key_value_heads", 0, "'num_key_value_heads' must be a positive integer, got 0"),
    ("use_sliding_window", "false", "'use_sliding_window' must be true or false, got 'false'"),
    ("tie_word_embeddings", "false", "'tie_word_embeddings' must be true or false"),
    ("mlp_only_layers", [-1, 999], "'mlp_only_layers' must be a list of layer indices"),
    ("num_hidden_layers", 10**9, "'num_hidden_layers' is 1,000,000,000, past the largest"),
    ("max_window_layers", "x", "'max_window_layers' must be a non-negative integer"),
    ("mlp_only_layers", 3, "'mlp_only_layers' must be a list of layer indices"),
    ("decoder_sparse_step", "2", "'decoder_sparse_step' must be a positive integer"),
])
def test_malformed_hf_config_fields_are_named(tmp_path, field, value, message):
    cfg = {"model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "vocab_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, field: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"config.json: config field {message}"):
        ModelSpec.from_hf_config(path)


@pytest.mark.parametrize("fields, expected, warned", [
    ({"torch_dtype": "float16"}, "fp16", None), ({"dtype": "float32"}, "fp32", None),
    ({"torch_dtype": None}, "bf16", None), ({}, "bf16", None),
    ({"torch_dtype": "half"}, "fp16", None), ({"torch_dtype": "torch.float32"}, "fp32", None),
    ({"torch_dtype": "float"}, "fp32", None),  # torch's name: fp32, not bf16's half the bytes
    # the first key that names a dtype: "" or "auto" in torch_dtype defers to dtype
    ({"torch_dtype": "", "dtype": "float16"}, "fp16", None),
    ({"torch_dtype": "auto", "dtype": "float16"}, "fp16", None),
    ({"torch_dtype": "bfloat16", "dtype": "float32"}, "bf16", None),
    ({"torch_dtype": "auto"}, "bf16", "'torch_dtype' is 'auto'"),
    ({"dtype": "float8_e4m3fn"}, "bf16", "'dtype' is 'float8_e4m3fn'"),
    ({"torch_dtype": 8}, "bf16", "'torch_dtype' is 8"),
])
def test_hf_dtype_reads_known_names_and_warns_on_others(tmp_path, caplog, fields, expected, warned):
    # "auto" or fp8 still describes a shape FLOPs can be counted for; refusing it stopped even
    # `costmodel flops`, and calibrate times in its own --dtype.
    cfg = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "vocab_size": 128, "intermediate_size": 96, **fields}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert ModelSpec.from_hf_config(path).dtype == expected
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if warned is None:
        assert not warnings
    else:
        assert len(warnings) == 1 and f"config field {warned}, not one of" in warnings[0]


@pytest.mark.parametrize("change, message", [
    # A typo of 1e9 layers: refused, not a loop over a billion layers (it hung).
    (dict(num_layers=10**9, moe_layers=None), "num_layers=1000000000 is past the largest accepted"),
    (dict(vocab_size=10**30), "vocab_size=.* is past the largest accepted"),
    (dict(tie_word_embeddings="false"), "tie_word_embeddings must be true or false"),
    (dict(qk_norm="no"), "qk_norm must be true or false"),
    (dict(name=5), "name must be a string"),
])
def test_spec_refuses_nonsense_values(change, message):
    base = PRESETS["qwen3-30b-a3b"].to_dict()
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**base, **change})


def test_spec_takes_numpy_scalars_as_python_values():
    import numpy as np

    base = PRESETS["qwen3-30b-a3b"].to_dict()
    spec = ModelSpec(**{**base, "num_layers": np.int64(48), "qk_norm": np.bool_(True),
                        "moe_layers": [np.int32(i) for i in range(48)]})
    assert type(spec.num_layers) is int and spec.qk_norm is True
    assert spec.fingerprint() == PRESETS["qwen3-30b-a3b"].fingerprint()
    json.dumps(spec.to_dict())  # serialisable as plain JSON


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_hf_config_defaults_kv_heads_to_heads_and_head_dim_to_hidden_over_heads(tmp_path):
    """As transformers reads a config without them: no num_key_value_heads is MHA, no
    head_dim is hidden_size // num_attention_heads (896 / 14 = 64, not the usual 128)."""
    cfg = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
           "num_attention_heads": 14, "intermediate_size": 4864, "vocab_size": 151936}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert (spec.num_kv_heads, spec.head_dim) == (14, 64)


# layers, hidden, heads, KV heads, head dim, (dense) intermediate size, vocabulary: from each
# model's published config.json (head dim 0: MLA, which has its own per-head dims).
PUBLISHED = {
    "qwen3-0.6b": (28, 1024, 16, 8, 128, 3072, 151936),
    "qwen3-4b": (36, 2560, 32, 8, 128, 9728, 151936),
    "qwen3-8b": (36, 4096, 32, 8, 128, 12288, 151936),
    "qwen3-32b": (64, 5120, 64, 8, 128, 25600, 151936),
    "qwen3-30b-a3b": (48, 2048, 32, 4, 128, 6144, 151936),
    "qwen3-235b-a22b": (94, 4096, 64, 4, 128, 12288, 151936),
    "llama-3.1-8b": (32, 4096, 32, 8, 128, 14336, 128256),
    "llama-3.1-70b": (80, 8192, 64, 8, 128, 28672, 128256),
    "qwen2.5-7b": (28, 3584, 28, 4, 128, 18944, 152064),
    "deepseek-v3": (61, 7168, 128, 128, 0, 18432, 129280),
}


def test_presets_hold_the_published_numbers():
    assert sorted(PUBLISHED) == sorted(preset_names())
    for name, numbers in PUBLISHED.items():
        s = ModelSpec.from_preset(name)
        assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim,
                s.intermediate_size, s.vocab_size) == numbers, name


def test_preset_names_ignore_case():
    assert ModelSpec.from_preset("Qwen3-8B") == ModelSpec.from_preset("qwen3-8b")
    assert ModelSpec.from_any("Qwen3-8B") == ModelSpec.from_preset("qwen3-8b")


def test_moe_layer_freq_counts_from_layer_zero_after_the_dense_ones():
    """DeepSeek's rule: past the first k dense layers, layer i is MoE when i % freq == 0."""
    s = ModelSpec(num_layers=6, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16,
                  intermediate_size=128, vocab_size=100, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=32, first_k_dense_layers=1, moe_layer_freq=2)
    assert s.moe_layer_ids() == (2, 4)


@pytest.mark.parametrize("tp, padded", [(1, 151936), (2, 152064), (4, 152064), (8, 152576)])
def test_megatrons_vocab_padding_keeps_the_shape_key(tp, padded):
    """Megatron pads the vocabulary to a multiple of 128 x TP: the padded model matches the
    cost model of its config.json, and a vocabulary 1,024 larger does not."""
    spec = PRESETS["qwen3-8b"]
    assert -(-spec.vocab_size // (128 * tp)) * 128 * tp == padded
    padded_spec = ModelSpec.from_dict({**spec.to_dict(), "vocab_size": padded})
    assert padded_spec.shape_key() == spec.shape_key()
    assert (padded_spec.fingerprint() == spec.fingerprint()) == (tp == 1)
    other = ModelSpec.from_dict({**spec.to_dict(), "vocab_size": spec.vocab_size + 1024})
    assert other.shape_key() != spec.shape_key()


def test_a_padded_vocabulary_gets_a_registry_estimate_of_its_model_too():
    """No shipped H100 profile: the estimate is built for the preset named, and a padded
    vocabulary of the same model is that model's shape."""
    from costmodel.model import load_cost_model

    padded = ModelSpec.from_dict({**PRESETS["qwen3-8b"].to_dict(), "vocab_size": 152064,
                                  "name": "megatron"})
    model = load_cost_model("h100/qwen3-8b", spec=padded)
    assert model.is_estimate and model.spec.name == "qwen3-8b"


# -- edges a mutation run found untested ------------------------------------------------
SMALL = dict(name="small", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
             intermediate_size=128, vocab_size=100)


def _hf(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return ModelSpec.from_hf_config(tmp_path)


@pytest.mark.parametrize("change, field", [
    (dict(sliding_window=8, sliding_window_layers=5), "sliding_window_layers"),
    (dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
          moe_layers=(1, 1)), "moe_layers"),
    (dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
          first_k_dense_layers=5), "first_k_dense_layers"),
    (dict(intermediate_size=0), "intermediate_size"),
])
def test_more_inconsistent_shapes_are_refused(change, field):
    with pytest.raises(ValueError, match=field):
        ModelSpec(**{**SMALL, **change})


_DS = {"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 4,
       "num_hidden_layers": 4, "vocab_size": 100, "intermediate_size": 96,
       "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
       "n_shared_experts": 2, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
       "qk_rope_head_dim": 4, "v_head_dim": 8, "first_k_dense_replace": 1, "moe_layer_freq": 1}


def test_hf_deepseek_shared_experts_are_count_times_width(tmp_path):
    spec = _hf(tmp_path, _DS)  # Moonlight-16B-A3B (deepseek_v3) has 2 shared experts
    assert spec.shared_expert_intermediate_size == 2 * 32
    assert spec.q_lora_rank == 0 and spec.moe_layer_ids() == (1, 2, 3)


def test_hf_qwen2_moe_reads_its_shared_expert(tmp_path):
    spec = _hf(tmp_path, {"model_type": "qwen2_moe", "hidden_size": 64, "num_attention_heads": 4,
                          "num_hidden_layers": 4, "vocab_size": 100, "intermediate_size": 96,
                          "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
                          "shared_expert_intermediate_size": 128})
    assert spec.shared_expert_intermediate_size == 128


def test_hf_qwen2_window_needs_use_sliding_window(tmp_path):
    # Qwen2.5-0.5B's published config: a window and max_window_layers < layers, but off.
    cfg = {"model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14,
           "num_key_value_heads": 2, "num_hidden_layers": 24, "vocab_size": 151936,
           "intermediate_size": 4864, "sliding_window": 32768, "max_window_layers": 21,
           "use_sliding_window": False}
    assert _hf(tmp_path, cfg).sliding_window_layers == 0
    on = _hf(tmp_path, {**cfg, "use_sliding_window": True})
    assert (on.sliding_window, on.sliding_window_layers) == (32768, 3)


def test_hf_qwen2_max_window_layers_past_the_model_means_no_window_layers(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 4, "vocab_size": 100, "intermediate_size": 96,
           "sliding_window": 16, "max_window_layers": 28, "use_sliding_window": True}
    assert _hf(tmp_path, cfg).sliding_window_layers == 0


def _small_megatron(**kw):
    base = dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=100,
                ffn_hidden_size=96)
    return argparse.Namespace(**{**base, **kw})


def test_megatron_int_moe_layer_freq_starts_at_layer_zero():
    spec = ModelSpec.from_megatron_args(_small_megatron(num_experts=8, moe_router_topk=2,
                                                  moe_ffn_hidden_size=32, moe_layer_freq=2))
    assert spec.moe_layer_ids() == (0, 2)


def test_megatron_prefers_the_padded_vocabulary():
    spec = ModelSpec.from_megatron_args(_small_megatron(vocab_size=100, padded_vocab_size=128))
    assert spec.vocab_size == 128


def test_a_tensor_parallel_shard_is_what_one_rank_computes():
    spec = ModelSpec.from_preset("qwen3-32b")  # 64 query heads, 8 KV heads, MLP 25,600
    assert spec.shard(1) is spec
    four = spec.shard(4)
    assert (four.num_heads, four.num_kv_heads, four.intermediate_size) == (16, 2, 6400)
    assert four.vocab_size == 152064 // 4  # padded to a multiple of 128 x 4 first, as Megatron
    assert (four.hidden_size, four.num_layers, four.head_dim) == (5120, 64, 128)
    assert four.name == "qwen3-32b (TP 4 rank)" and four.fingerprint() != spec.fingerprint()
    sixteen = spec.shard(16)  # fewer KV heads than ranks: one each, replicated
    assert (sixteen.num_heads, sixteen.num_kv_heads) == (4, 1)
    moe = ModelSpec.from_preset("qwen3-30b-a3b").shard(4)  # expert TP = TP, every expert here
    assert (moe.moe_intermediate_size, moe.num_experts, moe.num_experts_per_tok) == (192, 128, 8)
    whole = ModelSpec.from_preset("qwen3-30b-a3b").shard(4, expert_tensor_parallel=1)
    assert (whole.num_heads, whole.intermediate_size, whole.moe_intermediate_size) == (8, 1536, 768)
    assert whole.name == "qwen3-30b-a3b (TP 4, expert TP 1 rank)"
    assert spec.shard(4, expert_tensor_parallel=1) == four  # a dense model has no experts
    mla = ModelSpec.from_preset("deepseek-v3").shard(8, 1)  # low-rank projections stay whole
    assert (mla.num_heads, mla.num_kv_heads, mla.q_lora_rank, mla.kv_lora_rank) == (16, 16, 1536, 512)
    assert (mla.shared_expert_intermediate_size, mla.moe_intermediate_size) == (256, 2048)


@pytest.mark.parametrize("tp, message", [
    (3, r"num_heads=64, intermediate_size=25600, num_kv_heads=8 do not split evenly over TP 3; "
        r"the TP sizes up to 64 "
        r"that split it: 1, 2, 4, 8, 16, 32, 64"),
    (128, "num_heads=64 does not split evenly over TP 128"),
    (0, "tensor_parallel must be an integer >= 1, got 0"),
    ((2, 5), r"moe_intermediate_size=768 does not split evenly over TP 2 \(experts over 5\); "
             r"the TP sizes up to 64 that split it with expert TP 5: none"),
    (2.0, "tensor_parallel must be an integer >= 1"),
])
def test_a_tensor_parallel_size_the_model_does_not_split_by_is_refused(tp, message):
    spec = ModelSpec.from_preset("qwen3-30b-a3b" if isinstance(tp, tuple) else "qwen3-32b")
    with pytest.raises(ValueError, match=message):
        spec.shard(*tp) if isinstance(tp, tuple) else spec.shard(tp)


def test_the_tp_ranks_of_a_shard_do_the_whole_models_matmuls_between_them():
    """Every preset at every TP that splits it without replicating KV heads: tp shards'
    FLOPs add up to the whole model's, but for what Megatron keeps whole on every rank
    (MLA's down-projections, the router) and the vocabulary's padding."""
    from costmodel import flops

    for spec in PRESETS.values():
        for tp in (t for t in range(2, 65) if spec.num_kv_heads % t == 0):
            for etp in (None, 1):
                try:
                    rank = spec.shard(tp, etp)
                except ValueError:
                    continue
                kept = 0  # per-token FLOPs every rank repeats
                if spec.is_mla:
                    h = spec.hidden_size
                    kept = 2 * h * spec.q_lora_rank + 2 * h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
                projections = flops.attention_projection_flops_per_token
                assert tp * (projections(rank) - kept) == projections(spec) - kept, (spec.name, tp)
                assert tp * flops.attention_flops_per_pair(rank) == flops.attention_flops_per_pair(spec)
                assert tp * rank.intermediate_size == spec.intermediate_size
                if spec.is_moe:
                    whole, part = (flops.mlp_flops_per_token(s, moe=True) for s in (spec, rank))
                    assert part["moe_router"] == whole["moe_router"]
                    assert (etp or tp) * part["moe_experts"] == whole["moe_experts"]
                    assert tp * part["moe_shared_experts"] == whole["moe_shared_experts"]
                padded = -(-spec.vocab_size // (128 * tp)) * 128 * tp
                assert tp * flops.lm_head_flops_per_token(rank) == 2 * spec.hidden_size * padded


def test_a_dense_model_ignores_expert_tensor_parallelism():
    """A dense model has no experts: its shard under any expert TP is TP's (the model itself
    at TP 1, as CostModel records it), and a refusal names no expert TP."""
    spec = ModelSpec.from_preset("qwen3-8b")
    assert spec.shard(1, expert_tensor_parallel=4) is spec
    odd = dataclasses.replace(spec, name="odd", vocab_size=32064)  # not a multiple of 128
    assert odd.shard(1, 2) is odd and odd.shard(2, 8) == odd.shard(2)
    with pytest.raises(ValueError) as err:
        spec.shard(3, 7)
    assert "expert" not in str(err.value)
    assert str(err.value).endswith("the TP sizes up to 64 that split it: 1, 2, 4, 8, 16, 32")
