"""Triton kernels over the SSM state pools (conv, native, compact, replay); the peers' kernels beside them in baselines/."""
