"""PD pages across processes: prefill ranks export, decode ranks import, over `torch.distributed` (SPEC §4, §12).

Protocol of one transfer. Every process of the group builds the same plan; only the messages below cross.

1. Placement (`Placement`). A group of N processes holds prefill TP p and decode TP d, max(p, d) <= N:
   prefill rank i runs in process i, decode rank j in process N - 1 - j. When p + d <= N the two sides are
   disjoint processes, as in a disaggregated deployment, and every byte crosses the group. Otherwise
   the middle processes hold one rank of each side; what moves between the two ranks of one process
   is a local copy, counted apart from link bytes (`Transfer.local_bytes`).
2. Fields (`Field`). What moves is a tensor in global head numbering: the PD staging pages, viewed
   `[pages, P, L, parts, H_global, D]`, or a part of the hybrid state page. Each side keeps a full-size
   copy in its own memory (its staging buffer), and each rank owns a range of heads along one axis: a
   prefill rank has written its range (the replicas of a replicated slice write nothing), a decode
   rank needs its range. A field may be given as several blocks (views with the same head axis, e.g.
   runs of consecutive pages), moved alike.
3. Messages (`plan_messages`). For every field, every writer i and every decode rank j whose ranges
   overlap, the overlap moves from i's process to j's. Everything one process sends another goes as one
   contiguous uint8 buffer (segments in message order, 16-byte aligned); a pair whose only segment is
   already contiguous sends it, or receives into it, in place, with no packing copy.
4. Transfer (`Transfer.__call__`): pack (local messages are plain copies here), exchange (one
   `batch_isend_irecv` of every pair's buffer: NCCL fuses the sends and receives into one group launch,
   gloo posts them one by one; wait), unpack.

A receiver writes nothing outside the ranges it needs, so the rest of its staging buffer keeps what it
held (contract 5 is checked on it). The link ceiling of a transfer is its own exchange step (`phases`),
timed in the same samples: the same bytes between the same processes from contiguous buffers, what the
link gives this pattern; the transfer's time is the sum of its three steps, so it never beats it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

ALIGN = 16  # segment offsets in a packed buffer, so any dtype can be viewed at them

Range = tuple[int, int]  # [start, stop) of global heads


@dataclass(frozen=True)
class Placement:
    """Which process holds which rank (module docstring, step 1)."""

    world: int
    tp_prefill: int
    tp_decode: int

    def __post_init__(self) -> None:
        if self.world < 2:
            raise ValueError(f"a PD group needs at least 2 processes (one prefill, one decode), got {self.world}")
        need = max(self.tp_prefill, self.tp_decode)
        if min(self.tp_prefill, self.tp_decode) < 1 or need > self.world:
            raise ValueError(f"TP pair {self.tp_prefill}:{self.tp_decode} needs {need} processes, "
                             f"the group has {self.world}")

    def prefill_process(self, rank: int) -> int:
        return rank

    def decode_process(self, rank: int) -> int:
        return self.world - 1 - rank

    def prefill_rank(self, process: int) -> int | None:
        return process if process < self.tp_prefill else None

    def decode_rank(self, process: int) -> int | None:
        rank = self.world - 1 - process
        return rank if 0 <= rank < self.tp_decode else None

    @property
    def shared(self) -> bool:
        """Whether some process holds a prefill and a decode rank (p + d > N)."""
        return self.tp_prefill + self.tp_decode > self.world

    def describe(self) -> str:
        kind = "shared" if self.shared else "disjoint"
        return f"{kind} (prefill rank i in process i, decode rank j in process {self.world - 1} - j)"


@dataclass(frozen=True)
class Field:
    """How one tensor is split between the ranks (module docstring, step 2).

    Attributes:
        name: what it is (`kv`, `ssm`, ...), for messages and errors.
        axis: the head axis of its views.
        src: prefill rank -> heads it wrote, None for a rank that writes nothing (a replica).
        dst: decode rank -> heads it needs.
    """

    name: str
    axis: int
    src: tuple[Range | None, ...]
    dst: tuple[Range, ...]


@dataclass(frozen=True)
class Message:
    """Heads `[start, stop)` of field `field` (an index) from prefill rank `src` to decode rank `dst`."""

    field: int
    src: int
    dst: int
    start: int
    stop: int


def plan_messages(fields: Sequence[Field]) -> list[Message]:
    """Every overlap of a writer's range with a decode rank's range (module docstring, step 3).

    Raises:
        ValueError: two writers' ranges overlap, or a decode rank needs heads no writer wrote.
    """
    out = []
    for index, f in enumerate(fields):
        written = sorted(r for r in f.src if r is not None)
        for (_, stop), (start, _) in zip(written, written[1:], strict=False):
            if start < stop:
                raise ValueError(f"field {f.name}: two prefill ranks write heads {start}..{stop - 1}")
        for j, need in enumerate(f.dst):
            got = 0
            for i, have in enumerate(f.src):
                if have is None:
                    continue
                start, stop = max(have[0], need[0]), min(have[1], need[1])
                if start < stop:
                    out.append(Message(index, i, j, start, stop))
                    got += stop - start
            if got != need[1] - need[0]:
                raise ValueError(f"field {f.name}: decode rank {j} needs heads {need[0]}..{need[1] - 1}, "
                                 f"the prefill ranks wrote {got} of them")
    return out


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as `[nbytes]` uint8, sharing its memory."""
    return t.reshape(-1).view(torch.uint8)


@dataclass
class _Link:
    """Everything this process sends to (or receives from) one other process."""

    peer: int
    views: list[torch.Tensor]  # the segments, in message order, in this process's staging buffer
    buffer: torch.Tensor  # [nbytes] uint8: the views themselves when direct, else a packing buffer
    copies: list[tuple[torch.Tensor, torch.Tensor]]  # (buffer segment, view) pairs to pack / unpack

    @classmethod
    def of(cls, peer: int, views: list[torch.Tensor], device: torch.device) -> _Link:
        if len(views) == 1 and views[0].is_contiguous():
            return cls(peer, views, _flat_bytes(views[0]), [])
        offsets, end = [], 0
        for v in views:
            offsets.append(_align(end))
            end = offsets[-1] + v.numel() * v.element_size()
        buffer = torch.empty(end, dtype=torch.uint8, device=device)
        copies = [(buffer[o : o + v.numel() * v.element_size()].view(v.dtype).view(v.shape), v)
                  for o, v in zip(offsets, views, strict=True)]
        return cls(peer, views, buffer, copies)


class Transfer:
    """This process's part of one transfer: built once (plans, buffers), then run any number of times.

    Every process of the default process group (processes are its ranks) constructs it, a collective
    that checks that all processes agree on the message sizes, and calls it together. `src_blocks[f]`
    are this process's views of field `f` on the prefill side (None when it holds no prefill rank),
    `dst_blocks[f]` on the decode side.
    """

    def __init__(
        self,
        placement: Placement,
        fields: Sequence[Field],
        *,
        src_blocks: Sequence[Sequence[torch.Tensor]] | None,
        dst_blocks: Sequence[Sequence[torch.Tensor]] | None,
        device: torch.device | str,
    ) -> None:
        self.placement, self.fields = placement, list(fields)
        self.process = dist.get_rank()
        if dist.get_world_size() != placement.world:
            raise ValueError(f"placement for {placement.world} processes in a group of {dist.get_world_size()}")
        me = self.process
        if (src_blocks is None) != (placement.prefill_rank(me) is None):
            raise ValueError(f"process {me}: prefill views given iff it holds a prefill rank")
        if (dst_blocks is None) != (placement.decode_rank(me) is None):
            raise ValueError(f"process {me}: decode views given iff it holds a decode rank")
        self.messages = plan_messages(self.fields)
        device = torch.device(device)
        sends: dict[int, list[torch.Tensor]] = {}
        recvs: dict[int, list[torch.Tensor]] = {}
        for m in self.messages:
            src, dst = placement.prefill_process(m.src), placement.decode_process(m.dst)
            if src == me:
                sends.setdefault(dst, []).extend(self._segments(src_blocks, m))
            if dst == me:
                recvs.setdefault(src, []).extend(self._segments(dst_blocks, m))
        self.local = list(zip(recvs.pop(me, []), sends.pop(me, []), strict=True))  # (decode view, prefill view)
        self.sends = [_Link.of(peer, views, device) for peer, views in sorted(sends.items())]
        self.recvs = [_Link.of(peer, views, device) for peer, views in sorted(recvs.items())]
        self._agree()

    def _segments(self, blocks: Sequence[Sequence[torch.Tensor]] | None, m: Message) -> list[torch.Tensor]:
        axis = self.fields[m.field].axis
        return [b.narrow(axis, m.start, m.stop - m.start) for b in blocks[m.field]]

    def _agree(self) -> None:
        """Check, across the group, that every pair's two sides agree on the bytes they move, and total
        the link and local bytes (every process learns the totals)."""
        mine = {
            "send": {link.peer: link.buffer.numel() for link in self.sends},
            "recv": {link.peer: link.buffer.numel() for link in self.recvs},
            "local": sum(v.numel() * v.element_size() for v, _ in self.local),
        }
        every: list[Any] = [None] * self.placement.world
        dist.all_gather_object(every, mine)
        for src, info in enumerate(every):
            for dst, nbytes in info["send"].items():
                got = every[dst]["recv"].get(src)
                if got != nbytes:
                    raise ValueError(f"process {src} sends {nbytes} bytes to process {dst}, which expects {got}")
        self.link_bytes = sum(sum(info["send"].values()) for info in every)
        self.local_bytes = sum(info["local"] for info in every)
        self.link_messages = sum(len(info["send"]) for info in every)

    def __call__(self) -> None:
        self.pack()
        self.exchange()
        self.unpack()

    def phases(self) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
        """`(pack, exchange, unpack)`: the transfer in the three steps its timing takes apart, so the link
        ceiling is the exchange step of the very same samples (same messages, bytes, processes and timer)."""
        return self.pack, self.exchange, self.unpack

    def pack(self) -> None:
        """Copy what leaves this process into its send buffers, and do the copies that stay within it."""
        for buffer, view in (c for link in self.sends for c in link.copies):
            buffer.copy_(view)
        for dst, src in self.local:
            dst.copy_(src)

    def exchange(self) -> None:
        """Send and receive the link buffers between processes (contiguous, one message per peer)."""
        ops = [dist.P2POp(dist.isend, link.buffer, link.peer) for link in self.sends]
        ops += [dist.P2POp(dist.irecv, link.buffer, link.peer) for link in self.recvs]
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def unpack(self) -> None:
        """Copy what arrived from the receive buffers into this process's staging pages."""
        for buffer, view in (c for link in self.recvs for c in link.copies):
            view.copy_(buffer)
