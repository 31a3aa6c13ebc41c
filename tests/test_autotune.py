"""Autotune machinery (harness/autotune.py) and the Triton CPU shims (kernels/common/triton_cpu.py).

The kernels here are small fakes: a blocked torch function whose cost per config is programmed (so
the winner is known), and a real Triton kernel run by the interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from typing import Any, Callable

import pytest
import torch
import triton
import triton.language as tl
import triton.runtime.autotuner as triton_autotuner
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from harness import autotune
from harness.autotune import (
    AutotuneCache,
    AutotuneCacheError,
    ConfigClass,
    Level,
    NoValidConfigError,
    batch_bucket,
    batch_buckets,
    cached_choice,
    canonical_key,
    config_space,
    nearest_bucket,
    tune,
    wallclock_median_us,
)
from kernels.common import triton_cpu

GIB = 1 << 30
OOM_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB"
STATIC_KEY = {"family": "gdn", "mode": "native", "HV": 4, "K": 16, "V": 16, "state_dtype": torch.float32, "width": 4}
CANDIDATES = config_space(BV=[16, 32, 64], num_warps=[1, 2])


def cost_by_bv(costs: dict[int, float]) -> Callable[[dict], float]:
    return lambda config: costs[config["BV"]] + 0.1 * config["num_warps"]


class FakeKernel:
    """`out = 2 * x`, computed in column blocks of `BV`; counts builds and launches.

    The timer runs the launch it is given and reports the programmed cost of the config that ran.
    `broken(config)` makes a config compute a wrong value; `fail(config, launch_index)` returns an
    exception for a launch to raise (launch 0 is the check's, later ones the timer's).
    """

    def __init__(self, cost_us: Callable[[dict], float], broken=None, fail=None) -> None:
        self.cost_us = cost_us
        self.broken = broken or (lambda config: False)
        self.fail = fail or (lambda config, launch_index: None)
        self.builds: list[int] = []
        self.launches: list[dict] = []
        self._last: dict | None = None

    def build(self, bucket: int) -> dict[str, torch.Tensor]:
        self.builds.append(bucket)
        x = torch.randn(bucket, 80)
        return {"x": x, "out": torch.full_like(x, float("nan"))}

    def run(self, config: dict, inputs: dict[str, torch.Tensor]) -> None:
        error = self.fail(config, sum(c == config for c in self.launches))
        self.launches.append(config)
        if error is not None:
            raise error
        x, out, bv = inputs["x"], inputs["out"], config["BV"]
        for start in range(0, x.shape[1], bv):
            out[:, start:start + bv] = x[:, start:start + bv] * 2
        if self.broken(config):
            out[0, -1] += 1.0
        self._last = config

    def check(self, config: dict, inputs: dict[str, torch.Tensor]) -> tuple[bool, str]:
        inputs["out"].fill_(float("nan"))
        self.run(config, inputs)
        mismatches = int((inputs["out"] != inputs["x"] * 2).sum())
        return mismatches == 0, f"{mismatches} mismatching elements"

    def timer(self, fn: Callable[[], Any]) -> float:
        fn()
        return self.cost_us(self._last)


def tune_fake(kernel: FakeKernel, cache: AutotuneCache, batch: int = 8, **kwargs: Any):
    return tune("fake_scale", STATIC_KEY, batch, CANDIDATES, build=kernel.build, run=kernel.run,
                check=kernel.check, timer=kernel.timer, cache=cache, **kwargs)


@pytest.fixture
def cache(tmp_path) -> AutotuneCache:
    return AutotuneCache(tmp_path / "autotune.json", gpu_name="test-gpu", triton_version="3.6.0")


# -- config space, keys, buckets ------------------------------------------------------------------


def test_config_space_is_the_cartesian_product_in_axis_order() -> None:
    space = config_space(BV=[8, 16], num_warps=[1, 2, 4], num_stages=[2])
    assert len(space) == 6
    assert space[0] == {"BV": 8, "num_warps": 1, "num_stages": 2}
    assert space[1] == {"BV": 8, "num_warps": 2, "num_stages": 2}
    assert space[-1] == {"BV": 16, "num_warps": 4, "num_stages": 2}
    assert len({json.dumps(c, sort_keys=True) for c in space}) == 6


def test_config_space_keep_predicate() -> None:
    space = config_space(BV=[8, 16, 32, 64], num_warps=[1, 2, 4], keep=lambda c: c["BV"] >= 16 * c["num_warps"])
    assert space == [{"BV": 16, "num_warps": 1}, {"BV": 32, "num_warps": 1}, {"BV": 32, "num_warps": 2},
                     {"BV": 64, "num_warps": 1}, {"BV": 64, "num_warps": 2}, {"BV": 64, "num_warps": 4}]


def test_config_space_rejects_bad_axes() -> None:
    with pytest.raises(ValueError, match="at least one axis"):
        config_space()
    with pytest.raises(ValueError, match="axis 'BV' must be a non-empty list of values, got 32"):
        config_space(BV=32)
    with pytest.raises(ValueError, match="axis 'num_warps' must be a non-empty list"):
        config_space(BV=[16], num_warps=[])
    with pytest.raises(ValueError, match="rejected all 2 configs"):
        config_space(BV=[16, 32], keep=lambda c: False)


def test_canonical_key_is_order_independent_and_names_dtypes() -> None:
    a = canonical_key({"mode": "native", "dtypes": (torch.bfloat16, torch.float32), "width": 4})
    b = canonical_key({"width": 4, "dtypes": [torch.bfloat16, torch.float32], "mode": "native"})
    assert a == b == '{"dtypes":["bfloat16","float32"],"mode":"native","width":4}'
    assert canonical_key({"width": 4}) != canonical_key({"width": 5})
    with pytest.raises(ValueError, match="static key field 'state' must be"):
        canonical_key({"state": torch.zeros(2)})
    with pytest.raises(ValueError, match="must not be empty"):
        canonical_key({})


def test_batch_buckets() -> None:
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 255, 256, 257)] == [1, 2, 4, 4, 8, 8, 16, 256, 256, 512]
    assert batch_buckets(100) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert batch_buckets(1) == [1]
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        batch_bucket(0)


def test_nearest_bucket_uses_log2_distance() -> None:
    assert nearest_bucket(3, [1, 8]) == 8  # |log2 3 - 3| = 1.42 < |log2 3 - 0| = 1.58
    assert nearest_bucket(2, [1, 8]) == 1
    assert nearest_bucket(24, [8, 64]) == 64
    assert nearest_bucket(16, [8, 64]) == 8
    assert nearest_bucket(4, [2, 8]) == 8  # a tie goes to the larger bucket
    assert nearest_bucket(1000, [1, 2, 4]) == 4
    with pytest.raises(ValueError, match="no buckets"):
        nearest_bucket(4, [])


def test_levels_use_the_cli_names() -> None:
    assert [level.value for level in Level] == ["cache-only", "tune-missing", "force", "off"]
    assert Level("tune-missing") is Level.TUNE_MISSING
    with pytest.raises(ValueError, match=r"unknown autotune level 'fast'; choose one of \['cache-only'"):
        Level("fast")


# -- cache ----------------------------------------------------------------------------------------


def test_cache_round_trip_and_nearest_lookup(tmp_path) -> None:
    path = tmp_path / "sub" / "autotune.json"
    writer = AutotuneCache(path, gpu_name="NVIDIA H200", triton_version="3.6.0")
    assert writer.lookup("k", STATIC_KEY, 8) is None  # a missing file is an empty cache
    for bucket, bv in ((1, 16), (8, 32), (64, 64)):
        writer.store("k", STATIC_KEY, bucket, {"BV": bv, "num_warps": 4}, median_us=float(bv))

    reader = AutotuneCache(path, gpu_name="NVIDIA H200", triton_version="3.6.0")
    assert reader.get("k", STATIC_KEY, 8).config == {"BV": 32, "num_warps": 4}
    assert reader.get("k", STATIC_KEY, 16) is None
    hit = reader.lookup("k", STATIC_KEY, 24)
    assert (hit.bucket, hit.config["BV"], hit.median_us) == (64, 64, 64.0)
    assert reader.lookup("k", STATIC_KEY, 2).bucket == 1
    assert reader.lookup("k", STATIC_KEY, 5).bucket == 8
    assert hit.tuned_at.endswith("+00:00")

    other_key = dict(STATIC_KEY, width=3)
    assert reader.lookup("k", other_key, 8) is None
    assert reader.lookup("other_kernel", STATIC_KEY, 8) is None
    assert AutotuneCache(path, gpu_name="NVIDIA B200", triton_version="3.6.0").lookup("k", STATIC_KEY, 8) is None
    assert AutotuneCache(path, gpu_name="NVIDIA H200", triton_version="3.5.0").lookup("k", STATIC_KEY, 8) is None

    data = json.loads(path.read_text())
    assert data["format"] == 1
    assert set(data["entries"]["NVIDIA H200"]["3.6.0"]["k"][canonical_key(STATIC_KEY)]) == {"1", "8", "64"}


def test_cache_store_rejects_a_bucket_that_is_not_a_power_of_two(cache) -> None:
    with pytest.raises(ValueError, match="bucket must be a power of two, got 6"):
        cache.store("k", STATIC_KEY, 6, {"BV": 16}, 1.0)


def test_cache_store_keeps_entries_written_by_another_instance(tmp_path) -> None:
    path = tmp_path / "autotune.json"
    first = AutotuneCache(path, gpu_name="g", triton_version="t")
    second = AutotuneCache(path, gpu_name="g", triton_version="t")
    first.store("a", STATIC_KEY, 4, {"BV": 16}, 1.0)
    second.store("b", STATIC_KEY, 4, {"BV": 32}, 2.0)
    fresh = AutotuneCache(path, gpu_name="g", triton_version="t")
    assert fresh.get("a", STATIC_KEY, 4).config == {"BV": 16}
    assert fresh.get("b", STATIC_KEY, 4).config == {"BV": 32}


def test_cache_write_is_atomic(tmp_path, monkeypatch) -> None:
    path = tmp_path / "autotune.json"
    cache = AutotuneCache(path, gpu_name="g", triton_version="t")
    cache.store("k", STATIC_KEY, 4, {"BV": 16}, 1.0)
    before = path.read_bytes()
    assert os.listdir(tmp_path) == ["autotune.json"]

    def dump_then_die(obj, f, **kwargs):
        f.write('{"format": 1, "entries": {"half')
        raise OSError("disk full")

    monkeypatch.setattr(autotune.json, "dump", dump_then_die)
    with pytest.raises(OSError, match="disk full"):
        cache.store("k", STATIC_KEY, 8, {"BV": 32}, 1.0)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["autotune.json"]  # the temporary file is gone too


def test_cache_corrupt_file_raises_a_clear_error(tmp_path) -> None:
    path = tmp_path / "autotune.json"
    path.write_text('{"format": 1, "entries": {')
    with pytest.raises(AutotuneCacheError, match=f"autotune cache {path} is not valid JSON"):
        AutotuneCache(path)
    path.write_text('{"something": "else"}')
    with pytest.raises(AutotuneCacheError, match=f"autotune cache {path} is not an autotune cache of format 1"):
        AutotuneCache(path)


# -- tune: levels ---------------------------------------------------------------------------------


def test_cache_only_without_cache_uses_the_default(cache) -> None:
    def no_build(bucket: int) -> None:
        raise AssertionError("cache-only must not build inputs")

    kernel = FakeKernel(cost_by_bv({16: 3.0, 32: 1.0, 64: 2.0}))
    choice = tune("fake_scale", STATIC_KEY, 8, CANDIDATES, build=no_build, run=kernel.run, check=kernel.check,
                  cache=cache, level="cache-only", default={"BV": 64, "num_warps": 2})
    assert (choice.config, choice.source, choice.bucket, choice.records) == ({"BV": 64, "num_warps": 2}, "default",
                                                                              None, [])
    first = tune_fake(kernel, cache, level=Level.CACHE_ONLY)
    assert (first.config, first.source) == (CANDIDATES[0], "default")
    assert kernel.builds == [] and kernel.launches == []
    assert not os.path.exists(cache.path)


def test_tune_missing_tunes_once_then_hits_the_cache(cache) -> None:
    kernel = FakeKernel(cost_by_bv({16: 3.0, 32: 1.0, 64: 2.0}))
    tuned = tune_fake(kernel, cache, batch=5)
    assert tuned.source == "tuned" and tuned.bucket == 8
    assert tuned.config == {"BV": 32, "num_warps": 1}
    assert tuned.median_us == pytest.approx(1.1)
    assert kernel.builds == [8]
    assert [r.status for r in tuned.records] == ["ok"] * len(CANDIDATES)
    assert [r.config for r in tuned.records] == CANDIDATES

    launches = len(kernel.launches)
    again = tune_fake(kernel, cache, batch=7)
    assert (again.source, again.config, again.bucket, again.records) == ("cache", tuned.config, 8, [])
    assert kernel.builds == [8] and len(kernel.launches) == launches

    # Another bucket is missing, so it is tuned (tune-missing does not settle for a neighbour).
    assert tune_fake(kernel, cache, batch=9).source == "tuned"
    assert kernel.builds == [8, 16]


def test_cache_only_uses_the_nearest_cached_bucket(cache) -> None:
    kernel = FakeKernel(cost_by_bv({16: 3.0, 32: 1.0, 64: 2.0}))
    tune_fake(kernel, cache, batch=8)
    for batch in (1, 5, 300):
        choice = tune_fake(kernel, cache, batch=batch, level="cache-only")
        assert (choice.source, choice.bucket, choice.config) == ("cache", 8, {"BV": 32, "num_warps": 1})
    assert kernel.builds == [8]


def test_force_retunes_and_replaces_the_cached_config(cache) -> None:
    tune_fake(FakeKernel(cost_by_bv({16: 3.0, 32: 1.0, 64: 2.0})), cache)
    faster_64 = FakeKernel(cost_by_bv({16: 3.0, 32: 1.0, 64: 0.5}))
    assert tune_fake(faster_64, cache).source == "cache"
    forced = tune_fake(faster_64, cache, level="force")
    assert (forced.source, forced.config) == ("tuned", {"BV": 64, "num_warps": 1})
    assert faster_64.builds == [8]
    assert cache.get("fake_scale", STATIC_KEY, 8).config == {"BV": 64, "num_warps": 1}


def test_off_ignores_the_cache(cache) -> None:
    kernel = FakeKernel(cost_by_bv({16: 3.0, 32: 1.0, 64: 2.0}))
    tune_fake(kernel, cache)
    off = tune_fake(kernel, cache, level="off", default={"BV": 16, "num_warps": 2})
    assert (off.config, off.source) == ({"BV": 16, "num_warps": 2}, "default")


# -- tune: failures -------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["check", "timing"])
@pytest.mark.parametrize(
    "make_oom",
    [
        lambda: torch.OutOfMemoryError(OOM_MESSAGE),
        lambda: RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    ],
    ids=["OutOfMemoryError", "RuntimeError"],
)
def test_oom_candidate_is_recorded_and_the_sweep_goes_on(cache, make_oom, when: str) -> None:
    first_failing_launch = 0 if when == "check" else 1

    def fail(config: dict, launch_index: int):
        return make_oom() if config["BV"] == 64 and launch_index >= first_failing_launch else None

    kernel = FakeKernel(cost_by_bv({16: 3.0, 32: 2.0, 64: 1.0}), fail=fail)
    seen = []
    choice = tune_fake(kernel, cache, sink=seen.append)
    assert choice.config == {"BV": 32, "num_warps": 1}
    assert seen == choice.records and len(seen) == len(CANDIDATES)
    by_bv = {(r.config["BV"], r.config["num_warps"]): r for r in choice.records}
    for warps in (1, 2):
        oom = by_bv[(64, warps)]
        assert oom.status == "oom" and oom.median_us is None
        assert oom.wanted_bytes == 2 * GIB
        assert oom.free_bytes is None  # no CUDA here: unknown, not made up
        assert "CUDA out of memory" in oom.detail
    assert all(r.status == "ok" for r in choice.records if r.config["BV"] != 64)
    # Every record is JSON as it is (the runner writes them to autotune.jsonl).
    assert json.loads(json.dumps(seen[0].to_dict()))["static_key"]["state_dtype"] == "float32"


def test_mismatching_candidates_are_never_chosen(cache) -> None:
    kernel = FakeKernel(cost_by_bv({16: 3.0, 32: 2.0, 64: 1.0}), broken=lambda c: c["BV"] == 64)
    choice = tune_fake(kernel, cache)
    assert choice.config == {"BV": 32, "num_warps": 1}
    mismatches = [r for r in choice.records if r.status == "mismatch"]
    assert [r.config["BV"] for r in mismatches] == [64, 64]
    assert all(r.median_us is None and r.detail == "1 mismatching elements" for r in mismatches)


def test_compile_errors_and_out_of_resources_are_recorded(cache) -> None:
    import ast

    def fail(config: dict, launch_index: int):
        if config["BV"] == 64:
            return OutOfResources(required=262_144, limit=232_448, name="shared memory")
        if config["num_warps"] == 2:
            return CompilationError(None, ast.AST(), "BV * num_warps too large")
        return None

    choice = tune_fake(FakeKernel(cost_by_bv({16: 3.0, 32: 2.0, 64: 1.0}), fail=fail), cache)
    statuses = {(r.config["BV"], r.config["num_warps"]): r.status for r in choice.records}
    assert statuses == {(16, 1): "ok", (16, 2): "compile_error", (32, 1): "ok", (32, 2): "compile_error",
                        (64, 1): "out_of_resources", (64, 2): "out_of_resources"}
    assert choice.config == {"BV": 32, "num_warps": 1}
    assert "out of resource: shared memory" in choice.records[4].detail


def test_other_errors_propagate_and_nothing_is_cached(cache) -> None:
    def fail(config: dict, launch_index: int):
        return ValueError("index out of range") if config["BV"] == 32 else None

    with pytest.raises(ValueError, match="index out of range"):
        tune_fake(FakeKernel(cost_by_bv({16: 3.0, 32: 2.0, 64: 1.0}), fail=fail), cache)
    assert not os.path.exists(cache.path)


def test_no_valid_candidate_raises_with_the_records(cache) -> None:
    def fail(config: dict, launch_index: int):
        return torch.OutOfMemoryError(OOM_MESSAGE) if config["BV"] == 16 else None

    kernel = FakeKernel(cost_by_bv({16: 3.0, 32: 2.0, 64: 1.0}), broken=lambda c: c["BV"] != 16, fail=fail)
    seen = []
    with pytest.raises(NoValidConfigError) as info:
        tune_fake(kernel, cache, sink=seen.append)
    message = str(info.value)
    assert "no valid config among 6 candidates" in message
    assert "{'BV': 16, 'num_warps': 1}: oom (CUDA out of memory" in message
    assert "{'BV': 64, 'num_warps': 2}: mismatch (1 mismatching elements)" in message
    assert info.value.records == seen and len(seen) == 6
    assert not os.path.exists(cache.path)


def test_an_oom_while_building_inputs_marks_every_candidate(cache) -> None:
    def huge_build(bucket: int) -> None:
        raise torch.OutOfMemoryError(OOM_MESSAGE)

    kernel = FakeKernel(cost_by_bv({16: 3.0, 32: 2.0, 64: 1.0}))
    with pytest.raises(NoValidConfigError) as info:
        tune("fake_scale", STATIC_KEY, 8, CANDIDATES, build=huge_build, run=kernel.run, check=kernel.check,
             timer=kernel.timer, cache=cache)
    records = info.value.records
    assert [r.status for r in records] == ["oom"] * len(CANDIDATES)
    assert all(r.wanted_bytes == 2 * GIB and r.detail.startswith("building inputs at batch 8") for r in records)
    assert kernel.launches == []


# -- tune: equivalence classes --------------------------------------------------------------------

# Each member alone would pick a different BV; the class's summed cost picks BV 32.
MEMBER_COST_US = {"native_verify": {16: 1.0, 32: 2.0, 64: 4.0}, "compact_commit": {16: 6.0, 32: 2.5, 64: 1.0}}
STEP_CLASS = ConfigClass("gdn_step_layout", ("native_verify", "compact_commit"))
CLASS_KEY = {"family": "gdn", "HV": 4, "K": 16, "V": 16, "state_dtype": "float32", "width": 4}
CLASS_CANDIDATES = config_space(BV=[16, 32, 64])


class FakeClass:
    """Two member kernels computing the same blocked `2 * x`; the check compares both."""

    def __init__(self, broken: Callable[[str, dict], bool] = lambda member, config: False) -> None:
        self.members = {name: FakeKernel(cost_by_bv(costs), broken=partial(broken, name))
                        for name, costs in MEMBER_COST_US.items()}

    def check(self, config: dict, inputs: dict) -> tuple[bool, str]:
        results = {name: kernel.check(config, inputs) for name, kernel in self.members.items()}
        bad = [f"{name}: {detail}" for name, (ok, detail) in results.items() if not ok]
        return not bad, "; ".join(bad) or "all members equal the reference"

    def timer(self, fn: Callable[[], Any]) -> float:
        before = {name: len(kernel.launches) for name, kernel in self.members.items()}
        fn()
        (member,) = [name for name, kernel in self.members.items() if len(kernel.launches) > before[name]]
        return MEMBER_COST_US[member][self.members[member].launches[-1]["BV"]]

    def tune(self, cache: AutotuneCache, **kwargs: Any):
        runs = {name: kernel.run for name, kernel in self.members.items()}
        return tune(STEP_CLASS, CLASS_KEY, 8, CLASS_CANDIDATES, build=self.members["native_verify"].build,
                    run=runs, check=self.check, timer=self.timer, cache=cache, **kwargs)


@pytest.fixture
def class_cache(tmp_path) -> AutotuneCache:
    return AutotuneCache(tmp_path / "autotune.json", gpu_name="g", triton_version="t", classes=[STEP_CLASS])


def test_config_class_is_tuned_on_the_summed_cost_and_shared_by_members(class_cache) -> None:
    choice = FakeClass().tune(class_cache)
    assert (choice.source, choice.config, choice.median_us) == ("tuned", {"BV": 32}, 4.5)
    assert choice.records[1].member_us == {"native_verify": 2.0, "compact_commit": 2.5}
    assert {r.kernel for r in choice.records} == {"gdn_step_layout"}

    for member in STEP_CLASS.members:
        assert class_cache.cache_name(member) == "gdn_step_layout"
        assert class_cache.lookup(member, CLASS_KEY, 6).config == {"BV": 32}
        for level in ("cache-only", "tune-missing"):
            looked_up = cached_choice(member, CLASS_KEY, 8, cache=class_cache, level=level, default={"BV": 16})
            assert (looked_up.source, looked_up.config, looked_up.bucket) == ("cache", {"BV": 32}, 8)


def test_a_config_that_breaks_one_member_is_rejected_for_the_class(class_cache) -> None:
    fake = FakeClass(broken=lambda member, config: member == "compact_commit" and config["BV"] == 32)
    choice = fake.tune(class_cache)
    assert [r.status for r in choice.records] == ["ok", "mismatch", "ok"]
    assert choice.records[1].detail == "compact_commit: 1 mismatching elements"
    assert (choice.config, choice.median_us) == ({"BV": 64}, 5.0)
    assert class_cache.lookup("native_verify", CLASS_KEY, 8).config == {"BV": 64}


def test_config_class_misuse_is_refused(tmp_path, class_cache) -> None:
    fake = FakeClass()
    with pytest.raises(ValueError, match="kernel 'compact_commit' belongs to config class 'gdn_step_layout'"):
        tune("compact_commit", CLASS_KEY, 8, CLASS_CANDIDATES, build=fake.members["compact_commit"].build,
             run=fake.members["compact_commit"].run, check=fake.check, cache=class_cache)
    with pytest.raises(ValueError, match=r"needs one run per member \['native_verify', 'compact_commit'\]"):
        tune(STEP_CLASS, CLASS_KEY, 8, CLASS_CANDIDATES, build=fake.members["native_verify"].build,
             run={"native_verify": fake.members["native_verify"].run}, check=fake.check, cache=class_cache)
    unregistered = AutotuneCache(tmp_path / "other.json", gpu_name="g", triton_version="t")
    with pytest.raises(ValueError, match="config class 'gdn_step_layout' is not registered"):
        fake.tune(unregistered)
    with pytest.raises(ValueError, match="distinct member kernels"):
        ConfigClass("dup", ("a", "a"))
    with pytest.raises(ValueError, match="more than one config class"):
        AutotuneCache(tmp_path / "x.json", classes=[STEP_CLASS, ConfigClass("other", ("native_verify",))])


# -- a real Triton kernel under the interpreter ---------------------------------------------------


@triton.jit
def scale_rows_kernel(x_ptr, out_ptr, N, BV: tl.constexpr):
    # Models a kernel whose register/shared-memory budget caps the block size.
    tl.static_assert(BV <= 32)
    row = tl.program_id(0)
    for start in range(0, N, BV):
        cols = start + tl.arange(0, BV)
        mask = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=mask)
        tl.store(out_ptr + row * N + cols, x * 2.0 + 1.0, mask=mask)


def test_tune_a_triton_kernel_under_the_interpreter(cache) -> None:
    def build(bucket: int) -> dict[str, torch.Tensor]:
        x = torch.randn(bucket, 40)
        return {"x": x, "out": torch.full_like(x, float("nan"))}

    def run(config: dict, inputs: dict[str, torch.Tensor]) -> None:
        x = inputs["x"]
        scale_rows_kernel[(x.shape[0],)](x, inputs["out"], x.shape[1], BV=config["BV"])

    def check(config: dict, inputs: dict[str, torch.Tensor]) -> tuple[bool, str]:
        inputs["out"].fill_(float("nan"))
        run(config, inputs)
        ok = torch.equal(inputs["out"], inputs["x"] * 2.0 + 1.0)
        return ok, "bitwise equal to torch" if ok else "differs from torch"

    choice = tune("scale_rows", {"N": 40}, 3, config_space(BV=[16, 32, 64]), build=build, run=run, check=check,
                  timer=partial(wallclock_median_us, warmup=0, reps=1), cache=cache)
    statuses = {r.config["BV"]: r.status for r in choice.records}
    assert statuses == {16: "ok", 32: "ok", 64: "compile_error"}
    assert choice.config["BV"] in (16, 32) and choice.median_us > 0
    assert cache.get("scale_rows", {"N": 40}, 4).config == choice.config


# -- Triton CPU shims -----------------------------------------------------------------------------


@pytest.fixture
def shim():
    assert triton_cpu.install() is True
    yield triton_cpu
    triton_cpu.install("first")


def make_autotuned_scale(launched: list[int], do_bench=None):
    """A fresh 2-config autotuned kernel (a new Autotuner each call, so nothing is memoized)."""

    def note(nargs: dict) -> None:
        launched.append(nargs["BV"])

    @triton.autotune(configs=[triton.Config({"BV": 16}, pre_hook=note), triton.Config({"BV": 32}, pre_hook=note)],
                     key=["N"], do_bench=do_bench)
    @triton.jit
    def scale(x_ptr, out_ptr, N, BV: tl.constexpr):
        cols = tl.program_id(0) * BV + tl.arange(0, BV)
        tl.store(out_ptr + cols, tl.load(x_ptr + cols, mask=cols < N) * 3.0, mask=cols < N)

    return scale


def launch_autotuned(scale) -> None:
    x = torch.randn(70)
    out = torch.full_like(x, float("nan"))
    scale[lambda meta: (triton.cdiv(70, meta["BV"]),)](x, out, 70)
    assert torch.equal(out, x * 3.0)


def test_multi_config_autotune_picks_the_first_config_without_running_others(shim) -> None:
    launched: list[int] = []
    scale = make_autotuned_scale(launched)
    launch_autotuned(scale)
    assert scale.best_config.kwargs == {"BV": 16}
    assert launched == [16]  # only the launch itself; no config was benchmarked


def test_multi_config_autotune_can_time_every_config(shim) -> None:
    shim.install("time")
    launched: list[int] = []
    scale = make_autotuned_scale(launched)
    launch_autotuned(scale)
    assert sorted(launched[:2]) == [16, 32]  # each config ran once to be timed, then the winner
    assert len(launched) == 3 and launched[2] == scale.best_config.kwargs["BV"]


def test_a_kernel_with_its_own_benchmarker_keeps_it(shim) -> None:
    calls: list[int] = []

    def own_bench(kernel_call, quantiles):
        kernel_call()
        calls.append(1)
        return [float(len(calls))] * len(quantiles)

    launched: list[int] = []
    launch_autotuned(make_autotuned_scale(launched, do_bench=own_bench))
    assert len(calls) == 2 and launched == [16, 32, 16]


def test_do_bench_times_on_cpu(shim) -> None:
    x = torch.randn(256)
    median_ms = triton.testing.do_bench(lambda: x.mul(2), rep=5)
    assert median_ms > 0
    p50, p20, p80 = triton.testing.do_bench(lambda: x.mul(2), rep=5, quantiles=[0.5, 0.2, 0.8])
    assert 0 < p20 <= p50 <= p80
    with pytest.raises(ValueError, match="return_mode"):
        triton.testing.do_bench(lambda: None, return_mode="p99")


def test_install_is_idempotent(shim) -> None:
    installed = triton_autotuner.Autotuner.__dict__["do_bench"]
    assert isinstance(installed, property)
    assert shim.install() is True and shim.install() is True
    assert triton_autotuner.Autotuner.__dict__["do_bench"] is installed
    assert triton.testing.do_bench is triton_cpu.cpu_do_bench
    with pytest.raises(ValueError, match="pick must be one of"):
        shim.install("fastest")


def test_import_changes_nothing_when_not_interpreting() -> None:
    script = (
        "import triton.testing, triton.runtime.autotuner as a\n"
        "original = triton.testing.do_bench\n"
        "from kernels.common import triton_cpu\n"
        "assert not triton_cpu.interpreting()\n"
        "assert triton_cpu.install() is False\n"
        "assert triton.testing.do_bench is original\n"
        "assert not isinstance(a.Autotuner.__dict__['do_bench'], property)\n"
        "print('untouched')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "untouched"
