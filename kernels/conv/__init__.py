from kernels.conv.naive import causal_conv, naive_causal_conv_fp64

__all__ = ["causal_conv", "naive_causal_conv_fp64"]
