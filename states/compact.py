"""Compact mode: one state plus the round's small per-token records (SPEC §3).

Verify reads the state, emits outputs and records raw k, raw v, `exp(g)` and beta; it never writes the
state. When the accepted records reach the state is the variant:

* `accept`: accept replays tokens `0..accepted` from the records for every layer at once and writes
  each state once (state passes per round: verify read, commit read + write);
* `deferred`: accept only records each row's accepted count; the next forward of each layer first
  replays that layer's pending records onto the state it loads anyway, writes the state once, then
  verifies the new tokens from the same values (one read + one write per round). Records live in two
  halves by round parity, so a round's new records never overwrite pending ones still being read.

Rounding to the state dtype happens after every token exactly as in native, so committed states and
outputs equal native's bit for bit in both variants.
"""

from __future__ import annotations

import torch

from kernels.common.torch_ops import l2norm
from kernels.ssm.compact import CompactPool, compact_commit, compact_verify
from kernels.ssm.compact_precompute import compact_precompute_verify
from kernels.ssm.configs import (COMPACT_COMMIT, COMPACT_PRECOMPUTE, COMPACT_VERIFY, CONV, DEFERRED_PRECOMPUTE,
                                 DEFERRED_VERIFY)
from kernels.ssm.replay_precompute import precompute_supported
from states.base import (COMPACT_MATRIX_VERIFY, DEFERRED_PRECOMPUTE_PRECISION, Round, SSMState, StateConfig, _nbytes,
                         round_state)
from states.geometry import SSMGeometry
from states.params import TokenInputs


class CompactState(SSMState):
    """Compact pool. Variants: `accept` and `deferred` (above); `accept-precompute*` stores and commits as
    `accept`, `deferred-precompute*` as `deferred`, and both verify in matrix form on the triton backend
    (kernels/ssm/compact_precompute.py, at the precision `COMPACT_MATRIX_VERIFY` names); the torch backend
    computes them as `accept` and `deferred`."""

    mode = "compact"
    needs_drafts = True

    @property
    def deferred(self) -> bool:
        return self.is_deferred(self.cfg)

    @staticmethod
    def is_deferred(cfg: StateConfig) -> bool:
        """The variant commits a round's accepted records in the next verify (`deferred`, `deferred-precompute*`)."""
        return cfg.mode_variant == "deferred" or cfg.mode_variant in DEFERRED_PRECOMPUTE_PRECISION

    @classmethod
    def _validate_config(cls, geom: SSMGeometry, cfg: StateConfig) -> None:
        super()._validate_config(geom, cfg)
        if cfg.mode_variant in COMPACT_MATRIX_VERIFY and cfg.backend == "triton":
            why = precompute_supported(geom.head_k_dim, geom.head_v_dim, geom.family, cfg.width, geom.lower_bound)
            if why:
                raise ValueError(why)

    def _allocate(self) -> None:
        g, cfg = self.geom, self.cfg
        L, cap, dev = g.layers, cfg.max_requests, cfg.device
        H, HV, K, V = g.key_heads, g.value_heads, g.head_k_dim, g.head_v_dim
        # record positions: round token t at `half * W + t`; accept has one half, deferred two (by parity)
        P = cfg.width * self.halves(cfg)
        self.ssm = torch.zeros(L, cap, HV, K, V, dtype=cfg.state_dtype, device=dev)
        self.rec_k = torch.zeros(L, cap, H, P, K, dtype=cfg.act_dtype, device=dev)
        self.rec_v = torch.zeros(L, cap, HV, P, V, dtype=cfg.act_dtype, device=dev)
        gate_shape = (L, cap, HV, P) if g.family == "gdn" else (L, cap, HV, P, K)
        self.rec_decay = torch.zeros(gate_shape, dtype=torch.float32, device=dev)
        self.rec_beta = torch.zeros(L, cap, HV, P, dtype=torch.float32, device=dev)
        # deferred bookkeeping: slot -> last accepted token of the pending round (-1: none), and the half
        # that holds it; both stay put on idle rounds
        self.pending = torch.full((cap,), -1, dtype=torch.int32, device=dev)
        self.parity = torch.zeros(cap, dtype=torch.int32, device=dev)
        # triton launch configs by kernel (kernels/ssm/configs.py); the autotuner replaces them
        self.kernel_configs = self._default_kernel_configs()

    def kernels(self) -> tuple[str, ...]:
        return (self._verify_kernel(), COMPACT_COMMIT, CONV)

    def _verify_kernel(self) -> str:
        if self.cfg.mode_variant in COMPACT_MATRIX_VERIFY:
            return DEFERRED_PRECOMPUTE if self.deferred else COMPACT_PRECOMPUTE
        return DEFERRED_VERIFY if self.deferred else COMPACT_VERIFY

    @staticmethod
    def halves(cfg: StateConfig) -> int:
        """Record halves: 2 for the deferred variants (pending + new round), 1 for accept."""
        return 2 if CompactState.is_deferred(cfg) else 1

    def _kernel_pool(self) -> CompactPool:
        return CompactPool(self.ssm, self.rec_k, self.rec_v, self.rec_decay, self.rec_beta,
                           self.pending if self.deferred else None, self.parity if self.deferred else None)

    def _pool_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {
            **super()._pool_tensors(),
            "ssm": self.ssm, "rec_k": self.rec_k, "rec_v": self.rec_v,
            "rec_decay": self.rec_decay, "rec_beta": self.rec_beta,
        }
        if self.deferred:
            tensors.update(pending=self.pending, parity=self.parity)
        return tensors

    @classmethod
    def bytes_per_request(cls, geom: SSMGeometry, cfg: StateConfig) -> dict[str, int]:
        terms = super().bytes_per_request(geom, cfg)
        act = _nbytes(cfg.act_dtype)
        H, HV, K, V = geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
        terms["ssm"] = geom.layers * geom.state_elems * _nbytes(cfg.state_dtype)
        per_token = H * K * act + HV * V * act + HV * geom.gate_width * 4 + HV * 4
        terms["records"] = geom.layers * cfg.width * cls.halves(cfg) * per_token
        if cls.is_deferred(cfg):
            terms["pending"] = 8  # pending count and parity, int32 each
        terms["total"] = sum(terms.values())
        return terms

    def _reset_mode(self, slots: torch.Tensor) -> None:
        for t in (self.ssm, self.rec_k, self.rec_v, self.rec_decay, self.rec_beta):
            t[:, slots] = 0
        self.pending[slots] = -1  # load and reset drop pending records: the installed state is committed
        self.parity[slots] = 0

    # ------------------------------------------------------------------ torch backend
    def _replay_records(self, layer: int, rows: torch.Tensor, S: torch.Tensor, last: torch.Tensor,
                        half: torch.Tensor) -> torch.Tensor:
        """`S` (fp32, `[n, HV, K, V]`) advanced through record tokens `0..last[r]` of half `half[r]`,
        rounding to the state dtype after each token as native does (rows with `last < 0` unchanged)."""
        sd, step, W = self.cfg.state_dtype, self._step(), self.cfg.width
        for t in range(W):
            pos = half.long() * W + t  # [n] record position of token t
            S_new, _ = step(
                S,
                l2norm(self.rec_k[layer, rows, :, pos]),
                self.rec_v[layer, rows, :, pos].float(),
                self.rec_decay[layer, rows, :, pos],
                self.rec_beta[layer, rows, :, pos],
            )
            S = torch.where((t <= last)[:, None, None, None], round_state(S_new, sd), S)
        return S

    def _forward_torch(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        p, valid = self._conv_and_prepare(layer, inputs, rnd)
        sd, step, W = self.cfg.state_dtype, self._step(), rnd.width
        S = self.ssm[layer, rnd.slots].float()
        new_half = torch.zeros_like(rnd.slots)
        if self.deferred:
            active = rnd.widths > 0
            last = torch.where(active, self.pending[rnd.slots], -1)
            S = self._replay_records(layer, rnd.slots, S, last, self.parity[rnd.slots])
            written = (last >= 0)[:, None, None, None]
            self.ssm[layer, rnd.slots] = torch.where(written, S.to(sd), self.ssm[layer, rnd.slots])
            new_half = 1 - self.parity[rnd.slots].long()
        o_pad = torch.zeros(rnd.n, W, *p.v.shape[2:], device=S.device)
        for t in range(W):
            S_new, o = step(S, p.k[:, t], p.v[:, t], p.decay[:, t], p.beta[:, t], p.q[:, t])
            m = valid[:, t]
            o_pad[:, t] = o
            S = torch.where(m[:, None, None, None], round_state(S_new, sd), S)
            rows, pos = rnd.slots[m], (new_half * W + t)[m]
            self.rec_k[layer, rows, :, pos] = p.k_raw[m, t]
            self.rec_v[layer, rows, :, pos] = p.v_raw[m, t]
            self.rec_decay[layer, rows, :, pos] = p.decay[m, t]
            self.rec_beta[layer, rows, :, pos] = p.beta[m, t]
        return self._scatter_outputs(o_pad, rnd)

    def _forward_triton(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        p, g = self.params, self.geom
        args = (self._kernel_pool(), layer, self._conv_triton(layer, inputs, rnd), inputs.a, inputs.b,
                p.A_log[layer], p.dt_bias[layer], rnd.slots, rnd.widths, rnd.cu_seqlens,
                self.kernel_configs[self._verify_kernel()], g.lower_bound)
        precision = COMPACT_MATRIX_VERIFY.get(self.cfg.mode_variant)
        if precision is not None:
            return compact_precompute_verify(*args, precision=precision)
        return compact_verify(*args)

    def _accept_mode(self, rnd: Round, accepted: torch.Tensor) -> None:
        if self.deferred:
            # the next forward of each layer applies these records; idle rows keep what they had pending
            active = rnd.widths > 0
            self.pending[rnd.slots] = torch.where(active, accepted, self.pending[rnd.slots])
            self.parity[rnd.slots] = torch.where(active, 1 - self.parity[rnd.slots], self.parity[rnd.slots])
            return
        # accept: replay records `0..accepted[r]` into the state of every layer, one write per state
        if self.cfg.backend == "triton":
            compact_commit(self._kernel_pool(), rnd.slots, accepted, self.kernel_configs[COMPACT_COMMIT])
            return
        sd = self.cfg.state_dtype
        active = rnd.widths > 0
        rows, last = rnd.slots[active], accepted[active]
        half = torch.zeros_like(rows)
        for layer in range(self.geom.layers):
            S = self._replay_records(layer, rows, self.ssm[layer, rows].float(), last, half)
            self.ssm[layer, rows] = S.to(sd)

    def _snapshot_ssm(self, slots: torch.Tensor) -> torch.Tensor:
        """The committed state: deferred applies the pending records into a copy, the pool is only read."""
        if not self.deferred:
            return self.ssm[:, slots].transpose(0, 1).contiguous()
        last, half = self.pending[slots], self.parity[slots]
        if self.cfg.backend == "triton":
            g = self.geom
            out = torch.empty(slots.shape[0], g.layers, g.value_heads, g.head_k_dim, g.head_v_dim,
                              dtype=self.cfg.state_dtype, device=slots.device)
            compact_commit(self._kernel_pool(), slots, last, self.kernel_configs[COMPACT_COMMIT], dst=out)
            return out
        layers = [self._replay_records(layer, slots, self.ssm[layer, slots].float(), last, half).to(self.cfg.state_dtype)
                  for layer in range(self.geom.layers)]
        return torch.stack(layers, dim=1)

    def _load_ssm(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        self.ssm[:, slots] = ssm
