"""The fp64 reference of §2 batched over requests (how the engine runs it, on the run's device) gives what
it gives one request at a time."""

from __future__ import annotations

import pytest
import torch

from kernels.gdn.naive import naive_recurrent_gdn
from kernels.kda.naive import naive_recurrent_kda
from states.params import make_params, make_token_inputs
from states.presets import get_preset


@pytest.mark.parametrize("preset", ["tiny-gdn", "tiny-kda"])
def test_batched_reference_matches_one_request_at_a_time(preset):
    geom = get_preset(preset).ssm
    gen = torch.Generator().manual_seed(11)
    p = make_params(geom, torch.bfloat16, gen)
    N, T = 3, 5
    x = make_token_inputs(geom, N * T, torch.bfloat16, gen)
    state = torch.randn(N, geom.value_heads, geom.head_k_dim, geom.head_v_dim, generator=gen)
    window = torch.randn(N, geom.conv_dim, geom.conv_kernel - 1, generator=gen).to(torch.bfloat16)
    fn = naive_recurrent_gdn if geom.family == "gdn" else naive_recurrent_kda
    extra = () if geom.family == "gdn" else (geom.lower_bound,)
    params = (p.conv_weight[0], p.A_log[0], p.dt_bias[0], geom.key_heads, *extra)

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(N, T, *t.shape[1:])

    o, S, win = fn(rows(x.mixed_qkv), rows(x.a), rows(x.b), window, state, *params)
    assert o.shape == (N, T, geom.value_heads, geom.head_v_dim) and S.dtype == torch.float64
    for r in range(N):
        o1, S1, win1 = fn(rows(x.mixed_qkv)[r], rows(x.a)[r], rows(x.b)[r], window[r], state[r], *params)
        torch.testing.assert_close(o[r], o1, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(S[r], S1, rtol=1e-13, atol=1e-13)
        assert torch.equal(win[r], win1)
    assert o.abs().max() > 0.01 and not torch.equal(S[0, -1], S[1, -1])  # real values, distinct requests
