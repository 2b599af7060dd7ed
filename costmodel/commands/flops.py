"""`costmodel flops`: exact forward FLOPs by component for some sequence lengths."""

from __future__ import annotations

import argparse

from costmodel.commands.common import comma_ints
from costmodel.flops import BREAKDOWN_KEYS, flops_breakdown
from costmodel.spec import ModelSpec


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "flops", help="exact forward matmul FLOPs by component (per sequence, summed)",
        description="Exact forward matmul FLOPs of each sequence length, by component "
        "(projections, attention core, MLP or experts, LM head), and their sum; training "
        "is 3 x forward. Causal attention counts L(L+1)/2 query-key pairs.",
    )
    p.add_argument("--model", default="qwen3-8b",
                   help="preset name or HF config.json path (default: qwen3-8b)")
    p.add_argument(
        "--lengths", default="512,4096,32768", help="comma-separated sequence lengths (tokens) (default: 512,4096,32768)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = ModelSpec.from_any(args.model)
    lengths = comma_ints(args.lengths, "--lengths")
    columns = [(str(n), flops_breakdown([n], spec)) for n in lengths]
    if len(lengths) > 1:
        columns.append(("all", flops_breakdown(lengths, spec)))
    print(f"forward matmul FLOPs of {spec.name} (train = 3x), in TFLOP; causal pairs L(L+1)/2")
    print(f"{'component':<22}" + "".join(f"{name:>12}" for name, _ in columns))
    for key in BREAKDOWN_KEYS:
        if any(b[key] for _, b in columns):
            print(f"{key:<22}" + "".join(f"{b[key] / 1e12:>12.3f}" for _, b in columns))
    print(f"{'total':<22}" + "".join(f"{sum(b.values()) / 1e12:>12.3f}" for _, b in columns))
    print(
        f"{'attention share':<22}"
        + "".join(f"{b['attention_core'] / sum(b.values()):>12.1%}" for _, b in columns)
    )
    return 0
