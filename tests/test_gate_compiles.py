"""The GPU gate's compile-ahead finds, in the real run, every specialization it compiled (issue 23).

Triton 3.6 gives a kernel a different cache key depending on which kernel a process hashed first (it
merges a callee's constexpr globals before hashing the callee), so forked compile workers and the
launching process disagreed and the H200 gate recompiled serially what it had compiled ahead.
`stable_cache_keys` fixes the keys; these tests run without the interpreter, in subprocesses (the fast
suite interprets), on this CPU: keys need no GPU, and scripts/gate_specializations.py compiles CUDA
binaries here through a stand-in driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# compact's verify first, or native's: whichever a process hashes first missed _EMULATE_RTNE (kernels/ssm/step.py)
KEYS = """
import json, sys
from kernels.common.precompile import stable_cache_keys
from kernels.ssm import compact, native, replay
first = {"compact": compact.compact_verify_kernel, "native": native.native_verify_kernel}[sys.argv[1]]
first.cache_key  # hashed before anything else in this process, as a first launch would
stable_cache_keys()
print(json.dumps({k.__name__: k.cache_key for k in (native.native_verify_kernel, compact.compact_verify_kernel,
                                                     compact.compact_commit_kernel, replay.replay_forward_kernel)}))
"""


def _compiled_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), "PYTHONPATH": str(ROOT)}


def test_cache_keys_do_not_depend_on_which_kernel_a_process_hashes_first(tmp_path):
    keys = [json.loads(subprocess.run([sys.executable, "-c", KEYS, first], cwd=ROOT, env=_compiled_env(tmp_path),
                                      check=True, capture_output=True, text=True).stdout)
            for first in ("compact", "native")]
    assert keys[0] == keys[1]


@pytest.mark.slow
def test_compile_ahead_leaves_nothing_to_compile_on_first_launch(tmp_path):
    """The gate's compile-ahead (two forked workers) and then an SSM case and a page case through Triton's real
    JIT path: every specialization is loaded from the cache, none compiled on first launch."""
    report = tmp_path / "sim.json"
    for case in ("mtp-fixed tiny-kda, bf16 state, batch 2, drafts 3, accept fixed:1",
                 "cpu-page-restore tiny-gdn, page size 16, tp 2"):
        subprocess.run([sys.executable, "scripts/gate_specializations.py", "--mode", "simulate", "--processes", "2",
                        "--case", case, "--json", str(report)], cwd=ROOT, env=_compiled_env(tmp_path), check=True,
                       capture_output=True)
        sim = json.loads(report.read_text())
        assert sim["cases"] == 1 and not sim["errors"], sim
        assert sim["compile_ahead"]["recorded"] > 0 and not sim["compile_ahead"]["failures"]
        assert sim["compiled"] == 0 and sim["loaded"] == sim["compile_ahead"]["recorded"], sim["per_case"]


def test_compile_ahead_leaves_no_progress_bar_open_when_a_case_raises(monkeypatch):
    """A case's launch raises by design here (its outputs are garbage): its own bars never finish, so the
    compile-ahead gives it none, and only `gate compiles` (started and finished) reaches the reporter.
    (Recording needs a GPU driver: here it records nothing, which is all this test needs.)"""
    import contextlib
    from types import SimpleNamespace

    from harness.gate import compile_ahead
    from kernels.common import precompile

    monkeypatch.setattr(precompile, "collect_compiles", lambda: contextlib.nullcontext([]))
    monkeypatch.setattr(precompile, "compile_all", lambda jobs, processes=None: (0.0, []))

    started, finished = [], []

    def progress(description, total):
        started.append(description)
        left = [total]

        def advance():
            left[0] -= 1
            if left[0] == 0:
                finished.append(description)
        return advance

    def launch(case, ctx):
        ctx.progress("mtp-fixed tiny-gdn batch 2: native/triton", 12)  # advanced by nobody: the launch raises
        raise RuntimeError("garbage by design")

    planned = [(SimpleNamespace(launch=launch), SimpleNamespace(backends=("torch", "triton")))]
    ahead = compile_ahead(planned, "cpu", progress=progress)
    assert ahead == {"specializations": 0, "seconds": ahead["seconds"], "failures": []}
    assert started == finished == ["gate compiles"]
