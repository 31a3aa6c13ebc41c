"""harness.equivalence: bit comparison, ULP distance, RMS ratio, first mismatch, rollouts, reports."""

from __future__ import annotations

import json
import math

import pytest
import torch

from harness.equivalence import Comparison, EquivalenceReport, Rollout, compare, compare_each, failure_line, unpaired

LABELS = dict(name="o", lhs="compact/torch", rhs="native/torch", contract="compact-vs-native", scenario="decode")


def _cmp(actual, expected, policy="bitwise", tolerance=None, **kw):
    return compare(actual, expected, **{**LABELS, **kw}, policy=policy, tolerance=tolerance)


def _step(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Move each element of `x` up by k[i] representable values, one nextafter at a time."""
    out = x.clone()
    up = torch.full_like(x, math.inf)
    for _ in range(int(k.max())):
        moved = torch.nextafter(out, up)
        out = torch.where(k > 0, moved, out)
        k = k - 1
    return out


def test_identical_tensors_pass_bitwise():
    torch.manual_seed(0)
    a = torch.randn(4, 3, 5)
    c = _cmp(a, a.clone())
    assert c.bitwise_equal and c.passed
    assert c.mismatches == 0 and c.max_ulp == 0 and c.max_abs == 0 and c.rms_ratio == 0
    assert c.first_mismatch is None and c.numel == 60


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_ulp_distance_matches_repeated_nextafter(dtype):
    torch.manual_seed(1)
    # Both signs, and values at zero, so some steps cross from negative to positive
    # (-0.0 and +0.0 are one point: nextafter(-0.0, inf) is +min_subnormal, one step).
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    x = torch.cat([torch.randn(60), torch.tensor([-tiny, -0.0, 0.0, 1.0, -1.0])]).to(dtype)
    k = torch.randint(0, 6, x.shape)
    k[:5] = torch.tensor([0, 1, 2, 3, 5])  # each distance shows up at least once
    y = _step(x, k)
    for i in range(x.numel()):
        assert _cmp(y[i : i + 1], x[i : i + 1], policy="ulp", tolerance=5).max_ulp == int(k[i]), i
    whole = _cmp(y, x, policy="ulp", tolerance=5)
    assert whole.max_ulp == 5 and whole.passed
    assert not _cmp(y, x, policy="ulp", tolerance=4).passed


def test_ulp_known_pairs():
    one = torch.tensor([1.0])
    up = torch.nextafter(one, torch.tensor([2.0]))
    assert _cmp(up, one, policy="ulp", tolerance=0).max_ulp == 1
    assert _cmp(torch.nextafter(up, torch.tensor([2.0])), one, policy="ulp", tolerance=0).max_ulp == 2
    # bf16 has 7 stored mantissa bits: the next value after 1.0 is 1 + 2^-7.
    bf16, fp16 = torch.bfloat16, torch.float16
    b = _cmp(torch.tensor([1.0 + 2**-7], dtype=bf16), torch.tensor([1.0], dtype=bf16), policy="ulp", tolerance=1)
    assert b.max_ulp == 1 and b.passed
    h = _cmp(torch.tensor([1.0 + 2**-9], dtype=fp16), torch.tensor([1.0], dtype=fp16), policy="ulp", tolerance=1)
    assert h.max_ulp == 2 and not h.passed
    # Across zero: smallest negative and positive subnormals are 2 apart (both zeros are one point).
    tiny = torch.tensor([1e-45])
    assert _cmp(tiny, -tiny, policy="ulp", tolerance=2).max_ulp == 2
    # fp64 extremes of opposite sign: the distance does not fit int64 and saturates instead of wrapping.
    big = torch.tensor([1.7e308], dtype=torch.float64)
    assert _cmp(big, -big, policy="ulp", tolerance=0).max_ulp == torch.iinfo(torch.int64).max


def test_signed_zero_is_a_bit_mismatch_but_zero_error():
    c = _cmp(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))
    assert not c.bitwise_equal and not c.passed
    assert c.mismatches == 1 and c.max_ulp == 0 and c.max_abs == 0.0
    assert c.first_mismatch == {"dim0": 0}
    r = _cmp(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), policy="rms", tolerance=0.0)
    assert r.passed and r.rms_ratio == 0.0


def test_nan_payloads_differ_bitwise():
    a = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    b = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    c = _cmp(a, b)
    assert c.mismatches == 1 and not c.bitwise_equal and c.nan_count == 1
    same = _cmp(a, a.clone())
    assert same.bitwise_equal and same.passed  # identical bits, even NaN, are bitwise equal


@pytest.mark.parametrize("policy,tolerance", [("rms", 1e9), ("ulp", 10**9)])
def test_nan_never_passes_a_tolerance(policy, tolerance):
    torch.manual_seed(2)
    b = torch.randn(16)
    a = b.clone()
    a[3] = math.nan
    a[5] += 0.5
    c = _cmp(a, b, policy=policy, tolerance=tolerance)
    assert not c.passed and c.nan_count == 1 and math.isnan(c.rms_ratio)
    assert c.max_abs == pytest.approx(0.5, rel=1e-6)  # NaN elements are left out of the maxima
    assert c.first_mismatch == {"dim0": 3}


def test_first_mismatch_index_by_dim_name():
    torch.manual_seed(3)
    b = torch.randn(3, 4, 5, 6)
    a = b.clone()
    a[2, 3, 0, 0] += 1.0
    a[2, 1, 3, 4] -= 1.0  # earlier in row-major order than the first change
    c = _cmp(a, b, dims=("request", "layer", "head", "token"))
    assert c.first_mismatch == {"request": 2, "layer": 1, "head": 3, "token": 4}
    assert c.first_actual == pytest.approx(float(b[2, 1, 3, 4]) - 1.0)
    assert c.first_expected == float(b[2, 1, 3, 4])
    assert c.mismatches == 2 and c.mismatch_frac == pytest.approx(2 / 360)
    partial = _cmp(a, b, dims=("request", "layer"))
    assert partial.first_mismatch == {"request": 2, "layer": 1, "dim2": 3, "dim3": 4}


def test_errors_against_a_numpy_style_reference():
    torch.manual_seed(4)
    b = torch.randn(50, 7)
    a = b + 1e-3 * torch.randn(50, 7)
    c = _cmp(a, b, policy="rms", tolerance=1.0)
    a64, b64 = a.double(), b.double()
    assert c.rms_ratio == pytest.approx(float((a64 - b64).norm() / b64.norm()), rel=1e-12)
    assert c.max_abs == pytest.approx(float((a64 - b64).abs().max()), rel=1e-12)
    assert c.max_rel == pytest.approx(float(((a64 - b64).abs() / b64.abs()).max()), rel=1e-12)
    assert _cmp(a, b, policy="rms", tolerance=c.rms_ratio * 1.01).passed
    assert not _cmp(a, b, policy="rms", tolerance=c.rms_ratio * 0.99).passed


def test_mixed_dtypes_count_ulps_in_the_coarser_dtype():
    torch.manual_seed(5)
    ref = torch.randn(64, dtype=torch.float64)
    got = ref.to(torch.bfloat16)  # the correctly rounded value: 0 bf16 ULPs away, but not equal
    c = _cmp(got, ref, policy="ulp", tolerance=0)
    assert c.max_ulp == 0 and c.passed
    assert not c.bitwise_equal and c.mismatches > 0 and c.dtype == "bfloat16 vs float64"
    off = got.clone()
    off[7] = torch.nextafter(off[7], torch.tensor(math.inf, dtype=torch.bfloat16))
    one_off = _cmp(off, ref, policy="ulp", tolerance=0)
    assert one_off.max_ulp == 1 and not one_off.passed


def test_integer_pages_compare_exactly():
    torch.manual_seed(6)
    page = torch.randint(0, 256, (4, 64), dtype=torch.uint8)
    assert _cmp(page, page.clone(), name="page").passed
    bad = page.clone()
    bad[1, 10] ^= 1
    c = _cmp(bad, page, name="page", dims=("page", "byte"))
    assert c.mismatches == 1 and c.first_mismatch == {"page": 1, "byte": 10} and c.max_ulp == 1


def test_bad_input_raises():
    a = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"shapes differ.*\(3, 4\).*\(4, 3\)"):
        _cmp(a, torch.randn(4, 3))
    with pytest.raises(ValueError, match="unknown policy"):
        _cmp(a, a, policy="close")
    with pytest.raises(ValueError, match="needs a tolerance"):
        _cmp(a, a, policy="rms")
    with pytest.raises(ValueError, match="takes no tolerance"):
        _cmp(a, a, policy="bitwise", tolerance=1e-3)
    with pytest.raises(ValueError, match="3 dim names"):
        _cmp(a, a, dims=("request", "layer", "head"))
    with pytest.raises(ValueError, match="unsupported dtype"):
        _cmp(torch.randn(2, dtype=torch.complex64), torch.randn(2, dtype=torch.complex64))


def test_rollout_merges_rounds_and_keeps_the_drift_series():
    torch.manual_seed(7)
    rollout = Rollout()
    actual, expected = [], []
    for r in range(6):
        b = torch.randn(2, 3, 4)
        a = b.clone()
        if r >= 2:  # error grows with the round: drift
            a = b + (10.0 ** (r - 8)) * torch.randn(2, 3, 4)
        actual.append(a)
        expected.append(b)
        rollout.add(r, _cmp(a, b, policy="rms", tolerance=1e-4, dims=("request", "layer", "head")))
    merged = rollout.result()
    whole = _cmp(torch.stack(actual), torch.stack(expected), policy="rms", tolerance=1e-4)
    assert merged.rounds == 6 and merged.numel == 6 * 24
    assert merged.rms_ratio == pytest.approx(whole.rms_ratio, rel=1e-9)
    assert merged.mismatches == whole.mismatches and merged.max_abs == whole.max_abs
    assert merged.max_ulp == whole.max_ulp
    assert merged.first_mismatch["round"] == 2 and set(merged.first_mismatch) == {"round", "request", "layer", "head"}
    assert merged.rms_series[:2] == [0.0, 0.0]
    assert merged.rms_series[2] < merged.rms_series[3] < merged.rms_series[4] < merged.rms_series[5]
    assert merged.rms_ratio_max_round == 5 and merged.rms_ratio_max == merged.rms_series[5]
    assert not merged.passed  # round 5 (error ~1e-3) breaks the 1e-4 bound even if the mean would not
    assert not merged.bitwise_equal


def test_rollout_rejects_a_different_pair():
    rollout = Rollout()
    a = torch.randn(3)
    rollout.add(0, _cmp(a, a))
    with pytest.raises(ValueError, match="lhs"):
        rollout.add(1, _cmp(a, a, lhs="replay/torch"))
    with pytest.raises(ValueError, match="no rounds"):
        Rollout().result()


def test_report_json_roundtrip_is_strict_json_and_markdown_groups():
    torch.manual_seed(8)
    b = torch.randn(4, 4)
    bad = b.clone()
    bad[0, 1] = math.nan
    comps = [
        _cmp(b, b.clone()),
        _cmp(bad, b, policy="rms", tolerance=2e-3, name="ssm", dims=("request", "layer")),
        _cmp(b + 1e-5, b, policy="rms", tolerance=2e-3, lhs="replay/torch", contract="replay-vs-native"),
    ]
    report = EquivalenceReport(comps)
    assert not report.passed and report.failures == [comps[1]]
    text = report.to_json()

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    json.loads(text, parse_constant=no_constants)
    back = EquivalenceReport.from_json(text)
    for old, new in zip(comps, back.comparisons):
        for key, value in old.to_dict().items():
            got = new.to_dict()[key]
            assert got == value, key
    assert math.isnan(back.comparisons[1].rms_ratio)
    md = report.to_markdown()
    assert "FAIL: 2 of 3 comparisons passed, 1 failed" in md
    assert "## decode: compact-vs-native" in md and "## decode: replay-vs-native" in md
    assert "request=0, layer=1: nan vs" in md
    assert md.count("**FAIL**") == 1 and md.count("| PASS |") == 2
    assert isinstance(back.comparisons[0], Comparison)


def test_compare_each_judges_every_unit_like_compare_does():
    torch.manual_seed(9)
    b = torch.randn(5, 3, 4, dtype=torch.float32)
    a = b.clone()
    a[1] += 1e-3 * torch.randn(3, 4)  # unit 1 off by RMS ~1e-3
    a[3, 2, 1] = math.nan  # unit 3 holds a NaN
    a[4, 0, 2] = torch.nextafter(a[4, 0, 2], torch.tensor(math.inf))  # unit 4 one ULP off
    dims = ("head", "v")
    each = compare_each(a, b, **LABELS, policy="rms", tolerance=1e-5, dims=dims)
    assert len(each) == 5
    for unit, c in enumerate(each):
        one = _cmp(a[unit], b[unit], policy="rms", tolerance=1e-5, dims=dims)
        for key, value in one.to_dict().items():
            assert c.to_dict()[key] == value, (unit, key)
    assert [c.passed for c in each] == [True, False, True, False, True]
    assert each[3].worst_at == {"head": 2, "v": 1} and math.isnan(each[3].worst_abs)
    assert each[4].first_mismatch == {"head": 0, "v": 2} and each[4].max_ulp == 1
    worst = int((a[1] - b[1]).abs().argmax())
    assert each[1].worst_at == {"head": worst // 4, "v": worst % 4}
    assert each[1].worst_abs == pytest.approx(float((a[1] - b[1]).abs().max()))


def test_rollout_judges_each_round_and_layer_and_says_where_the_worst_is():
    torch.manual_seed(10)
    rollout = Rollout()
    for r in range(3):
        for layer in range(4):
            b = torch.randn(2, 3)
            a = b.clone()
            if (r, layer) == (1, 2):
                a[1, 0] += 0.5  # one bad unit among twelve: its own RMS breaks the bound, the mean would not
            rollout.add(r, _cmp(a, b, policy="rms", tolerance=0.05, dims=("request", "head")), layer=layer)
    merged = rollout.result()
    assert not merged.passed and merged.rms_ratio < 0.1 and merged.rms_ratio_max > 0.05
    assert merged.units == 12 and merged.failed_units == 1 and merged.rounds == 3
    assert merged.worst_at == {"round": 1, "layer": 2, "request": 1, "head": 0}
    assert merged.rms_ratio_max_round == 1 and merged.series_rounds == [0, 1, 2]
    line = failure_line(merged)
    assert line.startswith("FAIL decode: compact-vs-native: compact/torch vs native/torch o: RMS ratio")
    assert "at (round 1, layer 2, request 1, head 0); 1 of 12 (round, layer) units fail" in line


def test_unpaired_comparisons_fail_and_say_why():
    c = unpaired(name="o", lhs="compact/torch", rhs="native/torch", contract="1", scenario="decode",
                 policy="bitwise", why="native/torch ran out of memory")
    assert not c.passed and c.problem == "no partner: native/torch ran out of memory"
    assert not EquivalenceReport([c]).passed
    assert failure_line(c) == ("FAIL decode: contract 1 compact == native: compact/torch vs native/torch o: "
                               "no partner: native/torch ran out of memory")
    back = Comparison.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back.problem == c.problem and not back.passed
