"""`costmodel schedule`, `costmodel simulate` and the scheduler benchmark end to end on CPU."""

from __future__ import annotations

import json
import re

import pytest

from costmodel.cli import main


def test_schedule_prints_summary_and_writes_json(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(
        [
            "schedule",
            "--model",
            "qwen3-8b",
            "--dist",
            "rl",
            "--n",
            "2048",
            "--dp",
            "8",
            "--max-tokens",
            "16384",
            "--cost",
            "h200/qwen3-8b",
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert (
        "max/mean" in text and "makespan/lower bound" in text and "micro-batches per rank" in text
    )
    doc = json.loads(out.read_text())
    assert doc["dp_size"] == 8 and doc["cap_violations"] == 0
    assert doc["imbalance"] <= 1.005
    assert sorted(i for r in doc["microbatches"] for mb in r for i in mb) == list(range(2048))


def test_schedule_from_a_lengths_file(tmp_path, capsys):
    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(str(x) for x in [500, 1200, 3000, 800] * 16))
    assert main(["schedule", "--lengths", str(f), "--dp", "4", "--cost", "flops"]) == 0
    assert "64 lengths from" in capsys.readouterr().out


def test_schedule_takes_cost_model_as_the_other_commands_do(capsys):
    argv = ["schedule", "--n", "64", "--dp", "4"]
    assert main([*argv, "--cost-model", "h200/qwen3-8b"]) == 0
    assert "cost: qwen3-8b on NVIDIA H200 (measured)" in capsys.readouterr().out
    # No abbreviations: --cost-mod was read as --cost-model-allow-other-shape once.
    with pytest.raises(SystemExit):
        main([*argv, "--cost-mod", "h200/qwen3-8b"])
    assert "unrecognized arguments: --cost-mod" in capsys.readouterr().err


def test_simulate_names_samples_over_the_cap_apart_from_violations(capsys):
    assert main(["simulate", "--n", "32", "--dp", "4", "--max-tokens", "100"]) == 0
    out = capsys.readouterr().out
    assert "cap viol" in out and "32 sample(s) longer than the cap run alone" in out


def test_names_a_user_mixes_up_across_commands(tmp_path, capsys, monkeypatch):
    """From a walkthrough: bench-schedule's --cap and --lengths rl, and FLOPS in capitals,
    were refused by schedule and simulate; a preset given as the cost model named an
    unknown GPU instead of the GPU/MODEL form."""
    assert main(["schedule", "--lengths", "bimodal", "--n", "64", "--cap", "8192",
                 "--cost", "FLOPS"]) == 0
    out = capsys.readouterr().out
    assert "64 samples, distribution 'bimodal'" in out and "cap=8192" in out
    assert "cost: flops" in out
    # The name wins over a file of that name, as in bench-schedule; ./rl is the file.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rl").write_text("100\n200\n" * 8)
    assert main(["schedule", "--lengths", "rl", "--n", "64", "--dp", "2"]) == 0
    assert "64 samples, distribution 'rl'" in capsys.readouterr().out
    assert main(["schedule", "--lengths", "./rl", "--dp", "2"]) == 0
    assert "16 lengths from ./rl" in capsys.readouterr().out
    assert main(["simulate", "--n", "64", "--cost-model", "qwen3-8b"]) == 2
    err = capsys.readouterr().err
    assert ("'qwen3-8b' is a model preset, not a cost model: name one as GPU/MODEL, e.g. "
            "'h200/qwen3-8b'") in err
    assert err.rstrip().endswith("measured profiles shipped: h200/qwen3-8b")  # what a name can be


def test_schedule_user_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("100\nabc\n")
    assert main(["schedule", "--lengths", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "Traceback" not in err
    assert main(["schedule", "--n", "4", "--dp", "8"]) == 2
    assert "cannot fill" in capsys.readouterr().err
    assert main(["schedule", "--n", "10000000000", "--dp", "8"]) == 2  # not a MemoryError
    assert "at most 10,000,000" in capsys.readouterr().err


def test_simulate_compares_policies(tmp_path, capsys, monkeypatch):
    from costmodel.commands import simulate

    monkeypatch.setattr(simulate, "_VARIANT_QUICK_N", 1000)  # the slow-variant note's bar
    out = tmp_path / "sim.json"
    rc = main(
        [
            "simulate",
            "--model",
            "qwen3-8b",
            "--cost-model",
            "h200/qwen3-8b",
            "--n",
            "1024",
            "--dp",
            "8",
            "--max-tokens",
            "16384",
            "--variant",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    text, err = capsys.readouterr()
    assert "kk-samples baseline takes time quadratic in the number of samples" in err
    for policy in ("tokens", "flops", "baseline", "baseline kk-samples", "cost-model"):
        assert policy in text
    rows = {r["policy"]: r for r in json.loads(out.read_text())["policies"]}
    cm = rows["cost-model"]
    assert cm["cap_violations"] == 0 and cm["imbalance"] <= 1.005
    assert cm["makespan_ms"] <= min(r["makespan_ms"] for r in rows.values()) * 1.001


@pytest.mark.parametrize("cost_model", [None, "h200/qwen3-8b"])
def test_scheduler_benchmark_quick_run(tmp_path, capsys, load_benchmark, cost_model):
    """The benchmark script end to end (--quick): JSON with every case judged by one cost,
    ours never over the cap, never below the lower bound."""
    bench = load_benchmark("bench_scheduler")
    out = tmp_path / "bench.json"
    argv = ["--quick", "--no-memory", "--repeats", "1", "--json", str(out)]
    if cost_model:
        argv += ["--cost-model", cost_model]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert ("measured" if cost_model else "ESTIMATE") in doc["cost"]
    assert doc["cases"] and doc["timing"]
    for case in doc["cases"]:
        ours = case["ours"]
        assert ours["cap_violations"] == 0
        assert ours["makespan_over_lower_bound"] >= 1.0 - 1e-9
    assert "balance targets met" in capsys.readouterr().out


def test_grouped_benchmark_quick_run(tmp_path, load_benchmark):
    """Grouped against ungrouped schedules of the same batches: every case in the JSON,
    neither below the lower bound."""
    bench = load_benchmark("bench_grouped")
    out = tmp_path / "grouped.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == 4
    for case in cases:
        for side in ("grouped", "ungrouped"):
            assert case[side]["makespan_over_lower_bound"] >= 1.0 - 1e-9
            assert case[side]["max_over_mean"] >= 1.0 - 1e-12


def test_policy_gain_benchmark(tmp_path, load_benchmark, capsys):
    """The predicted gain table: every case of every row, and the cost-model policy never
    worse under its own model than token or FLOPs balance."""
    bench = load_benchmark("bench_policy_gain")
    out = tmp_path / "gain.json"
    assert bench.main(["--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(bench.DPS) * len(bench.PER_RANK)
    for row in rows:
        assert len(row["cases"]) == len(bench.CAPS) * len(bench.SEEDS)
        assert row["min_vs_tokens"] > -0.005 and row["min_vs_flops"] > -0.005, row
    assert "vs tokens" in capsys.readouterr().out


def test_context_parallel_benchmark(tmp_path, load_benchmark, capsys):
    """Every case judged per GPU: the per-GPU pricing's schedule is no worse than the
    one-GPU pricing's by more than the search's noise (it lost 0.11% once)."""
    bench = load_benchmark("bench_context_parallel")
    out = tmp_path / "cp.json"
    assert bench.main(["--json", str(out)]) == 0
    rows = json.loads(out.read_text())["cases"]
    assert len(rows) == len(bench.CASES) * len(bench.DISTS)
    for row in rows:
        assert len(row["cases"]) == len(bench.SEEDS) and row["min_excess"] > -0.005, row
    assert "mean excess" in capsys.readouterr().out


def test_fill_shapes_benchmark_quick_run(tmp_path, load_benchmark, capsys):
    """With and without the split start, every cost, every batch: never longer with it, and
    the gate put back as it was (the benchmark turns it off for its comparison)."""
    from costmodel.scheduler import counts

    gate = counts._full_fills_may_cost_less
    bench = load_benchmark("bench_fill_shapes")
    out = tmp_path / "fill.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    assert counts._full_fills_may_cost_less is gate
    doc = json.loads(out.read_text())
    assert set(doc["summary"]) == {"train", "forward", "cp4 forward", "cp8 train"}
    assert len(doc["cases"]) == 4 * 2 * 2 * len(bench.PER_RANK)
    for case in doc["cases"]:
        assert case["makespan"] <= case["makespan_without"] * (1 + 1e-12), case
    assert doc["summary"]["forward"]["shorter"] > 0  # the start is exercised
    assert "time ratio" in capsys.readouterr().out


def test_one_rank_benchmark_quick_run(tmp_path, load_benchmark):
    """The one-rank (verl) benchmark end to end (--quick): ours never over the cap and at
    most first fit's count; verl's rule re-implemented makes ceil(tokens / cap)."""
    bench = load_benchmark("bench_one_rank")
    out = tmp_path / "one_rank.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == 6
    for case in cases:
        assert case["ours"]["over_cap"] == 0 and case["ours+model"]["over_cap"] == 0
        assert case["ours"]["micro_batches"] <= case["ffd_micro_batches"]


def test_partition_benchmark_quick_run(tmp_path, load_benchmark):
    """Karmarkar-Karp against the list method (--quick): every case in the JSON, each
    timed (the run itself checks that both give the same set sums)."""
    bench = load_benchmark("bench_partition")
    out = tmp_path / "partition.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == sum(n <= 4096 for n, _, _ in bench.CASES)
    assert all(c["ours_ms"] > 0 and c["lists_ms"] > 0 for c in cases)


def test_near_equal_benchmark_quick_run(tmp_path, load_benchmark):
    """The near-equal benchmark end to end (--quick, 50,000 samples): swapping in bulk ends
    closer to the bound in far fewer changes than one change per pair and sweep, which the
    benchmark gets by switching bulk swaps off (so the switch must reach the sweeps)."""
    bench = load_benchmark("bench_near_equal")
    out = tmp_path / "near_equal.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == 4
    for case in cases:
        one, bulk = case["one_by_one"], case["bulk"]
        assert bulk["makespan_over_lower_bound"] < one["makespan_over_lower_bound"]
        assert 4 * bulk["changes"] < one["changes"]


# -- from a mutation check: each test fails when the code it names is broken ---------------


def _rows(out: str) -> list[list[str]]:
    """The per-rank (or per-policy) rows of a table: lines starting with a rank number."""
    return [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s", line)]


def test_schedule_table_numbers_add_up(capsys):
    """with --cost tokens the predicted column
    is each rank's tokens, the tokens column sums to the batch, 'vs mean' is cost/mean - 1."""
    assert main(["schedule", "--n", "64", "--dp", "3", "--cost", "tokens"]) == 0
    out = capsys.readouterr().out
    total = int(re.search(r"; ([\d,]+) tokens$", out.splitlines()[0]).group(1).replace(",", ""))
    assert "predicted tokens" in out and re.search(r"makespan [\d,]+ tokens", out)
    rows = _rows(out)
    assert [r[0] for r in rows] == ["0", "1", "2"]
    pred = [int(r[1].replace(",", "")) for r in rows]
    toks = [int(r[2].replace(",", "")) for r in rows]
    vs = [float(r[3].rstrip("%")) / 100 for r in rows]
    assert sum(toks) == total and pred == toks
    for p, v in zip(pred, vs):
        assert v == pytest.approx(p / (total / 3) - 1, abs=1e-5)


def test_schedule_and_simulate_json_record_their_input(tmp_path, capsys):
    """the JSON says what was scheduled and under what."""
    out = tmp_path / "s.json"
    assert main(["schedule", "--n", "64", "--dp", "2", "--cost", "h200/qwen3-8b",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["input"] == {
        "source": "64 samples, distribution 'rl', seed 0", "model": "qwen3-8b",
        "cost": "qwen3-8b on NVIDIA H200 (measured)", "context_parallel": 1,
        "group_size": None}
    out = tmp_path / "sim.json"
    assert main(["simulate", "--n", "64", "--dp", "2", "--max-tokens", "8192", "--json", str(out)]) == 0
    assert {k: v for k, v in json.loads(out.read_text())["input"].items()
            if k in ("dp", "max_tokens", "mode")} == {"dp": 2, "max_tokens": 8192, "mode": "train"}


def test_simulate_vs_tokens_column_is_relative_to_token_balance(tmp_path, capsys):
    """'vs tokens' is each makespan over the tokens row's, minus 1."""
    out = tmp_path / "sim.json"
    assert main(["simulate", "--n", "256", "--dp", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = {r["policy"]: r["makespan_ms"] for r in json.loads(out.read_text())["policies"]}
    for policy, ms in rows.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{policy} "))
        shown = float(line.split()[-6].rstrip("%")) / 100
        assert shown == pytest.approx(ms / rows["tokens"] - 1, abs=5e-5), line


def test_simulate_does_not_call_a_sample_of_exactly_the_cap_longer(tmp_path, capsys):
    """a sample of exactly --max-tokens fits; no 'longer than the cap' note."""
    f = tmp_path / "ln.txt"
    f.write_text("1000\n" * 4 + "100\n" * 8)
    assert main(["simulate", "--lengths", str(f), "--dp", "2", "--max-tokens", "1000"]) == 0
    assert "longer than the cap" not in capsys.readouterr().out


def test_schedule_flags_reach_the_scheduler(tmp_path, capsys):
    """--mode, --align and --order change the schedule as they say: a forward-only pass is
    cheaper than a training step, --align 2 makes 13 micro-batches per rank an even count
    (here 20: at 14 or more, those that fill where the profile is cheaper per token win), and
    longest-first runs each rank's costliest micro-batch first (the default keeps the
    packer's order, which here is not sorted)."""
    def schedule(*flags):
        out = tmp_path / "s.json"
        assert main(["schedule", "--n", "256", "--dp", "4", "--cost", "h200/qwen3-8b",
                     "--json", str(out), *flags]) == 0
        return json.loads(out.read_text())

    train = schedule()
    assert train["num_microbatches"] == 13
    assert schedule("--mode", "forward")["makespan"] < 0.5 * train["makespan"]
    aligned = schedule("--align", "2")["num_microbatches"]
    assert aligned % 2 == 0 and aligned >= 14
    assert not all(c == sorted(c, reverse=True) for c in train["microbatch_costs"])
    assert all(c == sorted(c, reverse=True)
               for c in schedule("--order", "longest-first")["microbatch_costs"])
    capsys.readouterr()


@pytest.mark.parametrize("dp, shown", [(16, list(range(16))), (20, [0, 1, 2, 3, 16, 17, 18, 19])])
def test_schedule_table_shows_every_rank_up_to_16_then_the_ends(dp, shown, capsys):
    """up to 16 ranks every one is a row; more: the first 4, '...', the last 4."""
    assert main(["schedule", "--n", "256", "--dp", str(dp)]) == 0
    out = capsys.readouterr().out
    assert [int(r[0]) for r in _rows(out)] == shown
    assert (re.search(r"^\s+\.\.\.$", out, re.M) is not None) == (dp > 16)


def test_schedule_n_over_the_limit_names_the_flag(capsys, monkeypatch):
    """--n over what the command schedules is refused naming --n (not the API's 'n'), and
    exactly the limit is accepted."""
    from costmodel.commands import schedule

    monkeypatch.setattr(schedule, "MAX_GENERATED", 64)
    assert main(["schedule", "--n", "64", "--dp", "2"]) == 0
    capsys.readouterr()
    assert main(["schedule", "--n", "65", "--dp", "2"]) == 2
    assert "--n 65 samples is more than this command schedules (at most 64" in capsys.readouterr().err


@pytest.mark.parametrize("flags, says", [
    # each said build_schedule's name (dp_size, max_tokens_per_microbatch, align), which
    # is no flag of these commands
    (["--dp", "0"], "--dp must be an integer >= 1, got 0"),
    (["--max-tokens", "0"], "--max-tokens must be an integer >= 1, got 0"),
    (["--cap", "-5"], "--max-tokens must be an integer >= 1, got -5"),
    (["--max-tokens", "3000000000"], "--max-tokens 3,000,000,000 is more than any sample"),
    (["--align", "0"], "--align must be an integer >= 1, got 0"),
    (["--n", "0"], "--n must be an integer >= 1, got 0"),
    (["--n", "10", "--dp", "4", "--align", "3"],
     "10 samples cannot fill --dp 4 ranks of --align 3 micro-batch(es) each (none may be "
     "empty): raise --n to 12 or more, or lower --dp or --align"),
])
@pytest.mark.parametrize("command", ["schedule", "simulate"])
def test_batch_flag_errors_name_the_flag(command, flags, says, capsys):
    assert main([command, "--n", "64", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert "dp_size" not in err and "max_tokens_per_microbatch" not in err


@pytest.mark.parametrize("command", ["schedule", "simulate", "bench-schedule"])
def test_an_empty_lengths_file_name_is_refused_not_drawn(command, capsys):
    """`--lengths "$FILE"` with FILE unset drew --dist's synthetic batch and exited 0
    (schedule, simulate); bench-schedule said "'.' is a folder"."""
    assert main([command, "--lengths", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the lengths file name is empty ('')" in err, err


def test_too_few_lengths_in_a_file_name_the_file_s_remedy(tmp_path, capsys):
    path = tmp_path / "lengths.txt"
    path.write_text("100\n200\n")
    assert main(["schedule", "--lengths", str(path), "--dp", "4"]) == 2
    assert "2 samples cannot fill --dp 4 ranks" in (err := capsys.readouterr().err)
    assert "add lengths to the file" in err


def test_simulate_cost_model_row_is_the_schedule_command_s_in_the_mode_asked(tmp_path, capsys):
    """The 'cost-model' policy is `schedule --cost MODEL` with the same flags (--mode,
    --align): the same makespan under the same judge; every policy honours --align; the
    validation line is the mode's; no slow-variant note for a small batch."""
    sched, sim = tmp_path / "s.json", tmp_path / "sim.json"
    flags = ["--n", "256", "--dp", "4", "--mode", "forward", "--align", "2"]
    assert main(["schedule", *flags, "--cost", "h200/qwen3-8b", "--json", str(sched)]) == 0
    capsys.readouterr()
    assert main(["simulate", *flags, "--cost-model", "h200/qwen3-8b", "--variant",
                 "--json", str(sim)]) == 0
    out, err = capsys.readouterr()
    rows = {r["policy"]: r for r in json.loads(sim.read_text())["policies"]}
    assert rows["cost-model"]["makespan_ms"] == pytest.approx(
        json.loads(sched.read_text())["makespan"], rel=1e-9)
    assert all(r["microbatches_per_rank"] % 2 == 0 for r in rows.values()), rows
    assert "validated (forward," in out and "validated (train," not in out
    assert "quadratic" not in err


def test_simulate_judges_with_the_h200_model_of_model_s_shape_by_default(capsys):
    """no --cost-model: the H200 cost model of --model's shape (not qwen3-8b's), and FLOPS
    in capitals is a row of the table, as lower case is."""
    assert main(["simulate", "--model", "qwen3-4b", "--n", "64", "--dp", "2"]) == 0
    assert "judged by: qwen3-4b on NVIDIA H200" in capsys.readouterr().out
    assert main(["simulate", "--n", "64", "--cost-model", "FLOPS"]) == 2
    assert "already a row of the table" in capsys.readouterr().err


def test_simulate_refuses_an_empty_cost_model(tmp_path, capsys):
    """`--cost-model ''` was read as unset: the default H200 model judged, without a word."""
    out = tmp_path / "sim.json"
    assert main(["simulate", "--n", "64", "--cost-model", "", "--json", str(out)]) == 2
    assert "the cost model is empty ('')" in capsys.readouterr().err and not out.exists()


def test_context_parallel_prices_one_gpu_of_each_split_micro_batch(tmp_path, capsys):
    """--context-parallel 4: schedule and simulate's cost-model row balance, and simulate
    judges every policy by, what one of the 4 GPUs of a micro-batch runs."""
    from costmodel.model import load_cost_model
    from costmodel.scheduler import generate_lengths

    sched, sim = tmp_path / "s.json", tmp_path / "sim.json"
    flags = ["--n", "256", "--dp", "4", "--max-tokens", "65536"]
    assert main(["schedule", *flags, "--cost", "h200/qwen3-8b", "--context-parallel", "4",
                 "--json", str(sched)]) == 0
    assert main(["simulate", *flags, "--context-parallel", "4", "--json", str(sim)]) == 0
    out = capsys.readouterr().out
    assert "one rank of context parallelism 4" in out
    simulated, scheduled = json.loads(sim.read_text()), json.loads(sched.read_text())
    assert simulated["input"]["context_parallel"] == scheduled["input"]["context_parallel"] == 4
    rows = {r["policy"]: r for r in simulated["policies"]}
    assert rows["cost-model"]["makespan_ms"] == pytest.approx(scheduled["makespan"], rel=1e-9)
    one_gpu = load_cost_model("h200/qwen3-8b").for_context_parallel(4)
    lengths = generate_lengths(256, "rl", seed=0)  # what --n 256 draws
    for mbs, costs in zip(scheduled["microbatches"], scheduled["microbatch_costs"]):
        assert costs == pytest.approx([one_gpu.microbatch_cost(lengths[mb]) for mb in mbs])
    assert main(["schedule", *flags, "--context-parallel", "0"]) == 2
    assert "--context-parallel must be an integer >= 1, got 0" in capsys.readouterr().err


def test_n_and_seed_with_a_lengths_file_are_said_to_do_nothing(tmp_path, capsys):
    """They draw from --dist; a file is scheduled whole, and was silently so."""
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(["100", "200", "300", "400"]))
    assert main(["schedule", "--lengths", str(path), "--dp", "2", "--n", "2", "--seed", "3"]) == 0
    captured = capsys.readouterr()
    assert "note: --n and --seed only apply to --dist; scheduling all 4 lengths" in captured.err
    assert "4 lengths from" in captured.out
    assert main(["schedule", "--lengths", str(path), "--dp", "2", "--seed", "3"]) == 0
    assert "note: --seed only applies to --dist" in capsys.readouterr().err
    assert main(["schedule", "--lengths", str(path), "--dp", "2"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main(["schedule", "--dp", "2", "--max-tokens", "65536"]) == 0  # --n defaults to 4096
    assert "4096 samples, distribution 'rl', seed 0" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["schedule", "simulate"])
def test_more_context_parallel_gpus_than_tokens_are_refused(command, capsys):
    """--context-parallel 10^14 was taken and priced each GPU's share of nothing."""
    flags = ["--n", "64", "--dp", "2", "--max-tokens", "4096"]
    assert main([command, *flags, "--cost-model", "h200/qwen3-8b", "--context-parallel",
                 "100000000000000"]) == 2
    err = capsys.readouterr().err
    assert "--context-parallel 100,000,000,000,000 is more GPUs than --max-tokens 4,096 has " \
           "tokens" in err and err.count("\n") == 1, err
    assert main([command, *flags, "--cost-model", "h200/qwen3-8b", "--context-parallel", "4096"]) == 0


def test_a_cost_model_file_given_as_the_model_says_to_give_it_as_cost(capsys):
    assert main(["schedule", "--model", "costmodel/profiles/h200/qwen3-8b.json"]) == 2
    err = capsys.readouterr().err
    assert "this is a cost model file (for model 'qwen3-8b'), not a model's config.json" in err, err
    assert "where a cost model is asked for (--cost-model)" in err, err


@pytest.mark.parametrize("command", [["simulate"], ["bench-schedule"], ["flops", "--lengths", "100"]])
def test_a_cost_model_file_as_the_model_names_no_flag_the_command_lacks(command, capsys):
    # simulate and bench-schedule take --cost-model only ("--cost" is no flag of theirs),
    # flops takes no cost model at all: the message names --cost-model, not --cost
    assert main([*command, "--model", "costmodel/profiles/h200/qwen3-8b.json"]) == 2
    err = capsys.readouterr().err
    assert "this is a cost model file" in err and "--cost " not in err and "--cost)" not in err, err
