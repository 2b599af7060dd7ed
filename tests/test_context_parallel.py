"""A cost model as one rank of a context-parallel group prices a micro-batch."""

import argparse
import types

import numpy as np
import pytest

from costmodel.context_parallel import ContextParallelCost
from costmodel.integrations import args as cm_args
from costmodel.integrations import slime
from costmodel.integrations.args import add_arguments, scheduler_from_args
from costmodel.model import load_cost_model
from costmodel.scheduler import build_schedule, generate_lengths
from costmodel.spec import ModelSpec

MODEL = load_cost_model("h200/qwen3-8b")


@pytest.mark.parametrize("mode", ["train", "forward"])
def test_one_rank_holds_a_share_of_the_tokens_and_of_the_attention(mode):
    """fixed + Σ attention / cp + token curve at T / cp: a rank's share of every sequence's
    attention FLOPs, its T / cp tokens through the GEMMs, and the whole fixed cost."""
    rank = MODEL.for_context_parallel(4)
    lengths = np.array([30000, 12000, 700, 5])
    want = (MODEL.fixed_cost(mode) + MODEL.sequence_costs(lengths, mode).sum() / 4
            + MODEL.token_costs([lengths.sum() / 4], mode)[0])
    assert rank.microbatch_cost(lengths, mode) == pytest.approx(want, rel=1e-12)
    # The fixed cost is not shared: a short micro-batch costs a rank most of one GPU's time.
    assert rank.microbatch_cost([64], mode) > 0.9 * MODEL.microbatch_cost([64], mode)
    costs = rank.microbatch_costs([3, 4000, 9], [0, 2, 2, 3], mode)
    assert costs[1] == 0 and costs[0] == pytest.approx(rank.microbatch_cost([3, 4000], mode))


def test_size_one_is_the_model_and_bad_sizes_are_refused():
    assert MODEL.for_context_parallel(1) is MODEL
    rank = MODEL.for_context_parallel(2)
    assert isinstance(rank, ContextParallelCost) and rank.spec is MODEL.spec
    assert not rank.is_estimate and rank.modes == MODEL.modes
    assert rank.label == "qwen3-8b on NVIDIA H200 (measured), one rank of context parallelism 2"
    for bad in (0, -2, 2.5, "2", True):
        with pytest.raises(ValueError, match="context-parallel size must be an integer >= 1"):
            MODEL.for_context_parallel(bad)
    with pytest.raises(ValueError, match="lengths"):
        rank.microbatch_cost([100, 0])


def test_the_scheduler_balances_one_ranks_time_and_checks_its_shape():
    lengths = generate_lengths(512, "rl", seed=3)
    rank = MODEL.for_context_parallel(4)
    s = build_schedule(lengths, dp_size=8, max_tokens_per_microbatch=4 * 16384, cost=rank,
                       spec="qwen3-8b")
    assert sorted(i for mbs in s.microbatches for mb in mbs for i in mb) == list(range(512))
    per_rank = [sum(rank.microbatch_cost(lengths[mb]) for mb in mbs) for mbs in s.microbatches]
    assert max(per_rank) / np.mean(per_rank) < 1.01
    with pytest.raises(ValueError, match="given with spec 'qwen3-32b'"):
        build_schedule(lengths, dp_size=8, max_tokens_per_microbatch=65536, cost=rank,
                       spec="qwen3-32b")


def test_training_flags_balance_one_context_parallel_rank():
    parser = add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
                              "--balance-by-flops", "--cost-model", "h200/qwen3-8b"])
    args.context_parallel_size = 4
    kwargs = scheduler_from_args(args, ModelSpec.from_preset("qwen3-8b"))
    assert kwargs["max_tokens_per_microbatch"] == 4 * 8192
    assert isinstance(kwargs["cost"], ContextParallelCost) and kwargs["cost"].size == 4
    args.context_parallel_size = 1
    assert scheduler_from_args(args, "qwen3-8b")["cost"] is kwargs["cost"].model


def test_slime_balances_one_rank_of_cp_size(monkeypatch):
    seen = []
    real = slime.build_schedule
    monkeypatch.setattr(slime, "build_schedule", lambda *a, **kw: seen.append(kw["cost"]) or real(*a, **kw))
    args = types.SimpleNamespace(
        use_dynamic_batch_size=True, max_tokens_per_gpu=8192, balance_data=True,
        cost_model="h200/qwen3-8b", num_layers=36, hidden_size=4096, num_attention_heads=32,
        num_query_groups=8, group_query_attention=True, kv_channels=128, ffn_hidden_size=12288,
        vocab_size=151936, qk_layernorm=True, swiglu=True, untie_embeddings_and_output_weights=True)
    lengths = generate_lengths(64, "rl", seed=0).tolist()
    slime.build_dp_schedule(args, {"dp_size": 2, "cp_size": 2}, lengths, global_batch_size=64,
                            rollout_indices=list(range(64)))
    assert isinstance(seen[0], ContextParallelCost) and seen[0].size == 2


def test_a_view_made_directly_checks_its_size():
    """ContextParallelCost is exported: a size of 0 priced every micro-batch at inf."""
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="context-parallel size must be an integer >= 1"):
            ContextParallelCost(MODEL, bad)


def test_slime_warns_once_when_the_cost_model_timed_another_tp_shard(tmp_path, monkeypatch, caplog):
    """As validate_args does for Megatron flags: slime's args carry the run's TP size."""
    from costmodel.estimate import estimate_cost_model

    monkeypatch.setattr(cm_args, "_warned", set())
    path = estimate_cost_model("qwen3-8b", "h200", tensor_parallel=2).save(tmp_path / "tp2.json")
    args = types.SimpleNamespace(
        use_dynamic_batch_size=True, max_tokens_per_gpu=8192, balance_data=True,
        cost_model=str(path), num_layers=36, hidden_size=4096, num_attention_heads=32,
        num_query_groups=8, group_query_attention=True, kv_channels=128, ffn_hidden_size=12288,
        vocab_size=151936, qk_layernorm=True, swiglu=True, untie_embeddings_and_output_weights=True,
        tensor_model_parallel_size=4)
    lengths = generate_lengths(64, "rl", seed=0).tolist()
    with caplog.at_level("WARNING", logger="costmodel.integrations.slime"):
        for _ in range(2):
            slime.build_dp_schedule(args, {"dp_size": 2, "cp_size": 1}, lengths,
                                    global_batch_size=64, rollout_indices=list(range(64)))
    warned = [r.getMessage() for r in caplog.records if "tensor parallelism 2" in r.getMessage()]
    assert len(warned) == 1 and "this run uses 4" in warned[0]
    caplog.clear()
    args.tensor_model_parallel_size = 2
    slime.build_dp_schedule(args, {"dp_size": 2, "cp_size": 1}, lengths, global_batch_size=64,
                            rollout_indices=list(range(64)))
    assert "tensor parallelism" not in caplog.text

