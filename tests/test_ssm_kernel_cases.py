"""scenarios/ssm_kernels.py: each bench case launches on its own pool and records, whichever cases are built
beside it (later cases reuse the builder's local names, so a closure that looked them up late ran on a
neighbour's pool: the matrix fold folded the folding forward's record count)."""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from kernels.ssm.configs import default_config
from scenarios.ssm_kernels import kernel_cases
from states.params import make_params
from states.presets import get_ssm_preset


def _cases(geom, params, names):
    return {c.name: c for c in kernel_cases(geom, params, batch=2, drafts=3, state_dtype=torch.float32,
                                            device="cpu", names=names, history_len=8, history=2)}


def test_the_matrix_fold_case_folds_its_own_records_beside_the_folding_forward():
    geom = replace(get_ssm_preset("tiny-gdn").ssm, layers=1)
    params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(0))
    alone = _cases(geom, params, ("replay-matrix-fold",))["replay-matrix-fold"]
    beside = _cases(geom, params, ("replay-matrix-fold", "replay-precompute-folding"))["replay-matrix-fold"]
    config = default_config(alone.kernel, head_k_dim=geom.head_k_dim, head_v_dim=geom.head_v_dim,
                            conv_dim=geom.conv_dim)
    folded = []
    for case in (alone, beside):
        dst = inspect.signature(case.run).parameters["d"].default  # the snapshot buffer the case folds into
        dst.fill_(float("nan"))
        case.run(config)
        folded.append(dst.clone())
    assert torch.isfinite(folded[0]).all()
    assert torch.equal(folded[0], folded[1]) and alone.moved_bytes == beside.moved_bytes
