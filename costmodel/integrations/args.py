"""Training-script flags: `--balance-by-flops --cost-model calibrated.json`, in one call.

    parser = argparse.ArgumentParser()
    ...                                    # the script's own flags
    costmodel.integrations.args.add_arguments(parser)
    args = parser.parse_args()
    validate_args(args, spec=spec)         # before training: one clear error, or nothing
    kwargs = scheduler_from_args(args, spec)
    schedule = build_schedule(lengths, dp_size=dp, **kwargs)

What gets balanced:

- no `--balance-by-flops`: tokens (Σ L per micro-batch, the classic dynamic batching);
- `--balance-by-flops`: exact analytic FLOPs of the model (`costmodel.flops`);
- `--balance-by-flops --cost-model X`: predicted time from a calibrated cost model (a file
  from `costmodel calibrate`, or a shipped name such as ``h200/qwen3-8b``).

Numpy only: torch is imported lazily and only to read the name of the GPU in use.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.calibration.device import current_gpu_name
from costmodel.checks import cost_model_choice, on_off, positive_int, whole_number
from costmodel.flops import MAX_LENGTH
from costmodel.spec import ModelSpec, as_spec, model_flag

if TYPE_CHECKING:
    from costmodel.model import CostModel

__all__ = ["add_arguments", "scheduler_from_args", "validate_args"]

logger = logging.getLogger(__name__)

# (option string, add_argument kwargs). Dests are argparse's defaults for these names,
# which are the names Megatron-based trainers (slime) already use.
_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "--use-dynamic-batch-size",
        dict(
            action="store_true",
            help="pack samples into micro-batches by a token cap (--max-tokens-per-gpu) "
            "instead of a fixed number of samples",
        ),
    ),
    (
        "--max-tokens-per-gpu",
        dict(
            type=int,
            default=None,
            metavar="TOKENS",
            help="token cap of one micro-batch on one GPU (multiplied by the context-parallel "
            "size when there is one)",
        ),
    ),
    (
        "--balance-data",
        dict(
            action="store_true",
            help="balance the data-parallel ranks (by tokens unless --balance-by-flops); "
            "build_schedule always does, so this flag only keeps slime's flag set",
        ),
    ),
    (
        "--balance-by-flops",
        dict(
            action="store_true",
            help="balance micro-batches and ranks by cost instead of tokens: analytic FLOPs, "
            "or predicted time with --cost-model; needs --use-dynamic-batch-size and "
            "--max-tokens-per-gpu",
        ),
    ),
    (
        "--cost-model",
        dict(
            default=None,
            metavar="PATH_OR_NAME",
            help="calibrated cost model for --balance-by-flops: a file from `costmodel "
            "calibrate`, or a shipped name such as h200/qwen3-8b",
        ),
    ),
    (
        "--cost-model-allow-other-shape",
        dict(
            action="store_true",
            help="accept a --cost-model calibrated for another model shape (its curves are "
            "then only an approximation of this model's costs)",
        ),
    ),
)

_GROUP_TITLE = "costmodel micro-batch balancing"
_LOADED_ATTR = "_costmodel_cost_model"
_DESTS_ATTR = "_costmodel_dests"  # our name -> the dest of the script's own option


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the balancing flags to ``parser``, skipping any it already has.

    A flag is skipped when the parser already owns its option string (``--max-tokens-per-gpu``
    or ``--max_tokens_per_gpu``) or its destination (``max_tokens_per_gpu``, say from
    ``--token-cap``): the script's own definition is reused, so nothing clashes. When the
    script's option stores under another destination (``--use-dynamic-batch-size`` with
    ``dest="dynamic"``), `validate_args` and `scheduler_from_args` read that one.

    ``parser`` may be an argument group (the flags go into it) or a sub-command's parser.
    Call it on the parser that owns flags like ``--max-tokens-per-gpu``: argparse lets a
    sub-command's defaults overwrite the values of the parent's flags of the same name.
    Returns ``parser``.
    """
    if isinstance(parser, argparse._MutuallyExclusiveGroup):
        raise TypeError(
            "add_arguments needs a parser or an argument group, not a mutually exclusive "
            "group (the balancing flags are used together)"
        )
    if not isinstance(parser, argparse._ActionsContainer):  # None was an AttributeError
        raise TypeError(f"add_arguments needs an argparse parser or argument group, got "
                        f"{type(parser).__name__}")
    existing = parser._option_string_actions  # argparse keeps no public view
    existing_dests = {action.dest for action in parser._actions}
    aliases: dict[str, str] = {}
    group = None if isinstance(parser, argparse.ArgumentParser) else parser
    for option, kwargs in _FLAGS:
        dest = _dest(option)
        theirs = existing.get(option) or existing.get("--" + dest)
        if theirs is not None:
            logger.debug("reusing the parser's own %s (dest %s)", option, theirs.dest)
            if theirs.dest != dest and dest not in existing_dests:
                aliases[dest] = theirs.dest
            continue
        if dest in existing_dests:
            logger.debug("reusing the parser's own destination %s", dest)
            continue
        if group is None:
            group = parser.add_argument_group(_GROUP_TITLE)
        group.add_argument(option, **kwargs)
    if aliases:
        known = dict(parser._defaults.get(_DESTS_ATTR) or {})
        parser.set_defaults(**{_DESTS_ATTR: {**known, **aliases}})
    return parser


def _flag(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    name = (getattr(args, _DESTS_ATTR, None) or {}).get(name, name)
    return getattr(args, name, default)


def _switch(args: argparse.Namespace, name: str) -> bool:
    return on_off(_flag(args, name, False), f"--{name.replace('_', '-')}")


def _context_parallel(args: argparse.Namespace) -> int:
    """Megatron's --context-parallel-size (1 where a script has none)."""
    cp = _flag(args, "context_parallel_size", 1)
    return 1 if cp is None else positive_int(cp, "--context-parallel-size")


def _cap(args: argparse.Namespace) -> int | None:
    cap = _flag(args, "max_tokens_per_gpu")
    if cap is None:
        return None
    # -2 made a cap of -200 tokens, and 0 read as 1
    return whole_number(cap, "--max-tokens-per-gpu") * _context_parallel(args)


def _spec_from_args(args: argparse.Namespace) -> ModelSpec | None:
    """The model shape from a Megatron-style namespace, or None when it has none."""
    if _flag(args, "hidden_size") is not None and _flag(args, "num_layers") is not None:
        return ModelSpec.from_megatron_args(args)
    return None


def _keys_are_attributes(args: dict) -> bool:
    """Whether a dict subclass reads its keys as attributes (EasyDict, addict.Dict), as the
    flags are read here; a plain dict never does."""
    keys = [k for k in args if isinstance(k, str) and k.isidentifier() and not hasattr(dict, k)]
    return type(args) is not dict and all(getattr(args, k, args) is args[k] for k in keys)


def validate_args(
    args: argparse.Namespace, spec: ModelSpec | str | Path | None = None
) -> CostModel | None:
    """Check the balancing flags before training starts; return the loaded cost model or None.

    Raises ValueError (with what to change) when:
    - ``--balance-by-flops`` is set without ``--use-dynamic-batch-size`` or without a
      ``--max-tokens-per-gpu`` cap, or the cap is below 1;
    - ``--cost-model`` is set without ``--balance-by-flops`` (it would be ignored);
    - ``--balance-by-flops`` is set and the model shape is neither given nor on ``args``;
    - the cost model does not load, or was calibrated for another model shape than ``spec``
      (allowed only with ``--cost-model-allow-other-shape``), or has no train-pass curves;
    - an on/off flag is not true or false, or ``--cost-model`` is empty.
    FileNotFoundError (naming the flag) when the ``--cost-model`` file does not exist, and
    another OSError (naming it too) when it cannot be read.
    Logs a warning when the cost model was measured on another GPU than the one in use
    (naming both) or, on the same GPU, under other torch, CUDA or attention-kernel versions
    at major.minor (`software.drift_note`); or for another tensor-parallel size than
    ``--tensor-model-parallel-size`` (1 when ``args`` has none) or, for a MoE model, experts
    split otherwise (``--expert-tensor-parallel-size``, TP when absent); and an info line
    when no GPU is visible or the model is an estimate.

    ``spec`` is the model being trained (a `ModelSpec`); without it, Megatron-style fields on
    ``args`` (hidden_size, num_layers, ...) are used. The loaded model is kept on ``args``
    so `scheduler_from_args` does not load it again.
    """
    if args is None or isinstance(args, dict) and not _keys_are_attributes(args):
        # A plain dict's keys are no attributes: every flag read as unset, then an
        # AttributeError where the loaded model is kept on args. (Not every Mapping: an
        # OmegaConf DictConfig is one, and reads its keys as attributes, as do the dicts
        # of EasyDict and addict.)
        raise TypeError(f"args must be the parsed flags (an argparse.Namespace), got "
                        f"{type(args).__name__}: pass argparse.Namespace(**config) for a dict")
    shape = as_spec(spec) if spec is not None else None  # a preset name or config.json path too
    dynamic = _switch(args, "use_dynamic_batch_size")
    by_flops = _switch(args, "balance_by_flops")
    cost_model_arg = cost_model_choice(_flag(args, "cost_model"), "--cost-model")
    raw_cap = _flag(args, "max_tokens_per_gpu")
    if raw_cap is not None and whole_number(raw_cap, "--max-tokens-per-gpu") < 1:
        raise ValueError(
            f"--max-tokens-per-gpu must be a positive number of tokens, got {raw_cap}"
        )
    cap = _cap(args)  # None without --max-tokens-per-gpu
    if cap is not None and cap > MAX_LENGTH:
        times_cp = " × --context-parallel-size" if _flag(args, "context_parallel_size", 1) not in (1, None) else ""
        raise ValueError(
            f"--max-tokens-per-gpu {raw_cap}{times_cp} is {cap:,} tokens, above the "
            f"{MAX_LENGTH:,} one micro-batch may hold; lower it"
        )
    if dynamic and raw_cap is None:
        raise ValueError(
            "--use-dynamic-batch-size needs a token cap: add --max-tokens-per-gpu TOKENS (or "
            "your script's own flag for max_tokens_per_gpu)"
        )
    if by_flops and not dynamic:
        # Only what is missing: with the cap given, "add --max-tokens-per-gpu" misled.
        also = "" if raw_cap is not None else " and --max-tokens-per-gpu TOKENS"
        raise ValueError(
            f"--balance-by-flops packs micro-batches by a token cap: add "
            f"--use-dynamic-batch-size{also}"
        )
    if cost_model_arg and not by_flops:
        raise ValueError(
            f"--cost-model {cost_model_arg} is only used with --balance-by-flops: add "
            "--balance-by-flops (or drop --cost-model to balance tokens)"
        )
    if by_flops and shape is None:
        shape = _spec_from_args(args)
        if shape is None:
            what = "to check --cost-model against" if cost_model_arg else "for analytic FLOPs"
            raise ValueError(
                f"--balance-by-flops needs the model shape {what}: pass spec= to "
                "validate_args (or Megatron-style --hidden-size/--num-layers/... on args)"
            )
    if not cost_model_arg:
        setattr(args, _LOADED_ATTR, None)
        return None

    from costmodel.model import load_cost_model

    allow_other = _switch(args, "cost_model_allow_other_shape")
    try:
        model = load_cost_model(cost_model_arg, spec=shape, allow_other_shape=allow_other)
    except ValueError as err:
        message = str(err)
        if not allow_other and "allow_other_shape" in message and shape is not None:
            # Say it in the training script's terms: a flag, not a keyword argument. (A
            # shape is known here: --cost-model needs --balance-by-flops, which needs one.)
            message = (
                f"{message.split(';')[0]}; calibrate one for this model with `costmodel "
                f"calibrate --model {model_flag(shape)}`, or pass --cost-model-allow-other-shape to "
                "use it anyway"
            )
        raise ValueError(f"--cost-model {cost_model_arg}: {message}") from None
    except OSError as err:  # missing, or unreadable (PermissionError): which flag, too
        raise type(err)(f"--cost-model {cost_model_arg}: {err}") from None
    if "train" not in model.modes:  # what scheduler_from_args balances: found at the first step
        raise ValueError(f"--cost-model {cost_model_arg}: it has curves for "
                         f"{', '.join(model.modes)} only, and training balances the train pass "
                         "(forward + backward): calibrate it with `costmodel calibrate --modes "
                         "train,forward` (the default)")
    _check_gpu(model, cost_model_arg)
    _check_tensor_parallel(model, args, cost_model_arg)
    setattr(args, _LOADED_ATTR, model)
    return model


def _check_tensor_parallel(model: CostModel, args: argparse.Namespace, label: str) -> None:
    """Warn when the cost model timed another tensor-parallel shard than this run's: a
    narrower shard runs further below peak, so its curve has another shape (the schedule
    stays within the cap either way; only the balance suffers)."""
    why = tensor_parallel_mismatch(model, *run_tensor_parallel(args))
    if why:
        logger.warning("--cost-model %s %s", label, why)


def run_tensor_parallel(args: Any, *, as_flags: bool = True) -> tuple[int, int | None]:
    """A run's Megatron-style (tensor_model_parallel_size, expert_tensor_parallel_size):
    1 and None (as TP) where ``args`` has none; a bad value is a ValueError naming it as a
    flag (``--tensor-model-parallel-size``) or, without ``as_flags``, as the attribute."""
    sizes = []
    for name in ("tensor_model_parallel_size", "expert_tensor_parallel_size"):
        raw = _flag(args, name)
        shown = "--" + name.replace("_", "-") if as_flags else name
        sizes.append(None if raw is None else positive_int(raw, shown))
    tp, etp = sizes
    return 1 if tp is None else tp, etp


def tensor_parallel_mismatch(model: Any, tensor_parallel: int,
                             expert_tensor_parallel: int | None = None) -> str | None:
    """Why `model`'s curves are not one rank's shard of a run at `tensor_parallel` (and
    Megatron's `expert_tensor_parallel`, which defaults to the TP size), or None when
    they are. Shared by `validate_args` and the slime drop-in."""
    model_tp = int(getattr(model, "tensor_parallel", 1))
    etp = tensor_parallel if expert_tensor_parallel is None else expert_tensor_parallel
    if model_tp != tensor_parallel:
        # calibrate splits experts TP ways unless told: say the run's expert TP where it differs
        experts = (f" --expert-tensor-parallel {etp}"
                   if model.spec.num_moe_layers and etp != tensor_parallel else "")
        return (f"timed one rank's shard at tensor parallelism {model_tp}, but this run uses "
                f"{tensor_parallel}: its curves are another shape's; calibrate for this run "
                f"with `costmodel calibrate --model {model_flag(model.spec)} --tensor-parallel "
                f"{tensor_parallel}{experts}`")
    model_etp = int(getattr(model, "expert_tensor_parallel", model_tp))
    if model.spec.num_moe_layers and etp != model_etp:
        # A run with --expert-tensor-parallel-size 1 (common with expert parallelism) keeps
        # its experts whole where Megatron's default splits them TP ways.
        return (f"split every expert {model_etp} ways, but this run's expert tensor "
                f"parallelism is {etp}: its MoE layers' curve is another expert width's; "
                f"calibrate for this run with `costmodel calibrate --model {model_flag(model.spec)} "
                f"--tensor-parallel {tensor_parallel} --expert-tensor-parallel {etp}`")
    return None


def _same_gpu(model_gpu: str, device_name: str) -> bool:
    """Whether a cost model's GPU label names the device in use.

    Uses the GPU registry when it can resolve both names; otherwise compares the names'
    words: one name's words in the other's, where the other adds only a brand ("geforce",
    "tesla", "quadro") or its memory size or kind ("rtx 4090" is the GeForce RTX 4090).
    "NVIDIA GeForce RTX 4090 D" is no RTX 4090, nor a MIG slice its whole GPU.
    """
    from costmodel.gpus import find_gpu_by_device_name, lookup_gpu, same_gpu_words

    def registry_key(name: str) -> str | None:
        try:
            return lookup_gpu(name).key
        except ValueError:  # a registered name plus words ("NVIDIA H200 NVL 141GB"), as
            info = find_gpu_by_device_name(name, allow_suffix=True)  # calibrate reads it
            return info.key if info is not None else None

    keys = registry_key(model_gpu), registry_key(device_name)
    if None not in keys:
        return keys[0] == keys[1]
    # a name the registry does not know: compare the names themselves
    logger.debug("GPU registry does not know %r or %r", model_gpu, device_name)

    def norm(name: str) -> str:
        name = name.lower().replace("nvidia", "").replace("-", " ").replace("_", " ")
        return " ".join(name.split())

    # Every word of one name in the other ("rtx 4090" in "geforce rtx 4090"); a shared
    # first word ("geforce", "tesla") made an RTX 3090 the same GPU as an RTX 4090, and a
    # word more ("ti", "super", "d", "mig 1g.10gb") another SKU the same GPU.
    a, b = set(norm(model_gpu).split()), set(norm(device_name).split())
    extra = (a ^ b) - {"geforce", "tesla", "quadro"}
    return bool(a and b) and (a <= b or b <= a) and same_gpu_words(" ".join(extra))


def _check_gpu(model, label: str) -> None:
    model_gpu = str(getattr(model, "gpu", "") or "")
    if getattr(model, "is_estimate", False):
        from costmodel.calibration.software import calibrate_again

        logger.info("--cost-model %s is an estimate from the GPU registry (%s), not a "
                    "measurement; `%s` on this GPU measures one", label,
                    model_gpu or "unknown GPU", calibrate_again(model))
    device = current_gpu_name()
    if device is None:
        logger.info("no CUDA GPU visible: not checking --cost-model %s's GPU (%s)", label, model_gpu)
    why = _mismatch(model, device)
    if why:
        logger.warning("--cost-model %s %s", label, why)


_warned: set[str] = set()  # what `warn_once` has logged in this process


def warn_once(log: logging.Logger, message: str) -> None:
    """Log a warning once per process (the drop-ins run every step)."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def gpu_mismatch(model: Any, *, start_cuda: bool = True) -> str | None:
    """Why ``model``'s times may not be this process's (as the rest of a sentence that starts
    with its name), or None: measured on another GPU than the one in use, or under other
    torch, CUDA or kernel versions (`software.drift_note`; checked without a GPU too: a
    process that schedules for GPUs it does not hold runs their software, as a rule).
    ``start_cuda=False`` compares GPUs only where this process has started CUDA already.
    Shared by `validate_args` and the slime and verl drop-ins."""
    return _mismatch(model, current_gpu_name(start_cuda))


def _mismatch(model: Any, device: str | None) -> str | None:
    """`gpu_mismatch` for the GPU named ``device`` (None: not known)."""
    from costmodel.calibration.software import calibrate_again, drift_note

    model_gpu = str(getattr(model, "gpu", "") or "")
    if device is not None and model_gpu and not _same_gpu(model_gpu, device):
        made = "is an estimate for" if getattr(model, "is_estimate", False) else "was measured on"
        return (f"{made} {model_gpu} but this process runs on {device}: its times "
                f"may not match this GPU; calibrate on this GPU with `{calibrate_again(model)}`")
    return drift_note(model)


def scheduler_from_args(
    args: argparse.Namespace, spec: ModelSpec | str | Path | None = None, *, dp_size: int | None = None
) -> dict[str, Any]:
    """Keyword arguments for `costmodel.scheduler.build_schedule` from the parsed flags.

    ``cost`` is ``"tokens"`` without ``--balance-by-flops``, ``"flops"`` with it, and the
    loaded cost model with ``--cost-model`` too (as one rank of the context-parallel group
    prices a micro-batch, `CostModel.for_context_parallel`); ``max_tokens_per_microbatch`` is
    the cap (× context-parallel size); ``spec`` is passed through. ``dp_size`` is included when
    given. Call `validate_args` first (this calls it when it has not run yet).
    """
    if spec is None and _switch(args, "balance_by_flops"):
        spec = _spec_from_args(args)  # Megatron-style shape fields, as validate_args does
    if not hasattr(args, _LOADED_ATTR):
        validate_args(args, spec=spec)
    cap = _cap(args)
    if cap is None or not _switch(args, "use_dynamic_batch_size"):
        # Without dynamic batch size, frameworks split by a fixed micro-batch size and ignore
        # the cap: a token-capped schedule would not be what runs.
        missing = [flag for flag, absent in (
            ("--use-dynamic-batch-size", not _switch(args, "use_dynamic_batch_size")),
            ("--max-tokens-per-gpu TOKENS", cap is None)) if absent]
        raise ValueError(
            f"the scheduler packs micro-batches under a token cap: add {' '.join(missing)}"
        )
    if _switch(args, "balance_by_flops"):
        model = getattr(args, _LOADED_ATTR)
        if (model is not None and spec is not None
                and as_spec(spec).shape_key() != model.spec.shape_key()
                and not _switch(args, "cost_model_allow_other_shape")):
            # Validated for another spec: again for this one (a file or GPU/MODEL name of
            # another shape raises naming both; a GPU key alone resolves to this spec's).
            validate_args(args, spec=spec)
            model = getattr(args, _LOADED_ATTR)
        if model is not None:
            # Each micro-batch is split over the context-parallel group: balance what one of
            # its ranks takes (a micro-batch's fixed cost weighs more against T / cp tokens).
            cost: Any = model.for_context_parallel(_context_parallel(args))
        else:
            if spec is None:
                raise ValueError(
                    "--balance-by-flops needs the model shape: pass spec= to scheduler_from_args"
                )
            cost = "flops"
    else:
        cost = "tokens"
    kwargs: dict[str, Any] = {
        "max_tokens_per_microbatch": cap,
        "cost": cost,
        "spec": spec,
        "mode": "train",
    }
    if dp_size is not None:
        kwargs["dp_size"] = positive_int(dp_size, "dp_size")  # 2.5 became 2 through int()
    return kwargs
