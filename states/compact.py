"""Compact mode: one state plus the round's small per-token records (SPEC §3).

Verify reads the state, emits outputs and records raw k, raw v, `exp(g)` and beta; it never writes the
state. Accept replays tokens `0..accepted` from the records for every layer at once and writes each
state once. Rounding to the state dtype happens after every token exactly as in native, so committed
states and outputs equal native's bit for bit.
"""

from __future__ import annotations

import torch

from kernels.common.torch_ops import l2norm
from kernels.ssm.compact import CompactPool, compact_commit, compact_verify
from kernels.ssm.configs import Config, check_config, default_configs
from states.base import Round, SSMState, StateConfig, _nbytes, round_state
from states.geometry import SSMGeometry
from states.params import TokenInputs


class CompactState(SSMState):
    mode = "compact"
    needs_drafts = True

    def _allocate(self) -> None:
        g, cfg = self.geom, self.cfg
        L, cap, W, dev = g.layers, cfg.max_requests, cfg.width, cfg.device
        H, HV, K, V = g.key_heads, g.value_heads, g.head_k_dim, g.head_v_dim
        self.ssm = torch.zeros(L, cap, HV, K, V, dtype=cfg.state_dtype, device=dev)
        # records of the round in progress: [L, slots, heads, W, ...], position t = round token t
        self.rec_k = torch.zeros(L, cap, H, W, K, dtype=cfg.act_dtype, device=dev)
        self.rec_v = torch.zeros(L, cap, HV, W, V, dtype=cfg.act_dtype, device=dev)
        gate_shape = (L, cap, HV, W) if g.family == "gdn" else (L, cap, HV, W, K)
        self.rec_decay = torch.zeros(gate_shape, dtype=torch.float32, device=dev)
        self.rec_beta = torch.zeros(L, cap, HV, W, dtype=torch.float32, device=dev)
        # triton launch configs by class (kernels/ssm/configs.py); the autotuner replaces them
        self.kernel_configs = default_configs(head_k_dim=K, head_v_dim=V, conv_dim=g.conv_dim)

    def set_kernel_configs(self, configs: dict[str, Config]) -> None:
        """Run the triton kernels with `configs` (config class -> config; classes not given keep theirs)."""
        self.kernel_configs = {**self.kernel_configs, **{c: check_config(c, cfg) for c, cfg in configs.items()}}

    def _kernel_pool(self) -> CompactPool:
        return CompactPool(self.ssm, self.rec_k, self.rec_v, self.rec_decay, self.rec_beta)

    def _pool_tensors(self) -> dict[str, torch.Tensor]:
        return {
            **super()._pool_tensors(),
            "ssm": self.ssm, "rec_k": self.rec_k, "rec_v": self.rec_v,
            "rec_decay": self.rec_decay, "rec_beta": self.rec_beta,
        }

    @classmethod
    def bytes_per_request(cls, geom: SSMGeometry, cfg: StateConfig) -> dict[str, int]:
        terms = super().bytes_per_request(geom, cfg)
        act = _nbytes(cfg.act_dtype)
        H, HV, K, V = geom.key_heads, geom.value_heads, geom.head_k_dim, geom.head_v_dim
        terms["ssm"] = geom.layers * geom.state_elems * _nbytes(cfg.state_dtype)
        terms["records"] = geom.layers * cfg.width * (H * K * act + HV * V * act + HV * geom.gate_width * 4 + HV * 4)
        terms["total"] = sum(terms.values())
        return terms

    def _reset_mode(self, slots: torch.Tensor) -> None:
        for t in (self.ssm, self.rec_k, self.rec_v, self.rec_decay, self.rec_beta):
            t[:, slots] = 0

    def _forward_torch(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        p, valid = self._conv_and_prepare(layer, inputs, rnd)
        sd, step = self.cfg.state_dtype, self._step()
        S = self.ssm[layer, rnd.slots].float()
        o_pad = torch.zeros(rnd.n, rnd.width, *p.v.shape[2:], device=S.device)
        for t in range(rnd.width):
            S_new, o = step(S, p.k[:, t], p.v[:, t], p.decay[:, t], p.beta[:, t], p.q[:, t])
            m = valid[:, t]
            o_pad[:, t] = o
            S = torch.where(m[:, None, None, None], round_state(S_new, sd), S)
            rows = rnd.slots[m]
            self.rec_k[layer, rows, :, t] = p.k_raw[m, t]
            self.rec_v[layer, rows, :, t] = p.v_raw[m, t]
            self.rec_decay[layer, rows, :, t] = p.decay[m, t]
            self.rec_beta[layer, rows, :, t] = p.beta[m, t]
        return self._scatter_outputs(o_pad, rnd)

    def _forward_triton(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        p, g = self.params, self.geom
        return compact_verify(
            self._kernel_pool(), layer, self._conv_triton(layer, inputs, rnd), inputs.a, inputs.b,
            p.A_log[layer], p.dt_bias[layer], rnd.slots, rnd.widths, rnd.cu_seqlens,
            self.kernel_configs["step"], g.lower_bound,
        )

    def _accept_mode(self, rnd: Round, accepted: torch.Tensor) -> None:
        """Commit: replay records `0..accepted[r]` into the state of every layer, one write per state."""
        if self.cfg.backend == "triton":
            compact_commit(self._kernel_pool(), rnd.slots, accepted, self.kernel_configs["step"])
            return
        sd, step = self.cfg.state_dtype, self._step()
        rows = rnd.slots[rnd.widths > 0]
        keep = accepted[rnd.widths > 0].long()
        for layer in range(self.geom.layers):
            S = self.ssm[layer, rows].float()
            for t in range(rnd.width):
                S_new, _ = step(
                    S,
                    l2norm(self.rec_k[layer, rows, :, t]),
                    self.rec_v[layer, rows, :, t].float(),
                    self.rec_decay[layer, rows, :, t],
                    self.rec_beta[layer, rows, :, t],
                )
                S = torch.where((t <= keep)[:, None, None, None], round_state(S_new, sd), S)
            self.ssm[layer, rows] = S.to(sd)

    def _snapshot_ssm(self, slots: torch.Tensor) -> torch.Tensor:
        return self.ssm[:, slots].transpose(0, 1).contiguous()

    def _load_ssm(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        self.ssm[:, slots] = ssm
