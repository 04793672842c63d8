"""K/V memory as a pool of fixed-size blocks ("pages"), and a prefix cache over whole blocks.

The pool is allocated once: nothing reallocates inside a step. A sequence holds one page per block of
its canvas; a page of prompt blocks can be shared with other sequences through the prefix cache, a
trie keyed by the blocks' token ids. Block-causal attention makes this exact: the K/V of block b
depend only on the tokens of blocks 0..b at their absolute positions, which is the trie path to b.

Verbs: `allocate` (evicting unreferenced cached blocks, least recently used first), `match` (the
longest cached run of a prompt's leading blocks, referenced), `commit` (a finished block becomes
cacheable), `release` (a sequence lets go of its pages), `evict`, and `view` (what one batched
forward reads and writes). Knows nothing of decoding or of requests.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch

from ..model import LLaDA2Config
from . import cpu_step

SCRATCH = 0  # page 0 is never handed out: padding queries write there, padding keys read from there


class CacheFull(RuntimeError):
    """No free page is left and none can be evicted (every cached block is in use)."""


@dataclass(eq=False)
class Node:
    """One cached block: its page, the blocks that follow it, who uses it and when it was last used."""

    page: int
    key: tuple[int, ...]
    parent: Node | None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    refs: int = 0
    used: int = 0


@dataclass
class CacheStats:
    lookups: int = 0  # whole prompt blocks looked up
    hits: int = 0  # of which found
    evictions: int = 0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.lookups if self.lookups else None


class BlockCache:
    """`pages` blocks of `block_size` tokens of every layer's K and V, with the prefix cache on top.
    `prefix=False` keeps the pool and never shares or keeps a block (the cache off). `layer_devices`:
    a model split over devices keeps each layer's pages on its layer's device."""

    def __init__(self, config: LLaDA2Config, pages: int, block_size: int, device, dtype, prefix: bool = True,
                 layer_devices: list[torch.device] | None = None):  # fmt: skip
        if pages < 2:
            raise ValueError("the pool needs at least 2 pages (one is scratch)")
        self.block_size, self.prefix = block_size, prefix
        shape = (config.num_hidden_layers, pages * block_size, config.num_key_value_heads, config.head_dim)
        if layer_devices is None:
            self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, slots, K, D]; slot = page * bs + offset
            self.v = torch.zeros(shape, device=device, dtype=dtype)
        else:  # per layer [slots, K, D], indexed like the stacked pool
            self.k = [torch.zeros(shape[1:], device=d, dtype=dtype) for d in layer_devices]
            self.v = [torch.zeros(shape[1:], device=d, dtype=dtype) for d in layer_devices]
        self.devices = {self.k.device} if layer_devices is None else {k.device for k in self.k}
        self.layer_k, self.layer_v = list(self.k), list(self.v)  # each layer's pool [slots, K, D], looked up once
        self.pages = pages
        self._free = list(range(pages - 1, SCRATCH, -1))  # a stack: pop() hands out low pages first
        self.root = Node(SCRATCH, (), None)
        self._cached = 0  # pages owned by trie nodes
        self._clock = itertools.count(1)
        self.stats = CacheStats()

    @staticmethod
    def page_bytes(config: LLaDA2Config, block_size: int, dtype: torch.dtype) -> int:
        return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * dtype.itemsize

    @classmethod
    def for_budget(cls, config: LLaDA2Config, megabytes: float, block_size: int, device, dtype, prefix: bool = True,
                   layer_devices: list[torch.device] | None = None):  # fmt: skip
        """A pool of `megabytes`, never smaller than one sequence of the model's full length (+ scratch)."""
        one = cls.page_bytes(config, block_size, dtype)
        least = -(-config.max_position_embeddings // block_size) + 1
        return cls(config, max(least, int(megabytes * 2**20) // one), block_size, device, dtype, prefix, layer_devices)

    # --- counts ------------------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.pages - 1 - len(self._free)

    @property
    def cached(self) -> int:
        return self._cached

    def evictable(self) -> int:
        """Pages eviction could free now: cached blocks no sequence uses, with no used block below them."""

        def count(node: Node) -> tuple[int, bool]:  # (evictable in the subtree, subtree wholly free)
            total, free = 0, True
            for child in node.children.values():
                n, f = count(child)
                total, free = total + n, free and f
            free = free and node.refs == 0
            return total + (1 if free and node is not self.root else 0), free

        return count(self.root)[0]

    # --- verbs -------------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """`n` private pages, evicting cached blocks if the free ones are too few; CacheFull if even
        that is not enough (nothing is taken then)."""
        if n > len(self._free):
            self.evict(n - len(self._free))
        if n > len(self._free):
            raise CacheFull(f"{n} K/V blocks wanted, {len(self._free)} free and none left to evict")
        return [self._free.pop() for _ in range(n)]

    def match(self, blocks: list[tuple[int, ...]]) -> list[Node]:
        """The cached nodes of the longest run of `blocks` from the start, each referenced once more
        (the caller releases them)."""
        self.stats.lookups += len(blocks)
        found: list[Node] = []
        node = self.root
        if self.prefix:
            for key in blocks:
                node = node.children.get(key)
                if node is None:
                    break
                found.append(node)
        now = next(self._clock)
        for node in found:
            node.refs += 1
            node.used = now
        self.stats.hits += len(found)
        return found

    def commit(self, parent: Node | None, key: tuple[int, ...], page: int) -> tuple[Node | None, bool]:
        """The private `page` holds the final K/V of block `key` after the blocks ending at `parent`
        (None: the first block). Returns (the block's node, whether the cache took `page`): taken, the
        node is referenced once by the caller (release it as a node); already cached, the caller keeps
        its page and does not reference the node. (None, False) with the prefix cache off."""
        if not self.prefix:
            return None, False
        parent = parent or self.root
        if key in parent.children:
            return parent.children[key], False
        node = Node(page, key, parent, refs=1, used=next(self._clock))
        parent.children[key] = node
        self._cached += 1
        return node, True

    def release(self, nodes: list[Node] = (), pages: list[int] = ()) -> None:
        """A sequence is done with cached `nodes` (they stay cached) and private `pages` (freed)."""
        now = next(self._clock)
        for node in nodes:
            node.refs -= 1
            node.used = now
        self._free.extend(reversed(pages))

    def evict(self, n: int) -> int:
        """Frees up to `n` pages of cached blocks that no sequence uses, least recently used leaves
        first (a block's children go before it: they are unreachable without it); how many it freed."""
        leaves = [(node.used, node.page, node) for node in self._nodes() if not node.children and node.refs == 0]
        heapq.heapify(leaves)  # least recently used first (a page number breaks ties: no two nodes share one)
        freed = 0
        while freed < n and leaves:
            _, _, node = heapq.heappop(leaves)
            parent = node.parent
            del parent.children[node.key]
            self._free.append(node.page)
            self._cached -= 1
            freed += 1
            if parent is not self.root and not parent.children and parent.refs == 0:
                heapq.heappush(leaves, (parent.used, parent.page, parent))
        self.stats.evictions += freed
        return freed

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def view(self, rows: list[tuple[list[int], int, int]], width: int) -> PagedView:
        """The view of one batched forward. `rows`: per row (pages by block index, first query
        position, end position): the row's queries are positions [start, end), right-aligned in a
        [B, width] query tensor (left padding), and it sees keys [0, end). The row descriptors go to
        the device in one copy; the slot tables and the mask are built there (`paged_tables`)."""
        bs, device = self.block_size, self.k[0].device
        S = max(end for _, _, end in rows)
        packed = torch.tensor([row_descriptor(pages, start, end, -(-S // bs), bs) for pages, start, end in rows])
        packed = packed.pin_memory() if device.type == "cuda" else packed
        packed = packed.to(device, non_blocking=True)
        view = PagedView(self, *paged_tables(packed, width, S, bs, all_visible(rows, width, bs)))
        if all(start // bs == (end - 1) // bs for _, start, end in rows):  # no row needs a mask
            view.packed = Packed.of(rows, width, bs, device)
        return view


@dataclass(frozen=True)
class Packed:
    """A batched forward whose rows need no mask (each row's queries inside its last block, which sees
    every key [0, end)), as flash-attn's varlen kernel takes it: the real queries of all rows packed,
    and each row's keys [0, end) packed, with their cumulative lengths. Sizes come from the host's own
    numbers (no host read); the shapes change with the rows' ends, so a CUDA graph takes the padded path."""

    query_rows: torch.Tensor  # [sum of query lengths] rows of the [B * T] query tensor that are real
    key_slots: torch.Tensor  # [sum of ends] pool slots of each row's keys, row after row
    cu_q: torch.Tensor  # [B + 1] int32
    cu_k: torch.Tensor  # [B + 1] int32
    max_q: int
    max_k: int

    @classmethod
    def of(cls, rows: list[tuple[list[int], int, int]], width: int, bs: int, device) -> Packed:
        """Built on the host with a few vectorised ops per row (a step's rows hold thousands of keys)."""
        offsets = torch.arange(bs)
        query_rows, key_slots, cu_q, cu_k = [], [], [0], [0]
        for r, (pages, start, end) in enumerate(rows):
            query_rows.append(torch.arange(r * width + width - (end - start), (r + 1) * width))  # no left padding
            used = torch.tensor(pages[: -(-end // bs)])
            key_slots.append((used[:, None] * bs + offsets).flatten()[:end])
            cu_q.append(cu_q[-1] + end - start)
            cu_k.append(cu_k[-1] + end)
        ints = torch.cat(query_rows + key_slots)
        counts = torch.tensor(cu_q + cu_k, dtype=torch.int32)
        if torch.device(device).type == "cuda":
            ints, counts = ints.pin_memory(), counts.pin_memory()
        ints, counts = ints.to(device, non_blocking=True), counts.to(device, non_blocking=True)
        nq, B = cu_q[-1], len(rows)
        return cls(ints[:nq], ints[nq:], counts[: B + 1], counts[B + 1 :],
                   max(b - a for a, b in zip(cu_q, cu_q[1:])), max(b - a for a, b in zip(cu_k, cu_k[1:])))  # fmt: skip


def row_descriptor(pages: list[int], start: int, end: int, n_pages: int, bs: int) -> list[int]:
    """One row of a step's tables as ints: [start, end, page of key block 0 .. n_pages - 1] (the scratch
    page past the row's end)."""
    used = -(-end // bs)
    return [start, end, *pages[:used], *[SCRATCH] * (n_pages - used)]


def all_visible(rows: list[tuple[list[int], int, int]], width: int, bs: int) -> bool:
    """Whether every query sees every key (no mask needed: attention's fast path), from the host's own
    numbers: no padding query, every row's queries inside its last block, and one end for all rows."""
    ends = {end for _, _, end in rows}
    return len(ends) == 1 and all(end - start == width and start // bs == (end - 1) // bs for _, start, end in rows)


def paged_tables(rows: torch.Tensor, width: int, S: int, bs: int, visible: bool):
    """rows [B, 2 + ceil(S/bs)] int64 on the device (row_descriptor's layout) -> (positions [B, T],
    writes [B * T], reads [B, S] slots, allow [B, 1, T, S] bool or None when `visible`, real [B, T]
    bool: the queries that are not left padding, which LLaDA2.2's block routing reads). Padding queries
    sit at position 0 and write to the scratch page; keys past a row's end read the scratch page and
    are masked. On the CPU one host kernel call makes them (cpu_step.paged_tables: a dozen torch ops
    cost more than the loops); elsewhere, and under torch.compile, `device_tables`."""
    if cpu_step.host_enabled(rows):
        return cpu_step.paged_tables(rows.numpy(), width, S, bs, visible, SCRATCH)
    return device_tables(rows, width, S, bs, visible)


def device_tables(rows: torch.Tensor, width: int, S: int, bs: int, visible: bool):
    """paged_tables with torch ops: static shapes for static (B, width, S), no host read (a CUDA graph
    can hold it)."""
    B = rows.shape[0]
    starts, ends, table = rows[:, 0], rows[:, 1], rows[:, 2:]
    keys = torch.arange(S, device=rows.device)
    reads = table.gather(1, (keys // bs).expand(B, S)) * bs + keys % bs  # [B, S]
    positions = ends[:, None] - width + torch.arange(width, device=rows.device)  # right-aligned queries
    pad = positions < starts[:, None]
    positions = positions.masked_fill(pad, 0)
    writes = reads.gather(1, positions).masked_fill(pad, SCRATCH * bs)
    if visible:
        return positions, writes.flatten(), reads, None, ~pad
    allow = (keys[None, None, :] // bs <= positions[:, :, None] // bs) & (keys[None, None, :] < ends[:, None, None])
    return positions, writes.flatten(), reads, allow[:, None], ~pad


class PagedView:
    """Slot tables and the mask of one batched forward: `update(layer, k, v)` writes the queries' K/V
    into their pages and returns each row's keys [0, end) gathered, padded to the longest row.
    `allow` None: every query sees every key (attention's fast path)."""

    packed: Packed | None = None  # set by BlockCache.view when no row needs a mask (flash-attn's varlen path)

    def __init__(self, cache: BlockCache, positions, writes, reads, allow, real=None):
        self.cache = cache
        self.positions, self.writes, self.reads, self.allow = positions, writes, reads, allow  # [B, T], [B*T], [B, S]
        self.real = real  # [B, T] bool: not left padding (None: no padding)
        # A split model's pool: the slot tables once more on each other device that holds layers.
        # The keys are gathered by index_select over the flat slots (on the CPU about 4x faster than
        # advanced indexing at a step's 500 keys).
        flat = reads.flatten()
        self.tables = {d: (moved(writes, d), moved(flat, d)) for d in cache.devices}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, K, T, D] -> every row's visible keys and values [B, K, S, D]."""
        pool_k, pool_v = self._write(layer, k, v)
        flat = self.tables[pool_k.device][1]  # [B * S]
        shape = (*self.reads.shape, *pool_k.shape[1:])
        keys, values = pool_k.index_select(0, flat).view(shape), pool_v.index_select(0, flat).view(shape)
        return keys.transpose(1, 2), values.transpose(1, 2)

    def update_packed(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, K, T, D] -> each row's keys and values [0, end), row after row [sum of ends, K, D]
        (`packed` set: the varlen attention's layout, no padding key read)."""
        pool_k, pool_v = self._write(layer, k, v)
        slots = self.packed.key_slots.to(pool_k.device, non_blocking=True)
        return pool_k.index_select(0, slots), pool_v.index_select(0, slots)

    def host_pools(self):
        """Every layer's pools [L, slots, K, D] (keys, values), this forward's write slots [B * T] and read
        slots [B, S], as numpy arrays (views, no copy), for a CPU caller that writes and gathers in its own
        loops (kernels/cpu.py's attend) as `update` does; None where the pools are not one CPU tensor each
        (a GPU, a model split over devices)."""
        k, v = self.cache.k, self.cache.v
        if not isinstance(k, torch.Tensor) or k.device.type != "cpu":
            return None
        return k.numpy(), v.numpy(), self.writes.numpy(), self.reads.numpy()

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        B, K, T, D = k.shape
        pool_k, pool_v = self.cache.layer_k[layer], self.cache.layer_v[layer]
        writes = self.tables[pool_k.device][0]
        pool_k.index_copy_(0, writes, k.transpose(1, 2).reshape(B * T, K, D))
        pool_v.index_copy_(0, writes, v.transpose(1, 2).reshape(B * T, K, D))
        return pool_k, pool_v


def moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """t on `device`: itself where it is there already (no op dispatched), else a non-blocking copy."""
    return t if t.device == device else t.to(device, non_blocking=True)
