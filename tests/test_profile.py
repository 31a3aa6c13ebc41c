"""A run says where its wall time went (manifest `wall_s`, SPEC §7), draws the drift figure of a long
rollout once after every case, and builds matplotlib's font cache in the background."""

from __future__ import annotations

import json

from harness.runner import run_scenario
from results.drift import figure
from results.store import load_run


def _long_decode(tmp_path):
    return run_scenario("decode", {"preset": "tiny-gdn", "batch": "1,2", "rounds": 32, "gates": "long-memory",
                                   "rep": 2, "warmup": 0}, argv=["harness", "run", "decode"], out_root=tmp_path)


def test_run_profile_counts_every_second_once(tmp_path):
    outcome = _long_decode(tmp_path)
    manifest = json.loads((outcome.path / "manifest.json").read_text())
    wall = manifest["wall_s"]
    for phase in ("imports", "setup", "reference", "rollout", "compare", "timing", "figures", "write", "total"):
        assert wall[phase] >= 0, phase
    assert wall["rollout"] > 0 and wall["compare"] > 0 and wall["timing"] > 0 and wall["figures"] > 0
    parts = sum(v for k, v in wall.items() if k != "total")
    assert abs(parts - wall["total"]) <= 0.02 * wall["total"] + 0.05, wall  # each second counted once
    cases = manifest["case_wall_s"]
    assert set(cases) == {"decode tiny-gdn, fp32 state, batch 1, 32 rounds, Lh 16, long-memory gates",
                          "decode tiny-gdn, fp32 state, batch 2, 32 rounds, Lh 16, long-memory gates"}


def test_long_rollouts_get_a_drift_figure(tmp_path):
    outcome = _long_decode(tmp_path)
    drift = sorted(p.name for p in (outcome.path / "figures").glob("drift-*.png"))
    assert drift == ["drift-decode-tiny-gdn-batch-1-32-rounds-lh-16-long-memory-gates.png",
                     "drift-decode-tiny-gdn-batch-2-32-rounds-lh-16-long-memory-gates.png"]
    # one line per mode and state dtype in each panel, from the per-round series against fp64
    batch2 = "decode tiny-gdn, fp32 state, batch 2, 32 rounds, Lh 16, long-memory gates"
    comps = [c for c in load_run(outcome.path).comparisons if c.case == batch2 and c.rhs == "fp64-reference"]
    fig = figure("decode", [("fp32", c) for c in comps])
    outputs, states = fig.axes
    lines = ["native/torch fp32 state", "replay-precompute/torch fp32 state", "replay/torch fp32 state"]
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
