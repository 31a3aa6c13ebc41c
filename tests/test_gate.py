"""`harness gate` passes on the real modes and fails, with a readable line, on everything it must refuse
(SPEC §5): broken contracts, a variant that went missing / out of memory / unsupported, a comparison
without a partner, a row that did not pass."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

from harness import expected
from harness.gate import GATE_OPTIONS, run_gate
from kernels.common.torch_ops import decay_from_log_gate, expand_heads
from scenarios import ssm_engine
from states.compact import CompactState
from states.native import NativeState
from states.replay import ReplayState

CASE_GDN = "mtp-fixed tiny-gdn, fp32 state, batch 3, drafts 3, accept geometric:0.6, 10 rounds, Lh 4"
CASES = [
    ("mtp-fixed", {"preset": "tiny-gdn", "batch": "3", "drafts": 3, "accept": "geometric:0.6", "rounds": 10,
                   "history_len": 4, **GATE_OPTIONS}),
    ("mtp-fixed", {"preset": "tiny-kda", "batch": "2", "drafts": 2, "accept": "fixed:1", "rounds": 8,
                   "history_len": 4, **GATE_OPTIONS}),
]


def _gate(tmp_path, cases=CASES, **kw):
    return run_gate(device="cpu", backends="torch", cases=cases, out_root=tmp_path, **kw)


def _fails(outcome, *parts: str) -> list[str]:
    """The failure lines holding every one of `parts`; asserts there is one."""
    assert not outcome.passed and outcome.lines[0].startswith("FAIL"), outcome.lines
    hits = [line for line in outcome.lines[1:] if all(p in line for p in parts)]
    assert hits, (parts, outcome.lines)
    return hits


def test_gate_passes_and_writes_reports(tmp_path):
    junit = tmp_path / "gate.xml"
    outcome = _gate(tmp_path, junit=junit)
    assert outcome.passed, outcome.lines
    assert outcome.lines[0].startswith("PASS") and "10 of 10 expected variants passed" in outcome.lines[0]
    assert (outcome.path / "equivalence.md").read_text().count("PASS") > 10
    assert "**PASS" in (outcome.path / "gate.md").read_text()
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0"
    names = [(tc.get("classname"), tc.get("name")) for tc in suite.iter("testcase")]
    assert len(names) == len(set(names)) == int(suite.get("tests"))
    assert not any(" #" in name for _, name in names)  # unique by case and contract, no numbering needed
    assert (CASE_GDN, "contract 1 compact == native: compact/torch vs native/torch o") in names
    assert (CASE_GDN, "contract 3 vs fp64 reference: replay/torch vs fp64-reference ssm") in names
    assert (CASE_GDN, "expected variant compact-deferred/torch") in names


def test_gate_catches_compact_committing_one_token_too_many(tmp_path, monkeypatch):
    original = CompactState._accept_mode

    def one_too_many(self, rnd, accepted):
        return original(self, rnd, torch.minimum(accepted + 1, rnd.widths - 1))

    monkeypatch.setattr(CompactState, "_accept_mode", one_too_many)
    line = _fails(_gate(tmp_path), CASE_GDN, "contract 1 compact == native: compact/torch vs native/torch ssm:")[0]
    assert "elements differ (bitwise)" in line and "at (round " in line and ", head " in line


def test_gate_catches_replay_folding_from_derived_records(tmp_path, monkeypatch):
    def fold_from_derived(self, layer, slots):
        # S <- exp(g) S + k d^T from the stored normalized k and corrected value d: the same math in
        # exact arithmetic, but not the native step (d was computed from a different association)
        count, base = self._count_base(slots)
        S = self.ssm[layer, slots].float()
        for j in range(int(count.max()) if count.numel() else 0):
            pos = base + j
            k = expand_heads(self.hist_k[layer, slots, :, pos].float(), self.geom.group)
            d = self.hist_d[layer, slots, :, pos].float()
            dec = decay_from_log_gate(self.hist_g[layer, slots, :, pos])
            dec = dec[..., None, None] if self.geom.family == "gdn" else dec[..., None]
            S_new = S * dec + k[..., None] * d[..., None, :]
            S = torch.where((j < count)[:, None, None, None], S_new, S)
        return S

    monkeypatch.setattr(ReplayState, "_fold", fold_from_derived)
    _fails(_gate(tmp_path), "contract 2 replay vs native: replay/torch vs native/torch ssm:")


def test_gate_catches_a_write_outside_the_batch(tmp_path, monkeypatch):
    original = NativeState._accept_mode

    def scribble(self, rnd, accepted):
        original(self, rnd, accepted)
        self.ssm[:, -1] += 1  # the last pool row is a spare slot no round uses

    monkeypatch.setattr(NativeState, "_accept_mode", scribble)
    _fails(_gate(tmp_path), "contract 5 untouched slots: native/torch vs before the rollout untouched ssm:")


def test_gate_catches_one_head_off_by_one_percent(tmp_path, monkeypatch):
    """A 1% error in one value head of replay's outputs (RMS ratio 5e-3 here with 4 heads; 1.8e-3 with 32,
    which the old 2e-3 bound let through) breaks the fp32 bound of 1e-5 on every (round, layer)."""
    original = ReplayState.forward

    def one_head_off(self, layer, inputs):
        o = original(self, layer, inputs)
        o[:, 3] *= 1.01
        return o

    monkeypatch.setattr(ReplayState, "forward", one_head_off)
    outcome = _gate(tmp_path, cases=CASES[:1])
    for contract in ("contract 2 replay vs native: replay/torch vs native/torch o:",
                     "contract 3 vs fp64 reference: replay/torch vs fp64-reference o:"):
        line = _fails(outcome, CASE_GDN, contract)[0]
        assert "> 1e-05 at round " in line and "head 3," in line and "request " in line and "token " in line


def _drop_variant(monkeypatch, dropped: str) -> None:
    original = ssm_engine.SSMCase.variants.fget
    monkeypatch.setattr(ssm_engine.SSMCase, "variants",
                        property(lambda case: [v for v in original(case) if ssm_engine.label(v) != dropped]))


def test_gate_fails_on_a_dropped_variant(tmp_path, monkeypatch):
    _drop_variant(monkeypatch, "compact-deferred/torch")
    line = _fails(_gate(tmp_path, cases=CASES[:1]), CASE_GDN, "expected variant compact-deferred/torch: missing")[0]
    assert "dropped" in line


def _oom_in(monkeypatch, mode: str) -> None:
    original = ssm_engine._rollout

    def rollout(v, *args):
        if v.mode == mode:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(v, *args)

    monkeypatch.setattr(ssm_engine, "_rollout", rollout)


def test_gate_fails_on_an_oom_the_budget_did_not_predict_and_on_unpaired_comparisons(tmp_path, monkeypatch):
    _oom_in(monkeypatch, "native")
    outcome = _gate(tmp_path, cases=CASES[:1])
    _fails(outcome, CASE_GDN, "expected variant native/torch: oom", "the memory budget predicted it fits")
    # everything checked against native now has no partner: never a silent skip
    for pair in ("contract 1 compact == native: compact/torch vs native/torch o: no partner",
                 "contract 1 compact == native: compact-deferred/torch vs native/torch ssm: no partner",
                 "contract 2 replay vs native: replay/torch vs native/torch o: no partner"):
        _fails(outcome, CASE_GDN, pair)
    # the variants themselves ran to the end and matched the fp64 reference: their rows are not mismatches
    assert not [line for line in outcome.lines if "expected variant compact/torch" in line], outcome.lines


def test_a_run_keeps_the_timings_of_variants_whose_partner_ran_out_of_memory(tmp_path, monkeypatch):
    """Native out of memory at a batch where compact and replay fit (Qwen3-Next batch 256 on an 80 GB card):
    their rows stay `passed` with timings and say which contracts went unchecked; the comparisons against
    native still fail, so the run does not pass."""
    from harness.runner import run_scenario

    _oom_in(monkeypatch, "native")
    outcome = run_scenario("mtp-fixed", {"preset": "tiny-gdn", "batch": "2", "rounds": 2, "history_len": 4,
                                         "backend": "torch", "warmup": 0, "rep": 2},
                           argv=["harness", "run"], out_root=tmp_path)
    rows = {(r["mode"], r.get("variant") or ""): r for r in outcome.rows}
    assert rows[("native", "")]["status"] == "oom"
    for key in (("compact", "accept"), ("compact", "deferred"), ("replay", "inline")):
        row = rows[key]
        assert row["status"] == "passed" and row["median_us"] > 0, row
        assert "unchecked (contract " in row["reason"] and "vs native/torch: out of memory" in row["reason"], row
    assert not outcome.equivalence.passed


def test_gate_accepts_an_oom_the_budget_predicted(tmp_path, monkeypatch):
    _oom_in(monkeypatch, "replay")
    monkeypatch.setattr(expected, "predicted_fits", lambda need, device: (False, 1 << 30))
    outcome = _gate(tmp_path, cases=CASES[:1])
    assert outcome.passed, outcome.lines
    gate_md = (outcome.path / "gate.md").read_text()
    assert "| replay/torch | oom | predicted by the memory budget" in gate_md


def test_gate_fails_on_unsupported_where_the_spec_supports_it(tmp_path, monkeypatch):
    def refuse(cls, geom, cfg):
        raise ValueError("replay refuses this geometry")

    monkeypatch.setattr(ReplayState, "_validate_config", classmethod(refuse))
    _fails(_gate(tmp_path, cases=CASES[:1]), CASE_GDN,
           "expected variant replay/torch: unsupported (replay refuses this geometry; the spec supports this variant)")


def test_gate_accepts_unsupported_where_the_spec_says_so(tmp_path):
    decode = [("decode", {"preset": "tiny-kda", "batch": "2", "rounds": 6, "history_len": 4, **GATE_OPTIONS})]
    outcome = _gate(tmp_path, cases=decode)
    assert outcome.passed, outcome.lines
    assert "compact mode needs drafts" in (outcome.path / "gate.md").read_text()


def test_gate_fails_on_a_row_that_did_not_pass(tmp_path, monkeypatch):
    original_run = ssm_engine.run_ssm_case

    def run(case, wl, ctx):
        result = original_run(case, wl, ctx)
        for row in result.rows:
            if row["mode"] == "replay":
                row.update(status="error", reason="kernel raised: illegal memory access")
        return result

    monkeypatch.setattr("scenarios.ssm_scenarios.run_ssm_case", run)
    _fails(_gate(tmp_path, cases=CASES[:1]), CASE_GDN,
           "expected variant replay/torch: error (kernel raised: illegal memory access)")


def test_gate_refuses_to_skip_triton_silently_on_cpu(monkeypatch):
    monkeypatch.setattr("harness.gate.interpreting", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1.*--backend torch"):
        run_gate(device="cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gate_compiles_ahead_in_parallel_and_still_passes(tmp_path):
    """On CUDA the gate records every Triton specialization its cases launch (launches skipped, outputs
    garbage), compiles them in forked workers, then runs for real from Triton's cache: the recorded set is
    not empty, compiles without errors, and the real run passes as without the step."""
    from harness.gate import compile_ahead
    from scenarios import get_scenario

    cases = [(n, {**o, "backend": "torch,triton", "device": "cuda"}) for n, o in CASES]
    planned = [(get_scenario(n), c) for n, o in cases for c in get_scenario(n).plan(o)]
    ahead = compile_ahead(planned, "cuda")
    assert ahead["specializations"] > 0 and ahead["failures"] == []
    outcome = run_gate(device="cuda", backends="torch,triton", cases=CASES, out_root=tmp_path)
    assert outcome.passed, outcome.lines
    # nothing compiled on first launch: what this process had not compiled yet came from the cache, so the
    # forked workers and this process computed the same cache keys (precompile.stable_cache_keys)
    compiles = json.loads((outcome.path / "manifest.json").read_text())["compiles"]
    assert compiles["first_launch"]["compiled"] == 0, compiles


def test_a_scenario_launch_runs_its_triton_rollouts_and_compares_nothing(monkeypatch):
    """What the compile-ahead pass records from: every Triton variant's first rounds, no comparison made."""
    from harness.runner import make_context
    from scenarios import get_scenario

    scenario = get_scenario("mtp-fixed")
    # two Triton variants, one round: the interpreter is slow, and deferred's snapshot launches a commit too
    (case,) = scenario.plan({**CASES[0][1], "backend": "torch,triton", "rounds": 1, "modes": "native,compact",
                             "compact_commit": "deferred"})
    ctx, report = make_context("cpu", 0, {}, None, scenario="gate", time_cases=False)
    ran = []
    original = ssm_engine._rollout
    monkeypatch.setattr(ssm_engine, "_rollout", lambda v, *a, **k: ran.append(v) or original(v, *a, **k))
    scenario.launch(case, ctx)
    assert {v.backend for v in ran} == {"triton"} and len(ran) == len([v for v in case.variants if v.backend == "triton"])
    assert not report.comparisons


def test_gpu_tiny_selection_keeps_every_family_dtype_and_pattern_and_shares_constexprs():
    """The GPU tiny gate (issue 23) leaves out only what the model gate repeats, keeps fixed:1 / none / all for
    both families and state dtypes, the long-memory drift on Triton and every page case; all its MTP cases
    verify at one width and history, so they compile each kernel once per preset and dtype. The CPU list keeps
    every case."""
    from harness.gate import TINY, model_cases, tiny_cases, tiny_ssm_cases

    gpu, cpu = tiny_cases(gpu=True), tiny_cases()
    assert len(cpu) == len(tiny_ssm_cases()) + 4 + 4  # + long memory, + a CPU-page and a PD entry per preset
    ssm = [(n, o) for n, o in gpu if n in ("mtp-fixed", "mtp-dynamic", "decode", "checkpoint-restore")]
    mtp = [o for n, o in ssm if n == "mtp-fixed"]
    assert {(o["preset"], o["state_dtype"], o["accept"]) for o in mtp} == {
        (p, sd, a) for p in TINY for sd in ("fp32", "bf16") for a in ("fixed:1", "none", "all")}
    assert {(o["drafts"], o["history_len"]) for o in mtp} == {(3, 4)}
    assert {(o["preset"], o.get("state_dtype")) for o in mtp if o.get("history_dtype") == "bf16"} == {
        (p, "fp32") for p in TINY}
    long_memory = [o for n, o in ssm if n == "decode"]
    assert {(o["preset"], o["state_dtype"], o["backend"], o["gates"]) for o in long_memory} == {
        (p, sd, "triton", "long-memory") for p in TINY for sd in ("fp32", "bf16")}
    # what the GPU tiny gate leaves out, the model gate runs: same scenario and acceptance at drafts 3
    model = {(n, o.get("accept")) for n, o in model_cases() if "state_dtype" in o}
    left_out = [(n, o) for n, o, why in tiny_ssm_cases() if why]
    assert left_out and all(n in {m for m, _ in model} for n, _ in left_out)
    assert all((n, o["accept"]) in model for n, o in left_out if n in ("mtp-fixed", "mtp-dynamic"))
    assert [c for c in gpu if c[0] in ("cpu-page-restore", "pd-roundtrip")] == [
        c for c in cpu if c[0] in ("cpu-page-restore", "pd-roundtrip")]
