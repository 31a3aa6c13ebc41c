"""The requests, pool slots and PD pages of pd-roundtrip's compared roundtrip, shared by its local and
dist transports (scenarios/pd_roundtrip.py, scenarios/pd_dist.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scenarios import page_options as po

SPARE_SLOTS = 2  # pool slots no request uses (contract 5)


@dataclass(frozen=True)
class Layout:
    """Request A (P + P/2 + 1 tokens: a full page, then a partial page filled from its first position)
    and request B (2P tokens: a -1 chunk that is not sent, then a full page), in scattered slots of a
    prefill pool and of a decode pool, over 4 PD pages (one spare); slots in token order."""

    P: int
    tail: int  # tokens of A's partial last page
    src: dict[str, torch.Tensor]  # A, B -> prefill pool slots
    dst: dict[str, torch.Tensor]  # A, B -> decode pool slots
    page: dict[str, int]  # a0, a1, b1, spare -> PD page id
    tokens: int  # slots of each pool

    @classmethod
    def make(cls, P: int, gen: torch.Generator) -> Layout:
        tail = P // 2 + 1
        sizes = {"A": P + tail, "B": 2 * P}
        tokens = sum(sizes.values()) + SPARE_SLOTS
        src, dst = po.scatter_slots(sizes, tokens, gen), po.scatter_slots(sizes, tokens, gen)
        page = dict(zip(("a0", "a1", "b1", "spare"), torch.randperm(4, generator=gen).tolist(), strict=True))
        return cls(P, tail, src, dst, page, tokens)

    def ids(self) -> list[torch.Tensor]:
        """Page ids of A [a0, a1] and B [-1 (not sent), b1]."""
        p = self.page
        return [torch.tensor([p["a0"], p["a1"]]), torch.tensor([-1, p["b1"]])]

    def sent_pages(self) -> list[int]:
        """The pages that carry tokens (every page but the spare)."""
        return sorted(self.page[k] for k in ("a0", "a1", "b1"))

    def reference_pages(self, kv: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
        """What PD pages shaped like `pages` hold after the prefill side wrote both requests, built from
        the global KV `[L, tokens + 1, heads, D]` by indexing alone: each chunk's rows token-major from the
        page's first position; every other byte the poison."""
        ref = po.poison(torch.empty_like(pages))
        for slots, ids in zip((self.src["A"], self.src["B"]), self.ids(), strict=True):
            for c, page in enumerate(ids.tolist()):
                if page >= 0:
                    chunk = slots[c * self.P : (c + 1) * self.P].to(kv.device)
                    ref[page, : chunk.numel()] = kv[:, chunk].transpose(0, 1)
        return ref
