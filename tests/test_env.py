"""harness.env: the run manifest and the copy ceilings."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch

from harness.env import REPO_ROOT, manifest, measure_ceilings

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_manifest_records_code_command_and_machine(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ceilings = {"cpu-memcpy": {"gbps": 12.5}}
    m = manifest(["harness", "run", "decode", "--batch", "1 2"], 7, "cpu", ceilings)
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert m["git_sha"] == head.stdout.strip() and isinstance(m["git_dirty"], bool)
    else:  # a copy of the tree without its .git (as on some GPU boxes)
        assert m["git_sha"] is None and m["git_error"]
    assert m["command"] == "harness run decode --batch '1 2'"
    assert m["argv"][-1] == "1 2" and m["seed"] == 7 and m["ceilings"] == ceilings
    assert m["torch"] == torch.__version__ and m["triton_interpret"] is True
    assert m["device"] == "cpu" and m["gpu_name"] is None and m["sm_count"] is None
    assert m["created_utc"].endswith("+00:00")
    json.dumps(m)  # everything in it is JSON


def test_manifest_without_git(tmp_path, monkeypatch):
    outside = manifest(["x"], None, "cpu", {}, repo_root=tmp_path)
    assert outside["git_sha"] is None and outside["git_dirty"] is None and outside["git_error"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable at all
    missing = manifest(["x"], None, "cpu", {})
    assert missing["git_sha"] is None and "FileNotFoundError" in missing["git_error"]


def test_cpu_ceiling_is_a_labelled_memcpy():
    c = measure_ceilings("cpu", cpu_bytes=1 << 20, warmup=1, repeats=5)
    assert set(c) == {"cpu-memcpy"}  # no GPU numbers on a CPU run
    memcpy = c["cpu-memcpy"]
    assert memcpy["bytes"] == 2 << 20 and memcpy["buffer_bytes"] == 1 << 20
    assert memcpy["timer"] == "cpu-wall" and memcpy["samples"] == 5
    assert math.isfinite(memcpy["gbps"]) and memcpy["gbps"] > 0
    with pytest.raises(ValueError, match="cpu_bytes must be >= 1"):
        measure_ceilings("cpu", cpu_bytes=0)


@pytest.mark.cuda
@needs_cuda
def test_cuda_manifest_and_ceilings():
    c = measure_ceilings("cuda", d2d_bytes=256 << 20, host_bytes=64 << 20, repeats=10)
    assert set(c) == {"d2d-copy", "h2d-pinned", "d2h-pinned"}
    assert c["d2d-copy"]["bytes"] == 512 << 20 and c["h2d-pinned"]["bytes"] == 64 << 20
    # A device copy beats the host link by far on any GPU this harness targets.
    assert c["d2d-copy"]["gbps"] > 5 * c["h2d-pinned"]["gbps"] > 0
    m = manifest(["x"], 0, "cuda", c)
    props = torch.cuda.get_device_properties(0)
    assert m["gpu_name"] == props.name and m["sm_count"] == props.multi_processor_count
    assert m["cuda"] == torch.version.cuda
