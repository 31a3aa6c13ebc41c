"""The peers' kernels alone, one layer, beside ours (scripts/bench_kernels.py; the shape of
../shared/reference/h200_peers_2026-12-03.md): each case is a launch of a peer's public function on
random non-zero inputs built before the closure, with the bytes that launch must move.

    fla-decode                 fla-core fused_recurrent_kda_fwd in place on a pool, T = 1 (incl. the q/k/v split)
    fla-mtp                    the same with indices [n, W]: read 1 state, write W (the vLLM-style native verify)
    flashinfer-decode          gated_delta_rule_decode_pretranspose, T = 1, in place (beside our decode)
    flashinfer-mtp-states      gated_delta_rule_mtp, intermediate_states_buffer: read 1 + write W states (beside
                               our native verify: the same bytes)
    flashinfer-mtp-scatter     gated_delta_rule_mtp, per-token ssm_state_indices into the pool (the engine's row)
    flashinfer-mtp-readonly    gated_delta_rule_mtp, disable_state_update=True: read 1 state (beside our
                               compact verify)
    flashinfer-mtp-final       gated_delta_rule_mtp, final state written: read 1 + write 1
    sglang-verify-<ring>-<p>   gdn_replayssm_spec_decode verify launch, T = W, ring L 16 holding 12 history
                               records, ring dtype bf16 | fp32, dot precision tf32 | ieee | tf32x3 | bf16x3
                               (beside our replay forward)
    sglang-compact-commit      commit_gdn_replayssm_circular of W accepted records (beside our compact commit;
                               two fills re-arming its cursors are timed with it)

A peer that is missing (or at another version) is one printed line and no cases; nothing here imports the
harness.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from kernels.ssm.baselines import BASELINES, PeerUnavailable
from kernels.ssm.baselines.fla import fla_gate_inputs
from kernels.ssm.baselines.sglang import PRECISIONS
from states.geometry import SSMGeometry
from states.params import SSMParams, make_token_inputs

SGLANG_RING, SGLANG_HISTORY = 16, 12  # the measured configuration: 12 committed records before the window

Case = tuple[str, Callable[[], object], int]


def peer_cases(geom: SSMGeometry, params: SSMParams, n: int, drafts: int, state_dtype: torch.dtype,
               device: str, say=print) -> list[Case]:
    """Every peer case this geometry and device support; `say` gets one line per peer that cannot run."""
    out: list[Case] = []
    for name, build in (("fla", _fla), ("flashinfer", _flashinfer), ("sglang", _sglang)):
        try:
            out += build(geom, params, n, drafts, state_dtype, device)
        except PeerUnavailable as e:
            say(f"{name}: no cases ({e})", file=sys.stderr)
    return out


def _rand(*shape, dtype=torch.float32, device="cuda", gen=None) -> torch.Tensor:
    return torch.rand(*shape, generator=gen, device=device).mul_(0.1).to(dtype)


def _nb(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _fla(geom, params, n, drafts, state_dtype, device) -> list[Case]:
    kernel = BASELINES["fla"].load(device)
    HV, K, V, W = geom.value_heads, geom.head_k_dim, geom.head_v_dim, drafts + 1
    act = torch.bfloat16
    state = HV * K * V * _nb(state_dtype)
    cases = []
    for name, width in (("fla-decode", 1), ("fla-mtp", W)):
        if name == "fla-mtp" and W == 1:
            continue
        T = n * width
        x = make_token_inputs(geom, T, act, torch.Generator().manual_seed(2)).to(device)
        rows = torch.rand(n * width, HV, K, V, device=device).to(state_dtype)
        cu = torch.arange(0, T + 1, width, dtype=torch.int64, device=device)
        idx = (torch.arange(n, device=device) if width == 1
               else torch.arange(n, device=device)[:, None] * width + torch.arange(width, device=device))
        num = None if width == 1 else torch.ones(n, dtype=torch.int32, device=device)
        g, beta, dtb, lower = fla_gate_inputs(x.a, x.b, params.dt_bias[0], K, geom.family, geom.lower_bound)

        def run(x=x, rows=rows, cu=cu, idx=idx, num=num, g=g, beta=beta, dtb=dtb, lower=lower, T=T):
            q, k, v = (t.contiguous()[None] for t in _split(geom, x.mixed_qkv))
            return kernel(q, k, v, g=g, beta=beta, A_log=params.A_log[0], dt_bias=dtb, initial_state=rows,
                          scale=K**-0.5, inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx,
                          num_accepted_tokens=num, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                          use_beta_sigmoid_in_kernel=True, lower_bound=lower)

        # per token: the split reads and writes the conv output, the kernel reads q, k, v, the gate [HV, K] and
        # beta, and writes the output (activation dtype); the gate layout is built before timing
        per_token = (3 * geom.conv_dim + HV * K + HV) * _nb(act) + HV * V * _nb(act)
        cases.append((name, run, n * (1 + width) * state + T * per_token))
    return cases


def _split(geom: SSMGeometry, qkv: torch.Tensor):
    H, HV, K, V = geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
    return (qkv[:, : H * K].unflatten(1, (H, K)), qkv[:, H * K : 2 * H * K].unflatten(1, (H, K)),
            qkv[:, 2 * H * K :].unflatten(1, (HV, V)))


def _flashinfer(geom, params, n, drafts, state_dtype, device) -> list[Case]:
    gdn = BASELINES["flashinfer"].load(device)
    if geom.family != "gdn" or state_dtype != torch.float32:
        raise PeerUnavailable("FlashInfer's cases here are GDN with an fp32 state")
    H, HV, K, V, T = geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim, drafts + 1
    gen = torch.Generator(device=device).manual_seed(3)
    bf = torch.bfloat16
    A_log, dt_bias = params.A_log[0].float(), params.dt_bias[0].float()
    state = HV * V * K * 4
    io = lambda t: t * ((2 * H * K + HV * V + 2 * HV) * 2 + HV * V * 2)  # noqa: E731  q, k, v, a, b in; bf16 out
    idx = torch.arange(n, dtype=torch.int32, device=device)

    def inputs(t):
        return (_rand(n, t, H, K, dtype=bf, device=device, gen=gen), _rand(n, t, H, K, dtype=bf, device=device, gen=gen),
                _rand(n, t, HV, V, dtype=bf, device=device, gen=gen), _rand(n, t, HV, dtype=bf, device=device, gen=gen),
                _rand(n, t, HV, dtype=bf, device=device, gen=gen))

    cases = []
    q1, k1, v1, a1, b1 = inputs(1)
    pool1 = _rand(n, HV, V, K, device=device, gen=gen)
    cases.append(("flashinfer-decode", lambda: gdn.gated_delta_rule_decode_pretranspose(
        q1, k1, v1, None, A_log, a1, dt_bias, b1, use_qk_l2norm=True, initial_state=pool1,
        initial_state_indices=idx, backend="flashinfer"), 2 * n * state + io(n)))
    if T == 1:
        return cases
    q, k, v, a, b = inputs(T)
    pool = _rand(n, HV, V, K, device=device, gen=gen)
    buf = _rand(n, T, HV, V, K, device=device, gen=gen)
    scatter_pool = _rand(n * T, HV, V, K, device=device, gen=gen)
    scatter_read = idx * T
    scatter = (idx[:, None] * T + torch.arange(T, dtype=torch.int32, device=device)).contiguous()

    def mtp(source=pool, read=idx, **kw):
        return lambda: gdn.gated_delta_rule_mtp(q, k, v, source, read, A_log, a, dt_bias, b, use_qk_l2norm=True, **kw)

    cases += [
        ("flashinfer-mtp-states", mtp(intermediate_states_buffer=buf, disable_state_update=True),
         n * (1 + T) * state + io(n * T)),
        ("flashinfer-mtp-scatter", mtp(source=scatter_pool, read=scatter_read, ssm_state_indices=scatter,
                                       disable_state_update=False), n * (1 + T) * state + io(n * T)),
        ("flashinfer-mtp-readonly", mtp(disable_state_update=True), n * state + io(n * T)),
        ("flashinfer-mtp-final", mtp(disable_state_update=False), 2 * n * state + io(n * T)),
    ]
    return cases


def _sglang(geom, params, n, drafts, state_dtype, device) -> list[Case]:
    ops = BASELINES["sglang"].load(device)
    if geom.family != "gdn" or state_dtype != torch.float32:
        raise PeerUnavailable("SGLang's cases here are GDN with an fp32 checkpoint")
    H, HV, K, V, T, L = geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim, drafts + 1, SGLANG_RING
    if SGLANG_HISTORY + T > L:
        raise PeerUnavailable(f"a window of W = {T} does not fit the ring of {L} after {SGLANG_HISTORY} records")
    gen = torch.Generator(device=device).manual_seed(4)
    bf, f32 = torch.bfloat16, torch.float32
    x = make_token_inputs(geom, n * T, bf, torch.Generator().manual_seed(5)).to(device)
    q, k, v = _split(geom, x.mixed_qkv)
    cu = torch.arange(0, n * T + 1, T, dtype=torch.int32, device=device)
    slots = torch.arange(n, device=device)
    checkpoint = _rand(n, HV, V, K, device=device, gen=gen)
    out = torch.empty(n * T, HV, V, dtype=f32, device=device)
    base = torch.zeros(n, dtype=torch.int32, device=device)
    flush = torch.zeros(n, dtype=torch.int8, device=device)
    rawv, rawk, beta = (_rand(n, HV, L, V, dtype=bf, device=device, gen=gen),
                        _rand(n, H, L, K, dtype=bf, device=device, gen=gen), _rand(n, HV, L, device=device, gen=gen))
    g_ring = -_rand(n, HV, L, device=device, gen=gen)
    precisions = PRECISIONS if str(device).startswith("cuda") else ("ieee",)  # the interpreter has IEEE only
    cases = []
    for ring_dtype in (bf, f32):
        d_ring = _rand(n, HV, L, V, dtype=ring_dtype, device=device, gen=gen)
        k_ring = _rand(n, H, L, K, dtype=ring_dtype, device=device, gen=gen)
        hist = _nb(ring_dtype)
        rec = (HV * V + H * K) * hist + HV * 4
        raw = (HV * V + H * K) * 2 + HV * 4
        moved = n * (HV * V * K * 4 + SGLANG_HISTORY * rec + T * (rec + raw)
                     + T * ((2 * H * K + HV * V + 2 * HV) * 2 + HV * V * 4))
        write_pos = torch.full((n,), SGLANG_HISTORY, dtype=torch.int32, device=device)
        for p in precisions:
            def run(d_ring=d_ring, k_ring=k_ring, write_pos=write_pos, p=p):
                return ops.gdn_replayssm_spec_decode(
                    q, k, v, x.a, x.b, params.A_log[0], params.dt_bias[0], checkpoint, d_ring, k_ring, g_ring, rawv,
                    rawk, beta, out, cu, slots, slots, write_pos, base, flush, max_cache_len=L, max_spec_len=T,
                    null_block_id=-1, launch_mode="verify", dot_precision=p, block_v=min(32, V), num_warps=1,
                    nk=2 if K >= 32 else 1)
            cases.append((f"sglang-verify-{'bf16' if ring_dtype == bf else 'fp32'}-{p}", run, moved))
    # the compact commit of W accepted records (fold every commit), one layer
    d1, k1, g1 = (_rand(1, n, HV, L, V, device=device, gen=gen), _rand(1, n, H, L, K, device=device, gen=gen),
                  -_rand(1, n, HV, L, device=device, gen=gen))
    ck = _rand(1, n, HV, V, K, device=device, gen=gen)
    accepted = torch.full((n,), T, dtype=torch.int32, device=device)

    wp, fl = accepted.clone(), torch.ones(n, dtype=torch.int8, device=device)

    def commit():
        # the commit clears the cursors of the rows it folds: re-arm them (two fills, timed with it)
        wp.fill_(T), fl.fill_(1)
        return ops.commit_gdn_replayssm_circular(
            checkpoint_state=ck, d_cache=d1, k_cache=k1, g_cache=g1, d_residual_cache=None, k_residual_cache=None,
            state_batch_indices=slots, replay_indices=slots, write_pos=wp, cache_base=base, is_flush=fl,
            accept_lens=accepted, null_block_id=-1)

    cases.append(("sglang-compact-commit", commit, n * (2 * HV * V * K * 4 + L * ((HV * V + H * K) * 4 + HV * 4))))
    return cases
