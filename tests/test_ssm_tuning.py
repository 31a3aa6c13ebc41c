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
               "deferred-verify", "replay-precompute"}
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
