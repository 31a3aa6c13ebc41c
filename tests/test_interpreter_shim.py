"""kernels/common/triton_cpu.py's device-call shim: a launch patches `triton.language` once, helper calls
inside it do not patch again, and what the kernel computes is what it computed without the shim."""

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from kernels.common.triton_cpu import interpreting

pytestmark = pytest.mark.skipif(not interpreting(), reason="the shim exists only under TRITON_INTERPRET=1")


@triton.jit
def _scaled(x, s):
    return x * s


@triton.jit
def _twice(x, s):
    return _scaled(_scaled(x, s), s)


@triton.jit
def _helpers_kernel(x, out, s, N: tl.constexpr, REPS: tl.constexpr):
    o = tl.program_id(0) * N + tl.arange(0, N)
    b = tl.load(x + o)
    for _ in tl.static_range(REPS):
        b = _twice(b, s)
    b = b + tl.cumsum(b, 0)  # a helper of Triton's own (triton/language/standard.py: `core`, not `tl`)
    tl.store(out + o, b)


def _expected(x: torch.Tensor, s: float, reps: int, n: int) -> torch.Tensor:
    b = x.clone()
    for _ in range(2 * reps):
        b = b * s
    b = b.view(-1, n)
    return (b + torch.cumsum(b, 1)).view(-1)


def _record_patches(monkeypatch) -> list:
    """`(function name, patch scope)` of every `_patch_lang` call from now on."""
    scopes = []
    patch = interpreter._patch_lang

    def recording(fn):
        scopes.append((fn.__name__, patch(fn)))
        return scopes[-1][1]

    monkeypatch.setattr(interpreter, "_patch_lang", recording)
    return scopes


def test_a_launch_patches_the_language_once_for_every_helper_call(monkeypatch):
    scopes = _record_patches(monkeypatch)
    n, programs, reps = 8, 3, 4
    x = torch.randn(n * programs)
    out = torch.full_like(x, float("nan"))
    _helpers_kernel[(programs,)](x, out, 0.5, N=n, REPS=reps)
    torch.testing.assert_close(out, _expected(x, 0.5, reps, n), rtol=0, atol=1e-6)
    # 3 programs x 4 reps x 3 helper calls ran; the launch patched, then Triton's cumsum once (tl.core)
    calls = [name for name, _ in scopes]
    assert calls[0] == "_helpers_kernel"
    assert 1 <= len(calls) <= 1 + 2, calls
    # the launch restored the language: its builtins are Triton's own again
    assert tl.core.is_builtin(tl.arange) and tl.core.is_builtin(tl.load)


def test_a_helper_called_outside_a_launch_still_patches(monkeypatch):
    scopes = _record_patches(monkeypatch)
    try:
        assert _scaled(2.0, 3.0) == 6.0
    finally:
        for _, scope in reversed(scopes):  # Triton never restores a helper call's patches; the test does
            scope.restore()
    assert [name for name, _ in scopes] == ["_scaled"]
