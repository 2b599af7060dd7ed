"""`costmodel correct`: factors per part fitted to runs measured end to end (CPU only)."""

from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import pytest

from costmodel.calibration.correct import (
    MIN_RUNS,
    Correction,
    Run,
    _judge,
    apply_correction,
    fit_correction,
    part_times,
    read_runs,
    run_line,
    validation_runs,
)
from costmodel.cli import main
from costmodel.model import PARTS, CostModel, load_cost_model

PROFILE = "h200/qwen3-8b"
# How a stack might differ from its calibration: overheads that overlap, a slower attention
# kernel, cheaper GEMMs in one graph, a head as measured.
TRUTH = {"overhead": 0.3, "attention": 1.5, "linear": 0.8, "head": 1.1}


def _batches(rng: np.random.Generator, count: int, per_run: int = 1) -> list[tuple]:
    """Runs of `per_run` micro-batches of 1..12 long-tailed sequences each."""
    def mb():
        n = int(rng.integers(1, 13))
        return tuple(int(x) for x in np.clip(rng.lognormal(np.log(900), 1.0, n), 16, 16384))
    return [tuple(mb() for _ in range(per_run)) for _ in range(count)]


def _runs(model, truth, *, count=80, noise=0.01, seed=0, per_run=3, mode="train"):
    """Whole-model runs timed by `model` with each part scaled by `truth`, with noise."""
    rng = np.random.default_rng(seed)
    shapes = _batches(rng, count, per_run)
    plain = [Run(microbatches=mbs, ms=1.0, mode=mode) for mbs in shapes]
    true_ms = part_times(model, plain) @ np.array([truth[p] for p in PARTS])
    noisy = true_ms * (1 + noise * rng.standard_normal(count))
    return [Run(microbatches=mbs, ms=float(ms), mode=mode) for mbs, ms in zip(shapes, noisy)]


@pytest.fixture(scope="module")
def model():
    return load_cost_model(PROFILE)


def test_parts_add_up_to_the_model(model):
    """part_times of whole-model runs is microbatch_cost summed, part by part; of a stack,
    stack_cost."""
    rng = np.random.default_rng(1)
    for mbs in _batches(rng, 20, per_run=3):
        for mode in model.modes:
            whole = part_times(model, [Run(microbatches=mbs, ms=1.0, mode=mode)])[0]
            assert whole.sum() == pytest.approx(sum(model.microbatch_cost(mb, mode) for mb in mbs),
                                                rel=1e-12)
            parts = model.breakdown(mbs[0], mode)
            assert parts["total"] == pytest.approx(model.microbatch_cost(mbs[0], mode), rel=1e-12)
            stack = part_times(model, [Run(microbatches=mbs[:1], ms=1.0, mode=mode, layers=4)])[0]
            assert stack.sum() == pytest.approx(model.stack_cost(mbs[0], mode, num_layers=4),
                                                rel=1e-12)


def test_fit_recovers_known_factors(model):
    runs = _runs(model, TRUTH) + _runs(model, TRUTH, mode="forward", seed=1)
    correction = fit_correction(model, runs)
    for mode in ("train", "forward"):
        fig = correction.figures[mode]
        assert fig["adopted"]
        # The parts that make a tenth of these runs or more; overhead (1-5%) and head (~8%,
        # token-linear as the linear part is) are pulled towards 1 by the prior, which
        # costs these runs' predictions little (checked below).
        for part in ("attention", "linear"):
            assert correction.scales[mode][part] == pytest.approx(TRUTH[part], rel=0.05), part
        assert fig["held_out"]["mape"] < 0.02 < fig["before"]["mape"]
    corrected = apply_correction(model, correction, source="test")
    fresh = _runs(model, TRUTH, seed=2, noise=0.0)
    predicted = np.array([sum(corrected.microbatch_cost(mb) for mb in r.microbatches) for r in fresh])
    measured = np.array([r.ms for r in fresh])
    assert np.mean(np.abs(predicted / measured - 1)) < 0.02
    # the file says what was done, and reads back the same
    scales = corrected.provenance["correction"]["scales"]["train"]
    assert scales == correction.scales["train"]
    again = type(corrected).from_dict(json.loads(json.dumps(corrected.to_dict())))
    assert again.microbatch_cost([900, 4000]) == pytest.approx(corrected.microbatch_cost([900, 4000]))


def test_corrections_compound(model):
    runs = _runs(model, TRUTH)
    once = apply_correction(model, fit_correction(model, runs), source="first")
    twice = apply_correction(once, fit_correction(once, runs), source="second")
    total = twice.provenance["correction"]["scales"]["train"]
    first = once.provenance["correction"]["scales"]["train"]
    second = fit_correction(once, runs).scales.get("train", dict.fromkeys(PARTS, 1.0))
    for part in PARTS:
        assert total[part] == pytest.approx(first[part] * second[part])
    for part in ("attention", "linear"):
        assert total[part] == pytest.approx(TRUTH[part], rel=0.05)
    assert abs(second["attention"] - 1) < 0.05 and abs(second["linear"] - 1) < 0.05


def test_no_systematic_error_keeps_the_curves(model):
    """Runs the model already predicts, up to 5% noise: a fit to them is noise, and the
    paired test keeps the curves (a bare "lower held-out mean" adopted 2 of these 6)."""
    for seed in range(6):
        runs = _runs(model, dict.fromkeys(PARTS, 1.0), noise=0.05, count=40, seed=seed)
        correction = fit_correction(model, runs)
        assert correction.scales == {}
        assert "no better than chance" in correction.figures["train"]["why_not"]
    same = apply_correction(model, correction, source="test")
    assert same.microbatch_cost([500, 9000]) == model.microbatch_cost([500, 9000])


def test_impossible_runs_are_refused(model, caplog):
    """Runs far faster than the model: the factors hit their bounds (a warning) and the
    corrected curves would beat the H200's peak (an error)."""
    fast = {p: 0.01 for p in PARTS}
    with caplog.at_level(logging.WARNING):
        correction = fit_correction(model, _runs(model, fast))
    assert "bound" in caplog.text
    with pytest.raises(ValueError, match="impossible.*not of"):
        apply_correction(model, correction, source="test")


def test_a_file_whose_own_curves_beat_the_peak_is_named_not_the_runs(tmp_path, model):
    """Regression (an audit's): a hand-edited model whose attention runs faster than the GPU
    (built in memory: `load_cost_model` refuses such a file), and `correct` said its runs
    "are not of" the model, whatever they were; the model is at fault, and a slight
    correction shows it."""
    doc = model.to_dict()
    attention = doc["curves"]["train"]["attention"]
    attention["ms"] = [attention["ms"][0]] * len(attention["ms"])  # flat: 32k as fast as 64
    edited = CostModel.from_dict(doc, source="edited.json")
    slight = Correction(scales={"train": {"overhead": 1.0, "attention": 1.1, "linear": 1.0,
                                          "head": 1.0}})
    with pytest.raises(ValueError, match=r"its own curves are impossible, before any "
                       r"correction \(\d+ knot\(s\) of its curves run faster than NVIDIA H200 can.*\): "
                       r"recalibrate it") as err:
        apply_correction(edited, slight, source="test")
    assert "not of" not in str(err.value)
    apply_correction(model, slight, source="test")  # the shipped curves pass


@pytest.mark.parametrize("key", [None, "h999"])
def test_a_file_without_a_registry_key_is_checked_against_its_gpu_s_peak(model, key):
    """A file from before gpu.key (the loader takes it), or one whose key is not in the
    registry, skipped the FLOPs check: factors of 0.01 were written, 4x past the peak of
    the NVIDIA H200 its gpu.name says it was measured on."""
    doc = model.to_dict()
    if key is None:
        del doc["gpu"]["key"]
    else:
        doc["gpu"]["key"] = key
    keyless = CostModel.from_dict(doc, source="old.json")
    fast = Correction(scales={"train": {p: 0.01 for p in PARTS}})
    with pytest.raises(ValueError, match="impossible.*NVIDIA H200.*not of"):
        apply_correction(keyless, fast, source="test")


def test_bad_fits_are_refused(model):
    runs = _runs(model, TRUTH, count=MIN_RUNS - 1)
    with pytest.raises(ValueError, match=f"at least {MIN_RUNS}"):
        fit_correction(model, runs)
    with pytest.raises(ValueError, match="no runs"):
        fit_correction(model, [])
    with pytest.raises(ValueError, match="folds"):
        fit_correction(model, _runs(model, TRUTH), folds=1)
    train_only = type(model).from_dict({**model.to_dict(), "curves": {
        "train": model.to_dict()["curves"]["train"]}, "validation": None})
    with pytest.raises(ValueError, match="forward passes"):
        fit_correction(train_only, _runs(model, TRUTH, mode="forward"))
    # Each refusal by its own message (a bare ValueError let one check stand in for another),
    # and an empty micro-batch among others: dropping that half of the check passed.
    for bad, says in (({"microbatches": (), "ms": 1.0}, "at least one micro-batch"),
                      ({"microbatches": ((5,), ()), "ms": 1.0}, "each of one sequence or more"),
                      ({"microbatches": ((5,),), "ms": 0.0}, "ms must be a positive number"),
                      ({"microbatches": ((5,),), "ms": 1.0, "mode": "eval"}, "'eval'")):
        with pytest.raises(ValueError, match=says):
            Run(**bad)


def test_runs_predicted_exactly(model):
    """Errors the correction leaves as they were leave the Wilcoxon test nothing to rank
    (scipy: NaN and a warning; NaN is no JSON for the file). A size range the model
    predicted exactly (error 0) and the correction predicts worse must not divide by
    that 0 when the refusal names the worst range."""
    parts = np.zeros((12, len(PARTS)))
    parts[:, 1] = np.linspace(1, 2, 12)  # one part, predicted exactly: the factors are 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = _judge(parts, parts.sum(axis=1), np.arange(12.0), 3)
    assert fig["p_value"] == 1.0 and not fig["adopted"]

    rng = np.random.default_rng(3)
    shapes = _batches(rng, 30)  # one micro-batch per run: its size is the run's
    parts = part_times(model, [Run(microbatches=mbs, ms=1.0) for mbs in shapes])
    smallest = np.argsort([sum(mbs[0]) for mbs in shapes], kind="stable")[:6]  # 1st of 5 ranges
    measured = parts @ np.array([1.0, 3.0, 1.0, 1.0])
    measured[smallest] = parts[smallest].sum(axis=1)
    runs = [Run(microbatches=mbs, ms=float(ms)) for mbs, ms in zip(shapes, measured)]
    fig = fit_correction(model, runs).figures["train"]
    assert not fig["adopted"] and "tokens worse (" in fig["why_not"]
    assert json.dumps(fig, allow_nan=False)


def test_malformed_earlier_correction(tmp_path, model):
    """A hand-edited provenance.correction cannot be compounded: a ValueError that says
    what to do, not an AttributeError from deep in apply_correction; `report` skips it."""
    correction = fit_correction(model, _runs(model, TRUTH))
    for bad in ("yes", [1, 2], {"scales": "x"}, {"scales": {"train": [1]}},
                {"scales": {"train": {"linear": "a"}}}):
        doc = model.to_dict()
        doc["provenance"] = {**doc["provenance"], "correction": bad}
        edited = type(model).from_dict(doc)
        with pytest.raises(ValueError, match="provenance.correction is malformed"):
            apply_correction(edited, correction, source="test")
        path = tmp_path / "edited.json"
        edited.save(path)
        assert main(["report", str(path)]) == 0
        assert main(["correct", str(path), "--runs", str(_runs_file(tmp_path, model)),
                     "-o", str(tmp_path / "out.json")]) == 2
        assert not (tmp_path / "out.json").exists()


def _runs_file(tmp_path, model):
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps({"microbatches": [list(mb) for mb in r.microbatches],
                                        "ms": r.ms}) + "\n" for r in _runs(model, TRUTH)))
    return path


def test_runs_file(tmp_path, model):
    runs = _runs(model, TRUTH, count=12)
    path = tmp_path / "runs.jsonl"
    lines = ["# one rank's step per line", ""]
    lines += [json.dumps({"mode": r.mode, "microbatches": [list(mb) for mb in r.microbatches],
                          "ms": r.ms}) for r in runs]
    path.write_text("\n".join(lines) + "\n")
    assert read_runs(path) == runs
    for text, match in (
        ('{"microbatches": [[5]], "ms": 1.0, "rank": 3}', "line 1: unknown field"),
        ('{"microbatches": [[5, 0]], "ms": 1.0}', "line 1: .*lengths"),
        ('{"microbatches": [5], "ms": 1.0}', "line 1: 'microbatches' must be"),
        ('{"microbatches": [[5]], "ms": "3"}', "line 1: 'ms' must be a number"),
        ('{"microbatches": [[5]], "ms": -2}', "line 1: ms must be a positive"),
        ("[1, 2]", "line 1: not a JSON object"),
        ("{broken", "line 1: "),
        ("# nothing\n", "holds no runs"),
        ('{"microbatches": [[5]], "ms": 1' + "0" * 400 + "}", "line 1: ms must be a positive"),
        ('{"microbatches": [[5]], "ms": 1.0}\n' + "[" * 100_000 + "]" * 100_000,
         "line 2: JSON nested too deeply"),
    ):
        path.write_text(text + "\n")
        with pytest.raises(ValueError, match=match):
            read_runs(path)


def test_runs_file_of_bytes(tmp_path):
    """Bytes that are no UTF-8 (a binary file given by mistake) are named by their line, not
    only by a decoder's offset into the file: a text-mode read decodes ahead, and raised it
    while reading line 1. A byte-order mark (PowerShell's `Out-File`) is no error."""
    path = tmp_path / "runs.jsonl"
    line = b'{"microbatches": [[5]], "ms": 1.0}\n'
    path.write_bytes(line * 300 + b"\xff\xfe\n")
    with pytest.raises(ValueError, match=r"line 301: not UTF-8 text \(byte 0xff at column 1\)"):
        read_runs(path)
    path.write_bytes(b"\xef\xbb\xbf" + line)
    assert read_runs(path) == [Run(microbatches=((5,),), ms=1.0)]
    with pytest.raises(ValueError, match="is a directory"):
        read_runs(tmp_path)


def test_validation_runs_of_the_shipped_profile(model):
    """The H200 validation's 120 micro-batches per pass read back as 4-layer stacks; factors
    fitted to them trade the launch-bound small micro-batches against the large ones (a
    separate H200 measurement, benchmarks/results/bench_correction_h200.json, shows them 30%
    off there), and the check over sizes refuses them."""
    runs = validation_runs(model)
    assert len(runs) == 240 and {r.layers for r in runs} == {4}
    correction = fit_correction(model, runs)
    assert correction.scales == {}
    train = correction.figures["train"]
    assert "8192-16384 tokens worse" in train["why_not"]
    assert train["scales"]["linear"] < 0.7  # what the refused fit would have done
    # the yardsticks, as validate computed them for the same micro-batches
    stored = model.extra["validation"]["modes"]["train"]["summary"]
    for split in ("all", ">=1024"):
        for name in ("tokens", "flops"):
            assert train["baselines"][split][name]["mape"] == pytest.approx(
                stored[split][name]["mape"], rel=1e-9)
    estimate = load_cost_model("h100/qwen3-8b")
    with pytest.raises(ValueError, match="no validation"):
        validation_runs(estimate)


def test_cli(tmp_path, capsys, model):
    # the shipped profile's own validation: refused (above), nothing written, status 1
    refused = tmp_path / "refused.json"
    assert main(["correct", PROFILE, "-o", str(refused)]) == 1
    assert "nothing written" in capsys.readouterr().out and not refused.exists()

    runs = _runs(model, TRUTH)  # in two files, as two ranks would write them
    files = [tmp_path / "runs.rank0.jsonl", tmp_path / "runs.rank1.jsonl"]
    for path, part in zip(files, (runs[::2], runs[1::2])):
        path.write_text("".join(run_line(r.microbatches, r.ms) + "\n" for r in part))
    out = tmp_path / "corrected.json"
    assert main(["correct", PROFILE, "--runs", *map(str, files), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "held-out" in text and f"wrote {out}" in text and " 80 " in text
    corrected = load_cost_model(str(out))
    assert corrected.provenance["correction"]["from"] == ", ".join(map(str, files))
    # the stored validation is judged again by the corrected curves, and says so
    assert corrected.extra["validation"]["revalidated"]["by"] == "corrected"
    assert main(["report", str(out)]) == 0
    assert "corrected: from" in capsys.readouterr().out

    # errors: one line, and no output written
    bad = tmp_path / "bad.json"
    for argv, match in (
        (["correct", "h100/qwen3-8b", "-o", str(bad)], "holds no validation"),
        (["correct", PROFILE, "--runs", str(tmp_path / "none.jsonl"), "-o", str(bad)],
         f"runs file not found: {tmp_path / 'none.jsonl'}"),  # was "[Errno 2] No such file ..."
        (["correct", PROFILE, "--folds", "1", "-o", str(bad)], "--folds must be in 2..100, got 1"),
        # before the runs are read: a missing file is not what --folds 0 is told
        (["correct", PROFILE, "--runs", str(tmp_path / "none.jsonl"), "--folds", "0", "-o",
          str(bad)], "--folds must be in 2..100, got 0"),
    ):
        assert main(argv) == 2
        assert match in capsys.readouterr().err
        assert not bad.exists()


def test_refit_of_a_corrected_file_warns(tmp_path, caplog, model):
    corrected = apply_correction(model, fit_correction(model, _runs(model, TRUTH)), source="t")
    path = corrected.save(tmp_path / "corrected.json")
    with caplog.at_level(logging.WARNING):
        assert main(["calibrate", "--refit", str(path), "-o", str(tmp_path / "refit.json")]) == 0
    assert "without the correction" in caplog.text


def test_a_trade_between_sizes_is_refused(model):
    """Small micro-batches cheaper than their parts (launches that overlap), large ones as
    predicted: no factor per part is true, and one fitted to all sizes must not be adopted
    for fitting the small ones at the large ones' cost."""
    rng = np.random.default_rng(4)
    shapes = [(tuple(int(x) for x in np.clip(rng.lognormal(np.log(600), 1.3, int(rng.integers(1, 9))),
                                            16, 16384)),) for _ in range(120)]
    plain = [Run(microbatches=mbs, ms=1.0) for mbs in shapes]
    predicted = part_times(model, plain).sum(axis=1)
    tokens = np.array([sum(mbs[0]) for mbs in shapes])
    measured = predicted * (1 - 0.4 * np.exp(-tokens / 1500)) * (1 + 0.01 * rng.standard_normal(120))
    runs = [Run(microbatches=mbs, ms=float(ms)) for mbs, ms in zip(shapes, measured)]
    fig = fit_correction(model, runs).figures["train"]
    assert fig["p_value"] < 0.05  # better on average, by more than chance ...
    assert not fig["adopted"] and "tokens worse" in fig["why_not"]  # ... but not at every size


def test_correction_benchmark(tmp_path, load_benchmark):
    """On the stored H200 times: random folds would have passed the validation's factors,
    the size check refuses them, and they would have priced the bench-schedule ranks ~30%
    low; factors fitted to those ranks stay within 5% of 1."""
    bench = load_benchmark("bench_correction")
    out = tmp_path / "correction.json"
    assert bench.main(["--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    validation_train, _, ranks, _, _, estimate_ranks = doc["cases"]
    assert validation_train["random_folds"]["wilcoxon_p"] < 0.05 and not validation_train["adopted"]
    random_folds_pick, estimate_from_ranks = doc["transfer"]
    assert random_folds_pick["corrected"]["mape"] > 10 * random_folds_pick["as_is"]["mape"]
    # the ranks' factors carry over to the validation's micro-batches of >= 1k tokens
    assert estimate_from_ranks["corrected_1k"] < 0.8 * estimate_from_ranks["as_is_1k"]
    assert all(abs(f - 1) < 0.05 for f in ranks["factors"].values()) and not ranks["adopted"]
    assert estimate_ranks["model"] == "estimate" and estimate_ranks["adopted"]


def test_run_recorder(tmp_path):
    """A training loop's steps as runs: timed between two synchronisations, appended one
    line a step, a failed step not recorded, bad lengths refused before the work."""
    from costmodel.integrations.runs import RunRecorder

    syncs = []
    recorder = RunRecorder(tmp_path / "new" / "runs.rank0.jsonl",
                           synchronize=lambda: syncs.append(1))
    with recorder.step([[300, 20], [4000]]):
        sum(range(10000))
    with pytest.raises(RuntimeError), recorder.step([[5]]):
        raise RuntimeError("out of memory")
    with pytest.raises(ValueError), recorder.step([[5, 0]]):
        pytest.fail("ran a step of bad lengths")
    with recorder.step([[7]], mode="forward"):
        pass
    runs = read_runs(recorder.path)
    assert [(r.microbatches, r.mode) for r in runs] == [(((300, 20), (4000,)), "train"),
                                                        (((7,),), "forward")]
    assert all(r.ms > 0 for r in runs) and recorder.steps == 2 and len(syncs) == 5
    with pytest.raises(ValueError, match="directory"):
        RunRecorder(tmp_path)
    with pytest.raises(ValueError, match="mode"):
        RunRecorder(tmp_path / "x.jsonl", mode="eval")


def test_run_recorder_keeps_the_lengths_it_was_given(tmp_path):
    """Regression: the lengths were read again after the block, so a loop that emptied its
    list (or a generator, read once) failed the step after it ran."""
    from costmodel.integrations.runs import RunRecorder

    recorder = RunRecorder(tmp_path / "runs.jsonl", synchronize=lambda: None)
    queue = [[300, 20], [4000]]
    with recorder.step(queue):
        while queue:
            queue.pop(0)
    with recorder.step(list(mb) for mb in [[7], [8, 9]]):
        pass
    assert [r.microbatches for r in read_runs(recorder.path)] == [((300, 20), (4000,)),
                                                                  ((7,), (8, 9))]


def test_run_recorder_steps_do_not_nest(tmp_path):
    """A step inside a step would write two lines, the outer one's time holding the
    inner's: refused, and neither written; the recorder works again after."""
    from costmodel.integrations.runs import RunRecorder

    recorder = RunRecorder(tmp_path / "runs.jsonl", synchronize=lambda: None)
    with pytest.raises(RuntimeError, match="do not nest"), recorder.step([[5]]), \
            recorder.step([[6]]):
        pytest.fail("ran a nested step")
    assert not recorder.path.exists() and recorder.steps == 0
    with recorder.step([[5]]):
        pass
    assert recorder.steps == 1


def test_recording_runs_imports_no_scipy_or_torch():
    """A training process that records runs imports the runs file alone: scipy's optimize and
    stats (the fit's) cost ~1 s to import, torch is the training script's to import."""
    import subprocess
    import sys

    code = ("import sys, costmodel.integrations.runs, costmodel.training.trainer\n"
            "print(sorted(m for m in ('scipy.optimize', 'scipy.stats', 'torch') "
            "if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_estimate_corrected_by_measured_runs(tmp_path, load_benchmark):
    """The registry estimate, corrected by the 352 ranks bench-schedule measured on the H200
    (stored times): held-out error well below the estimate's, factors near 1, and the label
    says what it is."""
    from costmodel.estimate import estimate_cost_model

    bench = load_benchmark("bench_correction")
    estimate = estimate_cost_model("qwen3-8b", "h200")
    correction = fit_correction(estimate, bench.bench_schedule_runs(bench.BENCH))
    fig = correction.figures["train"]
    assert fig["adopted"] and fig["held_out"]["mape"] < 0.5 * fig["before"]["mape"]
    assert all(0.9 < s < 1.2 for s in correction.scales["train"].values())
    corrected = apply_correction(estimate, correction, source="bench-schedule ranks")
    assert corrected.is_estimate and corrected.label.endswith("(ESTIMATE, corrected)")
    again = load_cost_model(str(corrected.save(tmp_path / "estimate.json")))
    assert again.label == corrected.label


def test_flops_yardstick_of_whole_model_runs(model):
    """The FLOPs yardstick sums each run's sequences' FLOPs (one vectorised call over every
    run): the same as summing run by run."""
    from costmodel.calibration.validate import best_scale
    from costmodel.flops import sequence_fwd_flops

    runs = _runs(model, TRUTH, count=30)
    fig = fit_correction(model, runs).figures["train"]
    work = np.array([sum(sequence_fwd_flops(mb, model.rank_spec).sum() for mb in r.microbatches)
                     for r in runs])
    measured = np.array([r.ms for r in runs])
    want = np.mean(np.abs(best_scale(work, measured) * work / measured - 1))
    assert fig["baselines"]["all"]["flops"]["mape"] == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("ms", [-1.0, 0, 1e-300, "12.5", True])
def test_a_validation_time_no_gpu_measured_is_named_not_a_traceback(tmp_path, capsys, caplog, ms):
    """Regression (an audit's): a stored validation point measured at -1 ms failed deep in
    the summary with an IndexError traceback in `correct` and `calibrate --refit`; 0 ms
    made `correct` say "ms must be a positive number" of no file, and a refit fail to write
    its infinite error; 1e-300 ms was written as a 1e300 error; "12.5" and true were read
    as times."""
    from costmodel.calibration.pipeline import refit
    from costmodel.profiles import profile_path

    doc = json.loads(profile_path("h200", "qwen3-8b").read_text())
    doc["validation"]["modes"]["train"]["points"][3]["measured_ms"] = ms
    path, out = tmp_path / "model.json", tmp_path / "corrected.json"
    path.write_text(json.dumps(doc))
    assert main(["correct", str(path), "-o", str(out)]) == 2
    assert "validation's micro-batches cannot be read back" in capsys.readouterr().err
    assert f"train point 3 has measured_ms {ms!r}" in caplog.text
    assert not out.exists()
    assert refit(doc, source="test").extra["validation"] is None  # dropped, with the warning
