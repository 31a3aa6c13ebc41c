"""Kernels: Triton implementations, each next to its plain PyTorch reference (`naive.py`).

Nothing here imports the harness, the states or the scenarios.
"""
