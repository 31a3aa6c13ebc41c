"""State storage: the three SSM state modes (registered here) and the KV page pools."""

from __future__ import annotations

from states.base import SSMState, StateConfig
from states.compact import CompactState
from states.native import NativeState
from states.replay import ReplayState

MODES: dict[str, type[SSMState]] = {
    "native": NativeState,
    "compact": CompactState,
    "replay": ReplayState,
}


def make_state(geom, params, cfg: StateConfig) -> SSMState:
    """Build the state pool of `cfg.mode`; ValueError naming the choices for an unknown mode."""
    try:
        cls = MODES[cfg.mode]
    except KeyError:
        raise ValueError(f"unknown mode {cfg.mode!r}; choose one of {', '.join(MODES)}") from None
    return cls(geom, params, cfg)


__all__ = ["MODES", "SSMState", "StateConfig", "make_state"]
