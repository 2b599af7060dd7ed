"""The reference trainer's flags, their validation, and the plan of every step's schedule.

Numpy only. `prepare(args, dp_size)` runs every check the trainer needs — lengths file,
token cap, DP size against the samples per step, cost model shape — and builds every
step's schedule, so a bad input stops the run with one line before the first step, never
in the middle of one. Every rank calls it on its own with the same flags and gets the
same plan (the schedule is deterministic); the trainer checks that once per step anyway.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel.integrations.args import add_arguments, scheduler_from_args, validate_args
from costmodel.kernels import check_attention
from costmodel.model_file import check_output_path
from costmodel.scheduler.lengths import read_lengths
from costmodel.spec import ModelSpec
from costmodel.training.data import LengthSource

__all__ = ["Plan", "add_trainer_arguments", "prepare", "tiny_spec"]

logger = logging.getLogger(__name__)

# Synthetic lengths are the scheduler's "rl" mix (prompt 200-1500 + lognormal response,
# median 1500, clipped so a sample stays under 16384) times this scale: 1/32 gives ~100-token samples, so a CPU
# step of a tiny model takes tens of milliseconds while keeping the long tail.
_DEFAULT_SCALE = 1 / 32
# A rank waits this long for the others (seconds): to join the group, and in a collective.
# torch's default for gloo is 30 minutes, which a rank started by hand waited for a peer that
# died before joining; the demo's slowest wait is a peer's first Triton compile (seconds).
DEFAULT_GROUP_TIMEOUT_S = 300.0
_MOST_GROUP_TIMEOUT_S = 7 * 24 * 3600.0  # a week; more is a typo (timedelta overflows past ~1e14 s)


def add_trainer_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the reference trainer's flags (and the balancing flags) to ``parser``."""
    g = parser.add_argument_group("training run")
    g.add_argument("--steps", type=int, default=8, help="optimizer steps (default: 8)")
    g.add_argument(
        "--samples-per-step", type=int, default=64,
        help="samples in one global step, over all DP ranks (default: 64)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of data and weights (default: 0)")
    g.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default: 3e-3)")
    g.add_argument(
        "--lengths-file", default=None, metavar="PATH",
        help="take sample lengths from this file (whole numbers separated by newlines, commas "
        "or spaces, or .json/.npy) instead of the synthetic RL-like draw",
    )
    g.add_argument(
        "--length-scale", type=float, default=_DEFAULT_SCALE,
        help="scale of the synthetic RL-like lengths (default: 1/32, ~100 tokens a sample)",
    )
    g.add_argument(
        "--max-len", type=int, default=0,
        help="clip sample lengths to this many tokens (default: no clip)",
    )
    g.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto",
        help="cpu (gloo) or cuda (nccl); auto picks cuda when available",
    )
    g.add_argument(
        "--attention", default=None,
        help="varlen attention backend (default: sdpa on CPU, torch-varlen on CUDA)",
    )
    g.add_argument(
        "--group-timeout-s", type=float, default=DEFAULT_GROUP_TIMEOUT_S, metavar="SECONDS",
        help="how long a rank waits for the others, to join the process group and in each "
        f"collective, before it stops with an error (default: {DEFAULT_GROUP_TIMEOUT_S:.0f}; "
        "torch's own for gloo is 30 minutes)",
    )
    g.add_argument("--log-json", default=None, metavar="PATH",
                   help="write per-step records (JSON lines) here when the run ends")
    g.add_argument("--record-runs", default=None, metavar="PATH",
                   help="write every rank's micro-batches and compute time of every step here "
                   "when the run ends, as the runs file `costmodel correct --runs` reads")
    m = parser.add_argument_group("tiny GPT shape")
    for flag, default, what in (
        ("--layers", 2, "transformer layers"), ("--hidden", 64, "hidden size"),
        ("--heads", 4, "query heads"), ("--kv-heads", 2, "key/value heads (GQA)"),
        ("--head-dim", 16, "head dimension"), ("--ffn", 128, "SwiGLU intermediate size"),
        ("--vocab", 128, "vocabulary size"),
    ):
        m.add_argument(flag, type=int, default=default, help=f"{what} (default: {default})")
    add_arguments(parser)
    # The trainer always packs by a token cap; --balance-by-flops then changes what is
    # balanced. ~10 samples of ~100 tokens per micro-batch by default.
    parser.set_defaults(use_dynamic_batch_size=True, max_tokens_per_gpu=1024)
    notes = {"use_dynamic_batch_size": " (always on in this trainer)",
             "max_tokens_per_gpu": " (default here: %(default)s)"}
    for action in parser._actions:  # argparse keeps no public list of a parser's actions
        # (the script's own flag, reused by add_arguments, may have no help, or a hidden one)
        if action.dest in notes and action.help not in (None, argparse.SUPPRESS):
            action.help = f"{action.help}{notes[action.dest]}"
    return parser


def tiny_spec(args: argparse.Namespace, *, dtype: str = "fp32") -> ModelSpec:
    """The trained model's shape from the flags (ValueError on an inconsistent shape)."""
    for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.head_dim % 2:
        # Rotary embeddings turn pairs of dimensions: an odd one passed every check here and
        # failed in every worker's first forward ("rotary_dim must be even"), after spawning.
        raise ValueError(f"--head-dim must be even (rotary embeddings rotate pairs of "
                         f"dimensions), got {args.head_dim}")
    return ModelSpec(
        name="tiny-gpt",
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        intermediate_size=args.ffn,
        vocab_size=args.vocab,
        tie_word_embeddings=True,
        dtype=dtype,
    )


@dataclass(kw_only=True)
class Plan:
    """Everything a rank needs before its first step, identical on every rank."""

    spec: ModelSpec
    source: LengthSource
    dp_size: int
    scheduler_kwargs: dict[str, Any]
    lengths: list[np.ndarray] = field(default_factory=list)
    """Per step, the lengths of its samples (global indices)."""
    schedules: list[Any] = field(default_factory=list)
    """Per step, the `Schedule` (same on every rank)."""

    @property
    def cost_label(self) -> str:
        cost = self.scheduler_kwargs["cost"]
        if isinstance(cost, str):
            return cost
        return "cost-model" + (" (estimate)" if getattr(cost, "is_estimate", False) else "")


def group_timeout_s(args: argparse.Namespace) -> float:
    """--group-timeout-s, checked: the trainer's ranks use it to join the process group,
    before `prepare` checks the other flags (ranks started by hand or by torchrun)."""
    timeout = getattr(args, "group_timeout_s", DEFAULT_GROUP_TIMEOUT_S)  # a script's own parser
    if not 0 < timeout <= _MOST_GROUP_TIMEOUT_S:
        raise ValueError(f"--group-timeout-s must be in (0, {_MOST_GROUP_TIMEOUT_S:.0f}] "
                         f"seconds, got {timeout}")
    return float(timeout)


def _check_run_flags(args: argparse.Namespace, dp_size: int) -> None:
    if args.steps < 1:
        raise ValueError(f"--steps must be at least 1, got {args.steps}")
    if args.samples_per_step < 1:
        raise ValueError(f"--samples-per-step must be at least 1, got {args.samples_per_step}")
    if not 0 < args.lr < math.inf:  # inf made the loss NaN from the second step
        raise ValueError(f"--lr must be a positive finite number, got {args.lr}")
    if not 0 <= args.seed < 2**63:  # numpy wants >= 0; past 2^64 torch overflowed in the workers
        raise ValueError(f"--seed must be in 0..2^63-1, got {args.seed}")
    if args.attention is not None:
        check_attention(args.attention)  # in the parent, before workers start
    if not 0 < args.length_scale <= 1e3:  # a sanity limit: 1000x is ~100k-token samples
        raise ValueError(f"--length-scale must be in (0, 1000], got {args.length_scale}")
    if args.max_len < 0:
        raise ValueError(f"--max-len must be 0 (no clip) or positive, got {args.max_len}")
    group_timeout_s(args)
    if dp_size < 1:
        raise ValueError(f"the data-parallel size must be at least 1, got {dp_size}")
    if dp_size > args.samples_per_step:
        raise ValueError(
            f"{dp_size} data-parallel ranks but only {args.samples_per_step} samples per step: "
            f"every rank needs at least one sample; raise --samples-per-step to {dp_size} or "
            "more, or run fewer processes"
        )
    if not args.use_dynamic_batch_size:
        raise ValueError("the reference trainer packs by tokens: add --use-dynamic-batch-size")
    if args.log_json is not None:
        # Rank 0 writes it after the process group exists: a bad path must fail every rank
        # here (a folder that takes no files, /proc, included), not rank 0 alone while the
        # others wait in a collective.
        check_output_path(args.log_json, "--log-json")
    if getattr(args, "record_runs", None) is not None:  # (a script's own parser may lack it)
        check_output_path(args.record_runs, "--record-runs")
    _check_outputs_are_not_inputs(args)


def _check_outputs_are_not_inputs(args: argparse.Namespace) -> None:
    """ValueError when --log-json and --record-runs name one file (the second written at
    the end replaced the first), or either names the --lengths-file or --cost-model file
    (replaced, at the end of the run, by its log)."""
    record_runs = getattr(args, "record_runs", None)
    outputs = [(flag, value) for flag, value in (("--log-json", args.log_json),
                                                ("--record-runs", record_runs))
               if value is not None]
    inputs = [(flag, value) for flag, value in (("--lengths-file", args.lengths_file),
                                               ("--cost-model", getattr(args, "cost_model", None)))
              if isinstance(value, (str, os.PathLike)) and os.path.isfile(value)]
    if len(outputs) == 2 and _replaced(outputs[0][1]) == _replaced(outputs[1][1]):
        raise ValueError(f"--log-json and --record-runs are the same file {outputs[0][1]}: "
                         "give each its own path")
    for out_flag, out in outputs:
        for in_flag, path in inputs:
            if _replaced(out) == os.path.realpath(path):
                raise ValueError(f"{out_flag} {out} is the {in_flag} file: the run would "
                                 f"replace it; write {out_flag} elsewhere")


def _replaced(output: str | os.PathLike) -> str:
    """The file a write to ``output`` replaces (`atomic_output` renames onto the name: a
    link there is replaced, not the file it points to)."""
    folder, name = os.path.split(os.path.abspath(output))
    return os.path.join(os.path.realpath(folder), name)


def prepare(args: argparse.Namespace, dp_size: int, *, dtype: str = "fp32") -> Plan:
    """Validate the flags and build every step's schedule; raise before anything trains.

    Raises ValueError / FileNotFoundError with what to change (see the module docstring).
    """
    from costmodel.scheduler import build_schedule

    _check_run_flags(args, dp_size)
    spec = tiny_spec(args, dtype=dtype)
    validate_args(args, spec=spec)
    kwargs = scheduler_from_args(args, spec)
    cap = kwargs["max_tokens_per_microbatch"]

    file_lengths: tuple[int, ...] = ()
    if args.lengths_file:
        values = read_lengths(args.lengths_file)
        if values.size < args.samples_per_step:
            raise ValueError(
                f"{args.lengths_file} holds {values.size} lengths but --samples-per-step is "
                f"{args.samples_per_step}; lower --samples-per-step or add lengths"
            )
        file_lengths = tuple(int(v) for v in values)
    source = LengthSource(
        samples_per_step=args.samples_per_step,
        seed=args.seed,
        scale=args.length_scale,
        max_len=args.max_len,
        file_lengths=file_lengths,
    )
    plan = Plan(spec=spec, source=source, dp_size=dp_size, scheduler_kwargs=kwargs)
    steps = [source.lengths(step) for step in range(args.steps)]
    over = [step for step, lengths in enumerate(steps) if int(lengths.max()) > cap]
    if over:
        # The cap every step needs, not the first step's: one rerun, not one per step.
        longest = max(int(lengths.max()) for lengths in steps)
        where = args.lengths_file or "the synthetic draw"
        raise ValueError(
            f"{len(over)} of {args.steps} steps (first: step {over[0] + 1}) have samples longer "
            f"than --max-tokens-per-gpu {cap}, the longest {longest} tokens: a micro-batch "
            f"cannot hold them; raise --max-tokens-per-gpu to at least {longest} (or clip "
            f"lengths in {where} with --max-len)"
        )
    for step, lengths in enumerate(steps):
        if int(np.maximum(lengths - 1, 0).sum()) == 0:
            raise ValueError(
                f"every sample of step {step + 1} is 1 token long: next-token training needs "
                "samples of at least 2 tokens"
            )
        try:
            schedule = build_schedule(lengths, dp_size=dp_size, **kwargs)
        except ValueError as err:
            raise ValueError(
                f"cannot schedule step {step + 1}: {err} (here max_tokens_per_microbatch is "
                "--max-tokens-per-gpu and dp_size the number of processes)"
            ) from None
        plan.lengths.append(lengths)
        plan.schedules.append(schedule)
    logger.info(
        "planned %d steps: %d samples each, dp=%d, cap=%d tokens, balancing %s",
        args.steps, args.samples_per_step, dp_size, cap, plan.cost_label,
    )
    return plan
