"""scenarios/cost.py: a replay round's bytes count the checkpoint a second time only where the variant folds in a
launch of its own before the forward (states/base.py::separate_fold_launch, the choice states/replay.py makes)."""

from __future__ import annotations

import pytest
import torch

from scenarios.cost import TokenBytes, replay_round_bytes
from states.base import StateConfig, separate_fold_launch
from states.presets import get_preset


@pytest.mark.parametrize("preset", ["tiny-gdn", "tiny-kda"])
def test_a_fold_reads_the_checkpoint_again_only_after_a_launch_of_its_own(preset: str) -> None:
    g = get_preset(preset).ssm
    lh = 4
    widths, accepted = torch.tensor([3, 3]), torch.tensor([1, 2])
    counts = torch.tensor([lh - 1, 0])  # row 0 folds (count + width > Lh), row 1 does not
    passes = {}
    for variant in ("inline", "precompute", "matrix-bf16x3", "inline-matrix-bf16x3"):
        cfg = StateConfig("replay", max_requests=2, drafts=2, state_dtype=torch.float32, act_dtype=torch.bfloat16,
                          history_len=lh, history_dtype=torch.float32, variant=variant)
        tb = TokenBytes.of(g, cfg)
        per_record = tb.derived if "matrix" in variant else tb.raw + g.value_heads * g.gate_width * 4
        unfolded = replay_round_bytes(g, cfg, widths, accepted, torch.tensor([0, 0]))
        folded = replay_round_bytes(g, cfg, widths, accepted, counts)
        # the folding row adds its count records and the checkpoint's write, and the checkpoint's read too where
        # the fold is a launch of its own (the forward reads it in both rounds; no history after the fold)
        passes[variant] = (folded - unfolded) / g.layers - counts[0].item() * per_record
        passes[variant] /= tb.state
    assert passes["inline"] == pytest.approx(1)  # the inline forward folds the block it loads anyway
    assert passes["precompute"] == pytest.approx(2)  # the token fold's launch, then the forward reads it again
    assert passes["matrix-bf16x3"] == pytest.approx(2 if g.family == "kda" else 1)  # GDN's fold runs inside
    assert separate_fold_launch(g.family, "matrix-bf16x3") == (g.family == "kda")
    # the inline forward's matrix fold: in the forward's programs for both families, from the derived records
    assert passes["inline-matrix-bf16x3"] == pytest.approx(1)
    assert not separate_fold_launch(g.family, "inline-matrix-bf16x3")
