"""The `tl.dot` input precisions of the tensor-core kernels, as plain data (no torch or Triton import, so the
CLI can name them in its help without loading either).

`ieee` (fp32 FMAs), `tf32x3` and `bf16x6` compute a product to about fp32 accuracy, `bf16x3` to about
2^-17 relative; plain `tf32` rounds each operand to 10 mantissa bits (~1e-3 a product), outside the fp32
contract of SPEC §5. The default is the fastest that keeps that contract, measured on an H200 (replay's
precompute forward alone, Qwen3-Next, batch 128, W 4, each precision at its best config; the sweep in
results/reference/h200-2026-12-03b/precompute/): ieee 216 us, bf16x3 221, tf32x3 264, bf16x6 264, and plain
tf32 195 (outside the contract). The kernel is bound by its chain of dependent loads and small reductions,
not by the products, so fp32 FMAs cost no more than split tensor-core products there.
"""

PRECISIONS = ("ieee", "tf32x3", "bf16x3", "bf16x6", "tf32")
DEFAULT_PRECISION = "ieee"
