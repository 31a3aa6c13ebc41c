"""The `tl.dot` input precisions of the tensor-core kernels, as plain data (no torch or Triton import, so the
CLI can name them in its help without loading either).

`ieee` (fp32 FMAs), `tf32x3` and `bf16x6` compute a product to about fp32 accuracy, `bf16x3` to about
2^-17 relative; plain `tf32` rounds each operand to 10 mantissa bits (~1e-3 a product), outside the fp32
contract of SPEC §5. The default is the fastest that keeps that contract on an H200 (measured, see
kernels/ssm/replay_precompute.py).
"""

PRECISIONS = ("ieee", "tf32x3", "bf16x3", "bf16x6", "tf32")
DEFAULT_PRECISION = "tf32x3"
