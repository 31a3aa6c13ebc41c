"""The README's H200 section is generated from the committed reference runs (scripts/h200_summary.py),
not typed: it must hold exactly what the script prints from results/reference/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_h200_section_is_the_generated_one():
    spec = importlib.util.spec_from_file_location("h200_summary", ROOT / "scripts" / "h200_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text()
    section = readme.split(module.BEGIN, 1)[1].split(module.END, 1)[0]
    assert section == "\n" + module.summary(), "run `python3 scripts/h200_summary.py --write` after changing the runs"
    # the figures come from the rows: a goal line per issue-13 target, the gate verdict, a page row
    assert "compact deferred | >= 1.8x native" in section and "PASS: 2192 of 2192" in section


def test_peers_beside_ours_when_a_reference_has_peer_runs(tmp_path):
    """With peers/<run>/ (scripts/gpu_peers.sh), the summary puts our fastest variant of each mode beside the
    fastest peer row of that mode and batch, and lists each peer's worst error against fp64; without it,
    nothing (the committed references have none yet)."""
    import csv
    import json

    spec = importlib.util.spec_from_file_location("h200_summary", ROOT / "scripts" / "h200_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.peers_table(tmp_path) == []
    run = tmp_path / "peers" / "mtp-fixed-qwen3-next"
    run.mkdir(parents=True)
    rows = [("native", "", "triton", "390.9"), ("native", "", "flashinfer", "370.2"), ("native", "", "fla", "500.0"),
            ("replay", "inline", "triton", "335.9"), ("replay", "precompute", "triton", "300.0"),
            ("replay", "tf32", "sglang", "117.4"), ("compact", "accept", "triton", "130.5"),
            ("compact", "tf32", "sglang", "")]
    with open(run / "throughput.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["mode", "variant", "backend", "batch", "status", "median_us"])
        w.writeheader()
        for mode, variant, backend, us in rows:
            w.writerow(dict(mode=mode, variant=variant, backend=backend, batch="128",
                            status="passed" if us else "unsupported", median_us=us))
    comps = [dict(contract="baseline", rhs="fp64-reference", lhs="replay-tf32/sglang", name=n, rms_ratio_max=e,
                  rms_ratio=e) for n, e in (("o", 7.9e-4), ("ssm", 2e-4))]
    (run / "equivalence.json").write_text(json.dumps({"comparisons": comps}))
    text = "\n".join(module.peers_table(tmp_path))
    assert "| mtp-fixed-qwen3-next | native | 128 | 390.9 (native) | 370.2 (flashinfer) | 1.06x slower |" in text
    assert "| mtp-fixed-qwen3-next | replay | 128 | 300.0 (replay precompute) | 117.4 (sglang tf32) | 2.56x slower |" in text
    assert "compact | 128" not in text  # the peer's compact row did not pass: nothing to put beside ours
    assert "| replay-tf32/sglang | 0.00079 | 0.0002 |" in text


def test_each_target_takes_its_best_variant_inside_the_fp32_contract(tmp_path):
    """A mode's best is the fastest of its variants that keep the fp32 contract (deferred-precompute counts for
    deferred, every replay variant for replay), never a plain-tf32 one; every variant a run has gets a column."""
    import csv

    spec = importlib.util.spec_from_file_location("h200_summary", ROOT / "scripts" / "h200_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = tmp_path / "modes" / "mtp-fixed-qwen3-next-b128"
    run.mkdir(parents=True)
    us = {("native", ""): 1000, ("compact", "accept"): 800, ("compact", "accept-precompute-tf32"): 400,
          ("compact", "deferred"): 700, ("compact", "deferred-precompute-bf16x3"): 500,
          ("replay", "inline"): 900, ("replay", "matrix"): 600, ("replay", "precompute-tf32"): 300}
    with open(run / "throughput.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["mode", "variant", "backend", "status", "batch", "median_us", "ceiling_pct"])
        w.writeheader()
        for (mode, variant), t in us.items():
            w.writerow({"mode": mode, "variant": variant, "backend": "triton", "status": "passed", "batch": "128",
                        "median_us": t, "ceiling_pct": 80.0})
        w.writerow({"mode": "replay", "variant": "inline", "backend": "fla", "status": "passed", "batch": "128",
                    "median_us": 10, "ceiling_pct": 1})  # a peer's row is not ours
    targets = "\n".join(module.latest_targets(tmp_path))
    assert "| compact accept | 128 | >= 1.5x native | 1.25x |" in targets  # not the tf32 variant's 2.5x
    assert "| compact deferred | 128 | >= 2.0x native | 2.00x | met |" in targets  # deferred-precompute-bf16x3
    assert "| replay (best variant) | 128 | >= 2.5x native | 1.67x |" in targets  # matrix, not precompute-tf32
    header = module.latest_modes(tmp_path)[0]
    for column in ("compact deferred-precompute-bf16x3", "replay matrix", "replay precompute-tf32"):
        assert f" {column} |" in header
