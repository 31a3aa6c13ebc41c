"""Test-wide set-up: Triton runs in its interpreter on CPU tensors, matplotlib renders off-screen.

Markers (declared in pyproject.toml) and what runs them:

* no marker: the fast suite, what `pytest -q -n 2` (the README's second command, `make test`) runs. It
  holds every contract of SPEC §5 at one small shape at least: the Triton kernels in the interpreter
  (compact == native bit for bit, replay fold == native, untouched slots, the fp64 reference), the torch
  backend, the CLI end to end, the page kernels and the gate's refusals.
* `slow`: left out by default (pyproject's addopts hold `-m 'not slow'`); `pytest -n 2 -m slow`
  (`make test-slow`) runs them, and .ci/run does after the fast suite. More shapes and families of the
  interpreter kernel tests, the TP matrices in the interpreter, real presets and defaults end to end
  (`harness run decode` as the README gives it), the SSM autotune, 4 processes and torchrun. A slow test
  adds shapes or repeats a fast one at full size: no SPEC §5 contract is left to the slow tests alone.
* `cuda`: needs a CUDA device with TRITON_INTERPRET=0; in the fast suite, where each one skips with its
  reason on a CPU machine. `pytest -m cuda` runs them alone (scripts/gpu_gate.sh, `make gpu-gate`).

A `-m` on the command line replaces the default one: `-m slow`, `-m cuda`, or `-m 'slow or not slow'` for
everything.
"""

import os

# Must happen before torch, triton or matplotlib is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# One intra-op thread per test process (inherited by the processes tests start): the tensors here are tiny,
# and `pytest -n 2` on 2 cores already keeps both busy. With torch's default of a thread per core, each
# worker's OpenMP threads spin-wait for a core the other worker holds: measured on a loaded 2-core box,
# tests/test_gate.py took 46 CPU seconds with the default and 8.5 with one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Multi-config triton.autotune and triton.testing.do_bench need a benchmarker without a GPU; install it
# before any module binds do_bench.
import kernels.common.triton_cpu  # noqa: E402,F401


import pytest  # noqa: E402


@pytest.fixture
def light_runs(monkeypatch):
    """For tests of a run's rows, files and comparisons: the CPU copy ceiling measured over 1 MiB 3 times
    (64 MiB 23 times by default), no figures, which together took half of a small run's 4 s, and two timed
    samples a row (a Triton row in the interpreter spent 70 of a 95 s run in timing). The
    manifest still gets its wall-time profile. Where figures and ceilings are the subject the runs go
    without it: test_notebook.py, test_profile.py, test_env.py, the page scenario runs that check their
    figure, `harness run decode` as the README gives it."""
    from harness import env, timing

    measure = env.measure_ceilings
    monkeypatch.setattr(env, "measure_ceilings", lambda device, **_: measure(device, cpu_bytes=1 << 20, repeats=3))
    monkeypatch.setattr("results.plots.plot_run", lambda run: None)  # harness.runner imports it when drawing
    # two timed samples and no warm-up, whatever the run asks (the runner's floor is 5 + 1): these tests read
    # that rows are timed, not what the times are, and a timed Triton variant in the interpreter is ~1 s a call
    bench = timing.bench
    monkeypatch.setattr(timing, "bench", lambda fn, **kw: bench(fn, **{**kw, "warmup": 0, "rep": 2}))


@pytest.fixture(scope="session")
def make_trace():
    """`make_trace(path, preset="tiny-gdn", drafts=2, dynamic=True) -> path`: a small trace (batch 2, four
    rounds, geometric:0.6 acceptance, fp32 state, bf16 activations) written with `save_trace`."""
    import torch

    from scenarios.ssm_workload import AcceptModel, build_workload
    from scenarios.trace import save_trace
    from states.presets import get_preset

    def make(path, preset: str = "tiny-gdn", drafts: int = 2, dynamic: bool = True):
        wl = build_workload(get_preset(preset).ssm, batch=2, drafts=drafts, rounds=4, state_dtype=torch.float32,
                            act_dtype=torch.bfloat16, accept=AcceptModel.parse("geometric:0.6", drafts),
                            dynamic_widths=dynamic, seed=5, device="cpu")
        save_trace(path, wl, torch.float32)
        return path

    return make
