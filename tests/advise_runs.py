"""Small synthetic run directories for the `harness advise` tests: rows written through RunWriter (so they obey the
schema), with round times and bytes per request chosen so the right advice can be worked out by hand."""

from __future__ import annotations

from pathlib import Path

from results.store import RunWriter

MIB = 2**20
H200 = "NVIDIA H200"


def row(mode: str, drafts: int, batch: int, median_us: float | None, *, variant: str | None = None,
        spread_us: float = 1.0, bytes_per_request: int = 16 * MIB, status: str = "passed",
        state_dtype: str = "fp32", backend: str = "triton", preset: str = "tiny-gdn",
        config_source: str = "cached", reason: str | None = None) -> dict:
    """One decode (drafts 0) or mtp-fixed row; p20/p80 lie `spread_us` either side of the median."""
    if variant is None:
        variant = {"compact": "accept", "replay": "inline"}.get(mode)
    out = {
        "scenario": "decode" if drafts == 0 else "mtp-fixed", "family": "gdn", "mode": mode, "variant": variant,
        "backend": backend, "preset": preset, "device": "cuda:0", "batch": batch, "drafts": drafts,
        "width": drafts + 1, "accept": "all" if drafts == 0 else "geometric:0.7", "state_dtype": state_dtype,
        "act_dtype": "bf16", "history_len": 16 if mode == "replay" else None,
        "history_dtype": "fp32" if mode == "replay" else None, "layers": 2, "config": "{}",
        "config_source": config_source, "status": status, "reason": reason,
        "bytes_per_request_predicted": bytes_per_request, "bytes_per_request_measured": bytes_per_request,
    }  # fmt: skip
    if status == "passed":
        out.update(timer="cuda-graph", samples=30, median_us=median_us, p20_us=median_us - spread_us,
                   p80_us=median_us + spread_us, noise_pct=200 * spread_us / median_us)
    elif reason is None:
        out["reason"] = f"{status} (synthetic)"
    return out


def make_run(root: Path, rows: list[dict], *, gpu: str | None = H200, memory_bytes: int | None = 64 << 30,
             tag: str = "synthetic") -> Path:
    manifest = {"device": "cuda" if gpu else "cpu", "command": "synthetic rows for tests/test_advise.py"}
    if gpu:
        manifest.update(gpu_name=gpu, gpu_memory_bytes=memory_bytes)
    with RunWriter(root, manifest=manifest, tag=tag) as run:
        run.add_rows(rows)
    return run.final_dir
