"""Continuous batching: every step runs ONE forward over the active blocks of all running sequences,
makes one host sync, and applies each sequence's own thresholds to its rows.

Verbs: `add` (queue a sequence; `Busy` when the queue is full), `abort` (it stops before its next
forward), `step` (admit what fits, prefill what the prefix cache lacks, one batched forward, the
events), `idle`. Sequences join and leave between steps; a finished one leaves at once and its
pages go back to the pool (its finished whole blocks stay in the prefix cache). Waiting sequences are
admitted by priority (inline completions before rewrites), then in arrival order.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import torch

from ..errors import BadLogits, Busy, TooLong
from ..model import LLaDA2
from .cache import BlockCache, CacheFull, Node
from .policy import joint_threshold
from .sequence import Draft, GenerationResult, Sequence, Settings


@dataclass(frozen=True)
class Event:
    """What one step did for one sequence: a draft, or the end (result set; error set if it failed)."""

    id: int
    draft: Draft | None = None
    result: GenerationResult | None = None
    error: Exception | None = None


@dataclass
class _Entry:
    id: int
    seq: Sequence
    order: int
    nodes: list[Node]  # cached blocks this sequence references
    pages: list[int]  # page of each block of its canvas, by block index
    private: set[int]  # pages it owns (freed when it leaves)
    path: Node | None = None  # the trie node of its blocks [0, keyed)
    keyed: int = 0


@dataclass
class SchedulerStats:
    steps: int = 0  # batched denoising forwards
    rows: int = 0  # sequences summed over those forwards
    batch_max: int = 0
    prefills: int = 0

    @property
    def batch_mean(self) -> float | None:
        return self.rows / self.steps if self.steps else None


class Scheduler:
    """Runs the sequences of one model over one BlockCache. `max_batch` rows per forward (1: no
    batching, one sequence at a time in arrival order); `max_queue` sequences may wait."""

    def __init__(self, model: LLaDA2, cache: BlockCache, max_batch: int = 8, max_queue: int = 64,
                 use_cache: bool = True):  # fmt: skip
        self.model, self.cache, self.use_cache = model, cache, use_cache
        self.block_size = cache.block_size
        self.max_batch, self.max_queue = max(1, max_batch), max_queue
        self.waiting: list[_Entry] = []
        self.running: list[_Entry] = []
        self.stats = SchedulerStats()
        self._ids = itertools.count(1)
        self._order = itertools.count()

    # --- verbs -------------------------------------------------------------------------------------
    def add(self, settings: Settings) -> int:
        if len(self.waiting) >= self.max_queue:
            raise Busy(f"the engine is busy: {len(self.waiting)} requests are already waiting")
        seq = Sequence(settings, self.block_size, self.use_cache)
        if seq.n_blocks > self.cache.pages - 1:
            raise TooLong(f"a sequence of {seq.n_blocks} blocks of {self.block_size} tokens does not fit the K/V "
                          f"memory ({self.cache.pages - 1} blocks); start the engine with a larger --cache-mb")
        entry = _Entry(next(self._ids), seq, next(self._order), [], [], set())
        bisect.insort(self.waiting, entry, key=lambda e: (e.seq.settings.priority, e.order))
        return entry.id

    def abort(self, seq_id: int) -> None:
        """The sequence ends (cancelled) before the next forward it would be part of."""
        for entry in self.running + self.waiting:
            if entry.id == seq_id:
                entry.seq.aborted = True

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def drain(self) -> list[Event]:
        """Steps until idle (after aborts: no forward runs, every sequence just ends); the events."""
        events: list[Event] = []
        while not self.idle():
            events += self.step()
        return events

    @property
    def queued(self) -> int:
        return len(self.waiting)

    @torch.inference_mode()
    def step(self) -> list[Event]:
        """Admit, prefill, one batched forward; a draft event per sequence that ran, an end event per
        sequence that finished (ran to the end, stopped early, or was cancelled)."""
        events: list[Event] = []
        self._admit(events)
        rows = [entry for entry in self.running if entry.seq.ready()]  # the others have just finished
        self._leave(events)
        if not rows:
            return events
        self._forward(rows, events)
        self._leave(events)
        return events

    # --- admission and leaving ---------------------------------------------------------------------
    def _admit(self, events: list[Event]) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            entry = self.waiting[0]
            seq = entry.seq
            if seq.cancelled():  # while it waited: it ends without a forward
                seq.ready()
                self.waiting.pop(0)
                events.append(Event(entry.id, result=seq.result))
                continue
            try:
                self._place(entry)
            except CacheFull:
                return  # the pages come back as running sequences leave
            self.waiting.pop(0)
            self.running.append(entry)

    def _place(self, entry: _Entry) -> None:
        """Pages for every block of the canvas: the prompt's leading whole blocks from the prefix
        cache where they are cached, the rest private; then one prefill forward for the prompt's
        whole blocks the cache lacked, which are committed to the cache."""
        seq, cache, bs = entry.seq, self.cache, self.block_size
        nodes = cache.match(seq.blocks(0, seq.first)) if self.use_cache else []
        try:
            private = cache.allocate(seq.n_blocks - len(nodes))
        except CacheFull:
            cache.release(nodes)
            raise
        entry.nodes, entry.pages, entry.private = nodes, [n.page for n in nodes] + private, set(private)
        entry.path, entry.keyed = (nodes[-1] if nodes else None), len(nodes)
        seq.valid = seq.result.reused_tokens = reused = len(nodes) * bs  # nothing is matched without the cache
        if not self.use_cache or len(nodes) == seq.first:
            return
        lo, hi = reused, seq.first * bs
        ids = torch.tensor([seq.host[lo:hi]], device=self.model.device)
        self.model(ids, kv=cache.view([(entry.pages, lo, hi)], hi - lo), last_n=0)
        seq.result.prefill_forwards += 1
        self.stats.prefills += 1
        seq.valid = hi
        self._commit(entry, seq.first)

    def _commit(self, entry: _Entry, hi_block: int) -> None:
        """Blocks [keyed, hi_block) hold final K/V: the prefix cache takes the pages of those it lacks."""
        if not self.cache.prefix:
            return
        lo_block = entry.keyed
        for b, key in zip(range(lo_block, hi_block), entry.seq.blocks(lo_block, hi_block)):
            node, taken = self.cache.commit(entry.path, key, entry.pages[b])
            if taken:
                entry.private.discard(node.page)
                entry.nodes.append(node)
            entry.path, entry.keyed = node, b + 1

    def _leave(self, events: list[Event]) -> None:
        for entry in [e for e in self.running if e.seq.finished]:
            self.running.remove(entry)
            seq = entry.seq
            if self.use_cache and seq.error is None:
                self._commit(entry, seq.valid // self.block_size)
            self.cache.release(entry.nodes, sorted(entry.private))
            events.append(Event(entry.id, result=seq.result, error=seq.error))

    # --- the batched forward -----------------------------------------------------------------------
    def _forward(self, rows: list[_Entry], events: list[Event]) -> None:
        bs, device = self.block_size, self.model.device
        spans = [entry.seq.queries() for entry in rows]
        width = max(hi - start for start, hi in spans)
        ids = torch.tensor(
            [[0] * (width - (hi - start)) + e.seq.host[start:hi] for e, (start, hi) in zip(rows, spans)],
            device=device,
        )
        view = self.cache.view([(e.pages, start, hi) for e, (start, hi) in zip(rows, spans)], width)
        # The step rule's inputs go to the device before the forward: a copy made after it would wait for it.
        seqs = [entry.seq for entry in rows]
        frozen = torch.tensor([s.frozen for s in seqs], device=device)  # [B, bs]
        mask_ids = torch.tensor([s.settings.mask_id for s in seqs], device=device)  # [B]
        limits = torch.tensor([[s.settings.policy.threshold, s.settings.policy.editing_threshold] for s in seqs],
                              dtype=torch.float64, device=device)  # [B, 2]  # fmt: skip
        logits = self.model(ids, kv=view, last_n=bs)  # [B, bs, V]
        for r, seq in enumerate(seqs):
            at = seq.allowed_row
            if at is not None:
                logits[r, at].masked_fill_(~seq.settings.first_allowed, float("-inf"))
        update = joint_threshold(ids[:, -bs:], logits, frozen, mask_ids, limits[:, 0], limits[:, 1])
        finite = update.confidence.isfinite().all(1, keepdim=True).long()  # a NaN or +inf logit makes its softmax NaN
        packed = torch.cat([update.tokens, update.filled.long(), update.edited.long(), finite], dim=1).tolist()  # one sync
        for entry, (start, _), row in zip(rows, spans, packed):
            if not row[3 * bs]:
                entry.seq.fail(BadLogits(f"the model produced NaN or infinite logits at step {entry.seq.result.steps + 1} "
                                         f"(block {entry.seq.b}): its weights or its precision are broken"))  # fmt: skip
                continue
            draft = entry.seq.apply(start, row[:bs], row[bs : 2 * bs], row[2 * bs : 3 * bs])
            events.append(Event(entry.id, draft=draft))
        self.stats.steps += 1
        self.stats.rows += len(rows)
        self.stats.batch_max = max(self.stats.batch_max, len(rows))
