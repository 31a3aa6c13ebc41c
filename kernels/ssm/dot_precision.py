"""The `tl.dot` input precisions of the tensor-core kernels, as plain data (no torch or Triton import, so the
CLI can name them in its help without loading either).

`ieee` (fp32 FMAs), `tf32x3` and `bf16x6` compute a product to about fp32 accuracy, `bf16x3` to about
2^-17 relative; plain `tf32` rounds each operand to 10 mantissa bits (~1e-3 a product), outside the fp32
contract of SPEC §5. The default names the unsuffixed variants (`precompute`, `matrix`, `accept-precompute`,
`deferred-precompute`): ieee, which was the fastest of the first sweep (results/reference/h200-2026-12-03b/
precompute/, replay's precompute forward at 216 us against bf16x3's 221). Since the configs were tuned per
precision, bf16x3 is faster at every matrix kernel (h200-2026-12-04b/precompute, Qwen3-Next, batch 128, W 4:
replay precompute 151 us against ieee's 185, compact precompute 108 against 138, deferred precompute 226
against 231, matrix fold 158 against 169), so a run's default variants name bf16x3 explicitly
(scenarios/ssm_options.py RUN_VARIANTS) and the unsuffixed names keep meaning ieee.
"""

PRECISIONS = ("ieee", "tf32x3", "bf16x3", "bf16x6", "tf32")
DEFAULT_PRECISION = "ieee"
