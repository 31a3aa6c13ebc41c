"""SSM traces: a scenario's inputs in a file, so real activations can be replayed (SPEC §6).

Format `ssm-harness-trace`, version 1; documented in docs/TRACE_FORMAT.md. A trace is a `torch.save`
of plain dicts, lists, strings, numbers and tensors, loaded with `weights_only=True` (no code runs).
"""

from __future__ import annotations

import zipfile
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
    """Load and validate a trace against `geom`: every field present, of its documented shape and
    dtype, floats finite, widths and acceptances in range. ValueError naming the first problem, in one
    line that starts with `--trace FILE`."""
    where = f"--trace {path}"
    if Path(path).is_dir():
        raise ValueError(f"{where}: is a directory, not a trace file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file") from None
    except Exception as e:  # a corrupt or foreign file: say so in one line
        if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; unpickling anything else says only
            # what byte it tripped on (`KeyError: 101`)
            raise ValueError(f"{where}: not a trace: a trace is a file written by torch.save "
                             "(docs/TRACE_FORMAT.md), this one is not") from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"{where}: a torch.save file that is not a readable trace "
                         f"({type(e).__name__}: {first})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{where}: not an {FORMAT} file")
    if data.get("version") != VERSION:
        raise ValueError(f"{where}: version {data.get('version')} is not supported (this harness reads {VERSION})")
    want = {f: getattr(geom, f) for f in GEOMETRY_FIELDS}
    if data.get("geometry") != want:
        raise ValueError(f"{where}: geometry {data.get('geometry')} does not match the preset's {want}")
    act = ACT_DTYPES.get(data.get("act_dtype"))
    if act is None or data.get("state_dtype") not in STATE_DTYPES:
        raise ValueError(f"{where}: unknown dtypes act={data.get('act_dtype')!r} state={data.get('state_dtype')!r}")
    state = STATE_DTYPES[data["state_dtype"]]
    drafts = data.get("drafts")
    if not isinstance(drafts, int) or isinstance(drafts, bool) or drafts < 0:
        raise ValueError(f"{where}: drafts must be an integer >= 0, got {drafts!r}")
    W = drafts + 1
    g = geom
    gate_in = (g.value_heads,) if g.family == "gdn" else (g.value_heads, g.head_k_dim)
    bias = g.value_heads if g.family == "gdn" else g.value_heads * g.head_k_dim
    init_ssm = _tensor(where, data, "init.ssm", None, state)
    n = init_ssm.shape[0] if init_ssm.dim() else 0
    if n < 1:
        raise ValueError(f"{where}: init.ssm holds no request")
    _tensor(where, data, "init.ssm", (n, g.layers, g.value_heads, g.head_k_dim, g.head_v_dim), state)
    _tensor(where, data, "init.conv", (n, g.layers, g.conv_dim, g.conv_kernel - 1), act)
    _tensor(where, data, "params.conv_weight", (g.layers, g.conv_dim, g.conv_kernel), act)
    _tensor(where, data, "params.A_log", (g.layers, g.value_heads), torch.float32)
    _tensor(where, data, "params.dt_bias", (g.layers, bias), torch.float32)
    rounds = data.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        raise ValueError(f"{where}: rounds must be a non-empty list of rounds")
    for r in range(len(rounds)):
        pre = f"rounds[{r}]"
        widths = _tensor(where, data, f"{pre}.widths", (n,), "int")
        accepted = _tensor(where, data, f"{pre}.accepted", (n,), "int")
        for i, w in enumerate(widths.tolist()):  # before the sum below counts them
            if not 0 <= w <= W:
                raise ValueError(f"{where}: {pre}.widths[{i}] = {w} outside [0, {W}]")
        # only the packed rows are read; the padding after them is often a buffer never written (NaN is fine)
        read = int(widths.long().sum())
        _tensor(where, data, f"{pre}.mixed_qkv", (g.layers, n * W, g.conv_dim), act, read)
        _tensor(where, data, f"{pre}.a", (g.layers, n * W, *gate_in), act, read)
        _tensor(where, data, f"{pre}.b", (g.layers, n * W, g.value_heads), act, read)
        for i, (w, a) in enumerate(zip(widths.tolist(), accepted.tolist(), strict=True)):
            lo, hi = (0, w - 1) if w else (-1, -1)
            if not lo <= a <= hi:
                raise ValueError(f"{where}: {pre}.accepted[{i}] = {a} outside [{lo}, {hi}] for width {w}")
    data["_act_dtype"], data["_state_dtype"], data["_batch"], data["_drafts"] = act, state, n, drafts
    data["_rounds"] = len(rounds)
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


def _tensor(where: str, data: dict[str, Any], name: str, shape: tuple[int, ...] | None,
            dtype: torch.dtype | str, read_rows: int | None = None) -> torch.Tensor:
    """The tensor at dotted `name` (`rounds[2].a`), checked: present, `shape` (None: any), `dtype`
    ("int": any integer dtype), and finite when it holds floats: all of it, or with `read_rows` the first
    that many rows of dim 1 (a round's packed tokens; the rows after them are padding, never read)."""
    t: Any = data
    for part in name.replace("[", ".").replace("]", "").split("."):
        container_ok = isinstance(t, dict) or (isinstance(t, list) and part.isdigit() and int(part) < len(t))
        t = (t.get(part) if isinstance(t, dict) else t[int(part)]) if container_ok else None
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{where}: {name} is missing or not a tensor")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{where}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if dtype == "int":
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{where}: {name} has dtype {t.dtype}, expected an integer dtype")
    elif t.dtype != dtype:
        raise ValueError(f"{where}: {name} has dtype {DTYPE_NAMES.get(t.dtype, t.dtype)}, the trace declares "
                         f"{DTYPE_NAMES.get(dtype, dtype)}")
    read = t if read_rows is None else t[:, :read_rows]
    if t.is_floating_point() and not bool(torch.isfinite(read).all()):
        rows = "" if read_rows is None else f" in its first {read_rows} rows (the round's tokens)"
        raise ValueError(f"{where}: {name} holds NaN or Inf{rows}")
    return t
