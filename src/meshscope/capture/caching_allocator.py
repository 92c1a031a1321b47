"""The memory a GPU job reserves, not only what its tensors hold: a model of torch's CUDA caching allocator.

``torch.cuda.max_memory_reserved`` (what torchtitan logs as "memory", and its published tables) is the most memory
the allocator held from the driver: every tensor's block rounded up, the rest of the segments they were cut from,
and the blocks cached free for a later request of the same stream. The work log's live bytes are what
``max_memory_allocated`` measures (docs/forecast.md: within 0.3 % on one H100); this model replays the same
requests, in the order the rank made and freed its storages, through the allocator's rules as torch 2.13 has them
(c10/cuda/CUDACachingAllocator.cpp), and reports the reserved peak:

- sizes round up to 512 bytes; requests of 1 MiB or less come from the small pool, the rest from the large pool;
  each stream has its own blocks in each (a block freed on one stream is never reused for another's request);
- a request takes the smallest free block of its pool and stream that fits (ties: the lowest address) and splits
  it when the rest is 512 bytes or more (small pool, or expandable segments) or more than 1 MiB (large pool);
- with no fitting block, a new segment: 2 MiB for a small request, 20 MiB for one under 10 MiB, the request rounded
  up to 2 MiB otherwise; with ``expandable_segments:True`` (PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF,
  torchtitan's run_train.sh sets it) one segment per pool and stream instead, grown at its end by 2 MiB (small)
  or 20 MiB (large) pages, its free tail taken only when no other free block fits;
- a freed block merges with its free neighbours in its segment and stays cached.

Not modelled: ``max_split_size_mb``, ``roundup_power2_divisions`` and garbage collection (off by default); the
cache released when the GPU is full (reserved never passes the GPU's memory on a real one: the forecast compares
with it) or by ``torch.cuda.empty_cache()`` (a fake world answers it with nothing); blocks freed later than asked
where ``record_stream`` kept them for another stream.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Mapping

MIN_BLOCK = 512
"""Every request rounds up to a multiple of this (kMinBlockSize)."""
SMALL = 1 << 20
"""Requests of at most this many bytes come from the small pool (kSmallSize)."""
SMALL_SEGMENT = 2 << 20
"""A small pool's segment, and an expandable small segment's page (kSmallBuffer)."""
LARGE_SEGMENT = 20 << 20
"""A segment for a large request under `MIN_LARGE_ALLOC`, and an expandable large segment's page (kLargeBuffer)."""
MIN_LARGE_ALLOC = 10 << 20
"""Large requests of at least this many bytes get a segment of their own size (kMinLargeAlloc)."""
ROUND_LARGE = 2 << 20
"""Such a segment's size rounds up to this (kRoundLarge)."""


def expandable_segments(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the job's allocator grows one segment per pool and stream: ``expandable_segments:True`` in
    ``PYTORCH_ALLOC_CONF`` or, where that is not set (set but empty counts as set), ``PYTORCH_CUDA_ALLOC_CONF``;
    options separated by commas, white space ignored, the value ``True`` exactly (torch 2.13
    c10/core/AllocatorConfig.h, ``ConfigTokenizer``: any other spelling stops the job at start)."""
    conf = environ["PYTORCH_ALLOC_CONF"] if "PYTORCH_ALLOC_CONF" in environ else \
        environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    options = dict(part.split(":", 1) for part in "".join(conf.split()).split(",") if ":" in part)
    return options.get("expandable_segments") == "True"


def rounded(nbytes: int) -> int:
    """A request's size as the allocator cuts it (round_size)."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """The segment a fixed-size (not expandable) allocator reserves for a rounded request it cannot serve
    (get_allocation_size)."""
    if size <= SMALL:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


_RESIZING = -1
"""The key a resized storage's new block is held under until its old block is freed (no storage's key is
negative)."""


class _Block:
    __slots__ = ("addr", "size", "free", "prev", "next")

    def __init__(self, addr: int, size: int, prev: "_Block | None" = None, nxt: "_Block | None" = None):
        self.addr, self.size, self.free, self.prev, self.next = addr, size, True, prev, nxt


class _Pool:
    """One stream's blocks of one pool: the free ones by (size, address), best fit first; with expandable segments
    the segment's mapped end and its last block."""

    def __init__(self, small: bool, base: int):
        self.small = small
        self.free: list[tuple[int, int]] = []  # (size, addr), sorted
        self.by_addr: dict[int, _Block] = {}  # free blocks by address
        self.base = base  # an expandable segment's first address
        self.mapped = 0  # bytes mapped of it
        self.last: _Block | None = None  # the block that ends at the mapped end

    def add(self, block: _Block) -> None:
        block.free = True
        bisect.insort(self.free, (block.size, block.addr))
        self.by_addr[block.addr] = block

    def take(self, block: _Block) -> None:
        self.free.pop(bisect.bisect_left(self.free, (block.size, block.addr)))
        del self.by_addr[block.addr]
        block.free = False


class CachingAllocator:
    """Requests and frees of one rank's storages (by key) replayed through the caching allocator's rules (module
    doc); `reserved` and `peak` in bytes."""

    def __init__(self, expandable: bool = False):
        self.expandable = expandable
        self.reserved = 0
        self.peak = 0
        self._pools: dict[tuple[int, bool], _Pool] = {}
        self._held: dict[int, tuple[_Block, _Pool]] = {}
        self._next_addr = 0
        self.allocated = 0
        """Bytes of the blocks handed out (rounded): ``torch.cuda.memory_allocated``."""

    def malloc(self, key: int, nbytes: int, stream: int = 0) -> bool:
        """Storage `key` of `nbytes` made on `stream`; True where the allocator reserved more for it."""
        if nbytes <= 0 or key in self._held:
            return False
        size = rounded(nbytes)
        pool = self._pool(stream, size <= SMALL)
        block = self._fit(pool, size)
        grew = False
        if block is None:
            block = self._grow(pool, size)
            grew = True
        pool.take(block)
        if block.size - size >= (MIN_BLOCK if pool.small or self.expandable else SMALL + 1):
            rest = _Block(block.addr + size, block.size - size, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            if pool.last is block:
                pool.last = rest
            pool.add(rest)
        self._held[key] = (block, pool)
        self.allocated += block.size
        return grew

    def resize(self, key: int, nbytes: int, stream: int = 0) -> bool:
        """Storage `key` resized in place to `nbytes`: a new block is taken while the old one is still held, then
        the old one freed (torch 2.13 aten/src/ATen/native/cuda/Resize.cpp, ``resize_bytes_cuda``); True where
        the allocator reserved more."""
        grew = self.malloc(_RESIZING, nbytes, stream)
        self.free(key)
        if _RESIZING in self._held:
            self._held[key] = self._held.pop(_RESIZING)
        return grew

    def free(self, key: int) -> None:
        """Storage `key` was freed (or resized to nothing): its block is cached, merged with free neighbours."""
        entry = self._held.pop(key, None)
        if entry is None:
            return
        block, pool = entry
        self.allocated -= block.size
        for other in (block.prev, block.next):
            if other is not None and other.free:
                pool.take(other)
                if other is block.prev:
                    block.addr, block.prev = other.addr, other.prev
                    if other.prev is not None:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
                    if pool.last is other:
                        pool.last = block
                block.size += other.size
        pool.add(block)

    def _pool(self, stream: int, small: bool) -> _Pool:
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[stream, small] = _Pool(small, self._next_addr)
            self._next_addr += 1 << 48  # an expandable segment's address space, far from every other
        return pool

    def _fit(self, pool: _Pool, size: int) -> _Block | None:
        """The smallest free block that holds `size` (the lowest address among equals); with expandable segments
        the free block at the mapped end only where no other fits (it can grow instead)."""
        i = bisect.bisect_left(pool.free, (size, -1))
        if i == len(pool.free):
            return None
        block = pool.by_addr[pool.free[i][1]]
        if self.expandable and block is pool.last and i + 1 < len(pool.free):
            block = pool.by_addr[pool.free[i + 1][1]]
        return block

    def _grow(self, pool: _Pool, size: int) -> _Block:
        """Reserve more for a request no free block fits: a new segment, or the expandable segment's end mapped
        further (its free last block grows into the new pages)."""
        if not self.expandable:
            grown = segment_size(size)
            block = _Block(self._next_addr, grown)
            self._next_addr += grown
        else:
            page = SMALL_SEGMENT if pool.small else LARGE_SEGMENT
            tail = pool.last if pool.last is not None and pool.last.free else None
            need = size - (tail.size if tail else 0)
            grown = -(-need // page) * page
            if tail is not None:
                pool.take(tail)
                tail.size += grown
                block = tail
            else:
                block = _Block(pool.base + pool.mapped, grown, pool.last)
                if pool.last is not None:
                    pool.last.next = block
                pool.last = block
            pool.mapped += grown
        pool.add(block)
        self.reserved += grown
        self.peak = max(self.peak, self.reserved)
        return block
