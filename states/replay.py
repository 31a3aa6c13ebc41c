"""Replay mode: one checkpoint plus a history ring of per-token records (SPEC §3).

Per request and layer: the checkpoint `S0`, and a ring of `2 * Lh` records in two halves. Derived
records (normalized k, corrected value d, log gate g) let forward compute outputs from `S0` and the
history without writing the state; raw records (raw k, raw v, beta) let a fold replay the accepted
tokens through exactly the native step, in fp32, rounding once. The cursor (`phase * 2Lh + count`)
counts accepted records since the checkpoint; accepting only moves it. Before a round, a request
whose history would overflow (`count + width > Lh`) folds, and its next records go to the other half,
so a fold never overwrites records that are still being read.

With `G_t = sum_{i <= t} g_i` over the history since the checkpoint and `D(x) = diag(exp(x))`:
`S_t = D(G_t) S0 + sum_{j <= t} D(G_t - G_j) k_j d_j^T`, which gives each new token's
`sk_t`, `d_t = beta_t (v_t - sk_t)` and `o_t` without materializing `S_t`. Products of `exp(g)` are
carried forward only (never divided back), so nothing overflows.
"""

from __future__ import annotations

import torch

from kernels.common.torch_ops import decay_from_log_gate, expand_heads, l2norm, seq_sum
from kernels.ssm.configs import CONV, REPLAY_FOLD, REPLAY_FORWARD, REPLAY_MATRIX_FOLD, REPLAY_PRECOMPUTE
from kernels.ssm.replay import ReplayPool, replay_fold, replay_forward, replay_prepare
from kernels.ssm.replay_matrix_fold import matrix_fold_supported, replay_matrix_fold
from kernels.ssm.replay_precompute import precompute_supported, replay_precompute_forward
from states.base import (DTYPE_NAMES, INLINE_MATRIX_PRECISION, MATRIX_FOLD_PRECISION, REPLAY_MATRIX_FORWARD, Round,
                         SSMState, StateConfig, _nbytes, separate_fold_launch)
from states.geometry import SSMGeometry
from states.params import SSMParams, TokenInputs


class ReplayState(SSMState):
    """Replay pool. On the triton backend `kernel_configs` holds `{kernel: config}` for the forward
    (`replay-forward`, which folds inside, or `replay-precompute`), the fold (`replay-fold`: snapshots,
    materialize, and the precompute variants' folds; `replay-matrix-fold` for the matrix-fold variants, whose
    BK the inline forward's matrix fold also takes) and `conv`.

    Variants: `inline` walks the round token by token; `precompute` runs the round's products on
    tensor cores (kernels/ssm/replay_precompute.py), at the precision `REPLAY_MATRIX_FORWARD` names
    (`precompute-<precision>` for the others), with a layer's folds in a fold launch just before it.
    Those fold through native's step; `matrix*` runs the same forward and folds in matrix form from the
    stored d's (kernels/ssm/replay_matrix_fold.py; states within the fp32 contract, not bitwise);
    `inline-matrix*` is `inline`'s forward with that matrix fold inside it. The torch backend computes the
    forward of all with the same reference formula, and each fold as its variant does."""

    mode = "replay"

    def __init__(self, geom: SSMGeometry, params: SSMParams, cfg: StateConfig) -> None:
        super().__init__(geom, params, cfg)
        # triton: the round's fold decision (`[n]` int32, batch row -> cursor to fold or -1), from prepare
        self._fold_from: torch.Tensor | None = None

    @classmethod
    def _validate_config(cls, geom: SSMGeometry, cfg: StateConfig) -> None:
        super()._validate_config(geom, cfg)
        Lh = cfg.history_len
        if Lh < 4 or Lh & (Lh - 1):
            raise ValueError(f"history length must be a power of two and at least 4, got {Lh}")
        if Lh < cfg.width:
            raise ValueError(f"history length {Lh} is shorter than the verify width W = {cfg.width}")
        if cfg.history_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"history dtype must be fp32 or bf16, got {DTYPE_NAMES.get(cfg.history_dtype)}")
        if cfg.mode_variant in REPLAY_MATRIX_FORWARD and cfg.backend == "triton":
            why = precompute_supported(geom.head_k_dim, geom.head_v_dim, geom.family, cfg.width, geom.lower_bound)
            if why:
                raise ValueError(why)
        if cfg.mode_variant in MATRIX_FOLD_PRECISION:  # both backends: the torch fold reads the same d's
            why = matrix_fold_supported(geom.head_k_dim, geom.head_v_dim, cfg.history_dtype)
            if why:
                raise ValueError(why)

    def _allocate(self) -> None:
        g, cfg = self.geom, self.cfg
        L, cap, P, dev = g.layers, cfg.max_requests, 2 * cfg.history_len, cfg.device
        H, HV, K, V = g.key_heads, g.value_heads, g.head_k_dim, g.head_v_dim
        gate = (L, cap, HV, P) if g.family == "gdn" else (L, cap, HV, P, K)
        self.ssm = torch.zeros(L, cap, HV, K, V, dtype=cfg.state_dtype, device=dev)  # the checkpoint
        # ring records: [L, slots, heads, 2 * Lh, ...]; ring position = phase * Lh + record number
        self.hist_k = torch.zeros(L, cap, H, P, K, dtype=cfg.history_dtype, device=dev)
        self.hist_d = torch.zeros(L, cap, HV, P, V, dtype=cfg.history_dtype, device=dev)
        self.hist_g = torch.zeros(gate, dtype=torch.float32, device=dev)
        self.raw_k = torch.zeros(L, cap, H, P, K, dtype=cfg.act_dtype, device=dev)
        self.raw_v = torch.zeros(L, cap, HV, P, V, dtype=cfg.act_dtype, device=dev)
        self.raw_beta = torch.zeros(L, cap, HV, P, dtype=torch.float32, device=dev)
        self.cursor = torch.zeros(cap, dtype=torch.int32, device=dev)  # slot -> phase * 2Lh + count
        self._pool = ReplayPool(self.ssm, self.hist_k, self.hist_d, self.hist_g, self.raw_k, self.raw_v,
                                self.raw_beta, self.cursor)
        # triton launch configs by kernel (kernels/ssm/configs.py); the autotuner replaces them
        self.kernel_configs = self._default_kernel_configs()

    @property
    def _matrix_fold(self) -> bool:
        return self.cfg.mode_variant in MATRIX_FOLD_PRECISION

    def kernels(self) -> tuple[str, ...]:
        forward = REPLAY_PRECOMPUTE if self.cfg.mode_variant in REPLAY_MATRIX_FORWARD else REPLAY_FORWARD
        return (forward, REPLAY_MATRIX_FOLD if self._matrix_fold else REPLAY_FOLD, CONV)

    def _fold_launch(self, slots: torch.Tensor, fold_from: torch.Tensor, **where) -> None:
        """The variant's fold kernel over `slots` (`dst` / `layer` as `replay_fold` takes them)."""
        if self._matrix_fold:
            replay_matrix_fold(self._pool, slots, fold_from, self.kernel_configs[REPLAY_MATRIX_FOLD],
                               precision=MATRIX_FOLD_PRECISION[self.cfg.mode_variant], **where)
        else:
            replay_fold(self._pool, slots, fold_from, self.kernel_configs[REPLAY_FOLD], **where)

    def _pool_tensors(self) -> dict[str, torch.Tensor]:
        return {
            **super()._pool_tensors(),
            "ssm": self.ssm, "hist_k": self.hist_k, "hist_d": self.hist_d, "hist_g": self.hist_g,
            "raw_k": self.raw_k, "raw_v": self.raw_v, "raw_beta": self.raw_beta, "cursor": self.cursor,
        }

    @classmethod
    def bytes_per_request(cls, geom: SSMGeometry, cfg: StateConfig) -> dict[str, int]:
        terms = super().bytes_per_request(geom, cfg)
        act, hist = _nbytes(cfg.act_dtype), _nbytes(cfg.history_dtype)
        H, HV, K, V = geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
        terms["ssm"] = geom.layers * geom.state_elems * _nbytes(cfg.state_dtype)
        terms["history"] = geom.layers * 2 * cfg.history_len * (
            H * K * hist + HV * V * hist + HV * geom.gate_width * 4 + H * K * act + HV * V * act + HV * 4
        )
        terms["cursor"] = 4
        terms["total"] = sum(terms.values())
        return terms

    def _reset_mode(self, slots: torch.Tensor) -> None:
        for t in (self.ssm, self.hist_k, self.hist_d, self.hist_g, self.raw_k, self.raw_v, self.raw_beta):
            t[:, slots] = 0
        self.cursor[slots] = 0

    # ------------------------------------------------------------------ cursor helpers
    def _count_base(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted records since the checkpoint, ring position of the first one) per slot, int64."""
        P, Lh = 2 * self.cfg.history_len, self.cfg.history_len
        cur = self.cursor[slots].long()
        return cur % P, (cur // P) * Lh

    # ------------------------------------------------------------------ fold / materialize
    def _fold(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Checkpoint of `slots` with their accepted records replayed, fp32 (not rounded, not written)."""
        if self._matrix_fold:
            return self._fold_matrix(layer, slots)
        count, base = self._count_base(slots)
        S = self.ssm[layer, slots].float()
        step = self._step()
        for j in range(int(count.max()) if count.numel() else 0):
            pos = base + j
            S_new, _ = step(
                S,
                l2norm(self.raw_k[layer, slots, :, pos]),
                self.raw_v[layer, slots, :, pos].float(),
                decay_from_log_gate(self.hist_g[layer, slots, :, pos]),
                self.raw_beta[layer, slots, :, pos],
            )
            S = torch.where((j < count)[:, None, None, None], S_new, S)
        return S

    def _fold_matrix(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """The matrix variants' fold (kernels/ssm/replay_matrix_fold.py), from the derived records:
        `e^{G_c} S0 + (Kd e^{rel})^T Dd`, fp32 (not rounded, not written)."""
        g, Lh = self.geom, self.cfg.history_len
        count, base = self._count_base(slots)
        S0 = self.ssm[layer, slots].float()
        pos = base[:, None] + torch.arange(Lh, device=S0.device)  # [n, Lh] -> ring position
        live = (torch.arange(Lh, device=S0.device)[None, :] < count[:, None])[:, None, :]  # [n, 1, Lh]
        kd = expand_heads(_gather_positions(self.hist_k[layer, slots], pos).float(), g.group)  # [n, HV, Lh, K]
        dd = _gather_positions(self.hist_d[layer, slots], pos).float() * live[..., None]  # [n, HV, Lh, V]
        hg = _gather_positions(self.hist_g[layer, slots], pos)  # [n, HV, Lh(, K)]
        hg = hg * (live if g.family == "gdn" else live[..., None])
        # gates after record j: the reverse cumsum of the gates shifted by one (as the kernel sums them)
        shifted = torch.cat([hg[:, :, 1:], torch.zeros_like(hg[:, :, :1])], dim=2)
        after = torch.flip(torch.cumsum(torch.flip(shifted, [2]), 2), [2])
        total = hg.sum(2)  # [n, HV(, K)]
        if g.family == "gdn":
            kd, S = kd * torch.exp(after)[..., None], S0 * torch.exp(total)[..., None, None]
        else:
            kd, S = kd * torch.exp(after), S0 * torch.exp(total)[..., None]
        return S + torch.einsum("nhjk,nhjv->nhkv", kd, dd)

    def materialize(self, slots: torch.Tensor) -> None:
        """Fold the accepted history of `slots` into their checkpoints (boundaries: prefill, export)."""
        slots = torch.as_tensor(slots, dtype=torch.long, device=self.cfg.device)
        self._check_slots(slots)
        self._between_rounds("materialize")
        self._fold_into_checkpoint(slots)

    def _fold_into_checkpoint(self, slots: torch.Tensor) -> None:
        if self.cfg.backend == "triton":
            return self._fold_triton(slots)
        for layer in range(self.geom.layers):
            self.ssm[layer, slots] = self._fold(layer, slots).to(self.cfg.state_dtype)
        self._flip(slots)

    def _fold_triton(self, slots: torch.Tensor) -> None:
        self._fold_launch(slots, self.cursor[slots])
        self._flip(slots)

    def _flip(self, slots: torch.Tensor) -> None:
        """After a fold: count 0, next records in the other half of the ring."""
        P = 2 * self.cfg.history_len
        phase = self.cursor[slots] // P
        self.cursor[slots] = (1 - phase) * P

    def _begin_round_mode(self, rnd: Round) -> None:
        if self.cfg.backend == "triton":
            return self._prepare_triton(rnd)
        count, _ = self._count_base(rnd.slots)
        overflow = count + rnd.widths.long() > self.cfg.history_len
        if bool(overflow.any()):
            self._fold_into_checkpoint(rnd.slots[overflow])

    def _prepare_triton(self, rnd: Round) -> None:
        """Fold decision and cursor flips on the device; each layer's forward folds its own records."""
        self._fold_from = replay_prepare(self._pool, rnd.slots, rnd.widths)

    # ------------------------------------------------------------------ forward
    def _forward_torch(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        p, valid = self._conv_and_prepare(layer, inputs, rnd)
        g, cfg = self.geom, self.cfg
        Lh, grp, hd = cfg.history_len, g.group, cfg.history_dtype
        n, slots = rnd.n, rnd.slots
        count, base = self._count_base(slots)
        S0 = self.ssm[layer, slots].float()
        kda = g.family == "kda"

        # history since the checkpoint, in local positions 0..Lh-1 (ring position base + j)
        pos = base[:, None] + torch.arange(Lh, device=S0.device)  # [n, Lh] -> ring position
        hk = _gather_positions(self.hist_k[layer, slots], pos).float()
        hdl = _gather_positions(self.hist_d[layer, slots], pos).float()
        hg = _gather_positions(self.hist_g[layer, slots], pos)
        Dk = torch.zeros(n, g.value_heads, Lh, g.head_k_dim, device=S0.device)  # e^{G_now - G_j} * k_j
        Dd = torch.zeros(n, g.value_heads, Lh, g.head_v_dim, device=S0.device)  # d_j
        eG = torch.ones(n, g.value_heads, g.gate_width, device=S0.device)  # e^{G_now}

        def advance(dec: torch.Tensor, m: torch.Tensor) -> None:
            nonlocal Dk, eG
            dec = dec if kda else dec[..., None]  # [n, HV, gw]
            Dk = torch.where(m[:, None, None, None], Dk * dec[:, :, None, :], Dk)
            eG = torch.where(m[:, None, None], eG * dec, eG)

        for j in range(Lh):
            m = j < count
            advance(decay_from_log_gate(hg[:, :, j]), m)
            put = m[:, None, None]
            Dk[:, :, j] = torch.where(put, expand_heads(hk[:, :, j], grp), Dk[:, :, j])
            Dd[:, :, j] = torch.where(put, hdl[:, :, j], Dd[:, :, j])

        o_pad = torch.zeros(n, rnd.width, g.value_heads, g.head_v_dim, device=S0.device)
        local = torch.arange(Lh, device=S0.device)
        for t in range(rnd.width):
            m = valid[:, t]
            advance(p.decay[:, t], m)
            k_t, q_t = expand_heads(p.k[:, t], grp), expand_heads(p.q[:, t], grp)
            sk = seq_sum(S0 * (eG * k_t)[..., None], -2) + _history_term(Dk, Dd, k_t)
            d_t = (p.beta[:, t][..., None] * (p.v[:, t] - sk)).to(hd)
            here = (local[None, :] == (count + t)[:, None]) & m[:, None]  # [n, Lh] local position of token t
            Dk = torch.where(here[:, None, :, None], expand_heads(p.k[:, t].to(hd).float(), grp)[:, :, None], Dk)
            Dd = torch.where(here[:, None, :, None], d_t.float()[:, :, None], Dd)
            o_pad[:, t] = seq_sum(S0 * (eG * q_t)[..., None], -2) + _history_term(Dk, Dd, q_t)
            rows, ring = slots[m], (base + count + t)[m]
            self.hist_k[layer, rows, :, ring] = p.k[m, t].to(hd)
            self.hist_d[layer, rows, :, ring] = d_t[m]
            self.hist_g[layer, rows, :, ring] = p.g[m, t]
            self.raw_k[layer, rows, :, ring] = p.k_raw[m, t]
            self.raw_v[layer, rows, :, ring] = p.v_raw[m, t]
            self.raw_beta[layer, rows, :, ring] = p.beta[m, t]
        return self._scatter_outputs(o_pad, rnd)

    def _forward_triton(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        p, g = self.params, self.geom
        qkv = self._conv_triton(layer, inputs, rnd)
        if self.cfg.mode_variant in REPLAY_MATRIX_FORWARD:
            # GDN's matrix fold runs in the forward's own programs, first (one launch, the folded block read
            # back from L2): Qwen3-Next batch 128 W 4, 9315 -> 8751 us a round on an H100. KDA's keeps its
            # launch: fused, its per-column gates made GLM-5.3-Flash's round slower, 3694 -> 4043 us
            # (results/reference/h100-2026-12-07/fold-in-forward). The token fold steps a whole [K, BV]
            # block through the records: always its own launch.
            fuse = not separate_fold_launch(g.family, self.cfg.mode_variant)
            if not fuse:
                self._fold_launch(rnd.slots, self._fold_from, layer=layer)
            return replay_precompute_forward(
                self._pool, layer, qkv, inputs.a, inputs.b, p.A_log[layer], p.dt_bias[layer], rnd.slots, rnd.widths,
                rnd.cu_seqlens, self.kernel_configs[REPLAY_PRECOMPUTE], g.lower_bound,
                precision=REPLAY_MATRIX_FORWARD[self.cfg.mode_variant],
                fold_from=self._fold_from if fuse else None,
            )
        # inline-matrix*: the inline forward folds inside itself in matrix form (the matrix fold's helper and BK)
        matrix = self.cfg.mode_variant in INLINE_MATRIX_PRECISION
        return replay_forward(
            self._pool, layer, qkv, inputs.a, inputs.b, p.A_log[layer], p.dt_bias[layer], rnd.slots, rnd.widths,
            rnd.cu_seqlens, self._fold_from, self.kernel_configs[REPLAY_FORWARD], g.lower_bound,
            fold_precision=INLINE_MATRIX_PRECISION[self.cfg.mode_variant] if matrix else None,
            fold_config=self.kernel_configs[REPLAY_MATRIX_FOLD] if matrix else None,
        )

    def _accept_mode(self, rnd: Round, accepted: torch.Tensor) -> None:
        self.cursor[rnd.slots] += torch.where(rnd.widths > 0, accepted + 1, 0)

    # ------------------------------------------------------------------ accepted state
    def _snapshot_ssm(self, slots: torch.Tensor) -> torch.Tensor:
        if self.cfg.backend == "triton":
            return self._snapshot_triton(slots)
        folded = [self._fold(layer, slots).to(self.cfg.state_dtype) for layer in range(self.geom.layers)]
        return torch.stack(folded, dim=1)

    def _snapshot_triton(self, slots: torch.Tensor) -> torch.Tensor:
        """Fold the accepted history of `slots` into a scratch `[n, L, HV, K, V]`; the pool is only read."""
        g = self.geom
        out = torch.empty(slots.shape[0], g.layers, g.value_heads, g.head_k_dim, g.head_v_dim,
                          dtype=self.cfg.state_dtype, device=slots.device)
        self._fold_launch(slots, self.cursor[slots], dst=out)
        return out

    def _load_ssm(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        self.ssm[:, slots] = ssm


def _history_term(Dk: torch.Tensor, Dd: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`sum_j (Dk_j . x) d_j`: Dk `[n, HV, J, K]`, Dd `[n, HV, J, V]`, x `[n, HV, K]` -> `[n, HV, V]`."""
    return torch.einsum("nhj,nhjv->nhv", torch.einsum("nhjk,nhk->nhj", Dk, x), Dd)


def _gather_positions(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """`x [n, heads, P, ...]` at per-row positions `pos [n, J]` -> `[n, heads, J, ...]`."""
    n, heads = x.shape[:2]
    idx = pos[:, None, :].expand(n, heads, -1)
    idx = idx.reshape(*idx.shape, *([1] * (x.dim() - 3))).expand(n, heads, pos.shape[1], *x.shape[3:])
    return torch.gather(x, 2, idx)
