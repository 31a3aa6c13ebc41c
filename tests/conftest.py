"""Test-wide set-up: Triton runs in its interpreter on CPU tensors, matplotlib renders off-screen."""

import os

# Must happen before triton or matplotlib is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
