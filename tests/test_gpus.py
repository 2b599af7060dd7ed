"""GPU registry and the registry estimate."""

import numpy as np
import pytest

from costmodel.estimate import estimate_cost_model
from costmodel.gpus import GPUS, find_gpu_by_device_name, lookup_gpu
from costmodel.model import load_cost_model
from costmodel.spec import ModelSpec, preset_names


def test_lookup_by_key_and_exact_name():
    assert lookup_gpu("h200").name == "NVIDIA H200"
    assert lookup_gpu("NVIDIA H100 80GB HBM3").key == "h100"
    assert lookup_gpu("nvidia  a100-sxm4-80gb").key == "a100"
    assert find_gpu_by_device_name("NVIDIA GeForce RTX 4090").key == "rtx4090"
    assert find_gpu_by_device_name("NVIDIA H300") is None


def test_china_market_variants_resolve_to_their_own_entries():
    # H800/A800 keep H100/A100 compute; the H800 PCIe must not fall to the SXM entry
    # through the "registered name plus words" rule calibrate uses on device names.
    assert find_gpu_by_device_name("NVIDIA H800").peak_bf16_flops == GPUS["h100"].peak_bf16_flops
    assert find_gpu_by_device_name("NVIDIA H800 PCIe", allow_suffix=True).key == "h800-pcie"
    assert find_gpu_by_device_name("NVIDIA H800 80GB HBM3", allow_suffix=True).key == "h800"
    assert lookup_gpu("NVIDIA A800-SXM4-80GB").sm_count == GPUS["a100"].sm_count


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown GPU 'v100'.*h100.*NVIDIA H200"):
        lookup_gpu("v100")


def test_every_entry_is_cited_and_plausible():
    names = [n for g in GPUS.values() for n in g.names]
    assert len(names) == len(set(names)), "an exact name maps to two keys"
    for g in GPUS.values():
        assert g.source and ("http" in g.source or "whitepaper" in g.source), g.key
        assert 50e12 <= g.peak_bf16_flops <= 5e15, g.key
        assert 300e9 <= g.hbm_bandwidth <= 10e12, g.key
        assert 40 <= g.sm_count <= 200, g.key
    assert GPUS["h100"].peak_bf16_flops == pytest.approx(989.4e12)
    assert GPUS["h200"].hbm_bandwidth == pytest.approx(4.8e12)
    for key in ("h100", "h100-pcie", "h100-nvl", "h200", "h800", "a100", "a800", "h20", "b200", "l40s", "a10g", "rtx4090"):
        assert key in GPUS


def test_estimate_is_labelled():
    m = estimate_cost_model(ModelSpec.from_preset("qwen3-8b"), "h200")
    assert m.is_estimate and m.provenance["kind"] == "estimate"
    assert "ESTIMATE" in m.provenance["note"] and "ESTIMATE" in m.label


def test_estimate_has_fixed_costs_below_1k_tokens():
    m = estimate_cost_model(ModelSpec.from_preset("qwen3-8b"), "h200")
    for mode in ("train", "forward"):
        layer = m.curves[mode].linear["dense"]
        # a Qwen3-8B layer: 500 tokens cost about what 100 cost
        assert float(layer(500)) / float(layer(100)) < 1.15
        # fixed costs dominate below ~1k tokens: the floor is at least half of the time there
        assert float(layer(16)) / float(layer(1000)) > 0.5
        assert float(layer(16)) / float(layer(4096)) < 0.3
        cost = [m.microbatch_cost([n], mode) for n in (100, 500)]
        assert cost[1] / cost[0] < 1.25


def test_estimate_is_close_to_the_measured_h200_stack():
    """The estimate's large-size rates come from the H200 session: judged against the
    micro-batches that session measured through 4 layers + head, it predicts their times
    within a few percent from 1k tokens (the earlier guesses were 22% too fast)."""
    from costmodel.calibration.validate import revalidate

    shipped = load_cost_model("h200/qwen3-8b")
    block = revalidate(estimate_cost_model("qwen3-8b", "h200"), shipped.extra["validation"])
    for mode, limit in (("train", 0.05), ("forward", 0.07)):
        points = block["modes"][mode]["points"]
        big = [p for p in points if p["tokens"] >= 4096]
        ratios = np.array([p["predicted_ms"] / p["measured_ms"] for p in big])
        assert 0.9 < np.median(ratios) < 1.05, mode
        assert block["modes"][mode]["summary"][">=1024"]["cost_model"]["mape"] < limit, mode


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100", "h20", "b200", "rtx4090"])
@pytest.mark.parametrize("preset", preset_names())
def test_estimate_every_preset_is_finite_and_monotone(gpu, preset):
    m = estimate_cost_model(ModelSpec.from_preset(preset), gpu)
    lengths = np.array([1, 16, 100, 1000, 8000, 32000, 100000])
    for mode in m.modes:
        c = m.sample_cost(lengths, mode)
        assert np.all(np.isfinite(c)) and np.all(np.diff(c) > 0)
        mb = [m.microbatch_cost([L], mode) for L in lengths]
        assert np.all(np.diff(mb) > 0)


def test_load_by_name_falls_back_to_estimate():
    m = load_cost_model("h100/qwen3-8b")  # no shipped H100 profile
    assert m.is_estimate and m.gpu.startswith("NVIDIA H100") and m.spec.name == "qwen3-8b"
    spec = ModelSpec.from_preset("llama-3.1-8b")
    assert load_cost_model("h100", spec=spec).spec is spec
    with pytest.raises(ValueError, match="unknown GPU"):
        load_cost_model("v100/qwen3-8b")
    with pytest.raises(ValueError, match=r"as a name \(GPU key / model preset\): unknown model preset .gpt-9."):
        load_cost_model("h200/gpt-9")
    with pytest.raises(ValueError, match="allow_other_shape"):
        load_cost_model("h200/qwen3-8b", spec=spec)


def test_shipped_h200_profile_is_measured_and_validated():
    m = load_cost_model("h200/qwen3-8b")
    assert not m.is_estimate and m.gpu == "NVIDIA H200" and m.spec.name == "qwen3-8b"
    assert m.provenance["kind"] == "measured"
    assert m.extra["flops_check"]["checked"] and m.extra["validation"]["count"] >= 100
    assert m.extra["device"]["torch"].startswith("2.11") and m.extra["device"]["sm_count"] == 132
    from costmodel.calibration.report import format_report

    assert "timing: eager calls" in format_report(m)  # measured before --timing graph existed
    assert m.validation_summary("train") == (
        "validated (train, 120 micro-batches): mean error 3.8% on >= 1k tokens, 13.2% on all sizes"
    )
    assert load_cost_model("h100/qwen3-8b").validation_summary() is None  # an estimate


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_device_names_match_the_longest_registered_name_in_whole_words():
    """`--gpu auto` on an H200 NVL must not read as an H200 (the longest prefix wins), an
    'H2000' is no H200 (whole words), and the registry's own lookup takes exact names."""
    assert find_gpu_by_device_name("NVIDIA H200 NVL 141GB", allow_suffix=True).key == "h200-nvl"
    assert find_gpu_by_device_name("NVIDIA H2000", allow_suffix=True) is None
    with pytest.raises(ValueError, match="unknown GPU"):
        lookup_gpu("NVIDIA H200 144GB")


def test_each_peak_is_the_dense_rate_its_source_cites():
    """Vendors quote bf16 with sparsity (twice the dense rate) as often as without: each
    peak must be the dense one its source text gives (within 2%: the L40S sheet's 733
    sparse is not exactly twice its 362.05 dense)."""
    import re

    checked = 0
    for g in GPUS.values():
        found = re.search(r"([\d,.]+) TFLOPS (?:fp16/)?bf16 (sparse|dense)", g.source)
        if found is None:
            continue
        tflops = float(found.group(1).replace(",", "")) / (2 if found.group(2) == "sparse" else 1)
        assert g.peak_bf16_flops == pytest.approx(tflops * 1e12, rel=0.02), g.key
        checked += 1
    assert checked >= 10


def test_the_moe_estimate_gives_each_expert_its_share_of_the_tokens():
    """Regression values of the registry estimate for an MoE layer's experts (routed
    experts see T·k/E rows each, not T·k); update them when the estimate is retuned on
    purpose."""
    m = estimate_cost_model("qwen3-30b-a3b", "h200")
    got = [float(m.curves["train"].linear["moe"](t)) for t in (512, 2048, 8192)]
    assert got == pytest.approx([1.420314235181167, 1.9637889024772612, 5.502816545874748],
                                rel=1e-6)


# -- from a second mutation check (estimate.py, gpus.py) ----------------------------------


def _gpu(peak: float, bandwidth: float):
    from costmodel.gpus import GpuInfo

    return GpuInfo(key="test", names=("Test GPU",), peak_bf16_flops=peak, hbm_bandwidth=bandwidth,
                   sm_count=100, source="a test's own numbers")


def test_the_estimate_is_built_from_the_assumptions_its_provenance_lists():
    """The provenance says what an estimate was built from: its fixed costs are the ones
    listed, on a GPU too fast for any work to show each curve is its launch floor, and the
    GPU's source is the registry entry's."""
    m = estimate_cost_model("qwen3-8b", "h200")
    assert m.provenance["gpu_source"] == GPUS["h200"].source
    listed = m.provenance["assumptions"]
    fast = estimate_cost_model("qwen3-8b", _gpu(1e18, 1e18))
    for mode in ("train", "forward"):
        assert m.curves[mode].layer_overhead_ms == listed["attention_call_ms"][mode]
        assert m.curves[mode].microbatch_overhead_ms == listed["microbatch_overhead_ms"][mode]
        c = fast.curves[mode]
        assert float(c.linear["dense"](16)) == pytest.approx(listed["layer_floor_ms"][mode], rel=1e-6)
        assert float(c.head(16)) == pytest.approx(listed["head_floor_ms"][mode], rel=1e-6)


def test_the_estimate_attention_runs_at_the_efficiency_its_provenance_states():
    """Forward attention runs at ``a * L / (L + b)`` of the peak as the provenance writes
    it, and a training pass takes the stated factor times the forward."""
    import re

    from costmodel import flops

    spec = ModelSpec.from_preset("qwen3-8b")
    m = estimate_cost_model(spec, "h100")
    listed = m.provenance["assumptions"]
    a, b = map(float, re.fullmatch(r"([\d.]+) \* L / \(L \+ ([\d.]+)\)",
                                   listed["attention_efficiency"]).groups())
    lengths = m.curves["forward"].attention.lengths  # the knots: no interpolation
    fwd = m.curves["forward"].attention(lengths)
    achieved = flops.attention_core_flops(lengths, spec) / (fwd / 1e3) / GPUS["h100"].peak_bf16_flops
    np.testing.assert_allclose(achieved, a * lengths / (lengths + b), rtol=1e-9)
    np.testing.assert_allclose(m.curves["train"].attention(lengths) / fwd,
                               listed["attention_train_time_factor"], rtol=1e-9)


@pytest.mark.parametrize("preset", ["qwen3-0.6b", "qwen3-30b-a3b"])
def test_a_memory_bound_layer_reads_every_weight_once_a_pass(preset):
    """Where the GPU waits on memory, a layer costs its weights' bytes over the bandwidth
    (at the listed efficiency): read once forward, three times in training (the forward and
    the two backward GEMMs). An MoE layer at 16 tokens × 8 experts each reads all of its 128
    experts, as it does at 1k tokens."""
    spec = ModelSpec.from_preset(preset)
    m = estimate_cost_model(spec, _gpu(1e18, 1e9))
    h, d = spec.hidden_size, spec.head_dim
    params = 2 * h * spec.num_heads * d + 2 * h * spec.num_kv_heads * d  # q, o; k, v
    if spec.num_experts:
        params += spec.num_experts * 3 * h * spec.moe_intermediate_size + h * spec.num_experts
    else:
        params += 3 * h * spec.intermediate_size
    efficiency = m.provenance["assumptions"]["bandwidth_efficiency"]
    one_read_ms = params * 2 / (1e9 * efficiency) * 1e3  # bf16 weights
    kind = spec.linear_kinds[0]
    for mode, reads in (("forward", 1), ("train", 3)):
        curve = m.curves[mode].linear[kind]
        assert [float(curve(t)) for t in (16, 1024)] == pytest.approx([reads * one_read_ms] * 2,
                                                                       rel=1e-6), mode


def test_an_fp16_model_moves_as_many_bytes_as_a_bf16_one():
    """fp16 and bf16 are both two bytes a value: the same estimate; fp32 moves twice as
    many, so a memory-bound layer costs twice as long."""
    import dataclasses

    spec = ModelSpec.from_preset("qwen3-0.6b")
    slow = _gpu(1e18, 1e9)
    costs = {dtype: float(estimate_cost_model(dataclasses.replace(spec, dtype=dtype), slow)
                          .curves["forward"].linear["dense"](64)) for dtype in ("bf16", "fp16", "fp32")}
    assert costs["fp16"] == costs["bf16"]
    assert costs["fp32"] == pytest.approx(2 * costs["bf16"], rel=1e-6)


def test_each_bandwidth_is_the_one_its_source_cites():
    """Like the peaks: each entry's memory bandwidth is the figure its source text gives
    (an NVLink cap quoted there is not the memory's)."""
    import re

    checked = 0
    for g in GPUS.values():
        found = re.search(r"(?<!capped at )(?<![\d,.])([\d,.]+) ([TG])B/s", g.source)
        if found is None:
            continue
        value = float(found.group(1).replace(",", "")) * (1e12 if found.group(2) == "T" else 1e9)
        assert g.hbm_bandwidth == pytest.approx(value, rel=1e-3), g.key
        checked += 1
    assert checked >= 10


def test_a_mig_slice_is_not_taken_for_its_whole_gpu():
    """'NVIDIA H100 80GB HBM3 MIG 1g.10gb' is a registered name plus words, but a MIG slice
    has a fraction of the SMs: it must not get the whole GPU's peak."""
    assert find_gpu_by_device_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb", allow_suffix=True) is None
    assert find_gpu_by_device_name("NVIDIA H100 80GB HBM3 mig 3g.40gb", allow_suffix=True) is None
    assert find_gpu_by_device_name("NVIDIA H100 80GB HBM3 PG", allow_suffix=True).key == "h100"


def test_keys_in_any_case_and_a_name_that_is_no_string():
    """`--gpu H200` is the key h200; a device name that is not a string (None from a
    failed query) is a ValueError saying so, not an AttributeError."""
    assert lookup_gpu(" H200 ").key == "h200"
    assert lookup_gpu("H100-PCIe").key == "h100-pcie"
    with pytest.raises(ValueError, match="device name is a string, got None"):
        find_gpu_by_device_name(None)


def test_only_memory_words_after_a_registered_name_keep_it_that_gpu():
    """A registered name plus its memory size or kind is that GPU; any other word may be
    another SKU with fewer SMs (an RTX 4090 D has 114 to the 4090's 128, a 4090 Laptop GPU
    is another chip): no entry, so no peak of the wrong GPU."""
    for name, key in (("NVIDIA GeForce RTX 4090 48G DDR5", "rtx4090"),
                      ("NVIDIA H20 141GB HBM3e", "h20"), ("NVIDIA H200 144GB", "h200")):
        assert find_gpu_by_device_name(name, allow_suffix=True).key == key, name
    for name in ("NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 D 48G DDR5",
                 "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                 "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H200 MIG 1g.18gb"):
        assert find_gpu_by_device_name(name, allow_suffix=True) is None, name
