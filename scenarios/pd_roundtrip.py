"""pd-roundtrip: a prefill TP group at TP p exports KV into PD staging pages, a decode TP group at TP d
imports it, for every TP pair asked; GQA and MLA; the hybrid state page too (SPEC §4, §6; contracts 4
and 5).

Two transports (`--transport`). `local` (the default, this module): both groups are simulated ranks
(head slices) in one process over the same page tensor: each prefill rank writes its head slice, one
rank per replicated slice (MLA: rank 0 alone), and every decode rank reads its slice at its own degree
(MLA: every rank the whole latent). `dist` (scenarios/pd_dist.py): the ranks are processes of one
`torch.distributed` group (NCCL on GPUs, gloo on CPUs), each side with its own pages, and the head
slices travel between them; what follows describes the local transport.

Equivalence, per backend, at the case's page size P (`--page-tokens`) with every layer of the preset;
pools hold random non-zero bytes (replica ranks other random bytes than their writer, so a second
write of a replicated slice shows), destinations are poisoned (0xA5) first:

* request A (P + P/2 + 1 tokens: a full page, then a partial page filled from its first position) and
  request B (2P tokens: a -1 chunk that is not sent, then a full page) are written by the prefill group
  and read into other, scattered slots of the decode group;
* contract 4: the page bytes equal the prefill KV in global head order, token-major; each decode
  rank's slots equal the prefill rows of its heads; contract 5: the spare page and the unused end of
  A's partial page, every other decode slot (B's skipped chunk included) and the padding row still
  hold the poison, and the prefill pools are unchanged.

Timing (backends whose comparisons passed): a separate export (`write`) and import (`read`) of
`--pages` full pages (auto: about 64 MiB per call on CUDA) between shuffled slots and shuffled pages,
index tensors already on the device. Rows have direction `export` and `import`.

Cost model (bytes per timed call, from `PDPagePool.traffic`): each token row that moves, of each
taking-part rank (the writers for an export, every decode rank for an import), all layers, that rank's
heads, read from device memory and written to device memory: twice the row bytes, judged against the
`d2d-copy` ceiling (read + written bytes of a device copy). Index tables are not counted.

Hybrid state page (presets with SSM layers): packed at TP p into the PD pages right after the
request's KV pages, read back and unpacked at TP d, byte-exact (see `page_options.state_page_row`).
"""

from __future__ import annotations

from typing import Any

import torch

from scenarios import page_options as po
from scenarios import pd_dist
from scenarios.base import CaseMemory, CaseResult, RunContext
from scenarios.page_tuning import kernel_name, launch_config
from scenarios.pd_layout import Layout
from states.kv_pool import KVPool, copy_group, page_rows
from states.pd_pages import PDPagePool

PAGE_DIMS = ("token", "layer", "head")
POOL_DIMS = ("rank", "layer", "token", "head")
ROW_DIRECTION = {"to_pages": "export", "to_pool": "import"}


class PdRoundtrip:
    name = "pd-roundtrip"
    help = ("Prefill at TP p writes KV into PD staging pages, decode at TP d reads it (every TP pair asked), "
            "GQA and MLA: byte-exact, untouched memory checked; GB/s vs the device-to-device ceiling. "
            "--transport local simulates every rank in this process; --transport dist runs the ranks as processes "
            "of one torch.distributed group (NCCL on --device cuda, one GPU per process; gloo on CPU), started "
            "by --nproc N or by torchrun: prefill rank i in process i, decode rank j in process N-1-j, so the "
            "sides are disjoint when p + d <= N and share the middle processes otherwise; a pair needs max(p, d) "
            "processes. Transfer rows are judged against the link ceiling (the same bytes by plain send/recv).")
    families = ("gqa", "mla")

    def plan(self, options: dict[str, Any]) -> list[po.PageCase]:
        cases = po.plan_pd_roundtrip(self.name, options)
        pd_dist.check_transport(options, cases)
        return cases

    def notes(self, options: dict[str, Any], cases: list[po.PageCase]) -> list[str]:
        """One line per preset whose heads the default sweep of TP pairs cannot take at every degree, and
        for --transport dist the pairs that need more processes than it has (they are unsupported rows)."""
        notes = []
        if options.get("tp_pairs") is None:
            for preset in dict.fromkeys(c.preset for c in cases):
                skipped = po.skipped_degrees(preset)
                if skipped:
                    notes.append(f"{preset}: {skipped}")
        if (options.get("transport") or "local") == "dist" and options.get("nproc") is not None:
            n = int(options["nproc"])
            big = sorted({(c.tp_prefill, c.tp_decode) for c in cases if max(c.tp_prefill, c.tp_decode) > n})
            if big:
                notes.append(f"pairs {', '.join(f'{p}:{d}' for p, d in big)} need more than --nproc {n} processes: "
                             "their rows are unsupported")
        return notes

    def memory(self, case: po.PageCase, device: str) -> CaseMemory:
        return po.page_case_memory(case, device)

    def launch(self, case: po.PageCase, ctx: RunContext) -> None:
        """The case's Triton launches, for a compile-ahead pass to record (harness/gate.py): the case
        itself (transfers and byte compares), or nothing with `--transport dist`, whose ranks launch in
        processes of their own."""
        if case.options.get("transport") != "dist":
            self.run(case, ctx)

    def run(self, case: po.PageCase, ctx: RunContext) -> CaseResult:
        g, P = case.attn, case.page_size
        p, d = case.tp_prefill, case.tp_decode
        repro = {"preset": case.preset, "page_tokens": str(P), "tp_pairs": f"{p}:{d}"}
        if case.options.get("transport") == "dist":
            return pd_dist.run_case(case, ctx, lambda backend, t: _launch(case, ctx, backend, t), repro)
        result = CaseResult()
        layout = Layout.make(P, torch.Generator().manual_seed(ctx.seed * 37 + P + 100 * p + d))
        with ctx.oom_guard() as guard:
            kv, src = po.source_group(g, layout.tokens, p, po.generator(ctx, P + p), ctx.device)
            before = [pool.kv.clone() for pool in src]
        if guard.record is not None:
            result.ooms.append({"scenario": self.name, "preset": case.preset, "page_size": P, **guard.record})
        for backend in case.backends:
            launch = {t: _launch(case, ctx, backend, t) for t in ("to_pages", "to_pool")}
            rows = {t: po.page_row(case, ctx, family=g.family, backend=backend, direction=name, layers=g.layers,
                                   repro=repro) for t, name in ROW_DIRECTION.items()}
            oom = guard.record
            if oom is None:
                with ctx.oom_guard() as backend_guard:
                    status, reason = _roundtrip(case, ctx, backend, layout, kv, src, before, launch).status()
                    timed = _time(case, ctx, backend, launch) if status == "passed" and ctx.time_cases else {}
                oom = backend_guard.record
                if oom is not None:
                    result.ooms.append({**rows["to_pages"], **oom})
            if oom is not None:
                status, reason, timed = "oom", oom.get("message", "out of memory"), {}
            for t, row in rows.items():
                row.update(config=launch[t]["config"], config_source=launch[t]["source"], status=status,
                           reason=reason, **timed.get(t, {}))
                result.rows.append(row)
        po.state_page_row(case, ctx, result, repro=repro,
                          make_pages=lambda n: PDPagePool(g, n, page_tokens=P, dtype=po.KV_DTYPE,
                                                          device=ctx.device).pages)
        return result


def _launch(case: po.PageCase, ctx: RunContext, backend: str, direction: str) -> dict[str, Any]:
    """Launch parameters of one side (triton only: the writing side's TP for an export, the reading
    side's for an import), with the row's config JSON and its source."""
    g = case.attn
    pages = case.timed_pages(po.page_bytes(g, case.page_size), ctx.device)
    tp = case.tp_prefill if direction == "to_pages" else case.tp_decode
    params, source = {}, "fixed"
    if backend == "triton":
        params, source = launch_config(ctx, case, kernel_name(direction, "direct", pd=True), tp, pages)
    return {"params": params, "source": source,
            "config": po.config_json("direct", pages, po.chunk_bytes(g, case.page_size), params)}


def _roundtrip(case: po.PageCase, ctx: RunContext, backend: str, layout: Layout, kv: torch.Tensor,
               src: list[KVPool], before: list[torch.Tensor], launch: dict[str, Any]) -> po.Checks:
    """The compared export and import of one backend; see the module docstring."""
    g, P = case.attn, layout.P
    checks = po.Checks(ctx, case.scenario, f"{backend} tp{case.tp_prefill}->tp{case.tp_decode}")
    pd = PDPagePool(g, 4, page_tokens=P, dtype=po.KV_DTYPE, device=ctx.device)
    po.poison(pd.pages)
    pd.write(src, [layout.src["A"], layout.src["B"]], layout.ids(), backend=backend, **launch["to_pages"]["params"])
    dst = po.poisoned_group(g, layout.tokens, case.tp_decode, ctx.device)
    pd.read(dst, [layout.dst["A"], layout.dst["B"]], layout.ids(), backend=backend, **launch["to_pool"]["params"])

    pg, tail = layout.page, layout.tail
    sent_src = torch.cat([layout.src["A"], layout.src["B"][P:]])  # B's first chunk is not sent
    written = torch.cat([pd.pages[pg["a0"]], pd.pages[pg["a1"], :tail], pd.pages[pg["b1"]]])
    want = kv[:, sent_src.to(kv.device)].transpose(0, 1)  # token-major [tokens, L, heads, D]
    checks.same(written, want, name="exported pages", rhs="prefill KV", contract="4", dims=PAGE_DIMS)
    checks.untouched(torch.cat([pd.pages[pg["spare"]], pd.pages[pg["a1"], tail:]]), name="untouched pages",
                     dims=PAGE_DIMS)
    sent_dst = torch.cat([layout.dst["A"], layout.dst["B"][P:]])
    checks.same(po.rank_rows(dst, sent_dst), po.expected_rows(kv, dst, sent_src), name="imported slots",
                rhs="prefill KV", contract="4", dims=POOL_DIMS)
    checks.untouched(po.rank_rows(dst, po.other_slots(layout.tokens, sent_dst)),
                     name="untouched slots and padding row", dims=POOL_DIMS)
    checks.same(torch.stack([pool.kv for pool in src]), torch.stack(before), name="prefill pools",
                rhs="before the roundtrip", contract="5", dims=POOL_DIMS)
    return checks


def _time(case: po.PageCase, ctx: RunContext, backend: str, launch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Timing fields per direction, on an export and an import of full pages between shuffled slots
    and shuffled pages."""
    g, P = case.attn, case.page_size
    n = case.timed_pages(po.page_bytes(g, P), ctx.device)
    gen = torch.Generator().manual_seed(ctx.seed + P)
    groups = {"to_pages": po.poisoned_group(g, n * P, case.tp_prefill, ctx.device),  # contents do not matter
              "to_pool": po.poisoned_group(g, n * P, case.tp_decode, ctx.device)}
    pd = PDPagePool(g, n, page_tokens=P, dtype=po.KV_DTYPE, device=ctx.device)
    slots, ids = torch.randperm(n * P, generator=gen), torch.randperm(n, generator=gen)
    table, ids_h = page_rows(slots, ids, P, "head")
    layer_major = pd.pages.transpose(1, 2)  # what the kernels take (PDPagePool does the same)
    out = {}
    for direction, pools in groups.items():
        params = launch[direction]["params"]
        # validated once (indices, devices), then timed without validation
        copy_group(pools, layer_major, table, ids_h, direction=direction, backend=backend, launch=params)
        traffic = pd.traffic(pools, slots, ids, direction=direction)
        fn = po.group_transfer(pools, layer_major, table.to(ctx.device), ids_h.to(ctx.device), direction=direction,
                               backend=backend, launch=params)
        out[direction] = po.timing_fields(ctx, fn, bytes_moved=traffic.device_bytes, tokens=traffic.tokens,
                                          ceiling="d2d-copy")
    return out
