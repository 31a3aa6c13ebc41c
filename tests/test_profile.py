"""A run says where its wall time went (manifest `wall_s`, SPEC §7), draws the drift figure of a long
rollout once after every case, and builds matplotlib's font cache in the background."""

from __future__ import annotations

import json

import pytest

from harness.runner import run_scenario
from results.drift import figure
from results.store import load_run

CASES = ["decode tiny-gdn, fp32 state, batch 1, 32 rounds, Lh 4, long-memory gates",
         "decode tiny-gdn, fp32 state, batch 2, 32 rounds, Lh 4, long-memory gates"]


@pytest.fixture(scope="module")
def long_decode(tmp_path_factory):
    """One run for the whole module: two cases (so time is attributed per case) of 32 rounds, the shortest
    rollout that gets a drift figure; Lh 4 keeps replay's timed fold cycle at 4 rounds instead of 16."""
    return run_scenario("decode", {"preset": "tiny-gdn", "batch": "1,2", "rounds": 32, "gates": "long-memory",
                                   "history_len": 4, "rep": 2, "warmup": 0}, argv=["harness", "run", "decode"],
                        out_root=tmp_path_factory.mktemp("runs"))


def test_run_profile_counts_every_second_once(long_decode):
    outcome = long_decode
    manifest = json.loads((outcome.path / "manifest.json").read_text())
    wall = manifest["wall_s"]
    for phase in ("imports", "setup", "reference", "rollout", "compare", "timing", "figures", "write", "total"):
        assert wall[phase] >= 0, phase
    assert wall["rollout"] > 0 and wall["compare"] > 0 and wall["timing"] > 0 and wall["figures"] > 0
    parts = sum(v for k, v in wall.items() if k != "total")
    assert abs(parts - wall["total"]) <= 0.02 * wall["total"] + 0.05, wall  # each second counted once
    assert set(manifest["case_wall_s"]) == set(CASES)


def test_long_rollouts_get_a_drift_figure(long_decode):
    outcome = long_decode
    drift = sorted(p.name for p in (outcome.path / "figures").glob("drift-*.png"))
    assert drift == ["drift-decode-tiny-gdn-batch-1-32-rounds-lh-4-long-memory-gates.png",
                     "drift-decode-tiny-gdn-batch-2-32-rounds-lh-4-long-memory-gates.png"]
    # one line per mode and state dtype in each panel, from the per-round series against fp64
    batch2 = CASES[1]
    comps = [c for c in load_run(outcome.path).comparisons if c.case == batch2 and c.rhs == "fp64-reference"]
    fig = figure("decode", [("fp32", c) for c in comps])
    outputs, states = fig.axes
    lines = ["native/torch fp32 state", "replay-inline-matrix-bf16x3/torch fp32 state",
             "replay-matrix-bf16x3/torch fp32 state", "replay/torch fp32 state"]
    assert sorted(outputs.get_legend_handles_labels()[1]) == lines
    assert sorted(states.get_legend_handles_labels()[1]) == lines
    assert all(len(line.get_xdata()) == 32 for line in outputs.lines if line.get_label().endswith("state"))


def test_font_cache_is_built_in_the_background_only_when_missing(tmp_path, monkeypatch):
    import matplotlib

    from harness import fontcache

    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path))  # the child builds its cache here
    monkeypatch.setattr(matplotlib, "get_cachedir", lambda: str(tmp_path))
    child = fontcache.prewarm()
    assert child is not None
    fontcache.wait(child)
    assert child.returncode == 0 and list(tmp_path.glob("fontlist-v*.json"))
    assert fontcache.prewarm() is None  # a cache exists: nothing to do
