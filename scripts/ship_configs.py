"""Copy the configs one GPU model tuned into harness/shipped_configs.json, the configs that ship with the
harness: a plain `harness run` on that GPU model uses them wherever its own autotune cache has nothing
(the row's config_source says `shipped`).

    python3 scripts/ship_configs.py results/runs/<autotune run>/cache.json --gpu "NVIDIA H200"

Entries of other GPUs and Triton versions already shipped are kept; the GPU's entries for the kernels and
static keys in the source replace the shipped ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.autotune import AutotuneCache  # noqa: E402
from harness.runner import SHIPPED_CACHE  # noqa: E402


def ship(source: Path, gpu: str, target: Path = SHIPPED_CACHE) -> int:
    """Merge `gpu`'s entries of the cache at `source` into `target`; returns how many were shipped."""
    entries = AutotuneCache(source, gpu_name=gpu)._data["entries"].get(gpu)
    if not entries:
        raise SystemExit(f"{source} holds no configs for GPU {gpu!r}")
    shipped = 0
    for triton_version, kernels in entries.items():
        dst = AutotuneCache(target, gpu_name=gpu, triton_version=triton_version)
        for kernel, keys in kernels.items():
            for key_json, buckets in keys.items():
                for bucket, entry in buckets.items():
                    per_key = (dst._data["entries"].setdefault(gpu, {}).setdefault(triton_version, {})
                               .setdefault(kernel, {}).setdefault(key_json, {}))
                    per_key[bucket] = entry
                    shipped += 1
        dst._write()
    return shipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cache", type=Path, help="an autotune cache (harness autotune --autotune-cache, or a run's copy)")
    ap.add_argument("--gpu", required=True, help="the GPU name as torch reports it, e.g. 'NVIDIA H200'")
    ap.add_argument("--to", type=Path, default=SHIPPED_CACHE)
    args = ap.parse_args()
    print(f"shipped {ship(args.cache, args.gpu, args.to)} entries for {args.gpu} into {args.to}")


if __name__ == "__main__":
    main()
