"""`harness autotune ssm`: the step class is tuned as one unit with the bitwise contracts as its check,
every candidate is recorded, and runs pick the cached configs up."""

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

    def first_two(options):  # the interpreter is slow: two candidates per class are enough here
        jobs = original(options)
        for job in jobs:
            job.candidates = job.candidates[:2]
        return jobs

    monkeypatch.setattr(ssm_tuning, "tuning_jobs", first_two)
    cache = tmp_path / "cache.json"
    out = run_autotune("ssm", {"batch": "2", "drafts": 1, "level": "force", "autotune_cache": str(cache),
                               "warmup": 0, "rep": 1}, argv=["test"], out_root=tmp_path)
    assert {c["kernel"] for c in out.choices} == {"step", "conv", "replay-precompute"}
    assert all(c["source"] == "tuned" for c in out.choices)
    records = pd.read_json(out.path / "autotune.jsonl", lines=True)
    assert len(records) == 6 and set(records["status"]) == {"ok"}
    assert json.loads(cache.read_text())["entries"]

    run = run_scenario("mtp-fixed", {"backend": "triton", "drafts": 1, "batch": "2", "rounds": 2,
                                     "autotune_cache": str(cache), "warmup": 1, "rep": 2},
                       argv=["test"], out_root=tmp_path)
    rows = [r for r in run.rows if r["status"] == "passed"]
    assert rows and all(r["config_source"] == "cached" for r in rows)
    step = next(c["config"] for c in out.choices if c["kernel"] == "step")
    assert all(json.loads(r["config"])["step"] == step for r in rows)


def test_tuning_rejects_bad_options():
    with pytest.raises(ValueError, match="--drafts must be >= 1"):
        ssm_tuning.tuning_jobs({"drafts": 0})
    with pytest.raises(ValueError, match="has no linear-attention layers"):
        ssm_tuning.tuning_jobs({"preset": "llama-3-8b"})
