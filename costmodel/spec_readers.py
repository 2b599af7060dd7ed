"""Read a `ModelSpec` from a Hugging Face config.json or from Megatron-style arguments.

Only the fields that change the cost of a micro-batch are read (see `costmodel.spec`);
each reader names the file or argument that is missing or wrong.
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from costmodel.spec import MAX_LAYERS, ModelSpec

__all__ = ["HF_MODEL_TYPES", "read_hf_config", "read_megatron_args"]

logger = logging.getLogger(__name__)


def read_hf_config(path: str | Path) -> ModelSpec:
    """A Hugging Face `config.json` (the file or its folder), without transformers."""
    cfg = _read_json(path)  # names the file in its own errors
    try:
        return _from_hf(cfg, name=_config_name(path))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def read_megatron_args(ns: Any) -> ModelSpec:
    """Megatron-style argument names (an argparse Namespace or any object)."""
    return _from_megatron(ns)


# ---- Hugging Face config.json ----------------------------------------------------------
HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v3")


def _read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"no config.json at {p}")
    try:
        data = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # incl. JSONDecodeError
        raise ValueError(f"{p} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a JSON object at top level")
    return data


def _config_name(path: str | Path) -> str:
    p = Path(path)
    return p.name if p.is_dir() else p.parent.name or p.stem


def _check_layer_count(layers: int | None, what: str) -> None:
    """Before a reader lists the layers (ModelSpec refuses the count too, but only after)."""
    if layers is not None and layers > MAX_LAYERS:
        raise ValueError(f"{what} is {layers:,}, past the largest accepted ({MAX_LAYERS:,}); "
                         "check it for a typo")


def _need(cfg: Mapping[str, Any], key: str, model_type: str) -> Any:
    if cfg.get(key) is None:
        raise ValueError(f"{model_type} config is missing the field {key!r}")
    return cfg[key]


# The integer fields the reader uses: each, when present, a non-negative integer; these
# divide or step, so at least 1.
_HF_INT_FIELDS = (
    "hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
    "head_dim", "intermediate_size", "vocab_size", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "n_routed_experts", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq",
    "sliding_window", "max_window_layers",
)
_HF_AT_LEAST_ONE = (
    "hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "head_dim",
    "vocab_size", "decoder_sparse_step", "moe_layer_freq", "kv_lora_rank",
)
_HF_BOOL_FIELDS = ("tie_word_embeddings", "use_sliding_window")
# torch_dtype / dtype -> ModelSpec.dtype; absent (null) reads as bf16, what RL trains in.
# Aliases too: torch's own ("half", "float"), "torch.float16", and ModelSpec's names.
_HF_DTYPES = {
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "float32": "fp32", "float": "fp32", "fp32": "fp32",
}


def _check_hf_types(cfg: Mapping[str, Any]) -> None:
    for key in _HF_INT_FIELDS:
        value = cfg.get(key)
        if value is None:
            continue
        low = 1 if key in _HF_AT_LEAST_ONE else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            kind = "a positive" if low else "a non-negative"
            raise ValueError(f"config field {key!r} must be {kind} integer, got {value!r}")
    _check_layer_count(cfg.get("num_hidden_layers"), "config field 'num_hidden_layers'")
    for key in _HF_BOOL_FIELDS:  # a string "false" would read as true
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise ValueError(f"config field {key!r} must be true or false, got {cfg[key]!r:.60}")
    only = cfg.get("mlp_only_layers")
    layers = cfg.get("num_hidden_layers")
    if only is not None and (not isinstance(only, list)
                             or not all(isinstance(i, int) and not isinstance(i, bool) for i in only)
                             or (layers is not None and not all(0 <= i < layers for i in only))):
        raise ValueError(f"config field 'mlp_only_layers' must be a list of layer indices "
                         f"(0..num_hidden_layers - 1), got {only!r:.80}")


def _from_hf(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    _check_hf_types(cfg)
    model_type = cfg.get("model_type")
    if model_type is None:
        if isinstance(cfg.get("schema"), str) and cfg["schema"].startswith("costmodel/"):
            # `--model calibrated.json`: the cost model goes where a cost model is asked for
            # (--cost-model: schedule, simulate, bench-schedule and the training flags; only
            # schedule has --cost, and calibrate and flops take none), its model as --model.
            made_for = cfg.get("spec", {}).get("name") if isinstance(cfg.get("spec"), Mapping) else None
            of = f" (for model {made_for!r})" if isinstance(made_for, str) and made_for else ""
            raise ValueError(f"this is a cost model file{of}, not a model's config.json: give "
                             "the model as a preset or config.json, and this file where a "
                             "cost model is asked for (--cost-model)")
        raise ValueError("config has no 'model_type' field; is this a Hugging Face config.json?")
    if model_type not in HF_MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(HF_MODEL_TYPES)}"
        )
    need = lambda key: _need(cfg, key, model_type)
    hidden, heads, layers = need("hidden_size"), need("num_attention_heads"), need("num_hidden_layers")
    kw: dict[str, Any] = dict(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        intermediate_size=cfg.get("intermediate_size") or 0,
        vocab_size=need("vocab_size"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        dtype=_hf_dtype(cfg),
    )
    if model_type in ("qwen2_moe", "qwen3_moe"):
        num_experts = need("num_experts")
        step = cfg.get("decoder_sparse_step") or 1
        dense_only = set(cfg.get("mlp_only_layers") or [])
        # HF: layer i is sparse iff i not in mlp_only_layers and (i + 1) % step == 0.
        kw.update(
            num_experts=num_experts,
            num_experts_per_tok=need("num_experts_per_tok"),
            moe_intermediate_size=need("moe_intermediate_size"),
            shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size") or 0,
            moe_layers=tuple(
                i for i in range(layers) if i not in dense_only and (i + 1) % step == 0
            ),
        )
    if model_type == "deepseek_v3":
        moe_width = need("moe_intermediate_size")
        kw.update(
            num_kv_heads=heads,  # MLA: every head has its own key/value after up-projection
            head_dim=0,
            q_lora_rank=cfg.get("q_lora_rank") or 0,
            kv_lora_rank=need("kv_lora_rank"),
            qk_nope_head_dim=need("qk_nope_head_dim"),
            qk_rope_head_dim=need("qk_rope_head_dim"),
            v_head_dim=need("v_head_dim"),
            num_experts=need("n_routed_experts"),
            num_experts_per_tok=need("num_experts_per_tok"),
            moe_intermediate_size=moe_width,
            shared_expert_intermediate_size=(cfg.get("n_shared_experts") or 0) * moe_width,
            first_k_dense_layers=cfg.get("first_k_dense_replace") or 0,
            moe_layer_freq=cfg.get("moe_layer_freq") or 1,
        )
    kw.update(_hf_sliding_window(cfg, model_type, layers))
    return ModelSpec(**kw)


def _hf_sliding_window(cfg: Mapping[str, Any], model_type: str, layers: int) -> dict[str, int]:
    window = cfg.get("sliding_window") or 0
    if not window:
        return {}
    if model_type == "mistral":
        return {"sliding_window": window, "sliding_window_layers": layers}
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and cfg.get("use_sliding_window"):
        # HF Qwen2/3: layers with index >= max_window_layers use the window.
        first = cfg.get("max_window_layers")
        first = layers if first is None else first  # null in some configs: no window layers
        return {"sliding_window": window, "sliding_window_layers": max(0, layers - first)}
    return {}


def _hf_dtype(cfg: Mapping[str, Any]) -> str:
    """The dtype the model trains in: the first of ``torch_dtype`` and ``dtype`` (newer
    transformers) that names one. A value this project does not time ("auto", fp8) reads as
    bf16 with a warning rather than an error: the shape still serves for FLOPs, and
    calibrate times in its own --dtype anyway."""
    given = {key: cfg[key] for key in ("torch_dtype", "dtype") if cfg.get(key) not in (None, "")}
    for value in given.values():
        name = value.removeprefix("torch.") if isinstance(value, str) else None
        if name in _HF_DTYPES:
            return _HF_DTYPES[name]
    if given:
        key, value = next(iter(given.items()))
        logger.warning("config field %r is %.40r, not one of bfloat16, float16, float32 (or "
                       "their aliases); reading the model as bf16 (calibrate --dtype chooses "
                       "what is timed)", key, value)
    return "bf16"


# ---- Megatron-style arguments ----------------------------------------------------------
def _from_megatron(ns: Any) -> ModelSpec:
    get = lambda key, default=None: getattr(ns, key, default)

    def need(key: str) -> Any:
        if get(key) is None:
            raise ValueError(f"Megatron args are missing {key!r}")
        return get(key)

    hidden, heads, layers = need("hidden_size"), need("num_attention_heads"), need("num_layers")
    for key, value in (("hidden_size", hidden), ("num_attention_heads", heads), ("num_layers", layers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Megatron args: {key} must be a positive integer, got {value!r}")
    _check_layer_count(layers, "Megatron args: num_layers")
    groups = get("num_query_groups") if get("group_query_attention", True) else None
    vocab = get("padded_vocab_size") or get("vocab_size")
    if vocab is None:
        raise ValueError("Megatron args are missing 'vocab_size' (or 'padded_vocab_size')")
    kw: dict[str, Any] = dict(
        name=get("model_name") or "megatron",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=groups or heads,
        head_dim=get("kv_channels") or hidden // heads,
        # Megatron's own default for SwiGLU (the only MLP here): 2/3 of 4h, a multiple of 64.
        intermediate_size=get("ffn_hidden_size") or int(4 * hidden * 2 / 3 / 64) * 64,
        vocab_size=vocab,
        tie_word_embeddings=not get("untie_embeddings_and_output_weights", False),
        qk_norm=bool(get("qk_layernorm", False)),
    )
    if get("swiglu") is False:
        raise ValueError("only SwiGLU MLPs are supported; pass --swiglu")
    num_experts = get("num_experts") or 0
    if num_experts:
        kw.update(
            num_experts=num_experts,
            num_experts_per_tok=need("moe_router_topk"),
            moe_intermediate_size=get("moe_ffn_hidden_size") or kw["intermediate_size"],
            shared_expert_intermediate_size=get("moe_shared_expert_intermediate_size") or 0,
            moe_layers=_megatron_moe_layers(get("moe_layer_freq", 1), layers),
        )
    if get("multi_latent_attention", False):
        kw.update(
            num_kv_heads=heads,
            head_dim=0,
            # MLA's --qk-layernorm norms the q and kv latents, not per-head q/k (the HF
            # config's qk_norm); read as qk_norm it missed the DeepSeek-V3 profile's shape.
            qk_norm=False,
            q_lora_rank=get("q_lora_rank") or 0,
            kv_lora_rank=need("kv_lora_rank"),
            qk_nope_head_dim=need("qk_head_dim"),
            qk_rope_head_dim=need("qk_pos_emb_head_dim"),
            v_head_dim=need("v_head_dim"),
        )
    window = get("window_size")
    if window:
        left = window[0] if isinstance(window, (tuple, list)) else window
        if isinstance(left, bool) or not isinstance(left, int):
            raise ValueError(f"Megatron args: window_size must be an int or (left, right) ints, "
                             f"got {window!r}")
        if left > 0:
            # Megatron / Transformer Engine (left, right) is inclusive, as in flash-attn: a
            # query sees keys i-left..i, left + 1 of them; ModelSpec's window counts the keys
            # a query sees, itself included (HF's sliding_window).
            kw.update(sliding_window=left + 1, sliding_window_layers=layers)
    return ModelSpec(**kw)


def _megatron_moe_layers(freq: Any, layers: int) -> tuple[int, ...]:
    """Megatron's --moe-layer-freq: an int f (layer i is MoE iff i % f == 0), a list of
    0/1 per layer, or that list as a Python expression such as "([0]*3+[1]*58)"."""
    if isinstance(freq, str):
        freq = _eval_layer_pattern(freq)
    if isinstance(freq, bool) or not isinstance(freq, (int, list, tuple)):
        raise ValueError(f"moe_layer_freq must be an int, a 0/1 list per layer, or that list as "
                         f"a string, got {freq!r:.60}")
    if isinstance(freq, int):
        if freq < 1:
            raise ValueError(f"moe_layer_freq must be >= 1, got {freq}")
        return tuple(i for i in range(layers) if i % freq == 0)
    pattern = list(freq)
    if len(pattern) != layers or any(p not in (0, 1) for p in pattern):
        raise ValueError(
            f"moe_layer_freq pattern must list 0/1 for each of the {layers} layers, got "
            f"{len(pattern)} entries: {pattern!r:.80}"
        )
    return tuple(i for i, p in enumerate(pattern) if p)


def _eval_layer_pattern(text: str) -> int | list[int]:
    """Evaluate ints, lists, `+` and `*` only: never `eval` an argument string."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add) and type(left) is type(right):
                return left + right
            if isinstance(node.op, ast.Mult) and not (isinstance(left, list) and isinstance(right, list)):
                size = max(len(x) if isinstance(x, list) else 1 for x in (left, right))
                count = right if isinstance(left, list) else left
                if isinstance(count, int) and size * abs(count) <= 1 << 20:  # layers, not memory
                    return left * right
        raise ValueError(f"moe_layer_freq {text!r}: a pattern of lists of 0/1 per layer with + "
                         "and * (e.g. \"[0]*3+[1]*58\")")

    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"moe_layer_freq {text!r} is not a valid pattern") from None
    return ev(tree.body)
