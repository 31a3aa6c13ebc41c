"""Tolerances of the SPEC §5 contracts, as data, each with the reason for its value.

Bitwise contracts have no tolerance. The RMS bounds below are ratios `||a - b|| / ||b||`. Bounds for
bf16 state were measured (see the comments) and are never widened silently: a change here is a
reviewed change with a new measurement.
"""

from __future__ import annotations

import torch

# Contract 2: replay outputs vs native outputs (same backend). With fp32 state they differ only by fp32
# reassociation (SPEC: RMS ratio 2e-3).
REPLAY_OUTPUT_RMS_FP32 = 2e-3
# With bf16 state native rounds the state after every token while replay keeps fp32 between folds, and a
# bf16 history stores k and d in bf16: outputs differ by accumulated bf16 rounding, about one bf16 ULP
# (2^-8 = 3.9e-3) relative. Measured 2026-12-02, torch backend, batch 4, decode 256 rounds and mtp-fixed
# 64 rounds (W = 4): worst per-round RMS ratio 3.7e-3 (gdn) / 1.5e-3 (kda) with bf16 state, 2.7e-3 (gdn)
# / 3.2e-3 (kda) with fp32 state and bf16 history. Bound: 2 bf16 ULPs.
REPLAY_OUTPUT_RMS_BF16 = 2 * 2.0**-8

# Contract 3: every backend vs the fp64 reference, fp32 state (SPEC).
REFERENCE_RMS_FP32 = 2e-3
# With bf16 state the per-token rounding compounds over a rollout. Same measurement as above: worst
# per-round RMS ratio 3.5e-3 outputs / 2.7e-3 states (gdn), 1.5e-3 / 1.9e-3 (kda); replay with a bf16
# history 2.7e-3 (gdn) / 3.2e-3 (kda) outputs. Bound: 1e-2 for both families (about 3x headroom).
REFERENCE_RMS_BF16 = {"gdn": 1e-2, "kda": 1e-2}

# Backend agreement (same mode, triton vs torch) and replay-vs-native bf16 states: both sides implement
# §2 in fp32 and differ in reduction order only; with bf16 state a different last bit of one token's
# rounding compounds like the bf16 reference drift above (replay vs native states measured 2.9e-3).
BACKEND_RMS_FP32 = 2e-3
BACKEND_RMS_BF16 = 1e-2


def replay_output_rms(state_dtype: torch.dtype, history_dtype: torch.dtype = torch.float32) -> float:
    """Replay vs native outputs. A bf16 history (derived k and d stored in bf16) rounds like a bf16
    state does, so it takes the bf16 bound even with fp32 state."""
    exact = state_dtype == torch.float32 and history_dtype == torch.float32
    return REPLAY_OUTPUT_RMS_FP32 if exact else REPLAY_OUTPUT_RMS_BF16


def reference_rms(family: str, state_dtype: torch.dtype, history_dtype: torch.dtype = torch.float32) -> float:
    """A mode vs the fp64 reference; replay with a bf16 history is bounded like bf16 state."""
    exact = state_dtype == torch.float32 and history_dtype == torch.float32
    return REFERENCE_RMS_FP32 if exact else REFERENCE_RMS_BF16[family]


def backend_rms(state_dtype: torch.dtype) -> float:
    return BACKEND_RMS_FP32 if state_dtype == torch.float32 else BACKEND_RMS_BF16
