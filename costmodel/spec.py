"""ModelSpec: the shape of a decoder-only transformer, from a preset, a HF config.json
or Megatron-style arguments (those two read by `costmodel.spec_readers`).

Only what changes the cost of a micro-batch is kept: widths, head counts, MoE
routing, MLA ranks, sliding windows, vocabulary. Weights, norms' epsilons and rope
bases do not change the time a kernel takes and are left out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.checks import did_you_mean, positive_int

_DTYPES = ("bf16", "fp16", "fp32")
_ACTIVATIONS = ("swiglu",)


# Megatron's vocabulary padding stays within this grain at TP 1, 2, 4, 8 (see `shape_key`).
_VOCAB_GRAIN = 1024


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shape. Every count is per model, not per rank (but in
    what `shard` returns: one tensor-parallel rank's share, the shape one GPU computes)."""

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
        if not isinstance(self.name, str):
            raise ValueError(f"a ModelSpec's name must be a string, got {self.name!r:.60}")
        for field in ("tie_word_embeddings", "qk_norm"):
            _require_bool(self, field)
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
                isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) for i in ids
            ):
                raise ValueError(f"{self.name}: moe_layers must be a list of layer indices, got "
                                 f"{ids!r:.60}")
            object.__setattr__(self, "moe_layers", tuple(int(i) for i in ids))  # hashable, like every field
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
    def linear_kinds(self) -> tuple[str, ...]:
        """The token-linear parts this model has: "dense" (an MLP), "moe" (experts), or both;
        a cost model keeps one curve for each."""
        return tuple(k for k, n in (("dense", self.num_dense_layers), ("moe", self.num_moe_layers)) if n)

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys (nope + rope for MLA)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    # ---- tensor parallelism --------------------------------------------------------
    def shard(self, tensor_parallel: int, expert_tensor_parallel: int | None = None) -> ModelSpec:
        """One rank's share of this model under `tensor_parallel`-way tensor parallelism, as
        Megatron splits it: query heads, key/value heads, the dense and shared-expert MLP
        widths and the vocabulary (padded to a multiple of 128 x TP) are divided by TP, each
        routed expert's width by `expert_tensor_parallel` (Megatron's default: TP; 1 keeps
        experts whole, as runs with expert parallelism often do); hidden size, layers, MLA's
        low-rank projections and the router stay whole. Fewer key/value heads than ranks
        count as one a rank (Megatron versions differ there: older ones refuse it). Expert
        parallelism (experts spread over ranks, tokens exchanged) and what the ranks
        exchange are not in it: a shard is what one GPU computes.

        Every token of the micro-batch goes through the shard's routed experts. That is
        Megatron's work per rank only where `expert_tensor_parallel` equals TP: a MoE model
        at TP > 1 trains with sequence parallelism, so T / TP tokens enter a rank's MoE
        layer and are gathered over the expert-TP group (T x ETP / TP, in balance under
        expert parallelism too). With ETP != TP the shard's routed experts do TP / ETP times
        a rank's FLOPs (ETP 1 at TP 4: 4x).

        The counts of the result are per rank (a shape to time kernels on), not per model."""
        tp = positive_int(tensor_parallel, "tensor_parallel")
        etp = self.expert_split(tp, expert_tensor_parallel)
        if tp == etp == 1:
            return self
        problem = _shard_problem(self, tp, etp)
        if problem:
            own_etp = expert_tensor_parallel is not None and self.is_moe
            fits = self.tensor_parallel_sizes(64, etp if own_etp else None)
            raise ValueError(f"{self.name}: {problem}; the TP sizes up to 64 that split it"
                             f"{f' with expert TP {etp}' if own_etp else ''}: "
                             f"{', '.join(map(str, fits)) or 'none'}")
        grain = 128 * tp  # Megatron's make-vocab-size-divisible-by, times TP
        experts = f", expert TP {etp}" if etp != tp else ""
        return dataclasses.replace(
            self,
            name=f"{self.name} (TP {tp}{experts} rank)",
            num_heads=self.num_heads // tp,
            num_kv_heads=max(1, self.num_kv_heads // tp),
            intermediate_size=self.intermediate_size // tp,
            moe_intermediate_size=self.moe_intermediate_size // etp,
            shared_expert_intermediate_size=self.shared_expert_intermediate_size // tp,
            vocab_size=-(-self.vocab_size // grain) * grain // tp,
        )

    def expert_split(self, tensor_parallel: int, expert_tensor_parallel: int | None = None) -> int:
        """How many ways `shard` splits each routed expert: `expert_tensor_parallel` for a MoE
        model where given (checked), else as many as TP (Megatron's default; a dense model
        has no experts to split, so at TP 1 its shard is the model itself)."""
        if expert_tensor_parallel is None:
            return tensor_parallel
        etp = positive_int(expert_tensor_parallel, "expert_tensor_parallel")
        return etp if self.is_moe else tensor_parallel

    def tensor_parallel_sizes(self, most: int = 64,
                              expert_tensor_parallel: int | None = None) -> list[int]:
        """The tensor-parallel sizes up to `most` that `shard` splits this model into (with
        routed experts split `expert_tensor_parallel` ways; None: as many as TP)."""
        return [tp for tp in range(1, most + 1)
                if not _shard_problem(self, tp, self.expert_split(tp, expert_tensor_parallel))]

    # ---- identity and (de)serialisation -------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON types (`from_dict` reads it back)."""
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
        return self._hash(self.vocab_size)

    def shape_key(self) -> str:
        """What a cost model is matched to a model by: `fingerprint` with the vocabulary
        rounded up to a multiple of 1,024. Megatron pads the vocabulary to a multiple of
        128 x the tensor-parallel size (Qwen3-8B's 151,936 to 152,064 at TP 2), which at TP
        1, 2, 4 or 8 never passes the next multiple of 1,024: a padded run and its
        config.json share a cost model (the padding moves the LM head's cost by under 1%).
        Other TP sizes (6: multiples of 768) can pass it: then the shapes differ."""
        return self._hash(-(-self.vocab_size // _VOCAB_GRAIN) * _VOCAB_GRAIN)

    def _hash(self, vocab_size: int) -> str:
        shape = self.to_dict()
        shape.pop("name")
        shape["vocab_size"] = vocab_size
        shape["moe_layers"] = list(self.moe_layer_ids())
        for field in ("first_k_dense_layers", "moe_layer_freq"):
            shape.pop(field)  # folded into moe_layers: equal layouts hash equal
        blob = json.dumps(shape, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ---- constructors ----------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str) -> ModelSpec:
        if not isinstance(name, str):
            raise ValueError(f"a model preset is named by a string, got {name!r:.60}; known "
                             f"presets: {', '.join(PRESETS)}")
        key = name.strip().lower()
        if key not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; {did_you_mean(key, PRESETS)}known "
                             f"presets: {', '.join(PRESETS)}")
        return PRESETS[key]

    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelSpec:
        """Read a Hugging Face `config.json` (the file or its folder) without transformers."""
        from costmodel.spec_readers import read_hf_config

        return read_hf_config(path)

    @classmethod
    def from_megatron_args(cls, ns: Any) -> ModelSpec:
        """Build from Megatron-style argument names (an argparse Namespace or any object)."""
        from costmodel.spec_readers import read_megatron_args

        return read_megatron_args(ns)

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
            f"{did_you_mean(text, PRESETS)}known presets: {', '.join(PRESETS)}"
        )


def preset_names() -> list[str]:
    """The built-in model shapes' names, as `ModelSpec.from_preset` and ``--model`` take them."""
    return list(PRESETS)


def model_flag(spec: ModelSpec) -> str:
    """What ``--model`` takes for ``spec`` in a command a message suggests: its preset's name
    where it is that preset's shape, else a placeholder for its HF config.json."""
    if spec.name in PRESETS and ModelSpec.from_preset(spec.name).fingerprint() == spec.fingerprint():
        return spec.name
    return "<its HF config.json>"


def as_spec(spec: ModelSpec | str | Path | Any) -> ModelSpec:
    """`spec` itself, the preset / HF config.json it names, or the shape Megatron-style
    arguments describe (slime passes its ``args`` where a model is wanted, as in its own
    ``calculate_fwd_flops(seqlens, args)``); ValueError otherwise."""
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, (str, Path)):
        return ModelSpec.from_any(spec)
    if all(hasattr(spec, key) for key in ("num_layers", "hidden_size", "num_attention_heads")):
        return ModelSpec.from_megatron_args(spec)
    raise ValueError(f"spec must be a ModelSpec, a preset name, a config.json path or Megatron "
                     f"args (num_layers, hidden_size, num_attention_heads, ...); got "
                     f"{type(spec).__name__} {spec!r:.60}")


def _shard_problem(spec: ModelSpec, tp: int, etp: int) -> str:
    """Why `spec` does not split over `tp` tensor-parallel ranks with experts split `etp`
    ways ("" when it does)."""
    splits = {"num_heads": tp, "intermediate_size": tp, "shared_expert_intermediate_size": tp,
              "moe_intermediate_size": etp}
    uneven = [f"{field}={getattr(spec, field)}" for field, ways in splits.items()
              if getattr(spec, field) % ways]
    kv = spec.num_kv_heads
    if kv % tp and tp % kv:  # fewer KV heads than ranks: only where TP is a multiple
        uneven.append(f"num_kv_heads={kv}")
    if not uneven:
        return ""
    over = f"TP {tp}" + (f" (experts over {etp})" if etp != tp else "")
    return f"{', '.join(uneven)} {'does' if len(uneven) == 1 else 'do'} not split evenly over {over}"


# ---- validation helpers ----------------------------------------------------------------
# Upper bounds far past any published model (DeepSeek-V3: 61 layers, 7168 wide, 256 experts):
# a typo such as 1e9 layers is refused here instead of hanging every loop over the layers or
# giving FLOPs in the 1e30s.
MAX_LAYERS = 4096
_MAX_COUNT = 1 << 16  # heads, experts
_MAX_WIDTH = 1 << 20  # hidden, MLP and head widths, ranks
_MAX_VOCAB = 1 << 24
_MAX_WINDOW = (1 << 31) - 1  # the longest sample the scheduler takes
_LIMITS = {
    "num_layers": MAX_LAYERS, "first_k_dense_layers": MAX_LAYERS,
    "sliding_window_layers": MAX_LAYERS, "moe_layer_freq": MAX_LAYERS,
    "num_heads": _MAX_COUNT, "num_kv_heads": _MAX_COUNT, "num_experts": _MAX_COUNT,
    "num_experts_per_tok": _MAX_COUNT, "vocab_size": _MAX_VOCAB, "sliding_window": _MAX_WINDOW,
}


def _require_int(spec: ModelSpec, field: str, low: int, why: str = "") -> None:
    """``field`` an integer in low.._LIMITS (a numpy integer too: stored as a Python int, so
    that the spec hashes and serialises as one)."""
    value = getattr(spec, field)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
        kind = "a positive" if low else "a non-negative"
        reason = f" ({why})" if why else ""
        raise ValueError(f"{spec.name}: {field} must be {kind} integer{reason}, got {value!r}")
    high = _LIMITS.get(field, _MAX_WIDTH)
    if value > high:
        raise ValueError(f"{spec.name}: {field}={value} is past the largest accepted "
                         f"({high:,}); check the config for a typo")
    object.__setattr__(spec, field, int(value))


def _require_positive_int(spec: ModelSpec, field: str, why: str = "") -> None:
    _require_int(spec, field, 1, why)


def _require_non_negative_int(spec: ModelSpec, field: str) -> None:
    _require_int(spec, field, 0)


def _require_bool(spec: ModelSpec, field: str) -> None:
    value = getattr(spec, field)
    if not isinstance(value, (bool, np.bool_)):  # "false" would read as True
        raise ValueError(f"{spec.name}: {field} must be true or false, got {value!r:.60}")
    object.__setattr__(spec, field, bool(value))


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
