"""What the KV page scenarios (cpu-page-restore, pd-roundtrip) share: option parsing into cases, bit
patterns and poison, byte comparisons, the TP group transfer that is timed, row identity and timing
fields, and the hybrid state page roundtrip (SPEC §4, §6, §7).

`plan_cpu_page_restore` / `plan_pd_roundtrip` validate everything before any work, so bad input fails
with one line and no run directory: an unknown preset or one without attention KV layers, a page size
that is not a power of two in [16, 1024], pages per transfer outside [1, 65536], a TP degree that
neither divides nor multiplies the preset's KV heads or does not divide its SSM heads, an unknown backend or variant, `--device cuda`
on a machine without CUDA.

Byte comparisons go through `ctx.compare` on integer views of the raw bytes: 8-byte words when a
tensor's rows are a multiple of 8 bytes (every preset's are), else bytes. Equal words are equal bytes,
so this is byte-exact, and it is about ten times cheaper than comparing single bytes, which matters at
real page sizes (a 1024-token DeepSeek-V3 page is 72 MB).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from kernels.pages import VARIANTS, check_page_size, page_copy
from scenarios.base import CaseMemory, CaseResult, RunContext
from scenarios.options import check_device, given, parse_int, parse_int_list, split_list
from states.base import DTYPE_NAMES
from states.geometry import AttnGeometry, SSMGeometry
from states.kv_pool import KVPool, tp_group
from states.presets import Preset, get_attn_preset
from states.state_pages import (
    StatePageLayout,
    pack_state_pages,
    read_state_bytes,
    state_page_count,
    unpack_state_pages,
    write_state_bytes,
)

PAGE_BACKENDS = ("torch", "triton")
TP_DEGREES = (1, 2, 4, 8)  # the TP degrees pd-roundtrip pairs by default
MAX_PAGES = 1 << 16
SEED_MAX = 2**31 - 1
SENTINEL = 0xA5  # every destination byte before a transfer
KV_DTYPE = torch.bfloat16
# `--pages auto`: on CUDA, pages per timed transfer so that one call moves about this many bytes (tens
# of MB, so launch and sync overheads do not dominate); on CPU, where runs are for correctness (and
# Triton is interpreted), a fixed small number.
AUTO_TRANSFER_BYTES = 64 << 20
CPU_AUTO_PAGES = 2


@dataclass(frozen=True)
class PageCase:
    """One point of a page scenario sweep: a preset at one page size and one TP pair.

    cpu-page-restore offloads and loads at one TP degree (`tp_prefill == tp_decode`); pd-roundtrip
    writes at `tp_prefill` and reads at `tp_decode`. `pages` is the pages per timed transfer (None:
    auto, see `timed_pages`); `options` are the run's CLI options (repro commands).
    """

    scenario: str
    preset: str
    backends: tuple[str, ...]
    variants: tuple[str, ...]
    page_size: int
    tp_prefill: int
    tp_decode: int
    pages: int | None
    options: dict[str, Any]

    @property
    def label(self) -> str:
        """The case in one readable line (gate failure lines, JUnit names)."""
        tp = f"tp {self.tp_prefill}" if self.scenario == "cpu-page-restore" else f"tp {self.tp_prefill}:{self.tp_decode}"
        return f"{self.scenario} {self.preset}, page size {self.page_size}, {tp}"

    @property
    def attn(self) -> AttnGeometry:
        return get_attn_preset(self.preset).attn

    @property
    def ssm(self) -> SSMGeometry | None:
        """The preset's SSM layers with global heads (a preset holds one rank's heads at its own TP)."""
        return global_ssm(get_attn_preset(self.preset))

    def timed_pages(self, one_page: int, device: str) -> int:
        """Pages per timed transfer: `--pages`, else (auto) enough pages of `one_page` bytes to move
        `AUTO_TRANSFER_BYTES` on CUDA (at least one), `CPU_AUTO_PAGES` on CPU."""
        if self.pages is not None:
            return self.pages
        if not device.startswith("cuda"):
            return CPU_AUTO_PAGES
        return max(1, min(MAX_PAGES, -(-AUTO_TRANSFER_BYTES // one_page)))


def global_ssm(preset: Preset) -> SSMGeometry | None:
    if preset.ssm is None:
        return None
    s = preset.ssm
    return dataclasses.replace(s, key_heads=s.key_heads * preset.tp, value_heads=s.value_heads * preset.tp)


# ------------------------------------------------------------------------------------------- parsing
def parse_page_sizes(value: Any, flag: str) -> list[int]:
    sizes = parse_int_list(value, flag)
    for size in sizes:
        try:
            check_page_size(size)
        except ValueError as e:
            raise ValueError(f"{flag}: {e}") from None
    return sizes


def parse_pages(value: Any) -> int | None:
    """Pages per timed transfer; None (auto) when not given or `auto`."""
    if value is None or str(value).strip() == "auto":
        return None
    try:
        pages = int(str(value))
    except ValueError:
        pages = 0
    if not 1 <= pages <= MAX_PAGES:
        raise ValueError(f"--pages must be an integer in [1, {MAX_PAGES}] (pages per timed transfer) or auto, "
                         f"got {value!r}")
    return pages


def parse_presets(value: Any) -> list[str]:
    names = split_list(given(value, "tiny-gdn"), "--preset")
    for name in names:
        try:
            get_attn_preset(name)
        except ValueError as e:  # naming the choices
            raise ValueError(f"--preset: {e}") from None
    return names


def check_tp(preset: str, tp: int, flag: str = "--tp") -> None:
    """ValueError unless every head group of the preset can take TP `tp`: it divides or multiplies the KV
    heads (MLA: any TP >= 1), and, in a hybrid preset, divides the SSM key and value heads, which are split
    over the ranks, never replicated. A model that cannot run at `tp` has no KV pages at `tp` to move either."""
    if tp < 1:
        raise ValueError(f"{flag}: TP degrees must be >= 1, got {tp}")
    found = get_attn_preset(preset)
    try:
        found.attn.local_kv_heads(tp)
    except ValueError as e:
        raise ValueError(f"{flag}: preset {preset}: {e}") from None
    ssm = global_ssm(found)
    if ssm is not None and (ssm.key_heads % tp or ssm.value_heads % tp):
        raise ValueError(f"{flag}: preset {preset}: TP {tp} does not divide its {ssm.key_heads} SSM key / "
                         f"{ssm.value_heads} value heads (the linear-attention layers split heads over the ranks)")


def tp_degrees(preset: str) -> list[int]:
    """The TP degrees of `TP_DEGREES` every head group of the preset can take (the default sweep)."""
    return [t for t in TP_DEGREES if _allows(preset, t)]


def skipped_degrees(preset: str) -> str | None:
    """What the default sweep of TP pairs leaves out for `preset` and why, in words (None: nothing), e.g.
    `TP 4, 8 left out: TP 4 does not divide its 2 SSM key / 4 value heads (...)`."""
    left_out = [t for t in TP_DEGREES if not _allows(preset, t)]
    if not left_out:
        return None
    try:
        check_tp(preset, left_out[0], "")
    except ValueError as e:
        why = str(e).split(f"preset {preset}: ", 1)[-1]
    return f"pairs with TP {', '.join(map(str, left_out))} left out: {why}"


def parse_tp_pairs(value: Any, preset: str) -> list[tuple[int, int]]:
    """`p:d` pairs; default every pair of `TP_DEGREES` the preset's heads allow."""
    if value is None:
        allowed = tp_degrees(preset)
        return [(p, d) for p in allowed for d in allowed]
    pairs = []
    for item in split_list(value, "--tp-pairs"):
        p, sep, d = item.partition(":")
        if not sep or not p.strip().isdigit() or not d.strip().isdigit():
            raise ValueError(f"--tp-pairs takes prefill:decode pairs like 1:2,8:1, got {item!r}")
        pair = (int(p), int(d))
        for tp in pair:
            check_tp(preset, tp, "--tp-pairs")
        pairs.append(pair)
    return pairs


def _allows(preset: str, tp: int) -> bool:
    try:
        check_tp(preset, tp)
    except ValueError:
        return False
    return True


def parse_backends(value: Any, device: str) -> list[str]:
    backends = split_list(given(value, "torch"), "--backend")
    for b in backends:
        if b not in PAGE_BACKENDS:
            raise ValueError(f"--backend: unknown backend {b!r}; page kernels run on {', '.join(PAGE_BACKENDS)}")
    check_device(device, backends)
    return backends


def parse_variants(value: Any) -> list[str]:
    variants = split_list(given(value, ",".join(VARIANTS)), "--variant")
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"--variant: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    return variants


def plan_cpu_page_restore(scenario: str, options: dict[str, Any]) -> list[PageCase]:
    """One case per preset x TP degree x page size."""
    device = given(options.get("device"), "cpu")
    backends = parse_backends(options.get("backend"), device)
    variants = parse_variants(options.get("variant"))
    sizes = parse_page_sizes(given(options.get("page_size"), "256"), "--page-size")
    pages = parse_pages(options.get("pages"))
    presets = parse_presets(options.get("preset"))
    tps = parse_int_list(given(options.get("tp"), "1"), "--tp")
    for preset in presets:
        for tp in tps:
            check_tp(preset, tp)
    _check_seed(options)
    opts = {**options, "scenario": scenario}
    return [
        PageCase(scenario, preset, tuple(backends), tuple(variants), size, tp, tp, pages, opts)
        for preset in presets for tp in tps for size in sizes
    ]  # fmt: skip


def plan_pd_roundtrip(scenario: str, options: dict[str, Any]) -> list[PageCase]:
    """One case per preset x page size x TP pair (PD transfers have one variant: the direct kernel)."""
    device = given(options.get("device"), "cpu")
    backends = parse_backends(options.get("backend"), device)
    sizes = parse_page_sizes(given(options.get("page_tokens"), "256"), "--page-tokens")
    pages = parse_pages(options.get("pages"))
    _check_seed(options)
    opts = {**options, "scenario": scenario}
    cases = []
    for preset in parse_presets(options.get("preset")):
        for p, d in parse_tp_pairs(options.get("tp_pairs"), preset):
            cases += [PageCase(scenario, preset, tuple(backends), ("direct",), size, p, d, pages, opts)
                      for size in sizes]
    return cases


def _check_seed(options: dict[str, Any]) -> None:
    parse_int(given(options.get("seed"), 0), "--seed", 0, SEED_MAX)


def page_case_memory(case: PageCase, device: str) -> CaseMemory:
    """Predicted memory of a page case: the compared transfers' pools (source, a copy of it, the
    destination group; a few tokens over four pages) and the timed transfer's (a pool group of
    `pages x page size` tokens per side, the pages, the staging pages), every rank's heads counted
    (replicated heads once per rank that holds them). CPU pages are host memory on any device."""
    g, P = case.attn, case.page_size
    parts = 2 if g.family == "gqa" else 1
    row = g.layers * parts * g.head_dim * KV_DTYPE.itemsize  # one token, one head

    def group(tokens: int, tp: int) -> int:
        return (tokens + 1) * row * g.local_kv_heads(tp) * tp

    compared_tokens = 4 * P + 8
    n = case.timed_pages(page_bytes(g, P), device)
    pools = 3 * group(compared_tokens, case.tp_prefill) + group(compared_tokens, case.tp_decode)
    pools += group(n * P, case.tp_prefill) + group(n * P, case.tp_decode)
    pages = (n + 4) * page_bytes(g, P)
    staging = n * page_bytes(g, P) if "staged" in case.variants else 0
    host_pages = case.scenario == "cpu-page-restore" and device.startswith("cuda")
    return CaseMemory(
        subject=f"--pages {case.pages or 'auto'} ({n} pages of {P} tokens, --preset {case.preset})",
        device=pools + staging + (0 if host_pages else pages), host=pages if host_pages else 0,
        hint="lower --pages or the page size",
    )


# ---------------------------------------------------------------------------------- bits and groups
def random_bits(shape: Iterable[int], dtype: torch.dtype, gen: torch.Generator, device: str) -> torch.Tensor:
    """Random non-zero bytes viewed as `dtype` (NaN, Inf and denormal patterns included; a copy that
    writes zeros cannot pass)."""
    shape = torch.Size(shape)
    n = shape.numel() * dtype.itemsize
    return torch.randint(1, 256, (n,), dtype=torch.uint8, generator=gen, device=device).view(dtype).view(shape)


def poison(t: torch.Tensor) -> torch.Tensor:
    t.view(torch.uint8).fill_(SENTINEL)
    return t


def scatter_slots(sizes: dict[str, int], tokens: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Disjoint random slots of a pool of `tokens` slots for each request (`sizes`: request -> tokens)."""
    perm = torch.randperm(tokens, generator=gen)
    out, start = {}, 0
    for name, n in sizes.items():
        out[name] = perm[start : start + n]
        start += n
    return out


def generator(ctx: RunContext, salt: int) -> torch.Generator:
    return torch.Generator(device=ctx.device).manual_seed(ctx.seed * 1000 + salt)


def source_group(g: AttnGeometry, tokens: int, tp: int, gen: torch.Generator, device: str
                 ) -> tuple[torch.Tensor, list[KVPool]]:
    """Global KV `[L, tokens + 1, parts * H, D]` of random bytes and the TP group holding it: each
    writing rank its head slice; replica ranks other random bytes, so a second write shows."""
    parts = 2 if g.family == "gqa" else 1
    kv = random_bits((g.layers, tokens + 1, parts * g.kv_heads, g.head_dim), KV_DTYPE, gen, device)
    pools = tp_group(g, tokens, tp, dtype=KV_DTYPE, device=device)
    for p in pools:
        own = kv[:, :, p.global_heads().to(device)]
        p.kv.copy_(own if p.shard.writes else random_bits(p.kv.shape, KV_DTYPE, gen, device))
    return kv, pools


def settle(ctx: RunContext) -> None:
    """Wait for the device before the host reads pinned pages: kernels and DMAs write them asynchronously."""
    if ctx.device.startswith("cuda"):
        torch.cuda.synchronize(ctx.device)


def poisoned_group(g: AttnGeometry, tokens: int, tp: int, device: str) -> list[KVPool]:
    pools = tp_group(g, tokens, tp, dtype=KV_DTYPE, device=device)
    for p in pools:
        poison(p.kv)
    return pools


def rank_rows(pools: list[KVPool], slots: torch.Tensor) -> torch.Tensor:
    """`[ranks, L, n, heads, D]`: every rank's rows at `slots`."""
    return torch.stack([p.kv[:, slots.to(p.kv.device)] for p in pools])


def expected_rows(kv: torch.Tensor, pools: list[KVPool], slots: torch.Tensor) -> torch.Tensor:
    """`[ranks, L, n, heads, D]`: the global KV rows at `slots`, each rank's heads."""
    rows = kv[:, slots.to(kv.device)]
    return torch.stack([rows[:, :, p.global_heads().to(kv.device)] for p in pools])


def other_slots(tokens: int, moved: torch.Tensor) -> torch.Tensor:
    """Every pool row (the padding row `tokens` included) not in `moved`."""
    keep = torch.ones(tokens + 1, dtype=torch.bool)
    keep[moved.cpu()] = False
    return keep.nonzero().flatten()


def group_transfer(pools: list[KVPool], pages: torch.Tensor, table: torch.Tensor, ids: torch.Tensor, *,
                   direction: str, backend: str, variant: str = "direct", launch: dict[str, int] | None = None,
                   staging: torch.Tensor | None = None, rank_pages: bool = False) -> Callable[[], None]:
    """The timed call: every taking-part rank's copy (writers for `to_pages`, all ranks for `to_pool`),
    as `kv_pool.copy_group` runs them, but with the index tensors already on the device and no
    validation (which reads them back: a host sync). Validate once with `copy_group` first.
    `rank_pages`: the pages hold only the rank's heads (a staging buffer), so every rank starts at head 0."""
    copy = page_copy(direction, backend, variant)
    extra: dict[str, Any] = dict(launch or {})
    if staging is not None:
        extra["staging"] = staging
    movers = [p for p in pools if p.shard.writes or direction == "to_pool"]

    def run() -> None:
        for p in movers:
            start = 0 if rank_pages else p.shard.head_start
            copy(p.kv, pages, table, ids, parts=p.parts, head_start=start, validate=False, **extra)

    return run


# --------------------------------------------------------------------------------------- comparisons
def _as_words(t: torch.Tensor) -> tuple[torch.Tensor, str]:
    raw = t.contiguous().view(torch.uint8)
    if raw.dim() and raw.shape[-1] % 8 == 0 and raw.storage_offset() % 8 == 0:
        return raw.view(torch.int64), "word"
    return raw, "byte"


class Checks:
    """The byte comparisons of one transfer variant: each recorded into the run as it is made; the
    variant passes only if all of them do."""

    def __init__(self, ctx: RunContext, scenario: str, lhs: str) -> None:
        self.ctx, self.scenario, self.lhs = ctx, scenario, lhs
        self.made: list[Any] = []

    def same(self, actual: torch.Tensor, expected: torch.Tensor, *, name: str, rhs: str, contract: str,
             dims: tuple[str, ...]) -> None:
        a, unit = _as_words(actual)
        b, _ = _as_words(expected.to(actual.device))
        c = self.ctx.compare(a, b, name=name, lhs=self.lhs, rhs=rhs, contract=contract, policy="bitwise",
                             dims=(*dims, unit)[: a.dim()], scenario=self.scenario)
        self.ctx.record(c)
        self.made.append(c)

    def untouched(self, actual: torch.Tensor, *, name: str, dims: tuple[str, ...]) -> None:
        """Contract 5: `actual` still holds the poison byte everywhere."""
        self.same(actual, torch.full_like(actual.contiguous().view(torch.uint8), SENTINEL), name=name,
                  rhs="poison (before the transfer)", contract="5", dims=dims)

    def status(self) -> tuple[str, str]:
        bad = [c for c in self.made if not c.passed]
        if bad:
            return "mismatch", f"{len(bad)} comparison(s) failed, first: {bad[0].name} vs {bad[0].rhs}"
        return "passed", ""


# ----------------------------------------------------------------------------------------------- rows
def page_row(case: PageCase, ctx: RunContext, *, family: str, backend: str, direction: str, layers: int,
             repro: dict[str, Any]) -> dict[str, Any]:
    """Identity of one row; KV page rows leave `mode` empty."""
    return {
        "scenario": case.scenario, "family": family, "mode": "", "backend": backend, "preset": case.preset,
        "device": ctx.device, "layers": layers, "tp_prefill": case.tp_prefill, "tp_decode": case.tp_decode,
        "page_size": case.page_size, "direction": direction, "config": "", "config_source": "",
        "repro": ctx.repro({**case.options, **repro, "backend": backend}),
    }  # fmt: skip


def config_json(variant: str, pages: int, chunk_bytes: int, launch: dict[str, int]) -> str:
    """The row's `config`: the variant, the timed transfer's pages and page chunk bytes (one layer of
    one page, what the bandwidth figure plots against), the pages' dtype, and the Triton launch parameters."""
    return json.dumps({"variant": variant, "pages": pages, "chunk_bytes": chunk_bytes, "dtype": DTYPE_NAMES[KV_DTYPE],
                       **launch}, sort_keys=True)


def chunk_bytes(g: AttnGeometry, page_size: int) -> int:
    """Bytes of one layer of one page, all heads: the contiguous block of a CPU page."""
    parts = 2 if g.family == "gqa" else 1
    return page_size * parts * g.kv_heads * g.head_dim * KV_DTYPE.itemsize


def page_bytes(g: AttnGeometry, page_size: int) -> int:
    """Bytes of one whole page (every layer, all heads)."""
    return chunk_bytes(g, page_size) * g.layers


def timing_fields(ctx: RunContext, fn: Callable[[], None], *, bytes_moved: int, tokens: int,
                  ceiling: str) -> dict[str, Any]:
    """Time `fn` with the run's timer and derive GB/s, tokens/s and % of the `ceiling` measured in this
    run (`cpu-memcpy` on a CPU run, whose timings are CPU timings)."""
    name = ceiling if ceiling in ctx.ceilings else "cpu-memcpy"
    return measured_fields(ctx.bench(fn), bytes_moved=bytes_moved, tokens=tokens, ceiling_name=name,
                           ceiling_gbps=ctx.ceilings.get(name, {}).get("gbps"))


def measured_fields(t: Any, *, bytes_moved: int, tokens: int, ceiling_name: str, ceiling_gbps: float | None
                    ) -> dict[str, Any]:
    """A row's timing fields from a Timing `t`, with GB/s, tokens/s and % of the ceiling (when known)."""
    seconds = t.median_us * 1e-6
    fields: dict[str, Any] = dict(
        timer=t.timer, samples=t.n_samples, median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us,
        noise_pct=t.noise_pct, bytes_moved=bytes_moved, achieved_gbps=bytes_moved / seconds / 1e9,
        tokens_per_s=tokens / seconds,
    )  # fmt: skip
    if ceiling_gbps:
        fields.update(ceiling_name=ceiling_name, ceiling_gbps=ceiling_gbps,
                      ceiling_pct=100 * fields["achieved_gbps"] / ceiling_gbps)
    return fields


# ----------------------------------------------------------------------------------------- state page
STATE_DTYPE, ACT_DTYPE = torch.float32, torch.bfloat16
STATE_KV_PAGES = 2  # the request's KV pages, which its state page follows


def state_page_row(case: PageCase, ctx: RunContext, result: CaseResult, *,
                   make_pages: Callable[[int], torch.Tensor], repro: dict[str, Any]) -> None:
    """The hybrid state page roundtrip of one request, for presets with SSM layers (one untimed row,
    direction `roundtrip`, family of the SSM layers).

    Every rank at TP `tp_prefill` holds random bytes in the layout `snapshot` returns (ssm
    `[1, L, HV / p, K, V]` fp32, conv `[1, L, conv_dim / p, kernel - 1]` bf16). They are packed into the
    global state page, written into the pages (`make_pages(n)`: CPU or PD pages) right after the
    request's KV pages (ids 0 and 1, left poisoned here), read back and unpacked at TP `tp_decode`.
    Contract 4: the bytes read back equal the packed page; re-packing the TP `tp_decode` ranks gives
    the same page, and unpacking that at TP `tp_prefill` gives back every rank's tensors. Contract 5:
    the KV pages, the rest of the last state page and the page after it still hold the poison.
    """
    g = case.ssm
    if g is None:
        return
    p, d = case.tp_prefill, case.tp_decode
    row = page_row(case, ctx, family=g.family, backend="torch", direction="roundtrip", layers=g.layers, repro=repro)
    unsupported = state_page_support(g, p, d)
    if unsupported:
        row.update(status="unsupported", reason=unsupported)
        result.rows.append(row)
        return
    with ctx.oom_guard() as guard:
        checks, note = _state_roundtrip(case, ctx, g, make_pages)
        row.update(zip(("status", "reason"), checks.status()))
        row["reason"] = row["reason"] or note
    if guard.record is not None:
        row.update(status="oom", reason=guard.record.get("message", "out of memory"))
        result.ooms.append({**row, **guard.record})
    result.rows.append(row)


def state_page_support(g: SSMGeometry, p: int, d: int) -> str:
    """Why TP `p` -> `d` cannot carry the state page ("" when it can)."""
    bad = [t for t in (p, d) if g.key_heads % t or g.value_heads % t]
    if not bad:
        return ""
    return f"the state page splits SSM heads over the ranks: TP {bad[0]} does not divide {g.key_heads} key / " \
           f"{g.value_heads} value heads"


def rank_states(ctx: RunContext, g: SSMGeometry, tp: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Random accepted states of one request on every rank of TP `tp`, as `snapshot` returns them (ssm
    `[1, L, HV / tp, K, V]` fp32, conv `[1, L, conv_dim / tp, kernel - 1]` bf16); the same from the same seed."""
    gen = generator(ctx, 7)
    hv = g.value_heads // tp
    local_conv = 2 * (g.key_heads // tp) * g.head_k_dim + hv * g.head_v_dim
    ssm = [random_bits((1, g.layers, hv, g.head_k_dim, g.head_v_dim), STATE_DTYPE, gen, ctx.device) for _ in range(tp)]
    conv = [random_bits((1, g.layers, local_conv, g.conv_kernel - 1), ACT_DTYPE, gen, ctx.device) for _ in range(tp)]
    return ssm, conv


def _state_roundtrip(case: PageCase, ctx: RunContext, g: SSMGeometry,
                     make_pages: Callable[[int], torch.Tensor]) -> tuple[Checks, str]:
    p, d = case.tp_prefill, case.tp_decode
    ssm, conv = rank_states(ctx, g, p)
    page = pack_state_pages(ssm, conv, g, p)[0]
    layout = StatePageLayout.of(g, STATE_DTYPE, ACT_DTYPE)
    one_page = page_bytes(case.attn, case.page_size)
    count = state_page_count(layout, one_page)
    pages = poison(make_pages(STATE_KV_PAGES + count + 1))
    ids = list(range(STATE_KV_PAGES, STATE_KV_PAGES + count))
    write_state_bytes(pages, ids, page)
    back = read_state_bytes(pages, ids, layout.nbytes, ctx.device)
    settle(ctx)

    checks = Checks(ctx, case.scenario, f"state page tp{p}->tp{d}")
    checks.same(back, page, name="state page bytes", rhs=f"packed at TP {p}", contract="4", dims=())
    ssm_d, conv_d = unpack_state_pages(back[None], g, d, state_dtype=STATE_DTYPE, act_dtype=ACT_DTYPE)
    again = pack_state_pages(ssm_d, conv_d, g, d)[0]
    checks.same(again, page, name=f"state page re-packed at TP {d}", rhs=f"packed at TP {p}", contract="4", dims=())
    ssm_p, conv_p = unpack_state_pages(again[None], g, p, state_dtype=STATE_DTYPE, act_dtype=ACT_DTYPE)
    checks.same(torch.stack(ssm_p), torch.stack(ssm), name="ssm state", rhs=f"TP {p} ranks", contract="4",
                dims=("rank", "request", "layer", "head", "k"))
    checks.same(torch.stack(conv_p), torch.stack(conv), name="conv window", rhs=f"TP {p} ranks", contract="4",
                dims=("rank", "request", "layer", "channel"))
    flat = pages.view(torch.uint8).view(pages.shape[0], -1)
    used_last = layout.nbytes - (count - 1) * one_page
    rest = torch.cat([flat[:STATE_KV_PAGES].flatten(), flat[ids[-1], used_last:], flat[ids[-1] + 1 :].flatten()])
    checks.untouched(rest, name="KV pages, end of the last state page, next page", dims=())
    return checks, f"state page of {layout.nbytes} bytes in {count} page(s) after the KV pages; untimed"
