"""The contract bounds as the comparisons pick them (scenarios/tolerances.py, scenarios/ssm_engine.py)."""

from types import SimpleNamespace

import pytest
import torch

from scenarios import tolerances
from scenarios.ssm_engine import Variant, _Comparisons

F32, B16 = torch.float32, torch.bfloat16


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_backend_bound_by_state_and_history(family):
    assert tolerances.backend_rms(family, F32) == tolerances.FP32_RMS
    assert tolerances.backend_rms(family, F32, F32) == tolerances.FP32_RMS
    # a bf16 history rounds the same fp32 records to bf16 on each backend, one ulp apart at a boundary
    assert tolerances.backend_rms(family, F32, B16) == tolerances.BF16_REFERENCE_RMS[family]["replay"]
    assert tolerances.backend_rms(family, B16, B16) == tolerances.BF16_BACKEND_RMS[family]
    assert tolerances.FP32_RMS < tolerances.backend_rms(family, F32, B16) < 0.1


@pytest.mark.parametrize("history", [F32, B16])
@pytest.mark.parametrize("mode", ["native", "compact", "replay"])
def test_output_backend_policy_reads_the_history_only_for_replay(mode, history):
    comps = SimpleNamespace(family="kda", case=SimpleNamespace(state_dtype=F32, history_dtype=history))
    policy = _Comparisons._output_policy(comps, Variant(mode, "", "triton"), "backend")
    wide = mode == "replay" and history == B16
    assert policy == {"contract": "3", "policy": "rms",
                      "tolerance": tolerances.BF16_HISTORY_BACKEND_RMS["kda"] if wide else tolerances.FP32_RMS}
