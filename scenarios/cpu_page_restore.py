"""cpu-page-restore: offload KV pages (GQA, MLA) of every simulated rank of a TP group to CPU pages and
load them back into other slots; the hybrid state page too (SPEC §4, §6; contracts 4 and 5).

Equivalence, per backend and variant, at the case's page size P with every layer of the preset; pools
and pages hold random non-zero bytes, destinations are poisoned (0xA5) first:

* request C (one page) is offloaded first, so its page is ready;
* one offload of request A (P + P/2 + 1 tokens: a full page, then a partial page kept at its tail) and
  request B (2P tokens: a -1 hole, then C's ready page, which the offload must skip);
* one load of A and B into other, scattered slots of a second, poisoned TP group at the same degree;
* compared byte for byte: contract 4: the offloaded page bytes equal the source KV in global head
  order, the ready flags, and each rank's loaded slots equal the source rows of its heads (B's second
  chunk gets C's rows: the ready page was not overwritten); contract 5: the spare page and the unused
  head of A's partial page, every other destination slot and the padding row still hold the poison,
  and the source pools are unchanged.

Timing (variants whose comparisons passed): a separate transfer of `--pages` full pages (auto: about
64 MiB per call on CUDA) between shuffled pool slots and shuffled pages, index tensors already on the
device (`page_options.group_transfer`); the page bookkeeping of `CPUPagePool` (ready flags) is host
work outside the timed call. Rows (`direction`):

    d2h, h2d                  direct variant: the kernel reads / writes pinned host memory itself
    d2h-staged, h2d-staged    staged variant, the whole transfer (device gather + bulk DMAs)
    gather, scatter           staged variant, its device half alone (pool <-> contiguous staging)

Cost model (bytes per timed call, from `CPUPagePool.traffic` and `kv_pool.group_traffic`): each token
row that moves, of each taking-part rank (the writers of each head slice for an offload, every rank
for a load: with MLA every rank loads the whole latent), all layers, that rank's heads. Host rows
count it once, as it crosses PCIe once (judged against `d2h-pinned` / `h2d-pinned`); gather/scatter
rows count device bytes read plus written (against `d2d-copy`). Index tables are not counted. On a
CPU run every row is judged against `cpu-memcpy` and its timings are CPU timings.

Hybrid state page (presets with SSM layers): one request's accepted conv window and SSM state (random
bytes, fp32 state, bf16 conv, in the layout `snapshot` returns) of every rank at the case's TP is
packed into the global state page, written into the CPU pages right after the request's two KV pages,
read back and unpacked at the same TP: byte-exact (contract 4), and the KV pages, the page after it
and the rest of its last page untouched (contract 5). Untimed: its row has direction `roundtrip`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scenarios import page_options as po
from scenarios.base import CaseMemory, CaseResult, RunContext
from scenarios.page_tuning import kernel_name, launch_config
from states.cpu_pages import CPUPagePool
from states.kv_pool import KVPool, copy_group, group_traffic, page_rows

SPARE_SLOTS = 2  # pool slots no request uses (contract 5)
PAGE_DIMS = ("layer", "token", "head")
POOL_DIMS = ("rank", "layer", "token", "head")
DIRECTIONS = {  # (variant, direction) -> (row direction, ceiling)
    ("direct", "to_pages"): ("d2h", "d2h-pinned"),
    ("direct", "to_pool"): ("h2d", "h2d-pinned"),
    ("staged", "to_pages"): ("d2h-staged", "d2h-pinned"),
    ("staged", "to_pool"): ("h2d-staged", "h2d-pinned"),
}
DEVICE_HALF = {"to_pages": "gather", "to_pool": "scatter"}  # staged rows of the device half alone


@dataclass(frozen=True)
class Layout:
    """Slots and pages of the compared transfers (module docstring); slots in token order."""

    P: int
    tail: int  # tokens of A's partial last page
    src: dict[str, torch.Tensor]  # C, A, B -> source pool slots
    dst: dict[str, torch.Tensor]  # A, B -> destination pool slots
    page: dict[str, int]  # c, a0, a1, spare -> CPU page id
    src_tokens: int
    dst_tokens: int

    @classmethod
    def make(cls, P: int, gen: torch.Generator) -> Layout:
        tail = P // 2 + 1
        sizes = {"C": P, "A": P + tail, "B": 2 * P}
        loaded = {"A": sizes["A"], "B": sizes["B"]}
        src_tokens, dst_tokens = sum(sizes.values()) + SPARE_SLOTS, sum(loaded.values()) + SPARE_SLOTS
        src, dst = po.scatter_slots(sizes, src_tokens, gen), po.scatter_slots(loaded, dst_tokens, gen)
        page = dict(zip(("c", "a0", "a1", "spare"), torch.randperm(4, generator=gen).tolist(), strict=True))
        return cls(P, tail, src, dst, page, src_tokens, dst_tokens)

    def ids(self, request: str) -> torch.Tensor:
        """The request's page ids: C [c], A [a0, a1], B [-1 hole, c (ready)]."""
        p = self.page
        return torch.tensor({"C": [p["c"]], "A": [p["a0"], p["a1"]], "B": [-1, p["c"]]}[request])


class CpuPageRestore:
    name = "cpu-page-restore"
    help = ("Offload GQA/MLA KV pages of a TP group to pinned CPU pages (a hole, a ready page, a tail page) and "
            "load them into other slots: byte-exact, untouched memory checked; GB/s vs the pinned-copy ceilings.")
    families = ("gqa", "mla")

    def plan(self, options: dict[str, Any]) -> list[po.PageCase]:
        return po.plan_cpu_page_restore(self.name, options)

    def memory(self, case: po.PageCase, device: str) -> CaseMemory:
        return po.page_case_memory(case, device)

    def launch(self, case: po.PageCase, ctx: RunContext) -> None:
        """The case's Triton launches, for a compile-ahead pass to record (harness/gate.py): the case
        itself, whose work is the transfers and their byte compares, little next to compiling them."""
        self.run(case, ctx)

    def run(self, case: po.PageCase, ctx: RunContext) -> CaseResult:
        result = CaseResult()
        g, P, tp = case.attn, case.page_size, case.tp_prefill
        layout = Layout.make(P, torch.Generator().manual_seed(ctx.seed * 31 + P))
        tick = ctx.progress(f"{self.name} {case.preset} P={P} tp{tp}", len(case.backends) * len(case.variants))
        with ctx.oom_guard() as guard:
            kv, src = po.source_group(g, layout.src_tokens, tp, po.generator(ctx, P), ctx.device)
            before = [p.kv.clone() for p in src]
        if guard.record is not None:
            result.ooms.append({"scenario": self.name, "preset": case.preset, "page_size": P, **guard.record})
        for backend in case.backends:
            for variant in case.variants:
                named = _rows(case, ctx, backend, variant)
                launch = {d: _launch(case, ctx, backend, variant, d) for d in ("to_pages", "to_pool")}
                oom = guard.record
                if oom is None:
                    with ctx.oom_guard() as variant_guard:
                        checks = _roundtrip(case, ctx, backend, variant, layout, kv, src, before, launch)
                        status, reason = checks.status()
                        timed = {}
                        if status == "passed" and ctx.time_cases:
                            timed = _time(case, ctx, backend, variant, launch)
                    oom = variant_guard.record
                    if oom is not None:
                        result.ooms.append({**named[0][0], **oom})
                if oom is not None:
                    status, reason, timed = "oom", oom.get("message", "out of memory"), {}
                for row, direction in named:
                    row.update(config=launch[direction]["config"], config_source=launch[direction]["source"],
                               status=status, reason=reason, **timed.get(row["direction"], {}))
                    result.rows.append(row)
                tick()
        po.state_page_row(case, ctx, result, repro={"page_size": str(P), "tp": str(tp), "preset": case.preset},
                          make_pages=lambda n: CPUPagePool(g, n, page_size=P, dtype=po.KV_DTYPE).pages)
        return result


def _rows(case: po.PageCase, ctx: RunContext, backend: str, variant: str) -> list[tuple[dict[str, Any], str]]:
    """`(row, transfer direction)` of one (backend, variant): both directions, and for the staged
    variant the device halves too."""
    names = [(DIRECTIONS[variant, d][0], d) for d in ("to_pages", "to_pool")]
    if variant == "staged":
        names += [(DEVICE_HALF[d], d) for d in ("to_pages", "to_pool")]
    repro = {"page_size": str(case.page_size), "tp": str(case.tp_prefill), "variant": variant, "preset": case.preset}
    return [(po.page_row(case, ctx, family=case.attn.family, backend=backend, direction=name, layers=case.attn.layers,
                         repro=repro), d) for name, d in names]


def _launch(case: po.PageCase, ctx: RunContext, backend: str, variant: str, direction: str) -> dict[str, Any]:
    """Launch parameters of one direction (triton only), with the row's config JSON and its source."""
    g = case.attn
    pages = case.timed_pages(po.page_bytes(g, case.page_size), ctx.device)
    params, source = {}, "fixed"
    if backend == "triton":
        params, source = launch_config(ctx, case, kernel_name(direction, variant, pd=False), case.tp_prefill, pages)
    return {"params": params, "source": source,
            "config": po.config_json(variant, pages, po.chunk_bytes(g, case.page_size), params)}


def _roundtrip(case: po.PageCase, ctx: RunContext, backend: str, variant: str, layout: Layout, kv: torch.Tensor,
               src: list[KVPool], before: list[torch.Tensor], launch: dict[str, Any]) -> po.Checks:
    """The compared offload and load of one (backend, variant); see the module docstring."""
    g, P, tp = case.attn, layout.P, case.tp_prefill
    checks = po.Checks(ctx, case.scenario, f"{variant}/{backend} tp{tp}")
    cpu = CPUPagePool(g, 4, page_size=P, dtype=po.KV_DTYPE)
    po.poison(cpu.pages)
    up, down = launch["to_pages"]["params"], launch["to_pool"]["params"]
    cpu.offload(src, layout.src["C"], layout.ids("C"), backend=backend, variant=variant, **up)
    cpu.offload(src, [layout.src["A"], layout.src["B"]], [layout.ids("A"), layout.ids("B")], backend=backend,
                variant=variant, **up)
    dst = po.poisoned_group(g, layout.dst_tokens, tp, ctx.device)
    cpu.load(dst, [layout.dst["A"], layout.dst["B"]], [layout.ids("A"), layout.ids("B")], backend=backend,
             variant=variant, **down)
    po.settle(ctx)

    pg, tail = layout.page, layout.tail
    written = torch.cat([cpu.pages[pg["c"]], cpu.pages[pg["a0"]], cpu.pages[pg["a1"], :, P - tail :]], dim=1)
    want = kv[:, torch.cat([layout.src["C"], layout.src["A"]]).to(kv.device)]  # [L, tokens, heads, D]
    checks.same(written, want, name="offloaded pages", rhs="source KV", contract="4", dims=PAGE_DIMS)
    ready = torch.zeros(4, dtype=torch.bool)
    ready[[pg["c"], pg["a0"], pg["a1"]]] = True
    checks.same(cpu.ready, ready, name="ready flags", rhs="pages offloaded", contract="4", dims=())
    checks.untouched(torch.cat([cpu.pages[pg["spare"]], cpu.pages[pg["a1"], :, : P - tail]], dim=1),
                     name="untouched pages", dims=PAGE_DIMS)

    # A comes back whole; B's hole stays poison and its second chunk holds C's rows (the ready page).
    moved_dst = torch.cat([layout.dst["A"], layout.dst["B"][P:]])
    moved_src = torch.cat([layout.src["A"], layout.src["C"]])
    checks.same(po.rank_rows(dst, moved_dst), po.expected_rows(kv, dst, moved_src), name="loaded slots",
                rhs="source KV", contract="4", dims=POOL_DIMS)
    checks.untouched(po.rank_rows(dst, po.other_slots(layout.dst_tokens, moved_dst)),
                     name="untouched slots and padding row", dims=POOL_DIMS)
    checks.same(torch.stack([p.kv for p in src]), torch.stack(before), name="source pools",
                rhs="before the transfers", contract="5", dims=POOL_DIMS)
    return checks


def _time(case: po.PageCase, ctx: RunContext, backend: str, variant: str,
          launch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Timing fields per row direction, on a transfer of full pages between shuffled slots and pages."""
    g, P, tp = case.attn, case.page_size, case.tp_prefill
    n = case.timed_pages(po.page_bytes(g, P), ctx.device)
    gen = torch.Generator().manual_seed(ctx.seed + P)
    pools = po.poisoned_group(g, n * P, tp, ctx.device)  # contents do not matter for timing
    cpu = CPUPagePool(g, n, page_size=P, dtype=po.KV_DTYPE)
    slots, ids = torch.randperm(n * P, generator=gen), torch.randperm(n, generator=gen)
    table, ids_h = page_rows(slots, ids, P, "tail")
    table_d, ids_d = table.to(ctx.device), ids_h.to(ctx.device)
    local = pools[0].shard.local_heads
    staging = None
    if variant == "staged":
        staging = torch.empty((n, g.layers, P, pools[0].parts * local, g.head_dim), dtype=po.KV_DTYPE,
                              device=ctx.device)
    out: dict[str, dict[str, Any]] = {}
    for direction in ("to_pages", "to_pool"):
        params = launch[direction]["params"]
        # validated once (indices, devices, pinning), then timed without validation
        copy_group(pools, cpu.pages, table, ids_h, direction=direction, backend=backend, variant=variant,
                   launch=params)
        traffic = cpu.traffic(pools, slots, ids, direction=direction, variant=variant)
        fn = po.group_transfer(pools, cpu.pages, table_d, ids_d, direction=direction, backend=backend,
                               variant=variant, launch=params, staging=staging)
        name, ceiling = DIRECTIONS[variant, direction]
        out[name] = po.timing_fields(ctx, fn, bytes_moved=traffic.host_bytes, tokens=traffic.tokens, ceiling=ceiling)
        if staging is not None:
            # the device half alone: every rank's gather into (scatter from) its staging pages
            rows = torch.arange(n, device=ctx.device)
            half = po.group_transfer(pools, staging, table_d, rows, direction=direction, backend=backend,
                                     launch=params, rank_pages=True)
            moved = group_traffic(pools, table, ids_h, direction=direction, host=False)
            out[DEVICE_HALF[direction]] = po.timing_fields(ctx, half, bytes_moved=moved.device_bytes,
                                                           tokens=moved.tokens, ceiling="d2d-copy")
    return out
