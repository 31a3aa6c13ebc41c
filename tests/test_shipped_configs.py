"""Configs that ship with the harness: a run takes the config of its own cache first, then the one shipped
for its GPU model (harness/shipped_configs.json), then the kernel's default; scripts/ship_configs.py
merges a GPU's tuned entries into the shipped file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import harness.runner as runner
from harness.autotune import AutotuneCache

KEY = {"family": "gdn", "W": 4}
DEFAULT = {"BV": 8, "num_warps": 1, "num_stages": 1}
SHIPPED = {"BV": 16, "num_warps": 2, "num_stages": 1}
TUNED = {"BV": 32, "num_warps": 4, "num_stages": 1}


def _ship_module():
    path = Path(__file__).resolve().parents[1] / "scripts" / "ship_configs.py"
    spec = importlib.util.spec_from_file_location("ship_configs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _context(tmp_path: Path, own_cache: Path, level: str = "cache-only"):
    ctx, _ = runner.make_context("cpu", 0, {}, None, scenario="mtp-fixed", autotune_level=level,
                                 autotune_cache=own_cache)
    return ctx


def test_run_cache_then_shipped_then_default(tmp_path, monkeypatch):
    shipped, own = tmp_path / "shipped.json", tmp_path / "own.json"
    AutotuneCache(shipped, gpu_name="cpu").store("native-verify", KEY, 128, SHIPPED, 10.0)
    monkeypatch.setattr(runner, "SHIPPED_CACHE", shipped)

    ctx = _context(tmp_path, own)
    assert ctx.kernel_config("native-verify", KEY, 100, DEFAULT) == (SHIPPED, "shipped")
    assert ctx.kernel_config("compact-commit", KEY, 100, DEFAULT) == (DEFAULT, "default")

    AutotuneCache(own, gpu_name="cpu").store("native-verify", KEY, 128, TUNED, 9.0)
    assert _context(tmp_path, own).kernel_config("native-verify", KEY, 100, DEFAULT) == (TUNED, "cached")
    # `--autotune off` ignores both
    assert _context(tmp_path, own, "off").kernel_config("native-verify", KEY, 100, DEFAULT) == (DEFAULT, "default")


def test_shipped_configs_of_another_gpu_are_not_used(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped.json"
    AutotuneCache(shipped, gpu_name="NVIDIA H200").store("native-verify", KEY, 128, SHIPPED, 10.0)
    monkeypatch.setattr(runner, "SHIPPED_CACHE", shipped)
    assert _context(tmp_path, tmp_path / "own.json").kernel_config("native-verify", KEY, 128, DEFAULT) == (
        DEFAULT, "default")


def test_ship_merges_one_gpu_and_keeps_the_rest(tmp_path):
    ship = _ship_module().ship
    source, target = tmp_path / "tuned.json", tmp_path / "shipped.json"
    AutotuneCache(target, gpu_name="NVIDIA H100").store("conv", KEY, 8, DEFAULT, 1.0)
    AutotuneCache(target, gpu_name="NVIDIA H200").store("native-verify", KEY, 128, DEFAULT, 1.0)
    tuned = AutotuneCache(source, gpu_name="NVIDIA H200")
    tuned.store("native-verify", KEY, 128, TUNED, 9.0)
    tuned.store("compact-verify", KEY, 256, SHIPPED, 5.0)
    AutotuneCache(source, gpu_name="cpu").store("conv", KEY, 8, TUNED, 1.0)

    assert ship(source, "NVIDIA H200", target) == 2
    h200 = AutotuneCache(target, gpu_name="NVIDIA H200")
    assert h200.get("native-verify", KEY, 128).config == TUNED
    assert h200.get("compact-verify", KEY, 256).config == SHIPPED
    assert AutotuneCache(target, gpu_name="NVIDIA H100").get("conv", KEY, 8).config == DEFAULT
    assert "cpu" not in json.loads(target.read_text())["entries"]
    with pytest.raises(SystemExit, match="no configs for GPU 'NVIDIA A100'"):
        ship(source, "NVIDIA A100", target)
