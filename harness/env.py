"""What a run ran on (the manifest) and the copy ceilings measured in the same run (SPEC §7, §9).

Ceilings are what a plain copy achieves on this machine, so a kernel's achieved bandwidth can be
read as a fraction of something measured, not of a datasheet number:

* `d2d-copy`: device-to-device `copy_` of a large buffer; bytes counted = read + written
  (2 x buffer), the same convention the scenarios' cost models use for on-device traffic.
* `h2d-pinned` / `d2h-pinned`: `copy_(non_blocking=True)` between a pinned host tensor and a
  device tensor; bytes counted = buffer (each byte crosses the link once).
* `cpu-memcpy` (CPU runs only): host `copy_` between two tensors, read + written, timed with the
  CPU wall clock. A CPU run reports no GPU ceilings.

Each is the median of repeated samples timed by `harness.timing.bench` (CUDA events on CUDA).
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from harness.timing import bench

REPO_ROOT = Path(__file__).resolve().parents[1]


def manifest(
    argv: Sequence[str],
    seed: int | None,
    device: torch.device | str,
    ceilings: dict,
    *,
    repo_root: Path = REPO_ROOT,
) -> dict:
    """The run's manifest: code version, command, machine, library versions, ceilings and seed.

    Git is optional: outside a work tree `git_sha` and `git_dirty` are None and `git_error` says why.
    """
    device = torch.device(device)
    return {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(argv),
        "argv": list(argv),
        "seed": seed,
        **_git_state(repo_root),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") == "1",
        "device": str(device),
        **_device_info(device),
        "ceilings": ceilings,
    }


def measure_ceilings(
    device: torch.device | str,
    *,
    d2d_bytes: int = 1 << 30,
    host_bytes: int = 256 << 20,
    cpu_bytes: int = 256 << 20,
    warmup: int = 3,
    repeats: int = 20,
) -> dict[str, dict]:
    """Copy ceilings on `device`: `{name: {gbps, bytes, buffer_bytes, method, timer, samples, noise_pct}}`.

    Args:
        device: `cpu` gives `cpu-memcpy`; a CUDA device gives `d2d-copy`, `h2d-pinned`, `d2h-pinned`.
        d2d_bytes: size of the device buffer copied on-device.
        host_bytes: size of the pinned host buffer copied each way.
        cpu_bytes: size of the host buffer for `cpu-memcpy`.
        warmup, repeats: untimed and timed copies per ceiling.
    """
    device = torch.device(device)
    for name, value in (("d2d_bytes", d2d_bytes), ("host_bytes", host_bytes), ("cpu_bytes", cpu_bytes)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if device.type == "cpu":
        src = torch.empty(cpu_bytes, dtype=torch.uint8).random_(0, 256)
        dst = torch.empty_like(src)
        return {
            "cpu-memcpy": _ceiling(
                lambda: dst.copy_(src), device, 2 * cpu_bytes, cpu_bytes, warmup, repeats,
                "host copy_ between two CPU tensors; bytes = read + written; CPU wall clock",
            ),
        }  # fmt: skip
    if device.type != "cuda":
        raise ValueError(f"unsupported device {device}; ceilings are measured on cpu or cuda")
    with torch.cuda.device(device):
        src = torch.empty(d2d_bytes, dtype=torch.uint8, device=device).random_(0, 256)
        dst = torch.empty_like(src)
        host = torch.empty(host_bytes, dtype=torch.uint8, pin_memory=True).random_(0, 256)
        dev = torch.empty(host_bytes, dtype=torch.uint8, device=device)
        ceilings = {
            "d2d-copy": _ceiling(
                lambda: dst.copy_(src), device, 2 * d2d_bytes, d2d_bytes, warmup, repeats,
                "device copy_ of one buffer into another; bytes = read + written; CUDA events",
            ),
            "h2d-pinned": _ceiling(
                lambda: dev.copy_(host, non_blocking=True), device, host_bytes, host_bytes, warmup, repeats,
                "pinned host -> device copy_(non_blocking=True); bytes = buffer; CUDA events",
            ),
            "d2h-pinned": _ceiling(
                lambda: host.copy_(dev, non_blocking=True), device, host_bytes, host_bytes, warmup, repeats,
                "device -> pinned host copy_(non_blocking=True); bytes = buffer; CUDA events",
            ),
        }  # fmt: skip
        del src, dst, host, dev
        torch.cuda.empty_cache()
    return ceilings


def _ceiling(fn, device, counted_bytes, buffer_bytes, warmup, repeats, method) -> dict:
    timer = "cpu-wall" if device.type == "cpu" else "cuda-event"
    timing = bench(fn, device=device, warmup=warmup, rep=repeats, timer=timer)
    return {
        "gbps": counted_bytes / (timing.median_us * 1e-6) / 1e9,
        "bytes": counted_bytes,
        "buffer_bytes": buffer_bytes,
        "method": method,
        "timer": timing.timer,
        "samples": timing.n_samples,
        "noise_pct": timing.noise_pct,
    }


def _git_state(root: Path) -> dict:
    try:
        sha = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain"))
    except (OSError, subprocess.SubprocessError) as exc:
        return {"git_sha": None, "git_dirty": None, "git_error": f"{type(exc).__name__}: {exc}"}
    return {"git_sha": sha, "git_dirty": dirty}


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.strip()


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _device_info(device: torch.device) -> dict:
    if device.type != "cuda":
        keys = ("gpu_name", "sm_count", "compute_capability", "gpu_memory_bytes", "cuda", "driver")
        return dict.fromkeys(keys)
    props = torch.cuda.get_device_properties(device)
    return {
        "gpu_name": props.name,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "gpu_memory_bytes": props.total_memory,
        "cuda": torch.version.cuda,
        "driver": _nvidia_driver(device),
    }


def _nvidia_driver(device: torch.device) -> str | None:
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


if __name__ == "__main__":  # `python -m harness.env [device]`: print this machine's manifest
    import json

    dev = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps(manifest(sys.argv, None, dev, measure_ceilings(dev)), indent=1))
