"""CostModel: evaluation, vectorisation, monotonicity, the file format and its validation."""

import dataclasses
import json
import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.curves import AttentionCurve, ModeCurves, TokenCurve
from costmodel.estimate import estimate_cost_model
from costmodel.model import CostModel, load_cost_model
from costmodel.model_file import SCHEMA, write_json_atomic
from costmodel.spec import ModelSpec

SPEC = ModelSpec.from_preset("qwen3-8b")


@pytest.fixture(scope="module")
def model():
    return estimate_cost_model(SPEC, "h200")


def _toy(spec=SPEC, *, per_layer=0.01, per_mb=0.5, gpu="NVIDIA H200"):
    """Round numbers, not a GPU's: its linear and head curves run faster than an H200
    can, so a file of it loads only for a GPU without a registry peak (``gpu``)."""
    curves = {
        "train": ModeCurves(
            attention=AttentionCurve([64, 1024, 8192], [0.001, 0.05, 2.0]),
            linear={"dense": TokenCurve([16, 1024, 8192], [0.2, 0.5, 4.0])},
            head=TokenCurve([16, 8192], [0.05, 3.0]),
            layer_overhead_ms=per_layer,
            microbatch_overhead_ms=per_mb,
        )
    }
    key = "h200" if gpu == "NVIDIA H200" else None
    return CostModel(spec=spec, gpu=gpu, gpu_key=key, curves=curves)


def test_constructor_takes_a_preset_name_and_refuses_a_bad_reference_count():
    """Regression: spec="qwen3-8b" was an AttributeError, reference_tokens "8192" a
    TypeError and 1.5 silently 1."""
    m = _toy(spec="qwen3-8b")
    assert m.spec == ModelSpec.from_preset("qwen3-8b")
    for bad in ("8192", 1.5, float("nan"), 0):
        with pytest.raises(ValueError, match="reference_tokens must be an integer >= 1"):
            CostModel(spec=SPEC, gpu="NVIDIA H200", curves=m.curves, reference_tokens=bad)


def test_formula_by_hand():
    m = _toy()
    lengths = [1000, 3000]
    c = m.curves["train"]
    want = (
        0.5 + 36 * 0.01
        + 36 * (float(c.attention(np.array([1000.0]))[0]) + float(c.attention(np.array([3000.0]))[0]))
        + 36 * float(c.linear["dense"](4000)) + float(c.head(4000))
    )
    assert m.microbatch_cost(lengths) == pytest.approx(want, rel=1e-12)
    b = m.breakdown(lengths)
    assert b["total"] == pytest.approx(want, rel=1e-12)
    assert b["overhead"] == pytest.approx(0.5 + 0.36)
    assert m.microbatch_cost([]) == 0.0


def test_curve_extrapolation():
    a = AttentionCurve([64, 1024, 8192], [0.001, 0.05, 2.0])
    assert float(a(16384)) == pytest.approx(2.0 * 4)  # L^2 tail
    L = np.arange(1, 40000, 7)
    assert np.all(np.diff(a(L)) >= 0)
    assert 0 <= a.low_exponent <= 2 and float(a(1)) > 0
    t = TokenCurve([16, 1024], [0.2, 0.5])
    assert float(t(1)) == pytest.approx(0.2)  # flat below: the launch floor
    assert float(t(2048)) == pytest.approx(1.0)  # last knot's time per token beyond


def test_microbatch_costs_matches_loop(model):
    rng = np.random.default_rng(1)
    sizes = rng.integers(0, 9, 300)  # includes empty micro-batches
    lengths = rng.integers(1, 50000, sizes.sum())  # beyond the attention table too
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    for mode in ("train", "forward"):
        vec = model.microbatch_costs(lengths, offsets, mode)
        loop = [model.microbatch_cost(lengths[a:b], mode) for a, b in zip(offsets[:-1], offsets[1:])]
        np.testing.assert_allclose(vec, loop, rtol=1e-9)
        assert np.all(vec[sizes == 0] == 0)


def test_token_costs_are_the_curves_sum_at_every_count_looked_up_or_not():
    """Whole counts come from a table grown on demand: the same numbers as the curves give
    (schedules stay bit for bit what they were), and counts it does not hold (fractions,
    past its largest size) are the curves' too. A count below 0, NaN or inf is an error (the
    curve read -3 tokens as its floor)."""
    m = _toy()
    c = m.curves["train"]

    def by_hand(tokens):
        return 36 * c.linear["dense"](tokens) + c.head(tokens)

    first = np.array([0, 1, 15, 16, 1000, 8192, 8193, 16384, 16385, 7.5])
    np.testing.assert_array_equal(m.token_costs(first), by_hand(first))
    grows = np.array([1.0, 16385, 100_000, 2**18, 2**18 + 1, 1e9, 131_071.5])
    np.testing.assert_array_equal(m.token_costs(grows), by_hand(grows))
    every = np.arange(2**18 + 2, dtype=np.float64)
    np.testing.assert_array_equal(m.token_costs(every), by_hand(every))
    assert m.token_costs([]).shape == (0,)
    for bad in (-3.0, np.nan, np.inf):
        with pytest.raises(ValueError, match="token counts must be finite and >= 0"):
            m.token_costs([100, bad])


def test_token_costs_of_one_count_is_a_0d_array_whatever_the_count():
    """Regression: a single count (a Python or numpy scalar) that the table does not hold,
    a fraction (every odd count under context parallelism 2) or one past the table, was a
    TypeError ('numpy.float64' object does not support item assignment), and a whole one
    came back as a numpy scalar, not the 0-d array of before."""
    m = _toy()
    c = m.curves["train"]
    for count in (0, 100, 100.0, 7.5, 16385, 300_000.0, 1e9, np.float64(7.5)):
        got = m.token_costs(count)
        assert isinstance(got, np.ndarray) and got.shape == ()
        np.testing.assert_array_equal(got, 36 * c.linear["dense"](count) + c.head(count))
    cp = m.for_context_parallel(2)
    np.testing.assert_array_equal(cp.token_costs(101), m.token_costs([50.5])[0])
    assert m.token_costs([[3, 4.5], [5, 1e6]]).shape == (2, 2)


def test_a_microbatch_costs_the_same_whatever_comes_before_it(model):
    """Each micro-batch is summed on its own: as differences of running sums, the costs after
    a 2^31-token sample carried its rounding (2e-5 relative, a fuzzer found)."""
    lengths = np.array([2**31 - 1, 100, 7, 100], dtype=np.int64)
    offsets = np.array([0, 1, 1, 3, 4])  # an empty micro-batch among them, too
    costs = model.microbatch_costs(lengths, offsets)
    assert costs[1] == 0.0
    assert costs[2] == model.microbatch_costs(lengths[1:3], np.array([0, 2]))[0]
    assert costs[3] == model.microbatch_costs(lengths[3:], np.array([0, 1]))[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 70000), min_size=1, max_size=12), st.integers(1, 70000))
def test_monotone_in_lengths_and_members(lengths, extra):
    m = _MODEL
    base = m.microbatch_cost(lengths)
    assert m.microbatch_cost(lengths + [extra]) > base
    longer = list(lengths)
    longer[0] += extra
    assert m.microbatch_cost(longer) >= base
    sc = m.sample_cost(np.sort(np.array(lengths + [extra])))
    assert np.all(np.diff(sc) >= 0)


_MODEL = estimate_cost_model(SPEC, "h200")


def test_vectorised_speed(model):
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 12, 10_000)
    lengths = rng.integers(1, 16000, sizes.sum())
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    model.microbatch_costs(lengths, offsets)  # builds the tables
    t0 = time.process_time()  # this process's CPU time: robust to a busy machine
    model.microbatch_costs(lengths, offsets)
    assert time.process_time() - t0 < 0.25  # ~1-2 ms on one core; loose for CI


def test_sample_cost_definition(model):
    c = model.curves["train"]
    ref = model.reference_tokens
    slope = 36 * c.linear["dense"].marginal_per_token(ref) + c.head.marginal_per_token(ref)
    L = np.array([100, 5000])
    np.testing.assert_allclose(model.sample_cost(L), 36 * c.attention(L) + L * slope, rtol=1e-9)


def test_sliding_window_reuses_attention_with_exact_pairs():
    spec = dataclasses.replace(SPEC, sliding_window=4096, sliding_window_layers=12)
    m = _toy(spec)
    full = _toy()
    c = m.curves["train"]
    assert m.microbatch_cost([2000]) == pytest.approx(full.microbatch_cost([2000]))
    a_w = float(c.attention(np.array([4096.0]))[0])
    pairs = lambda L: 4096 * 4097 / 2 + (L - 4096) * 4096
    extra = 12 * (a_w * pairs(20000) / pairs(4096) - float(c.attention(np.array([20000.0]))[0]))
    assert m.microbatch_cost([20000]) == pytest.approx(full.microbatch_cost([20000]) + extra)
    assert m.microbatch_cost([20000]) < full.microbatch_cost([20000])


def test_moe_needs_and_uses_its_own_curve():
    spec = ModelSpec.from_preset("deepseek-v3")  # 3 dense + 58 MoE layers
    m = estimate_cost_model(spec, "h200")
    c = m.curves["train"]
    T = 4096
    lin = m.breakdown([T])["linear"]
    assert lin == pytest.approx(3 * float(c.linear["dense"](T)) + 58 * float(c.linear["moe"](T)))
    with pytest.raises(ValueError, match="lack the linear curve"):
        _toy(ModelSpec.from_preset("qwen3-30b-a3b"))


def test_bad_inputs(model):
    with pytest.raises(ValueError, match=">= 1 token"):
        model.microbatch_cost([0, 5])
    with pytest.raises(ValueError, match="offsets"):
        model.microbatch_costs([1, 2, 3], [0, 2])
    with pytest.raises(ValueError, match="mode 'eval'"):
        model.microbatch_cost([5], "eval")
    with pytest.raises(ValueError, match="whole numbers"):
        model.sample_cost([1.5])


# ---- file format ---------------------------------------------------------------------------
def test_json_round_trip(tmp_path, model):
    path = tmp_path / "m.json"
    model.save(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA and doc["is_estimate"] is True
    assert doc["spec_fingerprint"] == SPEC.fingerprint()
    again = load_cost_model(path)
    assert again.is_estimate and again.spec == SPEC and again.gpu == model.gpu
    L = np.array([1, 100, 1000, 20000, 200000])
    for mode in ("train", "forward"):
        np.testing.assert_allclose(again.sample_cost(L, mode), model.sample_cost(L, mode), rtol=1e-12)
    again.save(tmp_path / "m2.json")
    assert json.loads((tmp_path / "m2.json").read_text())["curves"] == doc["curves"]


@pytest.fixture
def good_doc(model):
    return model.to_dict()


def _write(tmp_path, text):
    p = tmp_path / "bad.json"
    p.write_text(text)
    return p


def test_corrupt_json_says_file_and_position(tmp_path):
    p = _write(tmp_path, '{"schema": "costmodel/1", oops}')
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON.*line 1 column \d+"):
        load_cost_model(p)


def test_truncated_file(tmp_path, good_doc):
    text = json.dumps(good_doc)
    p = _write(tmp_path, text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON \(truncated\?\)"):
        load_cost_model(p)
    with pytest.raises(ValueError, match="empty"):
        load_cost_model(_write(tmp_path, ""))
    for cut in ('{"schema": -', '{"schema": "costmodel/1", "x": 1.5e'):  # cut mid-number
        with pytest.raises(ValueError, match=r"not valid JSON \(truncated\?\)"):
            load_cost_model(_write(tmp_path, cut))


@pytest.mark.parametrize("field, value, kind", [
    ("provenance", [1], "an object"), ("provenance", "x", "an object"),
    ("device", "x", "an object"), ("kernels", "x", "an object"),
    ("flops_check", "x", "an object"), ("validation", "x", "an object"),
    ("residuals", [], "an object"), ("measurements", {}, "a list"), ("created", 5, "a string"),
])
def test_wrongly_typed_optional_fields_are_named(tmp_path, good_doc, field, value, kind):
    """report, simulate and the scheduler read these: a wrong type is a load error naming
    the field, not a traceback later."""
    good_doc[field] = value
    with pytest.raises(ValueError, match=rf"bad\.json: field '{field}' must be {kind}, got "):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


@pytest.mark.parametrize("where, value, says", [
    (("is_estimate",), "false", r"field 'is_estimate' has the wrong type str \(expected bool\)"),
    (("is_estimate",), 0, r"field 'is_estimate' has the wrong type int \(expected bool\)"),
    (("gpu", "name"), 5, r"field gpu\.'name' has the wrong type int \(expected a string\)"),
    (("gpu", "name"), None, r"field gpu\.'name' has the wrong type NoneType"),
])
def test_wrongly_typed_required_fields_are_named(tmp_path, good_doc, where, value, says):
    """A string "false" read as truthy would label a file's hand-edited estimate as
    measured, a gpu name of 5 or null would load as "5" or "None": each is refused,
    naming the field (a mutation run: dropping either check failed no test)."""
    target = good_doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    with pytest.raises(ValueError, match=rf"bad\.json: {says}"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    del target[where[-1]]
    missing = r"missing field\(s\) \['is_estimate'\]" if where == ("is_estimate",) else \
        r"missing field gpu\.'name'"
    with pytest.raises(ValueError, match=rf"bad\.json: {missing}"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_wrong_schema(tmp_path, good_doc):
    good_doc["schema"] = "costmodel/2"
    with pytest.raises(ValueError, match=r"unsupported schema 'costmodel/2'.*reads 'costmodel/1'"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    del good_doc["schema"]
    with pytest.raises(ValueError, match="missing field 'schema'"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_missing_fields(tmp_path, good_doc):
    doc = dict(good_doc)
    del doc["curves"]
    with pytest.raises(ValueError, match=r"missing field\(s\) \['curves'\]"):
        load_cost_model(_write(tmp_path, json.dumps(doc)))
    doc = json.loads(json.dumps(good_doc))
    del doc["curves"]["train"]["head"]
    with pytest.raises(ValueError, match=r"missing field curves\.train\.'head'"):
        load_cost_model(_write(tmp_path, json.dumps(doc)))
    doc = json.loads(json.dumps(good_doc))
    doc["curves"]["train"]["attention"]["ms"] = "fast"
    with pytest.raises(ValueError, match="wrong type"):
        load_cost_model(_write(tmp_path, json.dumps(doc)))


def test_non_finite_numbers(tmp_path, good_doc):
    text = json.dumps(good_doc)
    value = good_doc["curves"]["train"]["head"]["ms"][3]
    bad = text.replace(json.dumps(value), "NaN", 1)
    with pytest.raises(ValueError, match=r"non-finite number nan at curves\.train\.head\.ms\[3\]"):
        load_cost_model(_write(tmp_path, bad))
    doc = CostModel.from_dict  # from an in-memory dict: same validation
    good_doc["curves"]["forward"]["overhead"]["per_layer_ms"] = float("inf")
    with pytest.raises(ValueError, match=r"non-finite number inf at curves\.forward\.overhead\.per_layer_ms"):
        doc(good_doc)


@pytest.mark.parametrize("key", ["per_layer_ms", "per_microbatch_ms"])
@pytest.mark.parametrize("value, says", [
    # a negative fixed cost scheduled; 5e306 ms a layer loaded, and priced micro-batches at inf
    (-1.0, r"curves\.train\.overhead: \w+_overhead_ms must lie between 0 and 1e\+09 ms, got -1"),
    (5e306, r"curves\.train\.overhead: \w+_overhead_ms must lie between 0 and 1e\+09 ms"),
    (True, r"field curves\.train\.overhead\.'{key}' has the wrong type bool"),  # read as 1 ms
])
def test_overheads_must_be_non_negative_numbers(tmp_path, good_doc, key, value, says):
    good_doc["curves"]["train"]["overhead"][key] = value
    with pytest.raises(ValueError, match=says.format(key=key)):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_what_loads_prices_every_length_finitely(tmp_path, good_doc):
    """From a fuzzer of cost model files (37,500 mutants; only these loaded and then priced
    at inf or NaN, or said little): a reference_tokens of 10^307 (every sample_cost NaN),
    two attention knots one log apart of nothing (scipy's bare "x must be strictly
    increasing"), and a knot nested 900 deep (its whole repr in the message)."""
    good_doc["reference_tokens"] = 10**307
    with pytest.raises(ValueError, match=r"reference_tokens must be a whole number of tokens "
                                         r"in 1\.\.2,147,483,647, got 1000"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    good_doc["reference_tokens"] = 2**31 - 1
    m = load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    assert np.all(np.isfinite(m.sample_cost([1, 8192, 2**31 - 1])))
    with pytest.raises(ValueError, match="reference_tokens must be at most 2,147,483,647"):
        CostModel(spec=m.spec, gpu=m.gpu, curves=m.curves, reference_tokens=2**31)
    attention = good_doc["curves"]["train"]["attention"]
    last = float(attention["lengths"][-1])
    attention["lengths"][-2:] = [last, float(np.nextafter(last, np.inf))]  # one log apart of 0
    with pytest.raises(ValueError, match=rf"attention: lengths {last!r} and \d+\.\d+ are too close "
                                         r"to tell apart; knots are whole tokens"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    nested: list = [1.0]
    for _ in range(900):
        nested = [nested]
    attention["lengths"][-1] = nested
    with pytest.raises(ValueError, match="knots must be numbers") as err:
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    assert len(str(err.value)) < 400


def test_numbers_past_float_and_deep_nesting_are_named(tmp_path, good_doc):
    # Each was an OverflowError / RecursionError traceback.
    text = json.dumps(good_doc)
    value = good_doc["curves"]["train"]["head"]["ms"][3]
    huge = text.replace(json.dumps(value), "1" + "0" * 400, 1)
    with pytest.raises(ValueError, match=r"401 digits at curves\.train\.head\.ms\[3\], past any float"):
        load_cost_model(_write(tmp_path, huge))
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON: Exceeds the limit"):
        load_cost_model(_write(tmp_path, text.replace(json.dumps(value), "9" * 5000, 1)))
    with pytest.raises(ValueError, match=r"bad\.json: JSON nested too deeply"):
        load_cost_model(_write(tmp_path, "[" * 100_000 + "]" * 100_000))


@pytest.mark.parametrize("knot", ["0.004", True, None])
def test_knots_must_be_numbers(tmp_path, good_doc, knot):
    # numpy read "0.004" and True as numbers: the file loaded with strings in its curves.
    good_doc["curves"]["train"]["head"]["ms"][0] = knot
    with pytest.raises(ValueError, match=rf"curves\.train\.head: knots must be numbers, got {knot!r}"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_malformed_spec_is_named_once(tmp_path, good_doc):
    good_doc["spec"]["moe_layers"] = 5
    with pytest.raises(ValueError, match=r"invalid model spec: .*moe_layers must be a list of layer"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    good_doc["spec"] = [1]
    with pytest.raises(ValueError) as err:
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    assert str(err.value).count("bad.json") == 1 and str(err.value).count("write a new file") == 1


def test_non_monotone_curve(tmp_path, good_doc):
    ms = good_doc["curves"]["train"]["linear"]["dense"]["ms"]
    ms[10], ms[11] = ms[11] * 1.5, ms[11]
    with pytest.raises(ValueError, match=r"curves\.train\.linear\.dense: curve is not monotone"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


@pytest.mark.parametrize("factor", [1e-320, 1e12])
def test_times_no_measurement_could_give_are_refused(tmp_path, good_doc, factor):
    # 1e-320 ms passed the > 0 check and evaluated to 0 (report divided by it); times
    # near 1e306 ms loaded and overflowed when used.
    curve = good_doc["curves"]["train"]["attention"]
    curve["ms"] = [v * factor for v in curve["ms"]]
    with pytest.raises(ValueError, match=r"curves\.train\.attention: times must lie between"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


@pytest.mark.parametrize("curve", ["attention", "linear.dense", "head"])
def test_knots_past_any_micro_batch_are_refused(tmp_path, good_doc, curve):
    """Regression: a knot at 1e300 tokens loaded, and `costmodel correct` on the file died
    with an OverflowError traceback (its FLOPs check cast the knots to int64)."""
    block = good_doc["curves"]["train"]
    for key in curve.split("."):
        block = block[key]
    xkey = "lengths" if curve == "attention" else "tokens"
    block[xkey][-1] = 10**300
    with pytest.raises(ValueError, match=rf"curves\.train\.{curve}: {xkey} must be at most "
                       r"2,147,483,647 .*got 1e\+300: not a measurement"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    # The longest micro-batch a schedule may hold still loads (the times are the H200's
    # at 32k: for a GPU without a registry peak, as no time a file may hold is for one).
    block[xkey][-1] = 2**31 - 1
    good_doc["gpu"] = {"name": "Toy GPU"}
    load_cost_model(_write(tmp_path, json.dumps(good_doc)))


@pytest.mark.parametrize("validation", [{"modes": []}, {"modes": {"train": "x"}},
                                        {"modes": {"train": {"summary": {"all": {"cost_model": {"mape": "x"}}}}}}])
def test_a_malformed_validation_block_is_skipped_with_a_warning(tmp_path, good_doc, validation, caplog):
    """Regression: `simulate` printed an AttributeError traceback (report skipped it)."""
    good_doc["validation"] = validation
    m = load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    assert m.validation_summary("train") is None
    assert "validation block is malformed" in caplog.text


@pytest.mark.parametrize("value", [3.0, "2"])
def test_a_hand_edited_extrapolation_exponent_is_named_as_not_read(tmp_path, good_doc, value, caplog):
    """The attention exponents are derived from the knots; editing one did nothing, silently."""
    attention = good_doc["curves"]["train"]["attention"]
    load_cost_model(_write(tmp_path, json.dumps(good_doc)))  # as saved: no word
    assert "follows from the knots" not in caplog.text
    attention["tail_exponent"] = value
    load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    assert f"curves.train.attention.tail_exponent is {value!r}, but it follows from the knots" in caplog.text


def test_paths_no_file_can_have_and_pipes(tmp_path, good_doc):
    """Regression: a 5,000-character name was a raw OSError, a pipe "no cost model file",
    and a save into /proc a FileNotFoundError naming the temp file."""
    import os
    import threading

    with pytest.raises(ValueError, match=r"'aaaa.*\.\.\.: no cost model file can be there"):
        load_cost_model("a" * 5000)
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "model.json"
        os.mkfifo(fifo)
        writer = threading.Thread(target=lambda: fifo.write_text(json.dumps(good_doc)))
        writer.start()
        try:
            assert load_cost_model(fifo).spec == SPEC
        finally:
            writer.join(timeout=10)
    if os.path.isdir("/proc/self"):
        with pytest.raises(ValueError, match=r"^/proc/x\.json: cannot write there"):
            load_cost_model("h200/qwen3-0.6b").save("/proc/x.json")


def test_an_empty_gpu_name_is_refused(tmp_path, good_doc):
    good_doc["gpu"]["name"] = " "
    with pytest.raises(ValueError, match="gpu.name is empty"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_other_model_shape(tmp_path, good_doc):
    p = _write(tmp_path, json.dumps(good_doc))
    other = ModelSpec.from_preset("llama-3.1-8b")
    with pytest.raises(ValueError) as err:
        load_cost_model(p, spec=other)
    msg = str(err.value)
    for part in ("qwen3-8b", SPEC.fingerprint(), "llama-3.1-8b", other.fingerprint(), "allow_other_shape=True"):
        assert part in msg
    m = load_cost_model(p, spec=other, allow_other_shape=True)
    assert m.spec == SPEC  # the curves stay those of the file's shape
    assert load_cost_model(p, spec=SPEC).spec == SPEC


def test_tampered_spec(tmp_path, good_doc):
    good_doc["spec"]["num_layers"] = 40
    with pytest.raises(ValueError, match="spec_fingerprint .* does not match its own spec"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no cost model file"):
        load_cost_model(tmp_path / "nope.json")


def test_a_folder_given_as_the_cost_model_names_the_file_in_it(tmp_path, model):
    with pytest.raises(FileNotFoundError, match=r"is a folder, not a cost model file$"):
        load_cost_model(tmp_path)
    model.save(tmp_path / "calibrated.json")
    with pytest.raises(FileNotFoundError, match=r"give the file in it, e\.g\. .*calibrated\.json$"):
        load_cost_model(tmp_path)


def test_an_empty_cost_model_name_says_so(tmp_path, monkeypatch):
    """"" is Path("."): it was refused as "is a folder, not a cost model file", naming no
    fix (and build_schedule(cost="") said the same of the current folder)."""
    from costmodel.scheduler import build_schedule

    monkeypatch.chdir(tmp_path)
    for empty in ("", "  "):
        with pytest.raises(ValueError, match=r"^the cost model is empty \('\s*'\): give a cost model file"):
            load_cost_model(empty)
        with pytest.raises(ValueError, match=r"the cost model is empty"):
            build_schedule([5, 6], dp_size=1, max_tokens_per_microbatch=16, cost=empty)


def test_atomic_write_leaves_nothing_when_interrupted(tmp_path, monkeypatch, model):
    target = tmp_path / "calibrated.json"

    def boom(fd):
        raise KeyboardInterrupt  # Ctrl-C in the middle of the write

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        model.save(target)
    assert list(tmp_path.iterdir()) == []
    # an existing file survives an interrupted overwrite untouched
    monkeypatch.undo()
    write_json_atomic(target, {"old": 1})
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        model.save(target)
    assert json.loads(target.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["calibrated.json"]


def test_unserialisable_document_writes_nothing(tmp_path):
    with pytest.raises(ValueError):
        write_json_atomic(tmp_path / "x.json", {"a": float("nan")})
    assert list(tmp_path.iterdir()) == []


def test_binary_file_is_named(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    with pytest.raises(ValueError, match=r"bad\.json: not a text file"):
        load_cost_model(p)


def test_cached_cost_model_reads_each_file_version_once(tmp_path, monkeypatch):
    import costmodel.model as model_module

    reads = []
    real = model_module.load_cost_model
    monkeypatch.setattr(
        model_module, "load_cost_model", lambda *a, **k: reads.append(a[0]) or real(*a, **k)
    )
    path = tmp_path / "m.json"
    with pytest.raises(FileNotFoundError):  # a failure is not remembered...
        model_module.cached_cost_model(path)
    _toy(per_mb=0.5, gpu="Toy GPU").save(path)
    first = model_module.cached_cost_model(path)  # ...the file is read once it exists
    assert model_module.cached_cost_model(str(path), spec=SPEC.name) is not first  # other key
    assert model_module.cached_cost_model(path) is first
    assert len(reads) == 3
    # Replaced by a new calibration of the same size with the old mtime put back (cp -p,
    # rsync -t): read again (another inode and ctime), and the new numbers are used.
    st = os.stat(path)
    _toy(per_mb=2.5, gpu="Toy GPU").save(path)
    assert os.stat(path).st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = model_module.cached_cost_model(path)
    assert again is not first and len(reads) == 4
    diff = again.microbatch_cost([100]) - first.microbatch_cost([100])
    assert diff == pytest.approx(2.0)
    # Rewritten in place (`cp new old` keeps the inode), same size: read again (the mtime,
    # set here past the coarse clock file times take, is part of the key).
    before = os.stat(path)
    with open(path, "r+") as f:
        text = f.read()
        assert text.count('"per_microbatch_ms": 2.5') == 1  # the toy has the train pass
        f.seek(0)
        f.write(text.replace('"per_microbatch_ms": 2.5', '"per_microbatch_ms": 4.5'))
    after = os.stat(path)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    os.utime(path, ns=(after.st_atime_ns, after.st_mtime_ns + 10**9))
    third = model_module.cached_cost_model(path)
    assert len(reads) == 5
    assert third.microbatch_cost([100]) - again.microbatch_cost([100]) == pytest.approx(2.0)
    # A hand-built spec with a list of MoE layers is a key like any other (stored as a tuple).
    listed = dataclasses.replace(SPEC, moe_layers=[])
    assert model_module.cached_cost_model(path, spec=listed, allow_other_shape=True) is not again


def test_layer_counts_and_modes_are_checked(model):
    for bad in (-3, 0, 2.5, True, float("nan")):  # -3 gave -10.1 ms
        with pytest.raises(ValueError, match="num_layers must be an integer >= 1"):
            model.stack_cost([100], num_layers=bad)
    with pytest.raises(ValueError, match="mode \\['train'\\] is not in this cost model"):
        model.microbatch_cost([100], mode=["train"])


def test_curves_of_another_interpolation_are_refused(tmp_path, good_doc):
    """A curve the file says is interpolated some other way would be read as ours."""
    good_doc["curves"]["train"]["attention"]["interpolation"] = "cubicspline9"
    with pytest.raises(ValueError, match=r"curves\.train\.attention\.interpolation is "
                       r"'cubicspline9', but this costmodel reads 'pchip-loglog' curves only"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    del good_doc["curves"]["train"]["attention"]["interpolation"]  # absent: ours
    load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_scheduling_a_pass_the_model_lacks_says_which_it_has(tmp_path, good_doc):
    from costmodel.scheduler import build_schedule

    del good_doc["curves"]["forward"]
    model = load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    with pytest.raises(ValueError, match=r"has curves for train only, not mode 'forward': "
                       r"schedule with mode 'train' \(--mode train\)"):
        build_schedule([100, 200, 300], dp_size=1, max_tokens_per_microbatch=1024, cost=model,
                       mode="forward")


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_a_forward_cost_uses_its_own_tables_after_a_train_cost():
    """Per-pass tables are cached on the model: a forward evaluated after a train one
    must be what a fresh model says, not the train pass's tables."""
    m = estimate_cost_model("qwen3-8b", "h200")
    train = m.microbatch_cost([4096, 1000], "train")
    forward = m.microbatch_cost([4096, 1000], "forward")
    fresh = estimate_cost_model("qwen3-8b", "h200").microbatch_cost([4096, 1000], "forward")
    assert forward == pytest.approx(fresh, rel=1e-12) and forward < train


@pytest.mark.parametrize("mode", ["train", "forward"])
def test_breakdown_adds_up_to_the_cost_in_each_pass(mode):
    m = estimate_cost_model("qwen3-8b", "h200")
    lengths = [4096, 1000, 77]
    parts = m.breakdown(lengths, mode)
    assert parts["total"] == pytest.approx(m.microbatch_cost(lengths, mode), rel=1e-12)
    assert parts["head"] == pytest.approx(float(m.curves[mode].head(sum(lengths))), rel=1e-12)


def test_token_curve_marginal_per_token_is_the_secant_slope():
    """the secant over [T/2, 3T/2] divided by half its width."""
    from costmodel.curves import TokenCurve

    t = TokenCurve([16, 1024], [0.2, 0.5])
    assert t.marginal_per_token(512) == pytest.approx(0.3 / 1008)


# -- edges a mutation run found untested ------------------------------------------------
def test_attention_low_exponent_is_clipped_to_two():
    a = AttentionCurve([100, 200, 400], [0.01, 0.1, 0.2])  # log-log slope 3.3 at the start
    assert a.low_exponent == 2.0
    assert float(a(50)[()]) == pytest.approx(0.01 / 4)


def test_attention_between_knots_is_pchip_in_log_log():
    from scipy.interpolate import PchipInterpolator

    xs, ys = [64, 1024, 8192, 32768], [0.001, 0.05, 2.0, 30.0]
    a = AttentionCurve(xs, ys)
    L = np.array([100.0, 3000.0, 20000.0])
    want = np.exp(PchipInterpolator(np.log(xs), np.log(ys))(np.log(L)))
    np.testing.assert_allclose(a(L), want, rtol=1e-12)


def test_stack_cost_by_hand_for_dense_and_moe_layers():
    m = estimate_cost_model("deepseek-v3", "h200")  # has both a dense and a moe curve
    c = m.curves["train"]
    L = np.array([1000.0, 3000.0])
    for moe, kind in ((False, "dense"), (True, "moe")):
        want = 3 * (c.layer_overhead_ms + float(c.attention(L).sum()) + float(c.linear[kind](4000)))
        got = m.stack_cost([1000, 3000], num_layers=3, moe=moe, head=False)
        assert got == pytest.approx(want, rel=1e-12)
    assert c.layer_overhead_ms > 0


# -- from a second mutation check (model_file.py) ------------------------------------------


def test_curves_of_unknown_passes_and_kinds_are_named(tmp_path, good_doc):
    """A pass or a layer kind this costmodel does not know ('training', a typo) is an error
    naming it, not silently left out; so is a file with no curves at all."""
    doc = json.loads(json.dumps(good_doc))
    doc["curves"]["training"] = doc["curves"]["train"]
    with pytest.raises(ValueError, match=r"bad\.json: unknown modes \['training'\] in 'curves'"):
        load_cost_model(_write(tmp_path, json.dumps(doc)))
    doc = json.loads(json.dumps(good_doc))
    doc["curves"]["train"]["linear"]["dense2"] = doc["curves"]["train"]["linear"]["dense"]
    with pytest.raises(ValueError, match=r"curves\.train\.linear has unknown kinds \['dense2'\]"):
        load_cost_model(_write(tmp_path, json.dumps(doc)))
    good_doc["curves"] = {}
    with pytest.raises(ValueError, match=r"bad\.json: 'curves' is empty"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_a_slightly_edited_extrapolation_exponent_is_named_too(tmp_path, good_doc, caplog):
    """An exponent edited in its third decimal does nothing either: named as not read."""
    attention = good_doc["curves"]["train"]["attention"]
    attention["low_exponent"] = round(attention["low_exponent"] + 0.001, 6)
    load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    assert "curves.train.attention.low_exponent is" in caplog.text


def test_a_rewrite_keeps_the_files_mode_and_a_new_file_gets_the_umasks(tmp_path):
    """Atomic writes go through a temp file, but the result has the mode a plain write
    would give it: what the umask allows for a new file, the old mode for a rewrite."""
    target = tmp_path / "calibrated.json"
    old_umask = os.umask(0o022)
    try:
        write_json_atomic(target, {"a": 1})
        assert target.stat().st_mode & 0o777 == 0o644
        target.chmod(0o600)
        write_json_atomic(target, {"a": 2})
        assert target.stat().st_mode & 0o777 == 0o600 and json.loads(target.read_text()) == {"a": 2}
    finally:
        os.umask(old_umask)


def test_output_paths_no_file_can_be_written_to_are_refused_before_any_work(tmp_path):
    """`check_output_path` runs before minutes of measuring: a pipe (a rename would replace
    it), a name longer than the filesystem takes, and a folder that takes no new files are
    each a ValueError naming the flag, and nothing is left behind."""
    from costmodel.model_file import check_output_path

    long_name = tmp_path / ("a" * 300 + ".json")
    # (Linux's stat refuses it before the name-length check: "File name too long")
    with pytest.raises(ValueError, match=r"^-o .*aaa\.json: (the file name is longer|cannot write)"):
        check_output_path(long_name, "-o")
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.json"
        os.mkfifo(fifo)
        with pytest.raises(ValueError, match=r"^-o .*fifo\.json is not a regular file"):
            check_output_path(fifo, "-o")
        with pytest.raises(ValueError, match="not a regular file"):
            write_json_atomic(fifo, {"a": 1})
        assert fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["fifo.json"] if hasattr(os, "mkfifo") else [])
    if os.path.isdir("/proc/self"):  # root may write anywhere, but /proc takes no new files
        with pytest.raises(ValueError, match=r"^-o /proc/x\.json: (cannot write there|no permission)"):
            check_output_path("/proc/x.json", "-o")
    assert check_output_path(tmp_path / "new" / "dir" / "x.json", "-o") == tmp_path / "new" / "dir" / "x.json"
    assert not (tmp_path / "new").exists()  # checked, not created


def test_a_negative_number_past_float_is_named_too(tmp_path, good_doc):
    """As a positive one: its digits and where it is, not an OverflowError or a message
    about something else (a negative knot)."""
    text = json.dumps(good_doc)
    value = good_doc["curves"]["train"]["head"]["ms"][3]
    huge = text.replace(json.dumps(value), "-1" + "0" * 400, 1)
    with pytest.raises(ValueError, match=r"401 digits at curves\.train\.head\.ms\[3\], past any float"):
        load_cost_model(_write(tmp_path, huge))


def test_a_blank_output_path_and_the_fields_past_four_of_another_shape(tmp_path, good_doc):
    """A blank -o is named as empty (not a file called '  ' in the working directory), and
    another shape's message says how many more fields differ than it lists."""
    from costmodel.model_file import check_output_path

    for blank in ("", "  "):
        with pytest.raises(ValueError, match="^-o is empty; give a file path"):
            check_output_path(blank, "-o")
    with pytest.raises(ValueError, match=r"differs in [^;]*, and \d+ more\)"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)), spec=ModelSpec.from_preset("llama-3.1-70b"))


def test_a_cost_model_of_one_tensor_parallel_rank(tmp_path):
    """A TP estimate prices one rank's shard: under a quarter of the whole layer's time for
    long micro-batches, more for short ones (fixed costs are not divided); the file keeps
    the TP size, and a file without one (written before it) is one GPU's whole layer."""
    spec = ModelSpec.from_preset("qwen3-32b")
    whole, rank = estimate_cost_model(spec, "h200"), estimate_cost_model(spec, "h200", tensor_parallel=4)
    assert rank.tensor_parallel == 4 and rank.spec == spec and rank.rank_spec == spec.shard(4)
    assert rank.label == "qwen3-32b at TP 4 on NVIDIA H200 (ESTIMATE)"
    short, long = [256], [16384, 16384]
    assert whole.microbatch_cost(short) / rank.microbatch_cost(short) < 3.5
    assert 3.5 < whole.microbatch_cost(long) / rank.microbatch_cost(long) <= 4.0
    loaded = load_cost_model(rank.save(tmp_path / "tp4.json"), spec=spec)
    assert loaded.tensor_parallel == 4 and loaded.microbatch_cost(long) == rank.microbatch_cost(long)
    doc = json.loads((tmp_path / "tp4.json").read_text())
    del doc["tensor_parallel"]
    assert CostModel.from_dict(doc).tensor_parallel == 1
    for bad, message in ((3, "do not split evenly over TP 3"), (0, "whole number in 1..1024"),
                         ("4", "whole number in 1..1024, got '4'"), (True, "got True")):
        doc["tensor_parallel"] = bad
        with pytest.raises(ValueError, match=f"cost model bad.json: .*{message}"):
            CostModel.from_dict(doc, source="bad.json")


def test_a_shipped_shard_profile_is_taken_by_its_name_only(tmp_path, monkeypatch):
    """`h200` with a model's shape takes the whole layer's profile, never a TP shard's of the
    same shape; the shard's is loaded by its name (h200/<model>-tp<N>)."""
    import costmodel.profiles as profiles

    spec = ModelSpec.from_preset("qwen3-32b")
    (tmp_path / "h200").mkdir()
    estimate_cost_model(spec, "h200", tensor_parallel=4).save(tmp_path / "h200" / "qwen3-32b-tp4.json")
    monkeypatch.setattr(profiles, "PROFILES_DIR", tmp_path)
    assert profiles.profile_for_shape("h200", spec.shape_key()) is None
    assert load_cost_model("h200/qwen3-32b-tp4", spec=spec).tensor_parallel == 4
    assert load_cost_model("h200", spec=spec).tensor_parallel == 1  # the estimate of the whole layer


def test_a_moe_shard_with_whole_experts_round_trips(tmp_path):
    """Expert TP other than TP (1: whole experts, as with expert parallelism) is kept in the
    file and the label; a dense model has no experts to split, so it reads as TP."""
    spec = ModelSpec.from_preset("qwen3-30b-a3b")
    rank = estimate_cost_model(spec, "h200", tensor_parallel=4, expert_tensor_parallel=1)
    assert rank.label == "qwen3-30b-a3b at TP 4, experts TP 1 on NVIDIA H200 (ESTIMATE)"
    assert rank.rank_spec.moe_intermediate_size == spec.moe_intermediate_size
    loaded = load_cost_model(rank.save(tmp_path / "moe.json"), spec=spec)
    assert (loaded.tensor_parallel, loaded.expert_tensor_parallel) == (4, 1)
    assert loaded.rank_spec == rank.rank_spec
    dense = estimate_cost_model("qwen3-8b", "h200", tensor_parallel=2, expert_tensor_parallel=1)
    assert dense.expert_tensor_parallel == 2 and dense.label.startswith("qwen3-8b at TP 2 on")
    doc = json.loads((tmp_path / "moe.json").read_text())
    doc["expert_tensor_parallel"] = 5
    with pytest.raises(ValueError, match=r"cost model bad.json: .*experts over 5"):
        CostModel.from_dict(doc, source="bad.json")


def test_a_shard_named_with_no_shipped_profile_is_estimated_at_that_size(caplog):
    """'b200/qwen3-32b-tp4' (as shard profiles are named) falls back to the estimate of that
    shard, as 'b200/qwen3-32b' does to the whole model's; a size the model does not split
    into is refused naming the cost model."""
    model = load_cost_model("b200/qwen3-32b-tp4")
    assert (model.tensor_parallel, model.expert_tensor_parallel) == (4, 4) and model.is_estimate
    assert "no measured profile for b200/qwen3-32b-tp4" in caplog.text
    moe = load_cost_model("h200/qwen3-30b-a3b-TP4-etp1", spec="qwen3-30b-a3b")
    assert (moe.tensor_parallel, moe.expert_tensor_parallel) == (4, 1)
    with pytest.raises(ValueError, match=r"cost model 'h200/qwen3-32b-tp3': qwen3-32b: .* over TP 3"):
        load_cost_model("h200/qwen3-32b-tp3")


def test_a_shard_name_finds_the_shipped_profile_of_that_shard(tmp_path, monkeypatch):
    """'-tp1' (-etp1) is the whole layer: the shipped measured profile, not an estimate; a
    leading zero, or an expert TP equal to TP (or of a dense model), names the shipped
    '<model>-tp<N>' file all the same."""
    whole = load_cost_model("h200/qwen3-8b")
    assert not whole.is_estimate
    for name in ("h200/qwen3-8b-tp1", "h200/qwen3-8b-TP01", "h200/qwen3-8b-tp1-etp1",
                 "h200/qwen3-8b-tp1-etp4"):
        model = load_cost_model(name)
        assert not model.is_estimate and model.extra["source"] == whole.extra["source"], name
    import costmodel.profiles as profiles

    (tmp_path / "h200").mkdir()
    shipped = tmp_path / "h200" / "qwen3-32b-tp4.json"
    estimate_cost_model("qwen3-32b", "h200", tensor_parallel=4).save(shipped)
    moe = tmp_path / "h200" / "qwen3-30b-a3b-tp4-etp1.json"
    estimate_cost_model("qwen3-30b-a3b", "h200", tensor_parallel=4, expert_tensor_parallel=1).save(moe)
    monkeypatch.setattr(profiles, "PROFILES_DIR", tmp_path)
    for name in ("h200/qwen3-32b-tp04", "h200/qwen3-32b-tp4-etp4", "h200/Qwen3-32B-TP4-ETP2"):
        assert load_cost_model(name).extra["source"] == str(shipped), name
    for name in ("h200/qwen3-30b-a3b-tp4-etp01", "h200/qwen3-30b-a3b-TP0004-ETP1"):
        assert load_cost_model(name).extra["source"] == str(moe), name
    assert load_cost_model("h200/qwen3-30b-a3b-tp4").extra.get("source") is None  # experts TP 4: none shipped


def test_a_file_saved_with_a_utf8_bom_loads(tmp_path, model):
    path = tmp_path / "calibrated.json"
    model.save(path)
    saved = json.loads(path.read_text())  # with its "created": a later to_dict() stamps anew
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as some Windows editors save it
    assert load_cost_model(path).to_dict() == saved


@pytest.mark.parametrize("key", [5, ["h200"], {"k": 1}, True])
def test_a_gpu_key_of_the_wrong_type_is_refused(tmp_path, good_doc, key):
    good_doc["gpu"]["key"] = key
    with pytest.raises(ValueError, match=r"bad\.json: field gpu\.'key' has the wrong type"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    del good_doc["gpu"]["key"]  # absent (older files): loads
    load_cost_model(_write(tmp_path, json.dumps(good_doc)))


def test_curves_faster_than_the_gpu_are_refused_on_load(tmp_path, good_doc):
    """A file edited to 1e-9 ms of attention loaded, and schedules balanced attention as
    free: what no GPU can run is refused, naming the file, the knot and the peak."""
    ms = good_doc["curves"]["train"]["attention"]["ms"]
    good_doc["curves"]["train"]["attention"]["ms"] = [1e-9 * (i + 1) for i in range(len(ms))]
    path = _write(tmp_path, json.dumps(good_doc))
    with pytest.raises(ValueError, match=r"bad\.json: \d+ knot\(s\) of its curves run faster than "
                       r"NVIDIA H200 can: the train attention curve at L=[\d,]+ .* 989 TFLOP/s bf16 "
                       r"peak; the file is corrupt or was edited"):
        load_cost_model(path)
    # Files from before gpu.key name their GPU only: checked against that name's peak.
    del good_doc["gpu"]["key"]
    with pytest.raises(ValueError, match="faster than NVIDIA H200 can"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    # Short lengths are not judged: their per-sequence attention is what a pack's time
    # leaves after the per-call cost, and a fit may floor it at 10 ns (a split, not a speed).
    good_doc["gpu"]["key"] = "h200"
    good_doc["curves"]["train"]["attention"]["ms"] = ms
    good_doc["curves"]["train"]["attention"]["ms"][0] = 1e-5
    assert load_cost_model(_write(tmp_path, json.dumps(good_doc))).gpu == "NVIDIA H200"
    # Every knot but the top one edited down (a review's case) is caught too: knots whose
    # work takes 0.1 ms or more at the peak are judged (from L = 2,048 here).
    edited = [1e-9] * (len(ms) - 1) + [ms[-1]]
    good_doc["curves"]["train"]["attention"]["ms"] = edited
    with pytest.raises(ValueError, match=r"the train attention curve at L=[\d,]+ takes 1e-09 ms"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)))
    # A GPU the registry lacks has no peak to check against: loaded as it is.
    good_doc["curves"]["train"]["attention"]["ms"] = [1e-9 * (i + 1) for i in range(len(ms))]
    good_doc["gpu"] = {"name": "Some Future GPU"}
    assert load_cost_model(_write(tmp_path, json.dumps(good_doc))).gpu == "Some Future GPU"


def test_the_shipped_profile_and_estimates_are_within_the_peak():
    """The check must not refuse real curves: the shipped profile peaks at 61% of the H200's
    peak, and every preset's estimate on every registered GPU stays under it."""
    from costmodel import gpus
    from costmodel.beyond_peak import curves_beyond_peak
    from costmodel.spec import preset_names

    assert curves_beyond_peak(load_cost_model("h200/qwen3-8b")) is None
    for preset in preset_names():
        spec = ModelSpec.from_preset(preset)
        for key in gpus.gpu_keys():
            assert curves_beyond_peak(estimate_cost_model(spec, key)) is None, (preset, key)


def test_another_shape_is_warned_about_only_once_the_file_is_whole(tmp_path, good_doc, caplog):
    """The "using a cost model made for ..." warning came before the same file's error."""
    other = ModelSpec.from_preset("qwen3-32b")
    good_doc["curves"]["train"]["head"]["ms"][0] = -1.0
    with pytest.raises(ValueError, match="times must be positive"):
        load_cost_model(_write(tmp_path, json.dumps(good_doc)), spec=other, allow_other_shape=True)
    assert "using a cost model made for" not in caplog.text
    good_doc["curves"]["train"]["head"]["ms"][0] = 0.5
    load_cost_model(_write(tmp_path, json.dumps(good_doc)), spec=other, allow_other_shape=True)
    assert "using a cost model made for qwen3-8b" in caplog.text
