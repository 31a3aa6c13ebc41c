"""SSM traces: a scenario's inputs in a file, so real activations can be replayed (SPEC §6).

Format `ssm-harness-trace`, version 1; documented in docs/TRACE_FORMAT.md. A trace is a `torch.save`
of plain dicts, lists, strings, numbers and tensors, loaded with `weights_only=True` (no code runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from scenarios.ssm_workload import SSMWorkload
from states.base import ACT_DTYPES, DTYPE_NAMES, STATE_DTYPES
from states.geometry import SSMGeometry
from states.params import SSMParams, TokenInputs

FORMAT = "ssm-harness-trace"
VERSION = 1
GEOMETRY_FIELDS = ("family", "layers", "key_heads", "value_heads", "head_k_dim", "head_v_dim", "conv_kernel",
                   "lower_bound")


def save_trace(path: str | Path, wl: SSMWorkload, state_dtype: torch.dtype) -> None:
    """Write a workload (generated or captured) as a version-1 trace."""
    g = wl.geom
    rounds = []
    for r in range(wl.rounds):
        per_layer = [wl.inputs(r, layer) for layer in range(g.layers)]
        rounds.append({
            "widths": wl.widths(r).cpu().to(torch.int32),
            "accepted": wl.accepted(r).cpu().to(torch.int32),
            "mixed_qkv": torch.stack([x.mixed_qkv.cpu() for x in per_layer]),
            "a": torch.stack([x.a.cpu() for x in per_layer]),
            "b": torch.stack([x.b.cpu() for x in per_layer]),
        })
    torch.save({
        "format": FORMAT,
        "version": VERSION,
        "geometry": {f: getattr(g, f) for f in GEOMETRY_FIELDS},
        "act_dtype": DTYPE_NAMES[wl.act_dtype],
        "state_dtype": DTYPE_NAMES[state_dtype],
        "drafts": wl.width - 1,
        "params": {"conv_weight": wl.params.conv_weight.cpu(), "A_log": wl.params.A_log.cpu(),
                   "dt_bias": wl.params.dt_bias.cpu()},
        "init": {"ssm": wl.init_ssm.cpu(), "conv": wl.init_conv.cpu()},
        "rounds": rounds,
    }, path)


def read_trace(path: str | Path, geom: SSMGeometry) -> dict[str, Any]:
    """Load and validate a trace against `geom`; ValueError naming the first problem."""
    where = f"trace {path}"
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except Exception as e:  # a corrupt or foreign file: say so in one line
        raise ValueError(f"{where}: not a readable trace ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{where}: not an {FORMAT} file")
    if data.get("version") != VERSION:
        raise ValueError(f"{where}: version {data.get('version')} is not supported (this harness reads {VERSION})")
    want = {f: getattr(geom, f) for f in GEOMETRY_FIELDS}
    if data["geometry"] != want:
        raise ValueError(f"{where}: geometry {data['geometry']} does not match the preset's {want}")
    act = ACT_DTYPES.get(data.get("act_dtype"))
    if act is None or data.get("state_dtype") not in STATE_DTYPES:
        raise ValueError(f"{where}: unknown dtypes act={data.get('act_dtype')!r} state={data.get('state_dtype')!r}")
    drafts, W = int(data["drafts"]), int(data["drafts"]) + 1
    init = data["init"]
    n = init["ssm"].shape[0]
    g = geom
    gate_in = (g.value_heads,) if g.family == "gdn" else (g.value_heads, g.head_k_dim)
    bias = g.value_heads if g.family == "gdn" else g.value_heads * g.head_k_dim
    _shape(where, "init.ssm", init["ssm"], (n, g.layers, g.value_heads, g.head_k_dim, g.head_v_dim))
    _shape(where, "init.conv", init["conv"], (n, g.layers, g.conv_dim, g.conv_kernel - 1))
    p = data["params"]
    _shape(where, "params.conv_weight", p["conv_weight"], (g.layers, g.conv_dim, g.conv_kernel))
    _shape(where, "params.A_log", p["A_log"], (g.layers, g.value_heads))
    _shape(where, "params.dt_bias", p["dt_bias"], (g.layers, bias))
    if not data["rounds"]:
        raise ValueError(f"{where}: has no rounds")
    for r, rd in enumerate(data["rounds"]):
        pre = f"rounds[{r}]"
        _shape(where, f"{pre}.widths", rd["widths"], (n,))
        _shape(where, f"{pre}.accepted", rd["accepted"], (n,))
        _shape(where, f"{pre}.mixed_qkv", rd["mixed_qkv"], (g.layers, n * W, g.conv_dim))
        _shape(where, f"{pre}.a", rd["a"], (g.layers, n * W, *gate_in))
        _shape(where, f"{pre}.b", rd["b"], (g.layers, n * W, g.value_heads))
        for i, (w, a) in enumerate(zip(rd["widths"].tolist(), rd["accepted"].tolist(), strict=True)):
            if not 0 <= w <= W:
                raise ValueError(f"{where}: {pre}.widths[{i}] = {w} outside [0, {W}]")
            lo, hi = (0, w - 1) if w else (-1, -1)
            if not lo <= a <= hi:
                raise ValueError(f"{where}: {pre}.accepted[{i}] = {a} outside [{lo}, {hi}] for width {w}")
    data["_act_dtype"], data["_batch"], data["_drafts"] = act, n, drafts
    return data


def load_trace(path: str | Path, geom: SSMGeometry, case: Any, device: str) -> SSMWorkload:
    """A workload whose every input comes from the trace file."""
    data = read_trace(path, geom)
    p = data["params"]
    return SSMWorkload(
        geom=geom,
        params=SSMParams(p["conv_weight"], p["A_log"], p["dt_bias"]).to(device),
        init_ssm=data["init"]["ssm"].to(case.state_dtype).to(device),
        init_conv=data["init"]["conv"].to(device),
        width=data["_drafts"] + 1,
        rounds=len(data["rounds"]),
        act_dtype=data["_act_dtype"],
        seed=0,
        device=device,
        widths_per_round=[rd["widths"].to(device) for rd in data["rounds"]],
        accepted_per_round=[rd["accepted"].to(device) for rd in data["rounds"]],
        trace_inputs=[
            [TokenInputs(rd["mixed_qkv"][layer], rd["a"][layer], rd["b"][layer]) for layer in range(geom.layers)]
            for rd in data["rounds"]
        ],
    )


def _shape(where: str, name: str, t: Any, want: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{where}: {name} is missing or not a tensor")
    if tuple(t.shape) != tuple(want):
        raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}, expected {tuple(want)}")
