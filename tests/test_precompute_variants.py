"""Replay's precision-labelled precompute variants: their names, what each launch accepts, and the bound each
comparison of theirs is judged by (the kernel's numerics: tests/test_triton_replay.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from kernels.ssm.dot_precision import DEFAULT_PRECISION, PRECISIONS
from kernels.ssm.replay_precompute import precompute_supported, replay_precompute_forward
from results.store import load_run
from scenarios import tolerances
from states.base import (INLINE_MATRIX_PRECISION, MATRIX_FOLD_PRECISION, MATRIX_PRECISION, MODE_VARIANTS,
                         PRECOMPUTE_PRECISION, REPLAY_MATRIX_FORWARD, exact_fold, precompute_precision,
                         tensor_core_precision)

runner = CliRunner()


def test_every_precision_is_a_named_replay_variant():
    assert MODE_VARIANTS["replay"][:2] == ("inline", "precompute")
    assert PRECOMPUTE_PRECISION["precompute"] == DEFAULT_PRECISION
    named = {v: p for v, p in PRECOMPUTE_PRECISION.items() if v != "precompute"}
    assert named == {f"precompute-{p}": p for p in PRECISIONS if p != DEFAULT_PRECISION}
    assert set(MODE_VARIANTS["replay"]) == {"inline", *PRECOMPUTE_PRECISION, *MATRIX_FOLD_PRECISION}
    # the matrix fold's variants: every precision that keeps the fp32 contract on the states it folds, after the
    # precompute forward (`matrix*`) or inside the inline one (`inline-matrix*`)
    matrix = {"matrix": DEFAULT_PRECISION,
              **{f"matrix-{p}": p for p in PRECISIONS if p not in (DEFAULT_PRECISION, "tf32")}}
    assert MATRIX_PRECISION == matrix
    assert INLINE_MATRIX_PRECISION == {f"inline-{v}": p for v, p in matrix.items()}
    assert MATRIX_FOLD_PRECISION == {**MATRIX_PRECISION, **INLINE_MATRIX_PRECISION}
    assert REPLAY_MATRIX_FORWARD == {**PRECOMPUTE_PRECISION, **MATRIX_PRECISION}
    assert [v for v in MODE_VARIANTS["replay"] if not exact_fold("replay", v)] == list(MATRIX_FOLD_PRECISION)
    # which precision a variant's tensor cores run at: the forward's, else (inline-matrix) the fold's
    assert tensor_core_precision("replay", "inline-matrix-bf16x3") == "bf16x3"
    assert precompute_precision("replay", "inline-matrix-bf16x3") is None
    assert tensor_core_precision("replay", "matrix-tf32x3") == "tf32x3"
    assert tensor_core_precision("replay", "inline") is None and tensor_core_precision("native", "") is None
    assert tensor_core_precision("compact", "deferred-precompute-bf16x3") == "bf16x3"
    assert all(exact_fold("compact", v) for v in MODE_VARIANTS["compact"]) and exact_fold("native", "")


def test_a_matrix_variant_with_a_bf16_history_is_unsupported_and_the_gate_expects_that():
    """Both backends refuse it (the torch fold reads the same stored d's); the gate accepts that `unsupported`
    row, and only with a bf16 history."""
    from types import SimpleNamespace

    from harness.expected import check_case
    from states import ReplayState
    from states.base import StateConfig
    from states.presets import get_preset

    geom = get_preset("tiny-gdn").ssm
    for backend in ("torch", "triton"):
        cfg = StateConfig("replay", 2, drafts=1, history_dtype=torch.bfloat16, variant="matrix", backend=backend)
        with pytest.raises(ValueError, match="bf16 history rounds"):
            ReplayState._validate_config(geom, cfg)
        ReplayState._validate_config(geom, replace(cfg, history_dtype=torch.float32))  # fp32 history: fine
    row = {"mode": "replay", "variant": "matrix", "backend": "torch", "status": "unsupported", "batch": 2}
    for history, passes in ((torch.bfloat16, True), (torch.float32, False)):
        case = SimpleNamespace(backends=("torch",), modes=("replay",), variants_of=lambda m: ("matrix",), drafts=1,
                               batch=2, history_dtype=history)
        (check,) = check_case("case", case, [row], "cpu")
        assert check.passed is passes, check.line()



def test_only_out_of_contract_variants_get_a_wider_output_bound():
    fp32 = tolerances.FP32_RMS
    assert tolerances.variant_output_rms("precompute-tf32", fp32) == tolerances.TENSOR_CORE_OUTPUT_RMS["precompute-tf32"]
    assert tolerances.TENSOR_CORE_OUTPUT_RMS["precompute-tf32"] > fp32
    for v in ("inline", "precompute", "precompute-bf16x3", "precompute-tf32x3", "precompute-ieee"):
        assert tolerances.variant_output_rms(v, fp32) == fp32
    # a bound already wider than the variant's (bf16 state) is kept
    assert tolerances.variant_output_rms("precompute-tf32", 0.05) == 0.05


def test_unsupported_geometries_say_why():
    assert "K >= 16" in precompute_supported(8, 16)
    assert precompute_supported(128, 128, "kda", 4, -5.0) is None
    assert "lower_bound" in precompute_supported(128, 128, "kda", 8, -20.0)
    assert precompute_supported(128, 128, "gdn", 8, -20.0) is None  # GDN's decays never factor


def test_the_launcher_refuses_an_unknown_precision():
    with pytest.raises(ValueError, match="precision 'fp16' not in"):
        _launch_with("fp16")


def _launch_with(precision: str) -> None:
    """A one-row GDN round on a tiny pool, launched with `precision` (validation runs before the kernel)."""
    from kernels.ssm.replay import ReplayPool

    L, cap, H, HV, K, V, P = 1, 1, 1, 1, 16, 16, 8
    pool = ReplayPool(torch.zeros(L, cap, HV, K, V), torch.zeros(L, cap, H, P, K), torch.zeros(L, cap, HV, P, V),
                      torch.zeros(L, cap, HV, P), torch.zeros(L, cap, H, P, K, dtype=torch.bfloat16),
                      torch.zeros(L, cap, HV, P, V, dtype=torch.bfloat16), torch.zeros(L, cap, HV, P),
                      torch.zeros(cap, dtype=torch.int32))
    W = 1
    qkv = torch.zeros(W, 2 * H * K + HV * V, dtype=torch.bfloat16)
    replay_precompute_forward(pool, 0, qkv, torch.zeros(W, HV), torch.zeros(W, HV), torch.zeros(HV), torch.zeros(HV),
                              torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.int32),
                              torch.tensor([0, 1], dtype=torch.int32), {"BV": 16, "BK": 16, "num_warps": 1, "num_stages": 1}, precision=precision)


@pytest.mark.usefixtures("light_runs")
def test_a_labelled_variant_runs_as_its_own_row_with_its_own_bound(tmp_path):
    result = runner.invoke(app, ["run", "mtp-fixed", "--preset", "tiny-gdn", "--drafts", "1", "--batch", "2",
                                 "--rounds", "3", "--modes", "native,replay", "--replay-forward",
                                 "precompute,precompute-tf32", "--history-len", "4", "--warmup", "0", "--rep", "2",
                                 "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = load_run(next(p for p in tmp_path.iterdir() if p.is_dir()))
    rows = run.throughput
    replay = rows[rows["mode"] == "replay"]
    assert list(replay["variant"]) == ["precompute", "precompute-tf32"]
    assert set(replay["status"]) == {"passed"}
    bounds = {(c.lhs, c.rhs): c.tolerance for c in run.comparisons if c.name == "o" and c.policy == "rms"}
    assert bounds[("replay-precompute-tf32/torch", "native/torch")] == tolerances.TENSOR_CORE_OUTPUT_RMS["precompute-tf32"]
    assert bounds[("replay-precompute/torch", "native/torch")] == tolerances.FP32_RMS


def test_the_help_names_the_variants_a_run_compares():
    """--help's defaults are written out (the CLI imports no scenario module to print its help): they must be
    the variants a run really compares when the options are left out."""
    from harness import cli
    from scenarios.ssm_options import RUN_VARIANTS

    for option, mode in ((cli.CompactCommit, "compact"), (cli.ReplayForward, "replay")):
        help_text = option.__metadata__[0].help
        assert f"(default {','.join(RUN_VARIANTS[mode])})" in help_text, (mode, help_text[:120])
    from scenarios.ssm_options import DECODE_RUN_VARIANTS
    assert f"(decode adds {','.join(DECODE_RUN_VARIANTS['replay'])})" in cli.ReplayForward.__metadata__[0].help
