"""`harness gate` passes on the real modes and fails on modes broken on purpose (SPEC §5)."""

from __future__ import annotations

import torch

from harness.gate import run_gate
from kernels.common.torch_ops import decay_from_log_gate, expand_heads
from states.compact import CompactState
from states.native import NativeState
from states.replay import ReplayState

CASES = [
    ("mtp-fixed", {"preset": "tiny-gdn", "batch": "3", "drafts": 3, "accept": "geometric:0.6", "rounds": 10,
                   "history_len": 4}),
    ("mtp-fixed", {"preset": "tiny-kda", "batch": "2", "drafts": 2, "accept": "fixed:1", "rounds": 8,
                   "history_len": 4}),
]


def _gate(tmp_path, **kw):
    return run_gate(device="cpu", backends="torch", cases=CASES, out_root=tmp_path, **kw)


def test_gate_passes_and_writes_reports(tmp_path):
    junit = tmp_path / "gate.xml"
    outcome = _gate(tmp_path, junit=junit)
    assert outcome.passed, outcome.lines
    assert (outcome.path / "equivalence.md").read_text().count("PASS") > 10
    assert 'failures="0"' in junit.read_text()


def test_gate_catches_compact_committing_one_token_too_many(tmp_path, monkeypatch):
    original = CompactState._accept_mode

    def one_too_many(self, rnd, accepted):
        return original(self, rnd, torch.minimum(accepted + 1, rnd.widths - 1))

    monkeypatch.setattr(CompactState, "_accept_mode", one_too_many)
    outcome = _gate(tmp_path)
    assert not outcome.passed
    assert any("compact/torch vs native/torch ssm (contract 1)" in line for line in outcome.lines), outcome.lines


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
    outcome = _gate(tmp_path)
    assert not outcome.passed
    assert any("replay/torch vs native/torch ssm (contract 2)" in line for line in outcome.lines), outcome.lines


def test_gate_catches_a_write_outside_the_batch(tmp_path, monkeypatch):
    original = NativeState._accept_mode

    def scribble(self, rnd, accepted):
        original(self, rnd, accepted)
        self.ssm[:, -1] += 1  # the last pool row is a spare slot no round uses

    monkeypatch.setattr(NativeState, "_accept_mode", scribble)
    outcome = _gate(tmp_path)
    assert not outcome.passed
    assert any("untouched ssm (contract 5)" in line for line in outcome.lines), outcome.lines
