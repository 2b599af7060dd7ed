"""ModelSpec: the shape of a decoder-only transformer, from a preset, a HF config.json
or Megatron-style arguments.

Only what changes the cost of a micro-batch is kept: widths, head counts, MoE
routing, MLA ranks, sliding windows, vocabulary. Weights, norms' epsilons and rope
bases do not change the time a kernel takes and are left out.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_DTYPES = ("bf16", "fp16", "fp32")
_ACTIVATIONS = ("swiglu",)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shape. Every count is per model, not per rank."""

    name: str = "custom"
    """Label only; it does not enter `fingerprint()`."""
    num_layers: int
    """Decoder layers (DeepSeek-V3's multi-token-prediction layer is not included)."""
    hidden_size: int
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads; `num_heads` must be a multiple (GQA). Equal for MHA and MLA."""
    head_dim: int
    """Query/key/value head dim; need not be hidden_size / num_heads (Qwen3). Unused by MLA."""
    intermediate_size: int
    """SwiGLU width of the dense MLP layers (0 when every layer is MoE)."""
    vocab_size: int
    tie_word_embeddings: bool = False
    activation: str = "swiglu"
    qk_norm: bool = False
    """RMSNorm on q and k per head (Qwen3); costs time, not matmul FLOPs."""

    num_experts: int = 0
    """Routed experts per MoE layer; 0 means a dense model."""
    num_experts_per_tok: int = 0
    """Top-k routed experts each token goes to."""
    moe_intermediate_size: int = 0
    """SwiGLU width of one routed expert."""
    shared_expert_intermediate_size: int = 0
    """Total SwiGLU width of the always-on shared experts (n_shared × width); 0 = none."""
    first_k_dense_layers: int = 0
    """The first k layers use the dense MLP (DeepSeek-V3: 3)."""
    moe_layer_freq: int = 1
    """After the first k, layer i is MoE iff i % freq == 0 (as in DeepSeek's config)."""
    moe_layers: tuple[int, ...] | None = None
    """Explicit MoE layer indices; overrides first_k_dense_layers/moe_layer_freq when set."""

    q_lora_rank: int = 0
    """MLA: rank of the query compression; 0 = queries projected directly."""
    kv_lora_rank: int = 0
    """MLA: rank of the joint key/value compression; 0 = not MLA."""
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    sliding_window: int = 0
    """Window of the sliding-window layers in tokens; 0 = none."""
    sliding_window_layers: int = 0
    """How many layers use the window (the rest attend to the whole sequence)."""
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "vocab_size"):
            _require_positive_int(self, field)
        for field in (
            "intermediate_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "first_k_dense_layers", "q_lora_rank",
            "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
            "sliding_window", "sliding_window_layers", "head_dim",
        ):
            _require_non_negative_int(self, field)
        _require_positive_int(self, "moe_layer_freq")
        if self.moe_layers is not None:
            ids = self.moe_layers
            if not isinstance(ids, (list, tuple)) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in ids
            ):
                raise ValueError(f"{self.name}: moe_layers must be a list of layer indices, got "
                                 f"{ids!r:.60}")
            object.__setattr__(self, "moe_layers", tuple(ids))  # hashable, like every field
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{self.name}: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}; grouped-query attention needs that"
            )
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"{self.name}: activation {self.activation!r}; allowed: {_ACTIVATIONS}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"{self.name}: dtype {self.dtype!r}; allowed: {_DTYPES}")
        if self.is_mla:
            for field in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                _require_positive_int(self, field, why="multi-head latent attention needs it")
        elif self.head_dim < 1:
            raise ValueError(f"{self.name}: head_dim must be >= 1, got {self.head_dim}")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"{self.name}: num_experts_per_tok={self.num_experts_per_tok} must be in "
                    f"1..num_experts={self.num_experts}"
                )
            _require_positive_int(self, "moe_intermediate_size", why="num_experts > 0")
            if self.first_k_dense_layers > self.num_layers:
                raise ValueError(
                    f"{self.name}: first_k_dense_layers={self.first_k_dense_layers} exceeds "
                    f"num_layers={self.num_layers}"
                )
            if self.moe_layers is not None:
                bad = [i for i in self.moe_layers if not 0 <= i < self.num_layers]
                if bad or len(set(self.moe_layers)) != len(self.moe_layers):
                    raise ValueError(
                        f"{self.name}: moe_layers must be distinct indices in 0..{self.num_layers - 1}"
                    )
        if self.num_dense_layers and self.intermediate_size < 1:
            raise ValueError(
                f"{self.name}: {self.num_dense_layers} dense layers need intermediate_size >= 1"
            )
        if self.sliding_window_layers > self.num_layers:
            raise ValueError(
                f"{self.name}: sliding_window_layers={self.sliding_window_layers} exceeds "
                f"num_layers={self.num_layers}"
            )
        if self.sliding_window_layers and not self.sliding_window:
            raise ValueError(f"{self.name}: sliding_window_layers > 0 needs sliding_window > 0")

    # ---- derived shape -------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def moe_layer_ids(self) -> tuple[int, ...]:
        """Indices of the MoE layers (empty for a dense model)."""
        if not self.is_moe:
            return ()
        if self.moe_layers is not None:
            return tuple(sorted(self.moe_layers))
        k, freq = self.first_k_dense_layers, self.moe_layer_freq
        return tuple(i for i in range(k, self.num_layers) if i % freq == 0)

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_ids())

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys (nope + rope for MLA)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    # ---- identity and (de)serialisation -------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["moe_layers"] is not None:
            d["moe_layers"] = list(d["moe_layers"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelSpec fields {unknown}; known: {sorted(known)}")
        kwargs = dict(d)
        try:
            return cls(**kwargs)
        except TypeError as err:  # a required field is missing
            raise ValueError(f"incomplete ModelSpec: {err}") from None

    def fingerprint(self) -> str:
        """A short hash of everything that changes cost (not the name)."""
        shape = self.to_dict()
        shape.pop("name")
        shape["moe_layers"] = list(self.moe_layer_ids())
        for field in ("first_k_dense_layers", "moe_layer_freq"):
            shape.pop(field)  # folded into moe_layers: equal layouts hash equal
        blob = json.dumps(shape, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ---- constructors ----------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str) -> ModelSpec:
        key = name.strip().lower()
        if key not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}")
        return PRESETS[key]

    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelSpec:
        """Read a Hugging Face `config.json` (the file or its folder) without transformers."""
        cfg = _read_json(path)  # names the file in its own errors
        try:
            return _from_hf(cfg, name=_config_name(path))
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    @classmethod
    def from_megatron_args(cls, ns: Any) -> ModelSpec:
        """Build from Megatron-style argument names (an argparse Namespace or any object)."""
        return _from_megatron(ns)

    @classmethod
    def from_any(cls, preset_or_path: str | Path) -> ModelSpec:
        """A preset name, or a path to a HF config.json / its folder."""
        text = str(preset_or_path)
        if not text.strip():
            raise ValueError(f"the model is empty; give a preset ({', '.join(PRESETS)}) or a "
                             "config.json path")
        if text.strip().lower() in PRESETS:
            return cls.from_preset(text)
        if Path(text).exists():
            return cls.from_hf_config(text)
        raise ValueError(
            f"{text!r} is neither a model preset nor an existing config.json path; "
            f"known presets: {', '.join(PRESETS)}"
        )


def preset_names() -> list[str]:
    return list(PRESETS)


def as_spec(spec: ModelSpec | str | Path) -> ModelSpec:
    """`spec` itself, or the preset / HF config.json it names; ValueError otherwise."""
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, (str, Path)):
        return ModelSpec.from_any(spec)
    raise ValueError(f"spec must be a ModelSpec, a preset name or a config.json path; got "
                     f"{type(spec).__name__} {spec!r:.60}")


# ---- validation helpers ----------------------------------------------------------------
def _require_positive_int(spec: ModelSpec, field: str, why: str = "") -> None:
    value = getattr(spec, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        reason = f" ({why})" if why else ""
        raise ValueError(f"{spec.name}: {field} must be a positive integer{reason}, got {value!r}")


def _require_non_negative_int(spec: ModelSpec, field: str) -> None:
    value = getattr(spec, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{spec.name}: {field} must be a non-negative integer, got {value!r}")


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
_HF_AT_LEAST_ONE = ("num_attention_heads", "decoder_sparse_step", "moe_layer_freq")


def _check_hf_types(cfg: Mapping[str, Any]) -> None:
    for key in _HF_INT_FIELDS:
        value = cfg.get(key)
        if value is None:
            continue
        low = 1 if key in _HF_AT_LEAST_ONE else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            kind = "a positive" if low else "a non-negative"
            raise ValueError(f"config field {key!r} must be {kind} integer, got {value!r}")
    only = cfg.get("mlp_only_layers")
    if only is not None and (not isinstance(only, list)
                             or not all(isinstance(i, int) and not isinstance(i, bool) for i in only)):
        raise ValueError(f"config field 'mlp_only_layers' must be a list of layer indices, got "
                         f"{only!r}")


def _from_hf(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    _check_hf_types(cfg)
    model_type = cfg.get("model_type")
    if model_type is None:
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
        dtype=_hf_dtype(cfg.get("torch_dtype") or cfg.get("dtype")),
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


def _hf_dtype(value: Any) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(str(value), "bf16")


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
            kw.update(sliding_window=left, sliding_window_layers=layers)
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


# ---- presets: numbers from each model's published config.json on the Hugging Face Hub ---
def _qwen3(name: str, **kw: Any) -> ModelSpec:
    base = dict(head_dim=128, vocab_size=151936, qk_norm=True)
    return ModelSpec(name=name, **{**base, **kw})


PRESETS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        # Qwen/Qwen3-0.6B, -4B, -8B, -32B
        _qwen3("qwen3-0.6b", num_layers=28, hidden_size=1024, num_heads=16, num_kv_heads=8,
               intermediate_size=3072, tie_word_embeddings=True),
        _qwen3("qwen3-4b", num_layers=36, hidden_size=2560, num_heads=32, num_kv_heads=8,
               intermediate_size=9728, tie_word_embeddings=True),
        _qwen3("qwen3-8b", num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8,
               intermediate_size=12288),
        _qwen3("qwen3-32b", num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8,
               intermediate_size=25600),
        # Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B: every layer MoE (decoder_sparse_step 1)
        _qwen3("qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4,
               intermediate_size=6144, num_experts=128, num_experts_per_tok=8,
               moe_intermediate_size=768),
        _qwen3("qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_heads=64, num_kv_heads=4,
               intermediate_size=12288, num_experts=128, num_experts_per_tok=8,
               moe_intermediate_size=1536),
        # meta-llama/Llama-3.1-8B, -70B
        ModelSpec(name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32,
                  num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256),
        ModelSpec(name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_heads=64,
                  num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256),
        # Qwen/Qwen2.5-7B (use_sliding_window is false in the published config)
        ModelSpec(name="qwen2.5-7b", num_layers=28, hidden_size=3584, num_heads=28,
                  num_kv_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064),
        # deepseek-ai/DeepSeek-V3: MLA, first 3 layers dense, 256 routed experts top-8 + 1 shared
        ModelSpec(name="deepseek-v3", num_layers=61, hidden_size=7168, num_heads=128,
                  num_kv_heads=128, head_dim=0, intermediate_size=18432, vocab_size=129280,
                  q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                  v_head_dim=128, num_experts=256, num_experts_per_tok=8,
                  moe_intermediate_size=2048, shared_expert_intermediate_size=2048,
                  first_k_dense_layers=3),
    )
}
