"""Test-wide set-up: Triton runs in its interpreter on CPU tensors, matplotlib renders off-screen."""

import os

# Must happen before triton or matplotlib is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

# Multi-config triton.autotune and triton.testing.do_bench need a benchmarker without a GPU; install it
# before any module binds do_bench.
import kernels.common.triton_cpu  # noqa: E402,F401
