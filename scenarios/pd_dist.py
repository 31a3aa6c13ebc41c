"""pd-roundtrip across processes: the `dist` transport (issue 10; SPEC §4, §12).

Every process of the run's `torch.distributed` group (harness/dist.py starts or joins it) runs each case;
prefill rank i lives in process i and decode rank j in process N - 1 - j (`states.pd_transport.Placement`:
disjoint processes when p + d <= N, else the middle processes hold one rank of each side). A TP pair
needs max(p, d) processes: asked for explicitly with fewer, it is bad input; in the default sweep of
pairs it is a row with status `unsupported`.

Per case and backend, each process:

1. builds the same inputs from the seed as every other process (the global prefill KV, the requests,
   slots and pages of `pd_layout.Layout`), keeps its prefill rank's pool (its heads; a replica rank
   other random bytes) and poisons its decode rank's pool and both sides' staging pages (0xA5);
2. compared roundtrip: its prefill rank writes its head slice of requests A and B into its own
   staging pages (`PDPagePool.write_rank`), the slices move to the decode processes
   (`states.pd_transport.Transfer`: each writer's overlap with each decode rank's heads), its decode
   rank reads its slice into its pool (`read_rank`);
3. checks its side(s): contract 4, the prefill rank's heads of its pages equal the prefill KV laid out
   in pages (`Layout.reference_pages`), the decode rank's heads of its pages the same, and its pool
   slots the prefill rows of its heads; contract 5, every other byte of both staging buffers, the
   decode pool's other slots and padding row still hold the poison, and the prefill pool is unchanged.
   Every process gets every comparison (`all_gather_object`), rank 0 records them, and the case
   passes only if all of them do;
4. times (passed cases), with `ctx.bench_group` (each sample the slowest process's): an export of
   `--pages` full pages between shuffled slots and shuffled pages, the transfer of those pages, and their
   import. The transfer is timed in its three steps (pack, exchange, unpack; `Transfer.phases`), each
   after a barrier, a sample being their sum; the link ceiling is the exchange step of those very
   samples, so it is measured on the same bytes, messages, processes and timer, and the transfer can
   never read above 100% of it.

Rows (rank 0 writes them): per backend `export`, `transfer` and `import`, all with `tp_prefill` and
`tp_decode`; `config` adds the transport, the process group's backend, the process count, the placement
and the link and local bytes. Cost model:

* export / import: `PDPagePool.traffic` (twice the row bytes of each taking-part rank, as in the local
  transport), summed over the processes; since each process has its own device, the ceiling is the
  run's device copy ceiling times the processes doing the work (`d2d-copy x2`; on a CPU `cpu-memcpy x2`,
  an upper bound, as the processes share the cores);
* transfer: the bytes that cross between processes (a shared placement's local copies are left out and
  the row's note says how many), against `link-<nccl|gloo> <preset> tp<p>:<d> page <P> <backend>`, the
  exchange step of the same transfer (step 4); each such ceiling is recorded with the run's ceilings
  (manifest.json and the printed header), like the copy ceilings.

Hybrid state page (presets with SSM layers; one untimed row, direction `roundtrip`): prefill rank i
writes its heads of the request's state page into its staging pages right after the KV pages
(`pack_rank_state`), the four head-split parts (conv q, k, v and ssm) move like the KV, decode rank j
unpacks its heads (`unpack_rank_state`); contract 4 on the moved heads and the unpacked tensors,
contract 5 on every other byte of both sides' pages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from scenarios import page_options as po
from scenarios.base import CaseResult, RunContext
from scenarios.options import parse_int
from scenarios.pd_layout import Layout
from states.kv_pool import KVPool, copy_rank, page_rows, tp_group
from states.pd_pages import KV_HEAD_AXIS, PDPagePool, kv_field
from states.pd_transport import Field, Placement, Range, Transfer
from states.state_pages import (
    StatePageLayout,
    pack_rank_state,
    pack_state_pages,
    state_page_count,
    state_transport,
    unpack_rank_state,
    unpack_state_pages,
)

TRANSPORTS = ("local", "dist")
DIST_BACKENDS = ("auto", "nccl", "gloo")
DIRECTIONS = {"export": "to_pages", "transfer": None, "import": "to_pool"}
PAGE_DIMS = ("page", "token", "layer", "part", "head")
POOL_DIMS = ("rank", "layer", "token", "head")
STATE_KV_PAGES = po.STATE_KV_PAGES

Launch = Callable[[str, str], dict[str, Any]]  # (backend, to_pages | to_pool) -> {params, source, config}


# ------------------------------------------------------------------------------------------ planning
def check_transport(options: dict[str, Any], cases: Sequence[po.PageCase]) -> None:
    """ValueError for transport options that do not fit (before any process starts): an unknown
    transport, dist options with the local one, a process group backend that does not fit the device,
    fewer than 2 processes, an explicitly asked TP pair that needs more processes than `--nproc`."""
    transport = options.get("transport") or "local"
    nproc, backend = options.get("nproc"), options.get("dist_backend") or "auto"
    device = str(options.get("device") or "cpu")
    if transport not in TRANSPORTS:
        raise ValueError(f"--transport: unknown transport {transport!r}; choose {' or '.join(TRANSPORTS)}")
    if transport == "local":
        for flag, value in (("--nproc", nproc), ("--dist-backend", None if backend == "auto" else backend)):
            if value is not None:
                raise ValueError(f"{flag} applies to --transport dist only")
        return
    if backend not in DIST_BACKENDS:
        raise ValueError(f"unknown --dist-backend {backend!r}; choose one of {', '.join(DIST_BACKENDS)}")
    if backend == "nccl" and not device.startswith("cuda"):
        raise ValueError("--dist-backend nccl needs --device cuda (CPU processes talk through gloo)")
    if backend == "gloo" and device.startswith("cuda"):
        raise ValueError("--dist-backend gloo moves CPU tensors here; use nccl (or auto) with --device cuda")
    if device.startswith("cuda:"):
        raise ValueError(f"--transport dist puts rank r on GPU r: give --device cuda, not {device}")
    if nproc is None:
        raise ValueError("--transport dist needs --nproc N (harness run starts N processes) or a torchrun launch")
    n = parse_int(nproc, "--nproc")
    if n < 2:
        raise ValueError(f"--nproc must be one integer >= 2 (a prefill and a decode process), got {nproc}")
    if options.get("tp_pairs") is not None:
        for case in cases:
            try:
                Placement(n, case.tp_prefill, case.tp_decode)
            except ValueError as e:
                raise ValueError(f"{e} (--nproc {n})") from None


# ------------------------------------------------------------------------------------------------ run
def run_case(case: po.PageCase, ctx: RunContext, launch: Launch, repro: dict[str, Any]) -> CaseResult:
    """One case on this process (every process of the group calls it); rows only on rank 0."""
    if ctx.bench_group is None or not dist.is_initialized():
        raise ValueError("--transport dist runs in a process group: start it with --nproc N or under torchrun")
    result = CaseResult()
    lead = dist.get_rank() == 0
    world, p, d = dist.get_world_size(), case.tp_prefill, case.tp_decode
    try:
        placement: Placement | None = Placement(world, p, d)
        unsupported = ""
    except ValueError as e:
        placement, unsupported = None, f"{e}; run with --nproc {max(p, d)} or more for this pair"
    for backend in case.backends:
        launches = {t: launch(backend, t) for t in ("to_pages", "to_pool")}
        if placement is None:
            status, reason, timed = "unsupported", unsupported, {}
        else:
            _barrier()  # every process starts the case together (and NCCL sees a collective before p2p)
            status, reason = _roundtrip(case, ctx, placement, backend, launches)
            timed = _time(case, ctx, placement, backend, launches) if status == "passed" and ctx.time_cases else {}
            oom = timed.pop("oom", None)
            if oom is not None:
                status, reason = "oom", oom.get("message", "out of memory")
                if lead:
                    result.ooms.append({"scenario": case.scenario, "preset": case.preset, "backend": backend,
                                        "tp_prefill": p, "tp_decode": d, "page_size": case.page_size, **oom})
        if lead:
            for direction, t in DIRECTIONS.items():
                row = po.page_row(case, ctx, family=case.attn.family, backend=backend, direction=direction,
                                  layers=case.attn.layers, repro=repro)
                fields = dict(timed.get(direction, {}))
                config = {"transport": "dist", "processes": world, **fields.pop("config", {})}
                if t is not None:  # a kernel's row: its launch config too
                    config = {**json.loads(launches[t]["config"]), **config}
                    row["config_source"] = launches[t]["source"]
                row.update(config=json.dumps(config, sort_keys=True), status=status,
                           reason=fields.pop("note", "") or reason, **fields)
                result.rows.append(row)
    _state_row(case, ctx, placement, unsupported, result, repro)
    return result


def _barrier() -> None:
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])  # this process's GPU, not a guess
    else:
        dist.barrier()


def _sides(placement: Placement) -> tuple[int | None, int | None]:
    """This process's prefill rank and decode rank (None where it holds none)."""
    me = dist.get_rank()
    return placement.prefill_rank(me), placement.decode_rank(me)


def _roundtrip(case: po.PageCase, ctx: RunContext, placement: Placement, backend: str,
               launches: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The compared roundtrip of one backend (module docstring, steps 1-3); the status of the whole group."""
    g, P, p, d = case.attn, case.page_size, case.tp_prefill, case.tp_decode
    i, j = _sides(placement)
    layout = Layout.make(P, torch.Generator().manual_seed(ctx.seed * 37 + P + 100 * p + d))
    kv, group = po.source_group(g, layout.tokens, p, po.generator(ctx, P + p), ctx.device)
    field = kv_field(g, p, d)
    label = f"{backend} tp{p}->tp{d}"
    made, src_blocks, dst_blocks = [], None, None
    pre = dec = None
    if i is not None:
        pool, pre = group[i], _staging(g, 4, P, ctx.device)
        before = pool.kv.clone()
        pre.write_rank(pool, [layout.src["A"], layout.src["B"]], layout.ids(), backend=backend,
                       **launches["to_pages"]["params"])
        src_blocks = [pre.head_blocks(layout.sent_pages())]
    if j is not None:
        dec = _staging(g, 4, P, ctx.device)
        dst_pool = _poisoned_pool(g, layout.tokens, d, j, ctx.device)
        dst_blocks = [dec.head_blocks(layout.sent_pages())]
    Transfer(placement, [field], src_blocks=src_blocks, dst_blocks=dst_blocks, device=ctx.device)()
    if pre is not None:
        checks = po.Checks(ctx, case.scenario, f"{label} prefill rank {i}")
        ref = layout.reference_pages(kv, pre.pages)
        _check_heads(checks, pre.pages, ref, _kv_views(g), [field], [field.src[i]], name="exported pages",
                     rhs="prefill KV")
        checks.same(pool.kv, before, name="prefill pool", rhs="before the roundtrip", contract="5",
                    dims=POOL_DIMS[1:])
        made += checks.made
    if dec is not None:
        checks = po.Checks(ctx, case.scenario, f"{label} decode rank {j}")
        ref = layout.reference_pages(kv, dec.pages)
        _check_heads(checks, dec.pages, ref, _kv_views(g), [field], [field.dst[j]], name="received pages",
                     rhs="prefill KV")
        dec.read_rank(dst_pool, [layout.dst["A"], layout.dst["B"]], layout.ids(), backend=backend,
                      **launches["to_pool"]["params"])
        sent_src = torch.cat([layout.src["A"], layout.src["B"][P:]])  # B's first chunk is not sent
        sent_dst = torch.cat([layout.dst["A"], layout.dst["B"][P:]])
        checks.same(po.rank_rows([dst_pool], sent_dst), po.expected_rows(kv, [dst_pool], sent_src),
                    name="imported slots", rhs="prefill KV", contract="4", dims=POOL_DIMS)
        checks.untouched(po.rank_rows([dst_pool], po.other_slots(layout.tokens, sent_dst)),
                         name="untouched slots and padding row", dims=POOL_DIMS)
        made += checks.made
    return _group_status(ctx, made)


def _staging(g: Any, pages: int, P: int, device: str) -> PDPagePool:
    pd = PDPagePool(g, pages, page_tokens=P, dtype=po.KV_DTYPE, device=device)
    po.poison(pd.pages)
    return pd


def _poisoned_pool(g: Any, tokens: int, tp: int, rank: int, device: str) -> KVPool:
    pool = KVPool.create(g, tokens, tp=tp, rank=rank, dtype=po.KV_DTYPE, device=device)
    po.poison(pool.kv)
    return pool


def _kv_views(g: Any) -> Callable[[torch.Tensor], list[list[torch.Tensor]]]:
    """Whole PD pages `[N, P, L, parts * H, D]` as the one block of `kv_field`: `[N, P, L, parts, H, D]`."""
    parts = 2 if g.family == "gqa" else 1
    return lambda pages: [[pages.unflatten(3, (parts, g.kv_heads))]]


def _check_heads(checks: po.Checks, buffer: torch.Tensor, reference: torch.Tensor,
                 views: Callable[[torch.Tensor], list[list[torch.Tensor]]], fields: Sequence[Field],
                 heads: Sequence[Range | None], *, name: str, rhs: str) -> None:
    """Contract 4: the heads this rank owns (`heads[f]` of field f; None: none) of `buffer` equal those of
    `reference`; contract 5: every other byte of `buffer` still holds the poison."""
    rest = buffer.clone()
    got, want, blank = views(buffer), views(reference), views(rest)
    for f, field in enumerate(fields):
        if heads[f] is None:
            continue
        start, width = heads[f][0], heads[f][1] - heads[f][0]
        for k, (x, y, z) in enumerate(zip(got[f], want[f], blank[f], strict=True)):
            what = name + (f" {field.name}" if len(fields) > 1 else "") + (f" block {k}" if len(got[f]) > 1 else "")
            mine = x.narrow(field.axis, start, width)
            dims = PAGE_DIMS if field.axis == KV_HEAD_AXIS else ("request", "layer", "head", "x")
            checks.same(mine, y.narrow(field.axis, start, width), name=what, rhs=rhs, contract="4",
                        dims=dims[: mine.dim() - 1])
            po.poison(z.narrow(field.axis, start, width))
    checks.untouched(rest.view(torch.uint8).flatten(), name=f"{name}: other heads and pages", dims=())


def _group_status(ctx: RunContext, made: list[Any]) -> tuple[str, str]:
    """Share every process's comparisons with every process; rank 0 records the others'. Returns the
    group's status (`passed` only if every comparison passed) and the reason."""
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, made)
    if dist.get_rank() == 0:
        for process, comparisons in enumerate(every):
            if process != 0:
                for c in comparisons:
                    ctx.record(c)
    bad = [c for comparisons in every for c in comparisons if not c.passed]
    if bad:
        return "mismatch", f"{len(bad)} comparison(s) failed, first: {bad[0].lhs}: {bad[0].name} vs {bad[0].rhs}"
    return "passed", ""


# --------------------------------------------------------------------------------------------- timing
def _time(case: po.PageCase, ctx: RunContext, placement: Placement, backend: str,
          launches: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Timing fields per direction (module docstring, step 4), or `{"oom": record}` when a process could not
    allocate its pools and pages (then no process times anything)."""
    g, P, p, d = case.attn, case.page_size, case.tp_prefill, case.tp_decode
    i, j = _sides(placement)
    n = case.timed_pages(po.page_bytes(g, P), ctx.device)
    gen = torch.Generator().manual_seed(ctx.seed + P)
    slots, ids = torch.randperm(n * P, generator=gen), torch.randperm(n, generator=gen)
    table, ids_h = page_rows(slots, ids, P, "head")  # table: [page row, position] -> pool slot
    work: dict[str, Callable[[], None]] = {"to_pages": lambda: None, "to_pool": lambda: None}
    blocks: dict[str, list[list[torch.Tensor]] | None] = {"to_pages": None, "to_pool": None}
    buffers = {}
    with ctx.oom_guard() as guard:  # the big allocations, before any collective
        for t, rank, tp in (("to_pages", i, p), ("to_pool", j, d)):
            if rank is not None:  # contents do not matter
                buffers[t] = (_poisoned_pool(g, n * P, tp, rank, ctx.device), _staging(g, n, P, ctx.device))
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, guard.record)
    oom = next((r for r in every if r is not None), None)
    if oom is not None:  # every process sees it and skips the timing together
        return {"oom": oom}
    for t, (pool, pd) in buffers.items():
        params = launches[t]["params"]
        layer_major = pd.pages.transpose(1, 2)  # what the kernels take
        copy_rank(pool, layer_major, table, ids_h, direction=t, backend=backend, launch=params)  # validated once
        work[t] = po.group_transfer([pool], layer_major, table.to(ctx.device), ids_h.to(ctx.device), direction=t,
                                    backend=backend, launch=params)
        blocks[t] = [pd.head_blocks(list(range(n)))]
    transfer = Transfer(placement, [kv_field(g, p, d)], src_blocks=blocks["to_pages"], dst_blocks=blocks["to_pool"],
                        device=ctx.device)
    timings = {"export": ctx.bench_group(work["to_pages"]), "transfer": ctx.bench_group(*transfer.phases()),
               "import": ctx.bench_group(work["to_pool"])}
    link = timings["transfer"].parts[1]  # the exchange step of the same samples: the link ceiling

    meta = PDPagePool(g, n, page_tokens=P, dtype=po.KV_DTYPE, device="meta")  # bytes only: no memory
    base = "d2d-copy" if ctx.device.startswith("cuda") else "cpu-memcpy"
    base_gbps = ctx.ceilings.get(base, {}).get("gbps")
    out = {}
    for direction, t, tp in (("export", "to_pages", p), ("import", "to_pool", d)):
        traffic = meta.traffic(tp_group(g, n * P, tp, dtype=po.KV_DTYPE, device="meta"), slots, ids, direction=t)
        out[direction] = po.measured_fields(
            timings[direction], bytes_moved=traffic.device_bytes, tokens=traffic.tokens,
            ceiling_name=f"{base} x{traffic.ranks}", ceiling_gbps=base_gbps * traffic.ranks if base_gbps else None)
    comm = dist.get_backend()
    ceiling = f"link-{comm} {case.preset} tp{p}:{d} page {P} {backend}"
    link_gbps = transfer.link_bytes / (link.median_us * 1e-6) / 1e9
    ctx.record_ceiling(ceiling, {
        "gbps": link_gbps, "bytes": transfer.link_bytes, "buffer_bytes": transfer.link_bytes,
        "method": f"the transfer's own exchange step ({transfer.link_messages} {comm} messages between the same "
                  "processes, contiguous buffers), timed in the same samples as the transfer; bytes = bytes "
                  "crossing between processes; each sample the slowest process's",
        "timer": link.timer, "samples": link.n_samples, "noise_pct": link.noise_pct,
    })
    out["transfer"] = po.measured_fields(timings["transfer"], bytes_moved=transfer.link_bytes, tokens=n * P,
                                         ceiling_name=ceiling, ceiling_gbps=link_gbps)
    shape = {"transport": "dist", "comm": comm, "processes": placement.world,
             "placement": "shared" if placement.shared else "disjoint", "pages": n,
             "chunk_bytes": po.chunk_bytes(g, P), "link_bytes": transfer.link_bytes,
             "local_bytes": transfer.local_bytes, "link_messages": transfer.link_messages}
    for fields in out.values():
        fields["config"] = dict(shape)
    if transfer.local_bytes:
        out["transfer"]["note"] = (f"placement {placement.describe()}: {transfer.local_bytes} of "
                                   f"{transfer.local_bytes + transfer.link_bytes} bytes stay within a process "
                                   "(local copies, not counted)")
    return out


# ----------------------------------------------------------------------------------------- state page
def _state_row(case: po.PageCase, ctx: RunContext, placement: Placement | None, unsupported: str,
               result: CaseResult, repro: dict[str, Any]) -> None:
    """The hybrid state page across processes (module docstring); one untimed row on rank 0."""
    g = case.ssm
    if g is None:
        return
    p, d = case.tp_prefill, case.tp_decode
    unsupported = unsupported or po.state_page_support(g, p, d)
    if placement is None or unsupported:
        status, reason = "unsupported", unsupported
    else:
        status, reason = _state_roundtrip(case, ctx, placement)
    if dist.get_rank() == 0:
        row = po.page_row(case, ctx, family=g.family, backend="torch", direction="roundtrip", layers=g.layers,
                          repro=repro)
        row.update(status=status, reason=reason, config=json.dumps({"transport": "dist", "comm": dist.get_backend(),
                                                                    "processes": dist.get_world_size()}))
        result.rows.append(row)


def _state_roundtrip(case: po.PageCase, ctx: RunContext, placement: Placement) -> tuple[str, str]:
    g, P, p, d = case.ssm, case.page_size, case.tp_prefill, case.tp_decode
    i, j = _sides(placement)
    ssm, conv = po.rank_states(ctx, g, p)  # every process draws every rank's state: the same bits
    page = pack_state_pages(ssm, conv, g, p)  # [1, nbytes]: the global state page (the reference)
    layout = StatePageLayout.of(g, po.STATE_DTYPE, po.ACT_DTYPE)
    one_page = po.page_bytes(case.attn, P)
    count = state_page_count(layout, one_page)
    label = f"state page tp{p}->tp{d}"

    def staging() -> tuple[torch.Tensor, torch.Tensor]:
        """Poisoned PD pages and, in them, the state bytes `[1, nbytes]` right after the KV pages."""
        pages = _staging(case.attn, STATE_KV_PAGES + count + 1, P, ctx.device).pages
        start = STATE_KV_PAGES * one_page
        return pages, pages.view(torch.uint8).view(-1)[start : start + layout.nbytes].view(1, -1)

    def views(pages: torch.Tensor) -> list[list[torch.Tensor]]:
        start = STATE_KV_PAGES * one_page
        return state_transport(layout, p, d, pages.view(torch.uint8).view(-1)[start : start + layout.nbytes][None])[1]

    fields, _ = state_transport(layout, p, d, None)
    sides: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    if i is not None:
        sides["prefill"] = staging()
        pack_rank_state(sides["prefill"][1], layout, p, i, ssm[i], conv[i])
    if j is not None:
        sides["decode"] = staging()
    Transfer(placement, fields, src_blocks=views(sides["prefill"][0]) if i is not None else None,
             dst_blocks=views(sides["decode"][0]) if j is not None else None, device=ctx.device)()
    made = []
    for side, rank in (("prefill", i), ("decode", j)):
        if rank is None:
            continue
        pages, _ = sides[side]
        reference = po.poison(torch.empty_like(pages))
        ref_bytes = reference.view(torch.uint8).view(-1)
        start = STATE_KV_PAGES * one_page
        ref_bytes[start : start + layout.nbytes] = page[0]
        heads = [f.src[rank] if side == "prefill" else f.dst[rank] for f in fields]
        checks = po.Checks(ctx, case.scenario, f"{label} {side} rank {rank}")
        _check_heads(checks, pages, reference, views, fields, heads, name=f"{side} state page", rhs=f"packed at TP {p}")
        if side == "decode":
            got_ssm, got_conv = unpack_rank_state(sides[side][1], layout, d, rank)
            want_ssm, want_conv = unpack_state_pages(page, g, d, state_dtype=po.STATE_DTYPE, act_dtype=po.ACT_DTYPE)
            checks.same(got_ssm, want_ssm[rank], name="ssm state", rhs=f"TP {p} ranks", contract="4",
                        dims=("request", "layer", "head", "k"))
            checks.same(got_conv, want_conv[rank], name="conv window", rhs=f"TP {p} ranks", contract="4",
                        dims=("request", "layer", "channel"))
        made += checks.made
    status, reason = _group_status(ctx, made)
    return status, reason or f"state page of {layout.nbytes} bytes in {count} page(s) after the KV pages; untimed"
