"""Predicted memory of an SSM case (decode, mtp-fixed, mtp-dynamic, checkpoint-restore), before any work.

Counted (bytes, `n` requests, `R` rounds, `W = drafts + 1`, `c` requests checked against fp64):

* device, shared by every variant: the initial state and conv window (generated in fp32, then cast),
  the per-round widths and acceptances (int64 while drawn), one round's token inputs of one layer;
* device, per variant: its pool, `(n + spare) x` the SPEC §3 bytes per request (checkpoint-restore
  holds every mode's pool at once, with room for the restored copies);
* host: the outputs kept for comparisons (fp32, every round and layer, of each variant others are
  compared against) and the fp64 reference (outputs, and states of every round).

It is an estimate of the large allocations, not of every transient, so it errs low; its job is to
refuse `--batch 1000000000` in a millisecond rather than fail in the allocator half a minute later.
"""

from __future__ import annotations

from scenarios import ssm_baselines
from scenarios.base import CHECK_REQUESTS, CaseMemory
from scenarios.ssm_engine import SPARE_SLOTS, SSMCase, label
from states import MODES
from states.base import _nbytes
from states.presets import get_preset


USUAL_BATCH, USUAL_ROUNDS = 4, 32


def ssm_case_memory(case: SSMCase, device: str, restore: bool = False) -> CaseMemory:
    """`restore`: checkpoint-restore's layout (every mode's pool at once, plus room to restore into)."""
    g = get_preset(case.preset).ssm
    n, W, R, L = case.batch, case.drafts + 1, case.rounds, g.layers
    sb, ab = _nbytes(case.state_dtype), _nbytes(case.act_dtype)
    fp32 = 4
    init = n * L * (g.state_elems * (fp32 + sb) + g.conv_dim * (g.conv_kernel - 1) * (fp32 + ab))
    schedule = 2 * R * n * 8
    token_row = g.conv_dim + g.value_heads * g.gate_width + g.value_heads
    inputs = n * W * token_row * (fp32 + ab)
    out_round = R * L * n * W * g.value_heads * g.head_v_dim
    variants = case.variants
    kept = sum(1 for v in variants if (v.mode == "native" or v.backend == "torch") and not ssm_baselines.is_baseline(v.backend))
    checked = min(n, case.options.get("check_requests") or CHECK_REQUESTS)
    reference = R * L * checked * (W * g.value_heads * g.head_v_dim + g.state_elems) * 8
    host = kept * out_round * fp32 + reference
    capacity = n + (max(1, n // 2) * sum(len(case.variants_of(m)) for m in case.modes) if restore else SPARE_SLOTS)
    pools = {}
    for v in variants:
        cfg = v.config(case, device, capacity)
        try:
            terms = (ssm_baselines.bytes_per_request(v.backend, g, cfg) if ssm_baselines.is_baseline(v.backend)
                     else MODES[v.mode].bytes_per_request(g, cfg))
            pools[label(v)] = capacity * int(terms["total"])
        except ValueError:  # a variant this case cannot run (e.g. compact without drafts) allocates nothing
            pools[label(v)] = 0
    device_bytes = init + schedule + inputs
    # Memory grows with the batch times the rounds (every round's outputs are kept for the comparisons), so
    # the error names whichever was given further above its usual value (4 requests, 32 rounds).
    rounds_given = case.options.get("rounds") is not None or case.options.get("trace") is not None
    if rounds_given and R / USUAL_ROUNDS > n / USUAL_BATCH:
        where = f"--trace {case.options['trace']} ({R} rounds)" if case.options.get("trace") else f"--rounds {R}"
        subject, hint = where, "every round's outputs are kept for the comparisons; lower --rounds"
    else:
        subject, hint = f"--batch {n}", "lower --batch, --rounds or --drafts, or run fewer --modes"
    return CaseMemory(subject=subject, device=device_bytes, host=host, variants=pools, together=restore, hint=hint)

