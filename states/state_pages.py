"""Hybrid state pages: a request's accepted SSM conv window and state, in global head numbering
(SPEC §4), appended after the request's KV pages.

Byte layout of one request (offsets 16-byte aligned, zero padding when freshly packed):

    conv  [L, conv_dim_global, kernel - 1]   activation dtype, channels q | k | v
    ssm   [L, HV_global, K, V]               state dtype

At TP t a rank holds `H / t` key heads and `HV / t` value heads: its conv channels are
`[q heads | k heads | v heads]` of its own slice, so the global conv order is
`[q of rank 0 .. t-1 | k of rank 0 .. t-1 | v of rank 0 .. t-1]`, and its state is value heads
`[r * HV / t, (r + 1) * HV / t)`. `pack_state_pages` takes every simulated rank's `snapshot` tensors
at one TP degree; `unpack_state_pages` gives every rank's `load` tensors at another. Across processes
each rank packs or unpacks only its own heads (`pack_rank_state`, `unpack_rank_state`), and
`state_fields` names the head-split parts a transport moves (`states/pd_transport.py`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from states.geometry import SSMGeometry
from states.pd_transport import Field

ALIGN = 16


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class StatePageLayout:
    """Where the conv window and the state of one request sit in its state page.

    Attributes:
        geometry: global SSM geometry (all heads).
        state_dtype, act_dtype: dtypes of the state and of the conv window.
        conv_bytes: bytes of the conv window, at offset 0.
        ssm_offset, ssm_bytes: where the state starts (16-byte aligned) and its size.
        nbytes: the whole page, a multiple of 16.
    """

    geometry: SSMGeometry
    state_dtype: torch.dtype
    act_dtype: torch.dtype
    conv_bytes: int
    ssm_offset: int
    ssm_bytes: int
    nbytes: int

    @classmethod
    def of(cls, geometry: SSMGeometry, state_dtype: torch.dtype, act_dtype: torch.dtype) -> StatePageLayout:
        g = geometry
        conv = g.layers * g.conv_dim * (g.conv_kernel - 1) * act_dtype.itemsize
        ssm = g.layers * g.state_elems * state_dtype.itemsize
        offset = _align(conv)
        return cls(g, state_dtype, act_dtype, conv, offset, ssm, _align(offset + ssm))

    def views(self, page_bytes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(conv [n, L, conv_dim, kernel - 1], ssm [n, L, HV, K, V])` views into `[n, nbytes]` uint8."""
        g, n = self.geometry, page_bytes.shape[0]
        conv = page_bytes[:, : self.conv_bytes].view(self.act_dtype)
        ssm = page_bytes[:, self.ssm_offset : self.ssm_offset + self.ssm_bytes].view(self.state_dtype)
        conv = conv.view(n, g.layers, g.conv_dim, g.conv_kernel - 1)
        return conv, ssm.view(n, g.layers, g.value_heads, g.head_k_dim, g.head_v_dim)


def _local_heads(geometry: SSMGeometry, tp: int) -> tuple[int, int]:
    if tp < 1 or geometry.key_heads % tp or geometry.value_heads % tp:
        raise ValueError(
            f"TP {tp} must divide the key heads ({geometry.key_heads}) and value heads ({geometry.value_heads})"
        )
    return geometry.key_heads // tp, geometry.value_heads // tp


# The parts of a state page that TP splits, each by heads along axis HEAD_AXIS of its view.
STATE_FIELDS = ("conv_q", "conv_k", "conv_v", "ssm")
HEAD_AXIS = 2


def state_fields(geometry: SSMGeometry, conv: torch.Tensor, ssm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Head-split views of a conv window and a state, global (a page) or one rank's (a snapshot).

    Args:
        geometry: the SSM geometry whose head counts `conv` and `ssm` hold (global, or one rank's).
        conv: `[n, L, conv_channels, kernel - 1]`, channels q | k | v.
        ssm: `[n, L, HV, K, V]`.

    Returns:
        `conv_q`, `conv_k` `[n, L, H, K, kernel - 1]`, `conv_v` `[n, L, HV, V, kernel - 1]` and `ssm`
        `[n, L, HV, K, V]`: views sharing memory with the inputs, heads on axis `HEAD_AXIS`.
    """
    g = geometry
    qk = g.key_heads * g.head_k_dim
    q, k, v = conv.split([qk, qk, g.value_heads * g.head_v_dim], dim=2)
    key = (g.key_heads, g.head_k_dim)
    return {"conv_q": q.unflatten(2, key), "conv_k": k.unflatten(2, key),
            "conv_v": v.unflatten(2, (g.value_heads, g.head_v_dim)), "ssm": ssm}


def rank_heads(geometry: SSMGeometry, tp: int, rank: int, field: str) -> tuple[int, int]:
    """`[start, stop)` of the global heads of `field` that rank `rank` of TP `tp` holds."""
    h, hv = _local_heads(geometry, tp)
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} is not a rank of TP {tp}")
    n = h if field in ("conv_q", "conv_k") else hv
    return rank * n, (rank + 1) * n


def local_geometry(geometry: SSMGeometry, tp: int) -> SSMGeometry:
    """The heads one rank of TP `tp` holds."""
    h, hv = _local_heads(geometry, tp)
    return dataclasses.replace(geometry, key_heads=h, value_heads=hv)


def _page_fields(layout: StatePageLayout, pages: torch.Tensor) -> dict[str, torch.Tensor]:
    conv, ssm = layout.views(pages)
    return state_fields(layout.geometry, conv, ssm)


def state_transport(layout: StatePageLayout, tp_prefill: int, tp_decode: int, pages: torch.Tensor | None
                    ) -> tuple[list[Field], list[list[torch.Tensor]] | None]:
    """How state pages split between prefill TP p and decode TP d (every rank owns its heads of each
    part), and the blocks of `pages` (`[n, nbytes]` uint8, or None) in the same order."""
    g = layout.geometry
    fields = [Field(name, HEAD_AXIS, tuple(rank_heads(g, tp_prefill, i, name) for i in range(tp_prefill)),
                    tuple(rank_heads(g, tp_decode, j, name) for j in range(tp_decode))) for name in STATE_FIELDS]
    if pages is None:
        return fields, None
    views = _page_fields(layout, pages)
    return fields, [[views[name]] for name in STATE_FIELDS]


def pack_rank_state(pages: torch.Tensor, layout: StatePageLayout, tp: int, rank: int, ssm: torch.Tensor,
                    conv: torch.Tensor) -> None:
    """Write one rank's accepted state (`[n, L, HV / tp, K, V]`, `[n, L, conv_dim_local, kernel - 1]`)
    into its heads of state pages `[n, nbytes]`; every other byte is left as it was."""
    local = state_fields(local_geometry(layout.geometry, tp), conv, ssm)
    for name, view in _page_fields(layout, pages).items():
        start, stop = rank_heads(layout.geometry, tp, rank, name)
        view.narrow(HEAD_AXIS, start, stop - start).copy_(local[name])


def unpack_rank_state(pages: torch.Tensor, layout: StatePageLayout, tp: int, rank: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's `load` tensors `(ssm, conv)` at TP `tp` from state pages, fresh and contiguous."""
    part = {}
    for name, view in _page_fields(layout, pages).items():
        start, stop = rank_heads(layout.geometry, tp, rank, name)
        part[name] = view.narrow(HEAD_AXIS, start, stop - start)
    conv = torch.cat([part[name].flatten(2, 3) for name in ("conv_q", "conv_k", "conv_v")], dim=2)
    return part["ssm"].clone(), conv


def pack_state_pages(
    ssm: list[torch.Tensor],
    conv: list[torch.Tensor],
    geometry: SSMGeometry,
    tp: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pack every rank's accepted state into state pages.

    Args:
        ssm: per rank r of TP `tp`, `[n, L, HV / tp, K, V]` in the state dtype (a `snapshot`).
        conv: per rank, `[n, L, conv_dim_local, kernel - 1]` in the activation dtype.
        geometry: the global SSM geometry.
        tp: TP degree of the ranks.
        out: optional `[n, nbytes]` uint8 destination (its padding is left as it was); zeros otherwise.

    Returns:
        `[n, nbytes]` uint8, one state page per request (`StatePageLayout.nbytes`).
    """
    h, hv = _local_heads(geometry, tp)
    g = geometry
    if len(ssm) != tp or len(conv) != tp:
        raise ValueError(f"TP {tp} needs {tp} ssm and conv tensors, got {len(ssm)} and {len(conv)}")
    n, device = ssm[0].shape[0], ssm[0].device
    layout = StatePageLayout.of(g, ssm[0].dtype, conv[0].dtype)
    local_conv = 2 * h * g.head_k_dim + hv * g.head_v_dim
    for r in range(tp):
        want_ssm = (n, g.layers, hv, g.head_k_dim, g.head_v_dim)
        want_conv = (n, g.layers, local_conv, g.conv_kernel - 1)
        for name, t, shape, dtype in (
            ("ssm", ssm[r], want_ssm, layout.state_dtype),
            ("conv", conv[r], want_conv, layout.act_dtype),
        ):
            if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
                raise ValueError(
                    f"rank {r} {name} must be {dtype} {list(shape)} on {device}, "
                    f"got {t.dtype} {list(t.shape)} on {t.device}"
                )
    if out is None:
        out = torch.zeros(n, layout.nbytes, dtype=torch.uint8, device=device)
    elif out.dtype != torch.uint8 or out.shape != (n, layout.nbytes) or out.device != device or out.stride(1) != 1:
        raise ValueError(
            f"out must be uint8 [{n}, {layout.nbytes}] with contiguous rows on {device}, "
            f"got {out.dtype} {list(out.shape)} on {out.device}"
        )
    for r in range(tp):
        pack_rank_state(out, layout, tp, r, ssm[r], conv[r])
    return out


def unpack_state_pages(
    pages: torch.Tensor,
    geometry: SSMGeometry,
    tp: int,
    *,
    state_dtype: torch.dtype,
    act_dtype: torch.dtype,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's `load` tensors at TP `tp` from state pages.

    Args:
        pages: `[n, nbytes]` uint8 state pages (`pack_state_pages` at any TP degree).
        geometry: the global SSM geometry; state_dtype, act_dtype: the dtypes it was packed with.

    Returns:
        `(ssm, conv)`: per rank, `[n, L, HV / tp, K, V]` state dtype and
        `[n, L, conv_dim_local, kernel - 1]` activation dtype, fresh contiguous tensors on `pages`' device.
    """
    _local_heads(geometry, tp)
    layout = StatePageLayout.of(geometry, state_dtype, act_dtype)
    if pages.dtype != torch.uint8 or pages.dim() != 2 or pages.shape[1] != layout.nbytes or pages.stride(1) != 1:
        raise ValueError(
            f"state pages must be uint8 [n, {layout.nbytes}] with contiguous rows, "
            f"got {pages.dtype} {list(pages.shape)}"
        )
    ranks = [unpack_rank_state(pages, layout, tp, r) for r in range(tp)]
    return [s for s, _ in ranks], [c for _, c in ranks]


def _byte_pages(pages: torch.Tensor, page_ids: list[int], nbytes: int) -> torch.Tensor:
    """`[N, page bytes]` uint8 view of a contiguous page tensor, after checking `page_ids` holds `nbytes`."""
    if not pages.is_contiguous():
        raise ValueError("state bytes go to a contiguous page tensor")
    flat = pages.view(torch.uint8).view(pages.shape[0], -1)
    need = math.ceil(nbytes / flat.shape[1])
    if len(page_ids) != need:
        raise ValueError(f"{nbytes} state bytes need {need} pages of {flat.shape[1]} bytes, got {len(page_ids)}")
    if any(not 0 <= p < flat.shape[0] for p in page_ids) or len(set(page_ids)) != len(page_ids):
        raise ValueError(f"state page ids must be distinct and in [0, {flat.shape[0]}), got {page_ids}")
    return flat


def write_state_bytes(pages: torch.Tensor, page_ids: list[int], data: torch.Tensor) -> None:
    """Copy state bytes `[nbytes]` uint8 into the listed pages of a page tensor (CPU or PD pages), in
    order, one copy per page; the unused end of the last page is left as it was."""
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError(f"state bytes must be 1-D uint8, got {data.dtype} {list(data.shape)}")
    flat = _byte_pages(pages, page_ids, data.numel())
    step = flat.shape[1]
    for i, page in enumerate(page_ids):
        chunk = data[i * step : (i + 1) * step]
        flat[page, : chunk.numel()].copy_(chunk, non_blocking=True)


def read_state_bytes(
    pages: torch.Tensor, page_ids: list[int], nbytes: int, device: torch.device | str
) -> torch.Tensor:
    """The `[nbytes]` uint8 state bytes `write_state_bytes` stored in the listed pages, on `device`."""
    flat = _byte_pages(pages, page_ids, nbytes)
    out = torch.empty(nbytes, dtype=torch.uint8, device=device)
    step = flat.shape[1]
    for i, page in enumerate(page_ids):
        chunk = out[i * step : (i + 1) * step]
        chunk.copy_(flat[page, : chunk.numel()], non_blocking=True)
    return out


def state_page_count(layout: StatePageLayout, page_bytes: int) -> int:
    """Pages of `page_bytes` one request's state page spans when appended after its KV pages."""
    return math.ceil(layout.nbytes / page_bytes)
