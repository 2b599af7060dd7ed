"""`costmodel presets`: the built-in model shapes."""

from __future__ import annotations

import argparse

from costmodel.flops import calculate_fwd_flops
from costmodel.spec import PRESETS


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "presets", help="list the built-in model presets",
        description="The built-in model shapes --model accepts by name (a Hugging Face "
        "config.json or a folder holding one works too): layers, hidden size, query/KV heads, "
        "head dim, MLP or experts, active parameters, and the tensor-parallel sizes up to 16 "
        "that split it (calibrate --tensor-parallel).",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    header = (f"{'preset':<16} {'layers':>6} {'hidden':>6} {'heads':>9} {'head':>4} {'mlp':>13} "
              f"{'active':>8}  TP sizes")
    print(header)
    print("-" * len(header))
    for name, spec in PRESETS.items():
        heads = f"{spec.num_heads}/{spec.num_kv_heads}"
        if spec.is_mla:
            heads += " MLA"
        mlp = (
            f"{spec.num_experts}x{spec.moe_intermediate_size} top{spec.num_experts_per_tok}"
            if spec.is_moe
            else str(spec.intermediate_size)
        )
        # Active parameters ≈ forward FLOPs of one token / 2 (without the embedding table).
        active = calculate_fwd_flops([1], spec) / 2e9
        print(
            f"{name:<16} {spec.num_layers:>6} {spec.hidden_size:>6} {heads:>9} "
            f"{spec.qk_head_dim:>4} {mlp:>13} {active:>7.2f}B  "
            f"{','.join(map(str, spec.tensor_parallel_sizes(16)))}"
        )
    return 0
