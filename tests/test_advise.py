"""`harness advise`'s model on synthetic runs whose right answer is worked out by hand in each test (results/advise.py).

E[tokens per round] under geometric p with S drafts is 1 + p + ... + p**S: 1.875 at p = 0.5 and S = 3, 3.439 at
p = 0.9; tokens/s per request = E / round time.
"""

from __future__ import annotations

import math

import pytest
from advise_runs import MIB, make_run, row

from results.acceptance import geometric, parse_acceptance
from results.advise import advise, advise_runs, load_sweep, resolve_budget
from scenarios.ssm_workload import AcceptModel, expected_accepted_tokens


def _labels(batch_advice):
    return [s.candidate.label for s in batch_advice.ranked]


@pytest.mark.parametrize("p", [0.0, 0.3, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("drafts", [0, 1, 3, 7])
def test_geometric_expectation_is_the_scenarios_own(p, drafts):
    got = geometric(p).expected_tokens(drafts)
    assert got == pytest.approx(expected_accepted_tokens(AcceptModel("geometric", p), drafts + 1), rel=1e-12)
    assert got == pytest.approx(sum(p**i for i in range(drafts + 1)), rel=1e-12)


def test_a_profile_counts_each_position_and_says_where_it_ends():
    acc = parse_acceptance(None, "0.84,0.60,0.39,0.27")
    assert acc.expected_tokens(3) == pytest.approx(1 + 0.84 + 0.60 + 0.39)
    assert acc.covers(4) and not acc.covers(5)
    with pytest.raises(ValueError, match="draft 5"):
        acc.expected_tokens(5)


def test_a_profile_file_reads_like_the_list(tmp_path):
    f = tmp_path / "acceptance.txt"
    f.write_text("# per-position acceptance, vLLM\n0.84 0.60\n0.39,0.27\n")
    assert parse_acceptance(None, str(f)).profile == (0.84, 0.60, 0.39, 0.27)


def _no_spec_run(tmp_path):
    """batch 8: decode native 100 us; native S=3 400 us; compact-accept S=3 300 us."""
    return make_run(tmp_path, [row("native", 0, 8, 100.0), row("native", 3, 8, 400.0), row("compact", 3, 8, 300.0)])


def test_no_speculation_wins_at_low_acceptance_and_loses_at_high(tmp_path):
    sweep = load_sweep([_no_spec_run(tmp_path)], "tiny-gdn")
    low = advise(sweep, geometric(0.5), budget_bytes=None).batches[0]
    # 1 / 100 us = 10000 tok/s; compact 1.875 / 300 us = 6250; native S=3 1.875 / 400 us = 4687.5
    assert _labels(low) == ["native/triton S=0 fp32", "compact-accept/triton S=3 fp32", "native/triton S=3 fp32"]
    assert [s.tokens_per_s_per_request for s in low.ranked] == pytest.approx([10000, 6250, 4687.5])
    assert low.margin_pct == pytest.approx(60.0)
    assert low.inside_noise is False  # bands: 9901-10101 against 6229-6271
    high = advise(sweep, geometric(0.9), budget_bytes=None).batches[0]
    # compact 3.439 / 300 us = 11463.3 > decode's 10000
    assert high.best.candidate.label == "compact-accept/triton S=3 fp32"
    assert high.best.tokens_per_s_per_request == pytest.approx(3.439 / 300e-6)
    assert high.best.tokens_per_s == pytest.approx(8 * 3.439 / 300e-6)


def test_the_rest_of_the_model_makes_speculation_pay(tmp_path):
    sweep = load_sweep([_no_spec_run(tmp_path)], "tiny-gdn")
    # A = 10000 us a round: decode 1 / 10100 us = 99.0 tok/s, compact 1.875 / 10300 us = 182.0
    fixed = advise(sweep, geometric(0.5), budget_bytes=None, rest_us=(10000.0, 0.0)).batches[0]
    assert fixed.best.candidate.label == "compact-accept/triton S=3 fp32"
    assert fixed.best.tokens_per_s_per_request == pytest.approx(1.875 / 10300e-6)
    # B = 1000 us a token of width: decode (W = 1) pays 1000, the S=3 rounds (W = 4) 4000
    per_token = advise(sweep, geometric(0.5), budget_bytes=None, rest_us=(0.0, 1000.0)).batches[0]
    rest = {s.candidate.label: s.rest_us for s in per_token.ranked}
    assert rest == {"native/triton S=0 fp32": 1000, "compact-accept/triton S=3 fp32": 4000,
                    "native/triton S=3 fp32": 4000}
    assert per_token.best.tokens_per_s_per_request == pytest.approx(1 / 1100e-6)


def test_the_memory_budget_flips_the_choice(tmp_path):
    """batch 64: native S=3 200 us at 64 MiB a request (4 GiB), compact-deferred S=3 250 us at 16 MiB (1 GiB)."""
    run = make_run(tmp_path, [row("native", 3, 64, 200.0, bytes_per_request=64 * MIB),
                              row("compact", 3, 64, 250.0, variant="deferred", bytes_per_request=16 * MIB)])
    sweep = load_sweep([run], "tiny-gdn")
    roomy = advise(sweep, geometric(0.7), budget_bytes=8 << 30)
    assert roomy.batches[0].best.candidate.label == "native/triton S=3 fp32"
    tight = advise(sweep, geometric(0.7), budget_bytes=2 << 30)
    b = tight.batches[0]
    assert _labels(b) == ["compact-deferred/triton S=3 fp32"] and b.runner_up is None
    assert [label for label, _ in b.excluded if "over the budget" in _] == ["native/triton S=3 fp32"]
    assert b.excluded[0][1].startswith("needs 4.0 GiB of state for 64 requests")
    concurrency = {c["label"]: c["max_concurrency"] for c in tight.concurrency()}
    assert concurrency == {"native/triton S=3 fp32": 32, "compact-deferred/triton S=3 fp32": 128}
    assert tight.mode_concurrency()["compact-deferred"]["max_concurrency"] == 128


def test_unmeasured_batches_are_interpolated_between_neighbours_or_not_measured(tmp_path):
    run = make_run(tmp_path, [row("native", 0, 8, 100.0, spread_us=10.0), row("native", 0, 32, 400.0, spread_us=20.0)])
    sweep = load_sweep([run], "tiny-gdn")
    out = advise(sweep, geometric(0.7), budget_bytes=None, batches=[4, 8, 16, 64])
    by_batch = {b.batch: b for b in out.batches}
    t = by_batch[16].best.timing
    # a third of the way from 8 to 32: 100 + 300 / 3, 90 + 290 / 3, 110 + 310 / 3
    assert (t.source, t.batches) == ("interpolated", (8, 32))
    assert (t.median_us, t.p20_us, t.p80_us) == pytest.approx((200.0, 90 + 290 / 3, 110 + 310 / 3))
    assert by_batch[8].best.timing.source == "measured"
    for b in (4, 64):
        assert by_batch[b].best is None
        assert by_batch[b].excluded[0][1].startswith("not measured (its rows: batch 8, 32; no extrapolation)")
    assert any(n.startswith("interpolated: linear in batch") for n in out.notes)


def test_oom_rows_exclude_their_batch_and_every_larger_one(tmp_path):
    run = make_run(tmp_path, [row("native", 3, 8, 100.0), row("native", 3, 32, None, status="oom"),
                              row("compact", 3, 8, 120.0), row("compact", 3, 32, 300.0)])
    out = advise(load_sweep([run], "tiny-gdn"), geometric(0.7), budget_bytes=None, batches=[8, 32, 64])
    by_batch = {b.batch: b for b in out.batches}
    assert by_batch[8].best.candidate.label == "native/triton S=3 fp32"
    assert dict(by_batch[32].excluded)["native/triton S=3 fp32"] == "oom in the run"
    assert _labels(by_batch[32]) == ["compact-accept/triton S=3 fp32"]
    assert dict(by_batch[64].excluded)["native/triton S=3 fp32"] == "oom in the run at batch 32, below this batch"
    assert next(c for c in out.concurrency() if c["mode"] == "native")["smallest_oom_batch"] == 32


def test_an_untimed_row_is_not_a_time(tmp_path):
    untimed = row("native", 0, 8, 100.0)
    for column in ("timer", "samples", "median_us", "p20_us", "p80_us", "noise_pct"):
        untimed.pop(column)
    run = make_run(tmp_path, [untimed, row("compact", 3, 8, 300.0)])
    b = advise(load_sweep([run], "tiny-gdn"), geometric(0.7), budget_bytes=None).batches[0]
    assert _labels(b) == ["compact-accept/triton S=3 fp32"]
    assert dict(b.excluded)["native/triton S=0 fp32"] == "passed untimed in the run: no round time"


def test_no_decode_rows_means_no_speculation_is_not_measured(tmp_path):
    run = make_run(tmp_path, [row("native", 3, 8, 100.0)])
    b = advise(load_sweep([run], "tiny-gdn"), geometric(0.7), budget_bytes=None).batches[0]
    assert ("no speculation (drafts 0)", "not measured: no decode row in the runs") in b.excluded


@pytest.mark.parametrize(("spreads", "inside"), [((5.0, 5.0), True), ((0.5, 0.5), False)])
def test_a_margin_inside_the_noise_is_said(tmp_path, spreads, inside):
    """native 100 us against replay 102 us (2% apart): bands of +-5 us overlap, of +-0.5 us do not."""
    run = make_run(tmp_path, [row("native", 0, 8, 100.0, spread_us=spreads[0]),
                              row("replay", 0, 8, 102.0, spread_us=spreads[1])])
    b = advise(load_sweep([run], "tiny-gdn"), geometric(0.7), budget_bytes=None).batches[0]
    assert b.margin_pct == pytest.approx(2.0)
    assert b.inside_noise is inside


def test_a_profile_shorter_than_the_drafts_leaves_the_candidate_out(tmp_path):
    run = make_run(tmp_path, [row("native", 3, 8, 100.0), row("native", 7, 8, 150.0)])
    b = advise(load_sweep([run], "tiny-gdn"), parse_acceptance(None, "0.84,0.60,0.39,0.27"), budget_bytes=None).batches[0]
    assert _labels(b) == ["native/triton S=3 fp32"]
    assert b.best.expected_tokens == pytest.approx(2.83)
    assert dict(b.excluded)["native/triton S=7 fp32"] == "the acceptance profile gives 4 positions, not 7 drafts"


def test_a_tuned_row_beats_a_newer_default_config_row(tmp_path):
    tuned = make_run(tmp_path, [row("native", 0, 8, 100.0, config_source="cached")], tag="tuned")
    untuned = make_run(tmp_path, [row("native", 0, 8, 180.0, config_source="default")], tag="untuned")
    out = advise(load_sweep([tuned, untuned], "tiny-gdn"), geometric(0.7), budget_bytes=None)
    assert out.batches[0].best.timing.median_us == 100.0
    assert any("measured more than once" in n for n in out.notes)


def test_the_default_budget_is_the_devices_memory_and_none_on_cpu(tmp_path):
    gpu = load_sweep([make_run(tmp_path, [row("native", 0, 8, 100.0)], memory_bytes=80 << 30)], "tiny-gdn")
    assert resolve_budget(gpu, None)[0] == 80 << 30
    assert resolve_budget(gpu, 2.5)[0] == int(2.5 * 2**30)
    cpu = load_sweep([make_run(tmp_path, [row("native", 0, 8, 100.0)], gpu=None)], "tiny-gdn")
    assert resolve_budget(cpu, None)[0] is None
    with pytest.raises(ValueError, match="holds no request"):
        resolve_budget(cpu, 0.001)


def test_unsupported_candidates_are_noted_once_not_judged(tmp_path):
    run = make_run(tmp_path, [row("native", 0, 8, 100.0),
                              row("compact", 0, 8, None, status="unsupported", reason="compact needs drafts")])
    out = advise(load_sweep([run], "tiny-gdn"), geometric(0.7), budget_bytes=None)
    assert _labels(out.batches[0]) == ["native/triton S=0 fp32"] and out.batches[0].excluded == []
    assert "compact-accept/triton S=0 fp32: unsupported in the runs (compact needs drafts)" in out.notes


def test_the_json_form_carries_the_verdict(tmp_path):
    out = advise_runs([_no_spec_run(tmp_path)], "tiny-gdn", accept="geometric:0.5", budget_gib=1.0)
    d = out.to_dict()
    b = d["batches"][0]
    assert (b["best"], b["runner_up"]) == ("native/triton S=0 fp32", "compact-accept/triton S=3 fp32")
    assert b["ranked"][0]["tokens_per_s_per_request"] == pytest.approx(10000)
    assert b["ranked"][0]["timing"] == "measured" and b["ranked"][0]["state_bytes"] == 8 * 16 * MIB
    assert d["budget_bytes"] == 2**30 and d["accept"] == "geometric:0.5"
    assert all(math.isfinite(r["tokens_per_s_per_request"]) for r in b["ranked"])


def test_the_choice_map_switches_where_speculation_starts_to_pay(tmp_path):
    """compact S=3 at 300 us beats decode at 100 us once 1 + p + p**2 + p**3 > 3, at p = 0.8105."""
    from results.advise import choice_map

    sweep = load_sweep([_no_spec_run(tmp_path)], "tiny-gdn")
    best = choice_map(sweep, [0.5, 0.8, 0.82, 0.95], [8, 16], budget_bytes=None)
    assert [best[(8, p)].label for p in (0.5, 0.8, 0.82, 0.95)] == ["native/triton S=0 fp32"] * 2 + [
        "compact-accept/triton S=3 fp32"] * 2
    assert best[(16, 0.5)] is None  # batch 16 has no rows below and above it: nothing judged
