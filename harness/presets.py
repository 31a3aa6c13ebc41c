"""Presets live in states/presets.py (below the scenarios, which use them); kept importable from here."""

from states.presets import PRESETS, Preset, get_preset

__all__ = ["PRESETS", "Preset", "get_preset"]
