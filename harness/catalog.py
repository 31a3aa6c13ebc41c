"""What `harness list` shows: the registries (scenarios, modes, presets, kernels) as plain data."""

from __future__ import annotations

from typing import Any

from scenarios import SCENARIOS
from states import MODES
from states.presets import PRESETS

# kernel family -> (fast implementation, reference), both importable paths
KERNELS: dict[str, tuple[str, str]] = {
    "conv": ("kernels/ssm/conv.py", "kernels/conv/naive.py"),
    "gdn step": ("kernels/ssm/step.py", "kernels/gdn/naive.py"),
    "kda step": ("kernels/ssm/step.py", "kernels/kda/naive.py"),
    "native verify": ("kernels/ssm/native.py", "states/native.py (torch backend)"),
    "compact verify + commit": ("kernels/ssm/compact.py", "states/compact.py (torch backend)"),
    "replay fold + forward": ("kernels/ssm/replay.py", "states/replay.py (torch backend)"),
    "fla baseline": ("kernels/ssm/baselines/fla.py", "kernels/gdn/naive.py, kernels/kda/naive.py"),
    "sglang baseline": ("kernels/ssm/baselines/sglang.py", "kernels/gdn/naive.py"),
    "flashinfer baseline": ("kernels/ssm/baselines/flashinfer.py", "kernels/gdn/naive.py"),
    "kv pages": ("kernels/pages/", "kernels/pages/naive.py"),
}

MODE_NOTES = {
    "native": "S + 1 state snapshots per request; accept picks one (no copy)",
    "compact": "1 state + the round's records; commit replays the accepted prefix (needs drafts)",
    "replay": "1 checkpoint + a 2 x Lh history ring; accept moves a cursor; folds when full",
}


def catalog(what: str = "all") -> dict[str, list[dict[str, Any]]]:
    sections = {
        "scenarios": lambda: [
            {"name": s.name, "families": ",".join(s.families), "what": s.help} for s in SCENARIOS.values()
        ],
        "modes": lambda: [{"name": m, "storage": MODE_NOTES[m]} for m in MODES],
        "presets": lambda: [
            {"name": p.name, "families": ",".join(p.families), "tp": p.tp, "source": p.source} for p in PRESETS.values()
        ],
        "kernels": lambda: [{"kernel": k, "fast": f, "reference": r} for k, (f, r) in KERNELS.items()],
    }
    if what == "all":
        return {name: make() for name, make in sections.items()}
    if what not in sections:
        raise ValueError(f"unknown list {what!r}; choose one of all, {', '.join(sections)}")
    return {what: sections[what]()}
