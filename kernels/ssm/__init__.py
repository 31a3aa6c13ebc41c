"""Triton kernels over the SSM state pools (conv, native, compact, replay, fla baseline)."""
