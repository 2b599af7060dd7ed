"""Training-script flags: add_arguments without clashes, validate_args, scheduler_from_args."""

from __future__ import annotations

import argparse
import dataclasses
import decimal
import fractions
import json
import logging
from pathlib import Path

import pytest

from costmodel.estimate import estimate_cost_model
from costmodel.integrations import args as cm_args
from costmodel.integrations.args import add_arguments, scheduler_from_args, validate_args
from costmodel.scheduler import generate_lengths
from costmodel.spec import ModelSpec

SPEC = ModelSpec.from_preset("qwen3-0.6b")
OTHER = ModelSpec.from_preset("qwen3-8b")


@pytest.fixture(scope="module")
def cost_model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cm") / "h200-qwen3-0.6b.json"
    estimate_cost_model(SPEC, "h200").save(path)
    return str(path)


def parse(argv, parser=None):
    parser = add_arguments(parser or argparse.ArgumentParser())
    return parser.parse_args(argv)


def test_adds_every_flag():
    args = parse(
        ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192", "--balance-data",
         "--balance-by-flops", "--cost-model", "h200/qwen3-8b"]
    )
    assert args.use_dynamic_batch_size and args.balance_data and args.balance_by_flops
    assert args.max_tokens_per_gpu == 8192 and args.cost_model == "h200/qwen3-8b"
    defaults = parse([])
    assert not defaults.balance_by_flops and defaults.max_tokens_per_gpu is None
    assert defaults.cost_model is None and not defaults.cost_model_allow_other_shape


def test_reuses_flags_the_parser_already_has():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens-per-gpu", type=int, default=4096)
    parser.add_argument("--use_dynamic_batch_size", action="store_true")  # underscore spelling
    group = parser.add_argument_group("theirs")
    group.add_argument("--balance-data", action="store_true", help="their own help")
    add_arguments(parser)  # must not raise argparse.ArgumentError
    add_arguments(parser)  # twice is harmless too
    args = parser.parse_args(["--use_dynamic_batch_size", "--balance-by-flops"])
    assert args.max_tokens_per_gpu == 4096  # their default is kept
    assert args.use_dynamic_batch_size and args.balance_by_flops
    helps = [a.help for a in parser._actions if "--balance-data" in a.option_strings]
    assert helps == ["their own help"]


def test_reuses_a_destination_under_another_option_string():
    parser = argparse.ArgumentParser()
    parser.add_argument("--token-cap", dest="max_tokens_per_gpu", type=int, default=123)
    args = parse([], parser)
    assert args.max_tokens_per_gpu == 123
    assert "--max-tokens-per-gpu" not in parser._option_string_actions


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--balance-by-flops"], "--use-dynamic-batch-size"),
        # Only what is missing: "add ... --max-tokens-per-gpu" with the cap given misled.
        (["--balance-by-flops", "--max-tokens-per-gpu", "100"], "add --use-dynamic-batch-size$"),
        (["--balance-by-flops"], "add --use-dynamic-batch-size and --max-tokens-per-gpu TOKENS"),
        (["--use-dynamic-batch-size", "--balance-by-flops"], "--max-tokens-per-gpu"),
        (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "0"], "positive"),
        (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "64", "--cost-model", "x.json"],
         "add --balance-by-flops"),
    ],
)
def test_validate_rejects_with_what_to_change(argv, needle):
    with pytest.raises(ValueError, match=needle.replace("-", r"\-")):
        validate_args(parse(argv), spec=SPEC)


FLOPS_ARGV = ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096", "--balance-by-flops"]


@pytest.mark.parametrize("args", [None, {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 0}])
def test_validate_and_scheduler_from_args_take_a_namespace_only(args):
    """A config dict read every flag as unset (its cap of 0 passed), then raised
    AttributeError where the loaded cost model is kept on args."""
    for call in (validate_args, scheduler_from_args):
        with pytest.raises(TypeError, match=r"^args must be the parsed flags \(an argparse\.Namespace\)"):
            call(args)


class _AttrDict(dict):
    """EasyDict / addict style: a dict whose keys read and set as attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value


def test_a_dict_that_reads_its_keys_as_attributes_is_taken():
    """Refused with the plain dicts ('args must be the parsed flags'), though its flags read
    as a namespace's do (as an OmegaConf DictConfig's, which is taken)."""
    flags = {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 4096, "balance_by_flops": True}
    assert validate_args(_AttrDict(flags), spec=SPEC) is None
    assert scheduler_from_args(_AttrDict(flags), spec=SPEC)["cost"] == "flops"
    with pytest.raises(ValueError, match="--max-tokens-per-gpu"):  # its flags are read
        validate_args(_AttrDict(flags, max_tokens_per_gpu=0), spec=SPEC)
    with pytest.raises(TypeError, match=r"^args must be the parsed flags"):
        validate_args(type("Config", (dict,), {})(flags), spec=SPEC)  # keys no attributes


def test_cost_model_of_another_shape_is_an_error_unless_opted_in(cost_model_file):
    args = parse([*FLOPS_ARGV, "--cost-model", cost_model_file])
    with pytest.raises(ValueError, match="--cost-model-allow-other-shape") as err:
        validate_args(args, spec=OTHER)
    assert cost_model_file in str(err.value)
    with pytest.raises(ValueError, match="--cost-model-allow-other-shape"):  # by preset name
        validate_args(parse([*FLOPS_ARGV, "--cost-model", cost_model_file]), spec=OTHER.name)
    # The hint names a preset only when the model is that preset's shape (a fine-tune's
    # folder can carry the preset's name with another shape).
    for spec, flag in ((OTHER, f"--model {OTHER.name}`"),
                       (dataclasses.replace(OTHER, num_layers=3), "--model <its HF config.json>`")):
        with pytest.raises(ValueError, match=flag):
            validate_args(parse([*FLOPS_ARGV, "--cost-model", cost_model_file]), spec=spec)
    args = parse([*FLOPS_ARGV, "--cost-model", cost_model_file, "--cost-model-allow-other-shape"])
    model = validate_args(args, spec=OTHER)
    assert model.spec.fingerprint() == SPEC.fingerprint()
    from costmodel.scheduler import build_schedule

    # ... and the scheduler takes it for OTHER, the shape it was allowed for.
    kwargs = scheduler_from_args(args, OTHER)
    assert kwargs["cost"] is model and kwargs["spec"] is OTHER
    build_schedule([900, 3000, 120, 4000], dp_size=2, **kwargs)


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]", '{"schema": "other/9"}'])
def test_cost_model_that_does_not_load(tmp_path, content):
    path = tmp_path / "cm.json"
    if content is not None:
        path.write_text(content)
    args = parse([*FLOPS_ARGV, "--cost-model", str(path)])
    with pytest.raises((FileNotFoundError, ValueError), match="cm.json") as err:
        validate_args(args, spec=SPEC)
    assert str(err.value).startswith(f"--cost-model {path}") and "\n" not in str(err.value)


def test_a_cost_model_without_the_train_pass_is_refused_before_training(tmp_path, cost_model_file):
    """Regression (an audit's): a file of forward curves only (calibrated with --modes
    forward, or its train fit dropped) passed validate_args, and every step's schedule
    failed, advising a --mode flag training scripts do not have."""
    doc = json.loads(Path(cost_model_file).read_text())
    del doc["curves"]["train"]
    path = tmp_path / "forward-only.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"^--cost-model .*forward-only\.json: it has curves for "
                       r"forward only, and training balances the train pass .*--modes train"):
        validate_args(parse([*FLOPS_ARGV, "--cost-model", str(path)]), spec=SPEC)


def test_cost_model_needs_a_shape_to_check(cost_model_file):
    args = parse([*FLOPS_ARGV, "--cost-model", cost_model_file])
    with pytest.raises(ValueError, match="shape to check --cost-model against: pass spec="):
        validate_args(args)


def test_flops_balance_needs_a_shape_before_training_starts():
    # Found by validate_args, not at the first scheduler_from_args of a training step.
    with pytest.raises(ValueError, match="shape for analytic FLOPs: pass spec="):
        validate_args(parse(FLOPS_ARGV))
    assert validate_args(parse(FLOPS_ARGV), spec=SPEC) is None


def test_scheduler_kwargs_per_policy(cost_model_file):
    tokens = scheduler_from_args(parse(["--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096"]), SPEC)
    assert tokens["cost"] == "tokens" and tokens["max_tokens_per_microbatch"] == 4096
    flops = scheduler_from_args(parse(FLOPS_ARGV), SPEC, dp_size=4)
    assert flops["cost"] == "flops" and flops["spec"] is SPEC and flops["dp_size"] == 4
    args = parse([*FLOPS_ARGV, "--cost-model", cost_model_file])
    model = validate_args(args, spec=SPEC)
    calibrated = scheduler_from_args(args, SPEC)
    assert calibrated["cost"] is model  # loaded once, by validate_args
    assert callable(calibrated["cost"].sample_cost)
    # Validated for one model, asked for another: it returned the first model's costs.
    with pytest.raises(ValueError, match="--cost-model-allow-other-shape"):
        scheduler_from_args(args, OTHER)


def test_scheduler_kwargs_feed_build_schedule(cost_model_file):
    from costmodel.scheduler import build_schedule

    lengths = [900, 3000, 120, 4000, 2500, 64, 700, 1800]
    for argv in (FLOPS_ARGV[:3], FLOPS_ARGV, [*FLOPS_ARGV, "--cost-model", cost_model_file]):
        kwargs = scheduler_from_args(parse(argv), SPEC)
        schedule = build_schedule(lengths, dp_size=2, **kwargs)
        seen = sorted(i for rank in schedule.microbatches for mb in rank for i in mb)
        assert seen == list(range(len(lengths)))


def test_context_parallel_multiplies_the_cap():
    args = parse(["--use-dynamic-batch-size", "--max-tokens-per-gpu", "1000"])
    args.context_parallel_size = 4
    assert scheduler_from_args(args, SPEC)["max_tokens_per_microbatch"] == 4000
    args.context_parallel_size = -2  # a cap of -200 tokens before
    with pytest.raises(ValueError, match="--context-parallel-size must be an integer >= 1"):
        scheduler_from_args(args, SPEC)
    args.context_parallel_size = 1
    with pytest.raises(ValueError, match="dp_size must be an integer >= 1, got 2.5"):
        scheduler_from_args(args, SPEC, dp_size=2.5)


def test_no_cap_for_the_scheduler():
    with pytest.raises(ValueError, match="--max-tokens-per-gpu"):
        scheduler_from_args(parse([]), SPEC)
    # A cap without dynamic batch size: the framework splits by a fixed size and ignores it.
    with pytest.raises(ValueError, match="add --use-dynamic-batch-size --max-tokens-per-gpu"):
        scheduler_from_args(parse([]), SPEC)
    with pytest.raises(ValueError, match="add --use-dynamic-batch-size$"):  # the cap is there
        scheduler_from_args(parse(["--max-tokens-per-gpu", "4096"]), SPEC)


def test_a_cap_past_one_micro_batch_names_context_parallelism_only_when_set():
    from costmodel.integrations.args import validate_args

    args = parse(["--use-dynamic-batch-size", "--max-tokens-per-gpu", "99999999999"])
    with pytest.raises(ValueError, match=r"--max-tokens-per-gpu 99999999999 is 99,999,999,999 tokens"):
        validate_args(args)
    args = parse(["--use-dynamic-batch-size", "--max-tokens-per-gpu", "300000000"])
    args.context_parallel_size = 8
    with pytest.raises(ValueError, match=r"300000000 × --context-parallel-size is 2,400,000,000"):
        validate_args(args)


def test_an_unreadable_cost_model_names_the_flag(monkeypatch):
    """Regression: a PermissionError said "[Errno 13] Permission denied: 'cm.json'" alone,
    where a missing file names --cost-model."""
    import costmodel.model

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "cm.json")

    monkeypatch.setattr(costmodel.model, "load_cost_model", unreadable)
    args = parse(["--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
                  "--balance-by-flops", "--cost-model", "cm.json"])
    with pytest.raises(PermissionError, match=r"^--cost-model cm.json: \[Errno 13\] Permission"):
        validate_args(args, spec=SPEC)


def test_warns_when_the_cost_model_is_from_another_gpu(cost_model_file, monkeypatch, caplog):
    args = parse([*FLOPS_ARGV, "--cost-model", cost_model_file])
    monkeypatch.setattr(cm_args, "current_gpu_name", lambda start_cuda=True: "NVIDIA H100 80GB HBM3")
    with caplog.at_level(logging.WARNING, logger="costmodel.integrations.args"):
        validate_args(args, spec=SPEC)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "NVIDIA H200" in warnings[0] and "NVIDIA H100 80GB HBM3" in warnings[0]
    # An estimate was not measured anywhere: said as what it is.
    assert "is an estimate for NVIDIA H200 but this process runs on" in warnings[0]


@pytest.mark.parametrize("device", ["NVIDIA H200", None])
def test_no_warning_on_the_same_gpu_or_without_one(cost_model_file, monkeypatch, caplog, device):
    args = parse([*FLOPS_ARGV, "--cost-model", cost_model_file])
    monkeypatch.setattr(cm_args, "current_gpu_name", lambda start_cuda=True: device)
    with caplog.at_level(logging.INFO, logger="costmodel.integrations.args"):
        validate_args(args, spec=SPEC)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("estimate" in r.getMessage() for r in caplog.records)  # labelled as such


def test_gpu_names_compare_through_the_registry():
    assert cm_args._same_gpu("h200", "NVIDIA H200")
    assert cm_args._same_gpu("NVIDIA H100 80GB HBM3", "h100")
    assert not cm_args._same_gpu("h200", "NVIDIA H100 80GB HBM3")
    assert cm_args._same_gpu("Made-Up GPU 9", "made up gpu 9")  # unknown: by name


def test_no_torch_needed_to_import():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import argparse\n"
        "from costmodel.integrations.args import add_arguments, validate_args, scheduler_from_args\n"
        "a = add_arguments(argparse.ArgumentParser()).parse_args(['--use-dynamic-batch-size', "
        "'--max-tokens-per-gpu', '10'])\n"
        "validate_args(a)\n"
        "import costmodel.training, costmodel.training.config, costmodel.training.bench\n"
        "import costmodel.training.bench_report, costmodel.training.microbatch_timer\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_their_option_under_another_dest_is_read_from_there():
    """Regression: `--use-dynamic-batch-size` with dest="dynamic" was taken as absent."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--use-dynamic-batch-size", dest="dynamic", action="store_true")
    parser.add_argument("--max_tokens_per_gpu", dest="cap", type=int)
    args = parse(["--use-dynamic-batch-size", "--max_tokens_per_gpu", "512", "--balance-by-flops"],
                 parser)
    assert not hasattr(args, "use_dynamic_batch_size") and args.dynamic and args.cap == 512
    kwargs = scheduler_from_args(args, SPEC)
    assert kwargs["cost"] == "flops" and kwargs["max_tokens_per_microbatch"] == 512
    with pytest.raises(ValueError, match=r"\-\-use\-dynamic\-batch\-size"):
        validate_args(parse(["--balance-by-flops", "--max_tokens_per_gpu", "512"], parser), spec=SPEC)


def test_into_an_argument_group_or_a_subcommand():
    """Regression: an argument group got a nested group (deprecated since Python 3.11)."""
    import warnings

    parser = argparse.ArgumentParser()
    group = parser.add_argument_group("mine")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        add_arguments(group)
    assert "--balance-by-flops" in [o for a in group._group_actions for o in a.option_strings]
    assert parser.parse_args(["--balance-by-flops"]).balance_by_flops
    with pytest.raises(TypeError, match="mutually exclusive"):
        add_arguments(parser.add_mutually_exclusive_group())
    for not_a_parser in (None, argparse.Namespace()):
        with pytest.raises(TypeError, match="needs an argparse parser or argument group, got"):
            add_arguments(not_a_parser)

    sub = argparse.ArgumentParser().add_subparsers(dest="cmd")
    train = add_arguments(sub.add_parser("train"))
    args = train.parse_args(["--use-dynamic-batch-size", "--max-tokens-per-gpu", "64"])
    assert scheduler_from_args(args, SPEC)["max_tokens_per_microbatch"] == 64


@pytest.mark.parametrize(
    ("definition", "argv"),
    [
        (dict(action="store_true"), ["--max-tokens-per-gpu"]),  # a switch, not a number
        (dict(default="lots"), []),
        (dict(type=float), ["--max-tokens-per-gpu", "12.5"]),
    ],
)
def test_their_cap_that_is_not_a_number_of_tokens(definition, argv):
    """Regression: a store_true --max-tokens-per-gpu became a 1-token cap (True)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens-per-gpu", **definition)
    args = parse(["--use-dynamic-batch-size", *argv], parser)
    with pytest.raises(ValueError, match="--max-tokens-per-gpu must be a whole number"):
        validate_args(args, spec=SPEC)


def test_kwargs_are_parameters_of_build_schedule(cost_model_file):
    import inspect

    from costmodel.scheduler import build_schedule

    params = set(inspect.signature(build_schedule).parameters)
    expected = {"tokens": FLOPS_ARGV[:3], "flops": FLOPS_ARGV,
                "model": [*FLOPS_ARGV, "--cost-model", cost_model_file]}
    for policy, argv in expected.items():
        kwargs = scheduler_from_args(parse(argv), SPEC, dp_size=2)
        assert set(kwargs) <= params
        assert set(kwargs) == {"max_tokens_per_microbatch", "cost", "spec", "mode", "dp_size"}
        assert kwargs["max_tokens_per_microbatch"] == 4096 and kwargs["dp_size"] == 2
        if policy == "model":
            assert kwargs["cost"].spec.fingerprint() == SPEC.fingerprint()
        else:
            assert kwargs["cost"] == policy


def megatron_args(**flags) -> argparse.Namespace:
    """What slime hands its data code: Megatron's namespace for qwen3-0.6b, plus our flags."""
    return argparse.Namespace(
        num_layers=28, hidden_size=1024, num_attention_heads=16, group_query_attention=True,
        num_query_groups=8, kv_channels=128, ffn_hidden_size=3072, padded_vocab_size=151936,
        qk_layernorm=True, swiglu=True, context_parallel_size=2,
        use_dynamic_batch_size=True, max_tokens_per_gpu=8192, balance_data=True, **flags,
    )


def test_slime_style_namespace():
    """max_tokens_per_gpu is per GPU: a context-parallel group packs cp x as many tokens;
    the model shape comes from Megatron's own fields when no spec is passed."""
    tokens = scheduler_from_args(megatron_args(balance_by_flops=False))
    assert tokens == {"max_tokens_per_microbatch": 16384, "cost": "tokens", "spec": None,
                      "mode": "train"}
    flops = scheduler_from_args(megatron_args(balance_by_flops=True))
    assert flops["cost"] == "flops" and flops["spec"].fingerprint() == SPEC.fingerprint()
    args = megatron_args(balance_by_flops=True, cost_model="h200/qwen3-0.6b")
    model = validate_args(args)
    assert scheduler_from_args(args)["cost"].model is model  # as one of the 2 CP ranks runs it
    with pytest.raises(ValueError, match="allow-other-shape"):
        validate_args(megatron_args(balance_by_flops=True, cost_model="h200/qwen3-8b"))


def test_a_megatron_run_with_a_padded_vocabulary_takes_its_models_profile():
    """Megatron pads Qwen3-8B's 151,936 tokens to 152,064 at TP 2: the shipped profile
    of its config.json was refused as another model's (an audit's finding)."""
    from costmodel.integrations.slime import build_dp_schedule

    args = megatron_args(balance_by_flops=True, cost_model="h200/qwen3-8b")
    vars(args).update(num_layers=36, hidden_size=4096, num_attention_heads=32,
                      num_query_groups=8, ffn_hidden_size=12288,
                      untie_embeddings_and_output_weights=True,
                      vocab_size=151936, padded_vocab_size=152064)
    model = validate_args(args)
    assert model.gpu == "NVIDIA H200" and not model.is_estimate  # the measured profile
    assert scheduler_from_args(args)["cost"].model is model
    lengths = generate_lengths(64, "rl", seed=0, max_response=4096).tolist()
    partitions, *_ = build_dp_schedule(args, dict(dp_size=2, cp_size=2), lengths,
                                       step_sample_indices=[list(range(64))])
    assert sorted(i for rank in partitions for i in rank) == list(range(64))


@pytest.mark.parametrize(("change", "message"), [
    # Each was accepted: "False" read as on, "" balanced FLOPs, 0 read as 1, 8192.7 as 8192.
    (dict(use_dynamic_batch_size="False"), "--use-dynamic-batch-size must be true or false"),
    (dict(balance_by_flops="yes"), "--balance-by-flops must be true or false"),
    (dict(balance_by_flops=2), "--balance-by-flops must be true or false"),
    # int() reads "8_192" and Arabic-Indic digits; a lengths file does not, nor do these
    (dict(max_tokens_per_gpu="8_192"), "--max-tokens-per-gpu must be a whole number"),
    (dict(max_tokens_per_gpu="\u0668\u0661\u0669\u0662"), "--max-tokens-per-gpu must be a whole number"),
    (dict(max_tokens_per_gpu="9" * 5000), "--max-tokens-per-gpu is a 5000-digit number, far above"),
    (dict(cost_model=""), "--cost-model is empty"),
    (dict(context_parallel_size=0), "--context-parallel-size"),
    (dict(max_tokens_per_gpu=decimal.Decimal("8192.7")), "--max-tokens-per-gpu must be a whole number"),
])
def test_flag_values_a_config_system_could_pass_are_checked(change, message):
    args = argparse.Namespace(use_dynamic_batch_size=True, max_tokens_per_gpu=8192,
                              balance_by_flops=True, cost_model=None)
    vars(args).update(change)
    with pytest.raises(ValueError, match=message):
        validate_args(args, spec=SPEC)


def test_whole_numbers_of_tokens_in_any_form_are_taken():
    import numpy as np

    # A YAML or int-typed config gives its switches as 1 and 0, and its numbers as Decimals,
    # Fractions or 0-d arrays: each was refused once.
    for cap in (8192, np.int64(8192), 8192.0, " 8192 ", "0" * 200 + "8192", decimal.Decimal("8192"),
                fractions.Fraction(8192), np.array(8192), np.array(8192.0)):
        for on in (True, np.bool_(True), 1, np.int8(1), np.array(True)):
            args = argparse.Namespace(use_dynamic_batch_size=on, max_tokens_per_gpu=cap,
                                      balance_by_flops=0, cost_model=None)
            assert scheduler_from_args(args, SPEC)["max_tokens_per_microbatch"] == 8192


def test_signed_digits_reads_ascii_digits_only():
    from costmodel.checks import signed_digits

    assert signed_digits("+0012") == ("", "12")
    assert signed_digits("-000") == ("-", "0")
    assert signed_digits("9" * 300) == ("", "9" * 300)  # the caller names a number this long
    for text in ("", "+", "8_192", "٨١٩٢", "1.0", " 12", "1e3", "--1"):
        assert signed_digits(text) is None, text


def test_two_gpus_the_registry_does_not_know_differ_by_name():
    """A cost model from one unknown GPU used on another must warn: names compared, not
    'both unknown, so the same'."""
    assert not cm_args._same_gpu("Made-Up GPU 9", "Other Card 7")
    assert cm_args._same_gpu("Made-Up GPU 9", "made up gpu 9")
    # Not by a shared first word: each pair is two GPUs (none in the registry).
    for a, b in (("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"),
                 ("Tesla V100-SXM2-32GB", "Tesla T4"),
                 ("NVIDIA RTX A6000", "NVIDIA RTX 6000 Ada Generation"),
                 ("h100 sxm", "NVIDIA H100 PCIe")):
        assert not cm_args._same_gpu(a, b) and not cm_args._same_gpu(b, a), (a, b)
    assert cm_args._same_gpu("rtx 4090", "NVIDIA GeForce RTX 4090")  # a short name of it


# -- from a second mutation check: costmodel.checks' promises no flag test reached ----------


def test_positive_int_refuses_switches_which_int_would_read_as_one():
    import numpy as np

    from costmodel.checks import positive_int

    assert positive_int(np.int32(3), "num_layers") == 3 and type(positive_int(np.int32(3), "x")) is int
    for value in (True, np.bool_(True), 0, -1, 2.0, "4"):
        with pytest.raises(ValueError, match=r"num_layers must be an integer >= 1"):
            positive_int(value, "num_layers")


def test_an_unset_switch_is_off_and_only_zero_and_one_are_switches():
    import numpy as np

    from costmodel.checks import on_off

    assert on_off(None, "--balance-by-flops") is False
    assert on_off(np.array(1), "--balance-by-flops") is True and on_off(0, "x") is False
    for value in ("False", 2, -1, 0.0):
        with pytest.raises(ValueError, match="--balance-by-flops must be true or false"):
            on_off(value, "--balance-by-flops")


def test_a_whole_number_is_at_most_a_hundred_digits_and_an_array_of_one_is_no_scalar():
    """int() takes up to 4,300 digits; a count or a length has far fewer, and a 200-digit
    one is named as such. A 1-element array is a list of numbers, not a number (only 0-d
    arrays are scalars)."""
    import numpy as np

    from costmodel.checks import plain_scalar, whole_number

    assert whole_number("9" * 100, "--max-tokens-per-gpu") == int("9" * 100)
    with pytest.raises(ValueError, match="--max-tokens-per-gpu is a 101-digit number, far above"):
        whole_number("9" * 101, "--max-tokens-per-gpu")
    one = np.array([8192])
    assert plain_scalar(one) is one
    with pytest.raises(ValueError, match="--max-tokens-per-gpu must be a whole number"):
        whole_number(one, "--max-tokens-per-gpu")


def test_a_cost_model_flag_of_true_or_a_number_is_refused_and_false_is_none():
    """A config's `cost_model: true` names no file: refused, naming the flag; false, 0 and
    None mean no cost model (balance FLOPs)."""
    import numpy as np

    from costmodel.checks import cost_model_choice

    for value in (None, False, 0, 0.0, np.bool_(False)):
        assert cost_model_choice(value, "--cost-model") is None
    for value in (True, 1, 2.5, np.bool_(True)):
        with pytest.raises(ValueError, match=r"--cost-model is .*: give a cost model file"):
            cost_model_choice(value, "--cost-model")
    assert cost_model_choice("h200/qwen3-8b", "--cost-model") == "h200/qwen3-8b"


def test_a_mig_slice_or_a_suffixed_variant_is_another_gpu_than_the_whole_one():
    """A cost model measured on a whole H100 does not describe a MIG slice of it (a fraction
    of its SMs), and an H200 model does not describe an 'NVIDIA H200 NVL 141GB', which
    calibrate takes as the H200 NVL: each warns. The same slice, or a memory-size suffix of
    the same GPU, does not."""
    assert not cm_args._same_gpu("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    assert not cm_args._same_gpu("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H100 80GB HBM3")
    assert cm_args._same_gpu("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    assert not cm_args._same_gpu("NVIDIA H200", "NVIDIA H200 NVL 141GB")
    assert cm_args._same_gpu("h200-nvl", "NVIDIA H200 NVL 141GB")
    assert cm_args._same_gpu("NVIDIA H200", "NVIDIA H200 144GB")


@pytest.mark.parametrize("model_tp, run_tp, warned", [
    (1, None, False), (1, 1, False), (4, 4, False), (1, 4, True), (4, None, True)])
def test_warns_when_the_cost_model_timed_another_tensor_parallel_shard(
        tmp_path, monkeypatch, caplog, model_tp, run_tp, warned):
    spec = ModelSpec.from_preset("qwen3-32b")
    path = estimate_cost_model(spec, "h200", tensor_parallel=model_tp).save(tmp_path / "cm.json")
    args = parse([*FLOPS_ARGV, "--cost-model", str(path)])
    if run_tp is not None:  # Megatron's flag; scripts without it run one GPU per layer
        args.tensor_model_parallel_size = run_tp
    monkeypatch.setattr(cm_args, "current_gpu_name", lambda start_cuda=True: None)
    with caplog.at_level(logging.WARNING, logger="costmodel.integrations.args"):
        validate_args(args, spec=spec)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not warned:
        assert warnings == []
        return
    assert len(warnings) == 1
    assert f"shard at tensor parallelism {model_tp}, but this run uses {run_tp or 1}" in warnings[0]
    assert f"costmodel calibrate --model qwen3-32b --tensor-parallel {run_tp or 1}" in warnings[0]


@pytest.mark.parametrize("model_etp, run_tp, run_etp, warned", [
    (None, 4, None, False), (None, 4, 4, False), (None, 4, 1, True),
    (1, 4, 1, False), (1, 4, None, True)])
def test_warns_when_the_run_splits_experts_otherwise_than_the_cost_model(
        tmp_path, monkeypatch, caplog, model_etp, run_tp, run_etp, warned):
    """ModelSpec.shard splits every expert TP ways (Megatron's default expert TP) unless told
    otherwise; a MoE run whose --expert-tensor-parallel-size (TP when absent) differs from
    the file's, e.g. 1 (common with expert parallelism), is warned."""
    spec = ModelSpec.from_preset("qwen3-30b-a3b")
    path = estimate_cost_model(spec, "h200", tensor_parallel=4,
                               expert_tensor_parallel=model_etp).save(tmp_path / "cm.json")
    args = parse([*FLOPS_ARGV, "--cost-model", str(path)])
    args.tensor_model_parallel_size = run_tp
    if run_etp is not None:
        args.expert_tensor_parallel_size = run_etp
    monkeypatch.setattr(cm_args, "current_gpu_name", lambda start_cuda=True: None)
    with caplog.at_level(logging.WARNING, logger="costmodel.integrations.args"):
        validate_args(args, spec=spec)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == int(warned)
    if warned:
        etp = run_etp or run_tp
        assert f"expert tensor parallelism is {etp}" in warnings[0]
        assert f"--tensor-parallel 4 --expert-tensor-parallel {etp}`" in warnings[0]


def test_the_tensor_parallel_advice_keeps_the_runs_expert_tp():
    """Another TP and whole experts (expert TP 1): the advice says both, since calibrate
    splits experts TP ways unless told (following a TP-only advice warned again)."""
    from costmodel.integrations.args import tensor_parallel_mismatch

    moe = estimate_cost_model("qwen3-30b-a3b", "h200", tensor_parallel=2)
    why = tensor_parallel_mismatch(moe, 4, 1)
    assert why is not None and why.endswith("--tensor-parallel 4 --expert-tensor-parallel 1`")
    assert tensor_parallel_mismatch(moe, 4, None).endswith("--tensor-parallel 4`")
    dense = estimate_cost_model("qwen3-8b", "h200", tensor_parallel=2)
    assert tensor_parallel_mismatch(dense, 4, 1).endswith("--tensor-parallel 4`")


def test_the_tensor_parallel_advice_names_a_model_calibrate_takes():
    """A model that is no preset (a config.json's folder name, Megatron args' 'megatron')
    gets the config.json placeholder in the advice, not a name `--model` refuses."""
    from costmodel.integrations.args import tensor_parallel_mismatch

    spec = dataclasses.replace(ModelSpec.from_preset("qwen3-8b"), name="megatron")
    why = tensor_parallel_mismatch(estimate_cost_model(spec, "h200", tensor_parallel=2), 4)
    assert why is not None and "--model <its HF config.json> --tensor-parallel 4`" in why
    moe = dataclasses.replace(ModelSpec.from_preset("qwen3-30b-a3b"), name="my-moe")
    why = tensor_parallel_mismatch(estimate_cost_model(moe, "h200", tensor_parallel=4), 4, 1)
    assert why is not None and "--model <its HF config.json> --tensor-parallel 4 " in why


@pytest.mark.parametrize("model_gpu, device", [
    ("NVIDIA H100 PCIe", "NVIDIA H100"),  # an H100 the registry cannot place is no PCIe one
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090 D"),  # 114 SMs to 128
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090 Laptop GPU"),
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090 Ti"),  # neither registered
    ("NVIDIA GeForce RTX 4080", "NVIDIA GeForce RTX 4080 SUPER"),
    ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB MIG 1g.4gb"),
])
def test_another_sku_of_the_same_chip_is_another_gpu(model_gpu, device):
    """A cost model of one SKU on another (fewer SMs, another chip, a slice) is warned
    about, both ways round: a word more than the other name's is another GPU unless it is
    a brand or a memory size or kind."""
    assert not cm_args._same_gpu(model_gpu, device)
    assert not cm_args._same_gpu(device, model_gpu)


@pytest.mark.parametrize("model_gpu, device", [
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090 48G DDR5"),
    ("RTX 3090", "NVIDIA GeForce RTX 3090"),
    ("Tesla V100-SXM2-32GB", "NVIDIA Tesla V100-SXM2-32GB"),
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090 24GB"),
])
def test_a_brand_or_memory_size_more_is_the_same_gpu(model_gpu, device):
    assert cm_args._same_gpu(model_gpu, device) and cm_args._same_gpu(device, model_gpu)
