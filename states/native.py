"""Native mode: a full state snapshot after every verified token (SPEC §3).

Storage per request and layer: `S + 1` state slots. Verify reads the accepted slot and writes the
state after token `t` into slot `t`; accepting `a` drafts just records `a` as the accepted slot (the
same offset selects the conv window), so nothing is copied.
"""

from __future__ import annotations

import torch

from kernels.ssm.configs import CONV, NATIVE_VERIFY
from kernels.ssm.native import native_verify
from states.base import Round, SSMState, StateConfig, _nbytes, round_state
from states.geometry import SSMGeometry
from states.params import TokenInputs


class NativeState(SSMState):
    mode = "native"

    def _allocate(self) -> None:
        g, cfg = self.geom, self.cfg
        # ssm: [L, slots, S + 1, HV, K, V]; snapshot after round token t in column t, accepted at conv_offset[slot]
        self.ssm = torch.zeros(
            g.layers, cfg.max_requests, cfg.drafts + 1, g.value_heads, g.head_k_dim, g.head_v_dim,
            dtype=cfg.state_dtype, device=cfg.device,
        )
        # triton launch configs by kernel (kernels/ssm/configs.py); the autotuner replaces them
        self.kernel_configs = self._default_kernel_configs()

    def kernels(self) -> tuple[str, ...]:
        return (NATIVE_VERIFY, CONV)

    def _pool_tensors(self) -> dict[str, torch.Tensor]:
        return {**super()._pool_tensors(), "ssm": self.ssm}

    @classmethod
    def bytes_per_request(cls, geom: SSMGeometry, cfg: StateConfig) -> dict[str, int]:
        terms = super().bytes_per_request(geom, cfg)
        terms["ssm"] = (cfg.drafts + 1) * geom.layers * geom.state_elems * _nbytes(cfg.state_dtype)
        terms["total"] = sum(terms.values())
        return terms

    def _reset_mode(self, slots: torch.Tensor) -> None:
        self.ssm[:, slots] = 0

    def _forward_torch(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        p, valid = self._conv_and_prepare(layer, inputs, rnd)
        sd, step = self.cfg.state_dtype, self._step()
        off = self.conv_offset[rnd.slots].long()
        S = self.ssm[layer, rnd.slots, off].float()  # read the accepted snapshot before any slot is rewritten
        o_pad = torch.zeros(rnd.n, rnd.width, *p.v.shape[2:], device=S.device)
        for t in range(rnd.width):
            S_new, o = step(S, p.k[:, t], p.v[:, t], p.decay[:, t], p.beta[:, t], p.q[:, t])
            S_new = round_state(S_new, sd)
            m = valid[:, t]
            o_pad[:, t] = o
            S = torch.where(m[:, None, None, None], S_new, S)
            self.ssm[layer, rnd.slots[m], t] = S_new[m].to(sd)
        return self._scatter_outputs(o_pad, rnd)

    def _forward_triton(self, layer: int, inputs: TokenInputs, rnd: Round) -> torch.Tensor:
        p, g = self.params, self.geom
        return native_verify(
            self.ssm, layer, self._conv_triton(layer, inputs, rnd), inputs.a, inputs.b, p.A_log[layer],
            p.dt_bias[layer], self.conv_offset, rnd.slots, rnd.widths, rnd.cu_seqlens,
            self.kernel_configs[NATIVE_VERIFY], g.lower_bound,
        )

    def _accept_mode(self, rnd: Round, accepted: torch.Tensor) -> None:
        """The accepted offset (set by the base as conv_offset) already selects the snapshot."""

    def _snapshot_ssm(self, slots: torch.Tensor) -> torch.Tensor:
        off = self.conv_offset[slots].long()
        return self.ssm[:, slots, off].transpose(0, 1).contiguous()

    def _load_ssm(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        self.ssm[:, slots, 0] = ssm
