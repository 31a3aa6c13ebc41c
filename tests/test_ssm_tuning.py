"""`harness autotune ssm`: one sweep per kernel, each candidate checked (bit for bit against native's
default config where the contracts say so), every candidate recorded, and runs pick the cached configs up."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import scenarios.ssm_tuning as ssm_tuning
from harness.runner import run_scenario
from harness.tune import run_autotune


@pytest.mark.slow
@pytest.mark.usefixtures("light_runs")  # the rows' configs are the subject, not their times
def test_tune_then_run_uses_the_cache(tmp_path, monkeypatch):
    original = ssm_tuning.tuning_jobs

    def first_two(options):  # the interpreter is slow: two candidates per kernel are enough here
        jobs = original(options)
        for job in jobs:
            job.candidates = job.candidates[:2]
        return jobs

    monkeypatch.setattr(ssm_tuning, "tuning_jobs", first_two)
    cache = tmp_path / "cache.json"
    out = run_autotune("ssm", {"batch": "2", "drafts": 1, "history_len": 4, "level": "force",
                               "autotune_cache": str(cache), "warmup": 0, "rep": 1}, argv=["test"], out_root=tmp_path)
    kernels = {"native-verify", "conv", "replay-forward", "replay-fold", "compact-verify", "compact-commit",
               "deferred-verify", "replay-precompute", "compact-precompute", "replay-matrix-fold",
               "deferred-precompute"}
    assert {c["kernel"] for c in out.choices} == kernels
    assert all(c["source"] == "tuned" for c in out.choices)
    records = pd.read_json(out.path / "autotune.jsonl", lines=True)
    assert len(records) == 2 * len(kernels) and set(records["status"]) == {"ok"}
    assert all("bitwise == native" in d for k, d in zip(records["kernel"], records["detail"]) if "verify" in k)
    assert json.loads(cache.read_text())["entries"]

    run = run_scenario("mtp-fixed", {"backend": "triton", "drafts": 1, "batch": "2", "rounds": 2, "history_len": 4,
                                     "autotune_cache": str(cache), "warmup": 1, "rep": 2},
                       argv=["test"], out_root=tmp_path)
    rows = [r for r in run.rows if r["status"] == "passed" and r["backend"] == "triton"]
    assert rows and all(r["config_source"] == "cached" for r in rows)
    tuned = {c["kernel"]: c["config"] for c in out.choices}
    for r in rows:  # every kernel the row ran, with the config the sweep chose
        ran = json.loads(r["config"])
        assert ran and all(ran[k] == tuned[k] for k in ran), r["mode"]


def test_tuning_rejects_bad_options():
    with pytest.raises(ValueError, match="--drafts must be >= 0"):
        ssm_tuning.tuning_jobs({"drafts": -1})
    with pytest.raises(ValueError, match="--history-len must be a power of two"):
        ssm_tuning.tuning_jobs({"drafts": 3, "history_len": 6})
    with pytest.raises(ValueError, match="has no linear-attention layers"):
        ssm_tuning.tuning_jobs({"preset": "llama-3-8b"})


def test_autotune_writes_only_its_run_directory_and_the_cache(tmp_path, monkeypatch):
    """Issue 17: an interrupted or fruitless sweep left an empty results/autotune/ in the checkout. The cache's
    folder is made when a winner is stored, and nothing else is written outside --out."""
    from scenarios.base import TuneJob

    def never_valid(options):
        return [TuneJob("k", {"a": 1}, 1, [{"x": 1}], {"x": 1}, build=lambda bucket: None,
                        run=lambda config, inputs: None, check=lambda config, inputs: (False, "never"))]

    monkeypatch.setattr(ssm_tuning, "tuning_jobs", never_valid)
    cache = tmp_path / "cache-dir" / "cache.json"
    out = run_autotune("ssm", {"level": "force", "autotune_cache": str(cache)}, argv=["test"], out_root=tmp_path / "runs")
    assert [c["source"] for c in out.choices] == ["error"]
    assert not (tmp_path / "cache-dir").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_matrix_kernels_are_keyed_and_tuned_by_their_dot_precision():
    """A bf16x3 row must not run on a config tuned (and checked) at ieee: the matrix kernels' static key carries
    the precision, the sweep tunes each at the precisions the default run variants use (or `--precision`'s),
    and a pool looks its kernels up at its variant's precision."""
    from states.base import StateConfig
    from states.presets import get_preset

    def tuned(options):
        return {(j.kernel, j.static_key.get("prec")) for j in ssm_tuning.tuning_jobs({"device": "cpu", **options})
                if j.kernel in ssm_tuning.MATRIX_KERNEL_BASES}

    # the defaults (RUN_VARIANTS): compact's accept-/deferred-precompute-bf16x3, replay's matrix-bf16x3
    assert tuned({}) == {("replay-precompute", "bf16x3"), ("compact-precompute", "bf16x3"),
                         ("deferred-precompute", "bf16x3"), ("replay-matrix-fold", "bf16x3")}
    both = tuned({"precision": "bf16x3,tf32"})  # the matrix fold has no plain-tf32 variant, so no tf32 job
    assert ("replay-matrix-fold", "tf32") not in both and ("replay-matrix-fold", "bf16x3") in both
    assert {("compact-precompute", "tf32"), ("replay-precompute", "bf16x3")} <= both
    with pytest.raises(ValueError, match="--precision: 'fp16'"):
        ssm_tuning.tuning_jobs({"device": "cpu", "precision": "fp16"})
    geom = get_preset("tiny-gdn").ssm
    runs = {("compact", "accept-precompute-bf16x3"): {"compact-precompute": "bf16x3"},
            ("compact", "deferred-precompute"): {"deferred-precompute": "ieee"},
            ("replay", "matrix-tf32x3"): {"replay-precompute": "tf32x3", "replay-matrix-fold": "tf32x3"},
            # the inline forward runs no tensor cores of its own; its matrix fold takes the fold kernel's BK, tuned
            # at the fold's precision
            ("replay", "inline-matrix-bf16x3"): {"replay-matrix-fold": "bf16x3"}}
    for (mode, variant), kernels in runs.items():
        cfg = StateConfig(mode, 2, drafts=3, variant=variant, backend="triton")
        for kernel, prec in kernels.items():
            assert ssm_tuning.static_key(geom, cfg, kernel)["prec"] == prec, (variant, kernel)
        assert "prec" not in ssm_tuning.static_key(geom, cfg, "conv")


def test_ssm_sweeps_on_cpu_are_the_default_and_one_other_config():
    """The interpreter's times say nothing about a GPU and the full space took many minutes on CPU."""
    for job in ssm_tuning.tuning_jobs({"device": "cpu"}):
        assert job.candidates[0] == job.default and len(job.candidates) == 2, job.kernel


@pytest.mark.slow
def test_autotune_ssm_runs_on_cpu_at_its_defaults(tmp_path):
    """A new user's `harness autotune ssm` on a CPU machine: it restarts itself in the interpreter, beats in
    the log at least every 10 s, caches the winners and writes nothing outside --out and the cache."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo_cache = Path(__file__).resolve().parents[1] / "results" / "autotune"
    existed = repo_cache.exists()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    (tmp_path / "cwd").mkdir()
    done = subprocess.run([sys.executable, "-m", "harness", "autotune", "ssm", "--out", str(tmp_path / "runs"),
                           "--autotune-cache", str(tmp_path / "c" / "cache.json")], cwd=tmp_path / "cwd", env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert lines[0].startswith("autotune: restarting with TRITON_INTERPRET=1")
    assert lines[-1].startswith("autotune ssm: done, 22/22 in ")  # 11 kernels (test above) x 2 candidates
    assert json.loads((tmp_path / "c" / "cache.json").read_text())["entries"]["cpu"]
    assert not any((tmp_path / "cwd").iterdir()) and repo_cache.exists() == existed
