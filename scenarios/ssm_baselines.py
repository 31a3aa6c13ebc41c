"""The peers' kernels (kernels/ssm/baselines) behind the harness's state protocol, so that a baseline row
runs the same rollout, comparisons and timing as a mode of ours (SPEC §5 last paragraph, §7).

`BaselineState` is an `SSMState` whose conv windows are ours (the conv kernel every triton mode runs,
so the peer sees the same conv outputs our kernels see) and whose recurrent state lives in the peer's
pool, in the peer's layout (`PeerPool`): `forward` hands the peer the conv outputs of the round and
returns its outputs; `snapshot` reads the peer's accepted state back in our layout; `load` writes ours
into the peer's. The untouched-slot check (contract 5) covers the peer's tensors too.

Rows for a (mode, family) the peer lacks are `unsupported` with the adapter's reason; so is every row of
a peer that is not installed, or installed at another version than the one pinned.
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from kernels.ssm.baselines import BASELINES, Baseline, Dims, PoolSpec
from kernels.ssm.configs import CONV, default_configs
from states import MODES
from states.base import SSMState, StateConfig
from states.geometry import SSMGeometry
from states.params import SSMParams


def is_baseline(backend: str) -> bool:
    return backend in BASELINES


def dims_of(g: SSMGeometry) -> Dims:
    return Dims(g.family, g.layers, g.key_heads, g.value_heads, g.head_k_dim, g.head_v_dim, g.lower_bound)


def spec_of(cfg: StateConfig) -> PoolSpec:
    return PoolSpec(cfg.mode, cfg.max_requests, cfg.width, cfg.state_dtype, cfg.act_dtype, cfg.history_len,
                    cfg.history_dtype, cfg.device, cfg.variant)


def unsupported(backend: str, g: SSMGeometry, cfg: StateConfig) -> str:
    """Why this baseline row cannot run here ("" when it can): the mode's own rules first (compact needs
    drafts), then what the peer lacks, then whether the peer is installed at its pinned version."""
    try:
        MODES[cfg.mode]._validate_config(g, replace(cfg, backend="triton", variant=""))
    except ValueError as e:
        return str(e)
    b = BASELINES[backend]
    why = b.unsupported(cfg.mode, g.family, spec_of(cfg), dims_of(g))
    return why or b.available(cfg.device)


def variants(backend: str, mode: str, family: str, device: str) -> tuple[str, ...]:
    return BASELINES[backend].variants(mode, family, device)


def describe(backend: str, g: SSMGeometry, cfg: StateConfig) -> str:
    return "baseline: " + BASELINES[backend].describe(spec_of(cfg), dims_of(g))


def bytes_per_request(backend: str, g: SSMGeometry, cfg: StateConfig) -> dict[str, int]:
    """The peer pool's state bytes and our conv windows (the base formula's terms), plus `total`; ValueError
    for a mode the peer has no kernel for (no pool of it exists)."""
    why = BASELINES[backend].unsupported(cfg.mode, g.family, spec_of(cfg), dims_of(g))
    if why:
        raise ValueError(why)
    terms = SSMState.bytes_per_request(g, cfg)  # our conv window and its offset
    terms["peer"] = BASELINES[backend].bytes_per_request(dims_of(g), spec_of(cfg))
    terms["total"] = sum(terms.values())
    return terms


class BaselineState(SSMState):
    """A peer's pool driven through the state protocol (begin_round / forward / accept / snapshot / load)."""

    def __init__(self, geom: SSMGeometry, params: SSMParams, cfg: StateConfig) -> None:
        self.baseline: Baseline = BASELINES[cfg.backend]
        self.backend = cfg.backend
        self.mode = cfg.mode
        # our conv runs as on the triton backend; the rest of the config is the peer pool's
        super().__init__(geom, params, replace(cfg, backend="triton"))
        self.cfg = replace(self.cfg, backend=cfg.backend)

    def _validate_config(self, geom: SSMGeometry, cfg: StateConfig) -> None:
        why = unsupported(self.backend, geom, replace(cfg, backend=self.backend))
        if why:
            raise ValueError(why)

    def _allocate(self) -> None:
        g = self.geom
        self.peer = self.baseline.pool(dims_of(g), spec_of(replace(self.cfg, backend=self.backend)))
        self.kernel_configs = default_configs((CONV,), head_k_dim=g.head_k_dim, head_v_dim=g.head_v_dim,
                                              conv_dim=g.conv_dim)

    def kernels(self) -> tuple[str, ...]:
        return (CONV,)

    def config_json(self) -> str:
        """The row's `config`: the peer functions' launch parameters, and our conv's."""
        return json.dumps({**self.peer.config(), CONV: dict(self.kernel_configs[CONV])}, sort_keys=True)

    def _pool_tensors(self) -> dict[str, torch.Tensor]:
        return {**super()._pool_tensors(), **{f"{self.backend}.{k}": t for k, t in self.peer.tensors().items()}}

    def _reset_mode(self, slots: torch.Tensor) -> None:
        self.peer.reset(slots)

    def _begin_round_mode(self, rnd) -> None:
        self.peer.begin_round(rnd.slots, rnd.widths, rnd.cu_seqlens)

    def _forward_triton(self, layer: int, inputs, rnd) -> torch.Tensor:
        p = self.params
        y = self._conv_triton(layer, inputs, rnd)
        return self.peer.forward(layer, y, inputs.a, inputs.b, p.A_log[layer], p.dt_bias[layer])

    def _accept_mode(self, rnd, accepted: torch.Tensor) -> None:
        self.peer.accept(accepted)

    def _snapshot_ssm(self, slots: torch.Tensor) -> torch.Tensor:
        return self.peer.state(slots).transpose(0, 1).contiguous()

    def _load_ssm(self, slots: torch.Tensor, ssm: torch.Tensor) -> None:
        self.peer.load(slots, ssm)

