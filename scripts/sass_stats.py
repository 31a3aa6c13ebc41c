"""Registers, spills and instruction mix of the SSM kernels for a CUDA target, on a machine without a GPU.

Device time is scarce; most kernel questions ("how many instructions per state element does a token
step cost", "did the state block spill", "are the loads 16 bytes wide") are answered by the compiler.
This script calls the real launchers (`scripts/bench_kernels.py`'s cases) on small CPU tensors with
Triton's driver replaced by one that reports a CUDA target and whose cache hook compiles each launch
for that target instead of running it; Triton's bundled `ptxas` and `nvdisasm` do the rest. Nothing
runs, so the figures are static: instructions in the SASS, registers, local-memory (spill) bytes.

Columns: regs, spill_bytes (stack frame, local memory), sass (instructions), and counts of the
classes that matter for the token step: FFMA / FMUL / FADD (fp32 math), SHFL (warp reductions),
BAR (block barriers: cross-warp reductions), LDS/STS (shared memory), LDG/STG (global), LDL/STL
(local memory: spills), MUFU (exp, rsqrt, ...).

`--by-line N` adds, under each kernel, its N source lines with the most instructions (nvdisasm's line table):
which line of a kernel its instructions come from. Triton's debug info has no inlining records, so the
instructions of `tl.sum` and friends land on triton/language/standard.py's lines, not on their callers'.

Usage:
    python3 scripts/sass_stats.py --preset qwen3-next --bv 16,32 --warps 1,2,4 --kernels compact,native
    python3 scripts/sass_stats.py --kernels replay-precompute --bv 32 --warps 1 --precision bf16x3 --by-line 25
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLASSES = ("FFMA", "FMUL", "FADD", "SHFL", "BAR", "LDS", "STS", "LDG", "STG", "LDL", "STL", "MUFU", "HMMA", "HGMMA")
_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


class _TargetOnlyDriver:
    """Just enough of a Triton driver for the JIT to specialize and compile for `target` (no device)."""

    def __init__(self, target: GPUTarget) -> None:
        self.target = target

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


_OPCODE = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")  # opcode, no modifiers
_LINE = re.compile(r'\s*//## File "([^"]+)", line (\d+)')  # nvdisasm -g's line marker


def disassemble(cubin: bytes) -> str:
    """A cubin's SASS with nvdisasm's line table (`-g`: Triton's PTX carries `.loc`s)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(_BIN / "nvdisasm"), "-c", "-g", f.name], capture_output=True, text=True,
                              check=True).stdout


def sass_counts(text: str) -> tuple[int, collections.Counter]:
    """(instructions, opcode counts) of a disassembly's text."""
    ops: collections.Counter = collections.Counter()
    for line_ops in count_by_line(text).values():
        ops.update(line_ops)
    return sum(ops.values()), ops


def count_by_line(text: str) -> dict[tuple[str, int], collections.Counter]:
    """Opcode counts per source line (file name, line) of a disassembly's text; instructions before the first
    line marker go to `("?", 0)`. An inlined `@triton.jit` helper's instructions land on the helper's own
    line, so the table says which line of which file the instructions are, not which call of it."""
    table: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    where = ("?", 0)
    for line in text.splitlines():
        loc = _LINE.match(line)
        if loc:
            where = (Path(loc.group(1)).name, int(loc.group(2)))
        elif m := _OPCODE.match(line):
            table[where][m.group(1)] += 1
    return table


def print_by_line(text: str, top: int) -> None:
    """The `top` source lines with the most instructions, each with its opcode classes and its text (read
    from the paths the line markers name)."""
    table = count_by_line(text)
    total = sum(sum(c.values()) for c in table.values())
    paths = {Path(f).name: Path(f) for f, _ in _LINE.findall(text)}
    sources: dict[str, list[str]] = {}
    for (name, no), ops in sorted(table.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        if name not in sources:
            path = paths.get(name)
            sources[name] = path.read_text().splitlines() if path and path.is_file() else []
        src = sources[name][no - 1].strip() if 0 < no <= len(sources[name]) else ""
        n = sum(ops.values())
        mix = " ".join(f"{c}:{ops[c]}" for c in CLASSES if ops.get(c))
        print(f"    {n:>5} {100 * n / total:5.1f}%  {name}:{no:<4} {mix:<40} {src[:70]}")


def resources(cubin: bytes) -> dict[str, int]:
    """Registers and stack (spill) bytes of the cubin's kernel, from `cuobjdump --dump-resource-usage`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(_BIN / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                              text=True, check=True).stdout
    reg = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    return {"regs": int(reg.group(1)) if reg else -1, "spill_bytes": int(stack.group(1)) if stack else -1}


class Capture:
    """Installs the target-only driver and a cache hook that compiles every launch instead of running it."""

    def __init__(self, arch: int) -> None:
        self.target = GPUTarget("cuda", arch, 32)
        self.compiled: list[tuple[str, object]] = []

    def __enter__(self) -> "Capture":
        triton.runtime.driver.set_active(_TargetOnlyDriver(self.target))
        knobs.runtime.jit_cache_hook = self._hook
        return self

    def __exit__(self, *exc) -> None:
        knobs.runtime.jit_cache_hook = None
        triton.runtime.driver._active = None  # back to lazily creating the real one (there may be none)

    def _hook(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002 - Triton's names
        jit = fn.jit_function
        src = triton.compiler.ASTSource(jit, compile["signature"], compile["constants"], compile["configs"][0])
        options = {k: compile[k] for k in ("num_warps", "num_ctas", "num_stages", "enable_fp_fusion", "extern_libs")}
        kernel = triton.compile(src, target=self.target, options=options)
        self.compiled.append((fn.name, kernel))
        return True  # skip the launch


def main() -> None:
    # Compile for the target, never interpret: before the kernels are imported (`triton.jit` picks the
    # interpreter at decoration time), and here rather than at import, so that importing this module (its
    # tests do) leaves the importing process's interpreter setting alone.
    os.environ.pop("TRITON_INTERPRET", None)
    import scripts.bench_kernels as bench
    from states.params import make_params
    from states.presets import get_ssm_preset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-next")
    ap.add_argument("--drafts", type=int, default=3)
    ap.add_argument("--state-dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--bv", default="16,32")
    ap.add_argument("--warps", default="1,2,4")
    ap.add_argument("--kernels", default="", help="comma list to keep (default: all but fla-decode)")
    ap.add_argument("--bk", default="32", help="K chunks of the precompute forward")
    ap.add_argument("--bc", default="", help="channel blocks of the conv (default: its default config)")
    ap.add_argument("--stages", default="1", help="num_stages of the precompute forward")
    ap.add_argument("--precision", default="", help="comma list of the precompute forward's dot precisions")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for H100/H200")
    ap.add_argument("--sass-dir", default="", help="also write each kernel's SASS here")
    ap.add_argument("--by-line", type=int, default=0, metavar="N",
                    help="also print each kernel's N source lines with the most SASS instructions")
    args = ap.parse_args()

    import states.base

    bench.DEVICE = "cpu"
    states.base._interpreting = lambda: True  # let triton-backend states live on CPU tensors: nothing runs
    geom = replace(get_ssm_preset(args.preset).ssm, layers=1)
    params = make_params(geom, torch.bfloat16, torch.Generator().manual_seed(0))
    sd = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.state_dtype]
    keep = set(filter(None, args.kernels.split(",")))
    print(f"{'kernel':<26} {'config':<16} {'regs':>5} {'spill':>6} {'sass':>6} " + " ".join(f"{c:>5}" for c in CLASSES))
    sweep_args = argparse.Namespace(bv=args.bv, warps=args.warps, bk=args.bk, bc=args.bc, stages=args.stages,
                                    precision=args.precision, drafts=args.drafts)
    for name, prec, cfg, fn, _ in bench.sweep(sweep_args, geom, params, sd, 2, keep):
        tag = (f"BC{cfg['BC']}" if "BC" in cfg else f"BV{cfg['BV']}") + f"w{cfg['num_warps']}" + (f"k{cfg['BK']}s{cfg['num_stages']}" if "BK" in cfg else "")
        with Capture(args.arch) as cap:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a config that does not compile is a line, not a crash
                print(f"{name:<26} {tag:<16} {type(e).__name__}: {str(e).splitlines()[0][:80]}")
                continue
        for kname, kernel in cap.compiled:
            cubin = kernel.asm["cubin"]
            sass = disassemble(cubin)
            total, ops = sass_counts(sass)
            res = resources(cubin)
            label = (name if len(cap.compiled) == 1 else f"{name}:{kname.removesuffix('_kernel')}") + (f":{prec}" if prec else "")
            print(f"{label:<26} {tag:<16} {res['regs']:>5} {res['spill_bytes']:>6} {total:>6} "
                  + " ".join(f"{ops.get(c, 0):>5}" for c in CLASSES), flush=True)
            if args.by_line:
                print_by_line(sass, args.by_line)
            if args.sass_dir:
                Path(args.sass_dir).mkdir(parents=True, exist_ok=True)
                Path(args.sass_dir, f"{label.replace(':', '-')}-{tag}.sass").write_text(sass)


if __name__ == "__main__":
    main()
