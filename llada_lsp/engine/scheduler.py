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
from ..model import LLaDA2, llada2
from . import cpu_step
from .cache import (
    SCRATCH,
    BlockCache,
    CacheFull,
    Node,
    Packed,
    PagedView,
    all_visible,
    paged_tables,
    row_descriptor,
)
from .policy import rule_for
from .sequence import DecodeSettings, GenerationResult, Sequence, StepDraft
from .step_layout import ALLOWED_AT, Ints, limits_row


@dataclass(frozen=True)
class Event:
    """What one step did for one sequence: a draft, or the end (result set; error set if it failed)."""

    id: int
    draft: StepDraft | None = None
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
    prefill_end: int = 0  # prompt positions [seq.valid, prefill_end) still to prefill, a chunk per step

    @property
    def prefilling(self) -> bool:
        return self.seq.valid < self.prefill_end


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
                 use_cache: bool = True, cuda_graph: bool = False, prefill_chunk: int | None = None):  # fmt: skip
        self.model, self.cache, self.use_cache = model, cache, use_cache
        self.block_size = cache.block_size
        # cuda_graph: each step replayed from a CUDA graph per (batch bucket, width, key bucket). Off by
        # default until measured on a GPU (docs/gpu.md); refused off CUDA and for a split model.
        if cuda_graph and (model.device.type != "cuda" or model.hops or not use_cache):
            raise ValueError("cuda_graph needs the whole model on one CUDA device and the block cache on")
        self.cuda_graph = cuda_graph
        # flash-attn's varlen kernel for a step whose rows need no mask: asked once, not per step (the
        # model's device and dtype lookups behind it cost a CPU step as much as filling its inputs)
        self.flash = llada2.flash_available(model.device, model.dtype) and not model.hops
        self.graphs: dict[tuple, tuple] = {}
        self.graph_pool = torch.cuda.graph_pool_handle() if cuda_graph else None
        self.inputs = StepInputs(model.device, model.config.vocab_size)
        if model.device.type == "cpu":
            cpu_step.warm_up()  # the step's host kernels compiled or loaded now, not in the first answer
        # the kind of block rule the model decodes with (LLaDA2.2's edit ids: JointThresholdInDel): what
        # its device step returns and how a row of it is read (policy.BlockRule)
        self.rule = rule_for(model.config)
        # Prompt tokens prefilled per step (whole blocks, at least one), in forwards of at most that many
        # tokens: memory per forward is bounded whatever the prompt's length, and a long prompt is
        # prefilled across steps while the running sequences keep denoising.
        chunk = PREFILL_CHUNK if prefill_chunk is None else prefill_chunk
        self.prefill_chunk = max(self.block_size, chunk // self.block_size * self.block_size)
        self.max_batch, self.max_queue = max(1, max_batch), max_queue
        self.waiting: list[_Entry] = []
        self.running: list[_Entry] = []
        self.stats = SchedulerStats()
        self._ids = itertools.count(1)
        self._order = itertools.count()

    # --- verbs -------------------------------------------------------------------------------------
    def add(self, settings: DecodeSettings) -> int:
        if len(self.waiting) >= self.max_queue:
            raise Busy(f"the engine is busy: {len(self.waiting)} requests are already waiting")
        seq = Sequence(settings, self.block_size, self.use_cache)
        if not isinstance(settings.policy, self.rule):  # Engine.settings makes them agree; a hand-made one may not
            raise ValueError(f"a {type(settings.policy).__name__} sequence for a model whose rule is "
                             f"{self.model.config.family.decoding_rule}")  # fmt: skip
        if seq.n_blocks > self.cache.pages - 1:
            raise TooLong(
                f"a sequence of {seq.n_blocks} blocks of {self.block_size} tokens does not fit the K/V "
                f"memory ({self.cache.pages - 1} blocks); start the engine with a larger --cache-mb"
            )
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
        self._prefill()
        # ready() may end a sequence (cancelled, or its last block closed); one still prefilling waits
        rows = [entry for entry in self.running if not entry.prefilling and entry.seq.ready()]
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
        seq.valid = seq.result.reused_tokens = len(nodes) * bs  # nothing is matched without the cache
        entry.prefill_end = seq.first * bs if self.use_cache else 0

    def _prefill(self) -> None:
        """The prompt blocks the prefix cache lacked, `prefill_chunk` tokens of them per step in forwards
        of whole blocks, oldest sequence first; each chunk's blocks are committed to the cache at once
        (their K/V are final). A forward's queries x keys stay within prefill_chunk^2 (what one chunk at
        the start of a prompt has): attention's mask, and its scores where SDPA takes the math backend,
        are [T, S], so a chunk far into a long prompt is shorter. A sequence cancelled meanwhile ends
        here, before its next chunk. Inline completions go first (priority, then arrival); while others
        decode, a rewrite's or a next edit's prompt takes BACKGROUND_PREFILL tokens a step at most, so a
        huge one does not hold every typing user's next step up."""
        budget, bs = self.prefill_chunk, self.block_size
        decoding = any(not e.prefilling for e in self.running)
        for entry in sorted(
            (e for e in self.running if e.prefilling), key=lambda e: (e.seq.settings.priority, e.order)
        ):
            seq = entry.seq
            if seq.cancelled():
                seq.ready()  # it ends (cancelled) without a forward
                continue
            if budget <= 0:
                break
            lo = seq.valid
            span = max(bs, self.prefill_chunk**2 // (lo + budget) // bs * bs)  # tokens whose [T, S] fits
            if decoding and seq.settings.priority > 0:
                span = min(span, max(bs, BACKGROUND_PREFILL // bs * bs))
            hi = min(entry.prefill_end, lo + min(budget, span))
            ids = torch.tensor([seq.host[lo:hi]], device=self.model.device)
            self.model(ids, kv=self.cache.view([(entry.pages, lo, hi)], hi - lo), last_n=0)
            seq.result.prefill_forwards += 1
            self.stats.prefills += 1
            seq.valid, budget = hi, budget - (hi - lo)
            self._commit(entry, hi // self.block_size)

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
        bs = self.block_size
        spans = [entry.seq.queries() for entry in rows]
        width = max(hi - start for start, hi in spans)
        decided = [hi - entry.seq.lo for entry, (_, hi) in zip(rows, spans)]  # a block each, or a draft's blocks
        D = max(decided)
        outside = [D - n for n in decided]  # of the D decisions, those before the row's active block
        S = max(hi for _, hi in spans)
        B = len(rows)
        if self.cuda_graph:  # static shapes: a graph per (batch bucket, width, key bucket)
            B, S = bucket(B), key_bucket(-(-S // bs)) * bs
        seqs = [entry.seq for entry in rows]
        visible = len(rows) == B and all_visible([(e.pages, a, b) for e, (a, b) in zip(rows, spans)], width, bs)
        constrained = self.cuda_graph or any(seq.allowed_row is not None for seq in seqs)
        ints, limits, allowed = self.inputs.fill(rows, spans, width, S, B, constrained, D, outside)
        if self.cuda_graph:
            packed = self._graphed(ints, limits, allowed, width, S, visible, D)
        else:  # flash-attn's varlen kernel where it runs and no row needs a mask (shapes follow the rows' ends)
            varlen = None
            if self.flash and all(start // bs == (hi - 1) // bs for start, hi in spans):
                varlen = Packed.of([(e.pages, a, b) for e, (a, b) in zip(rows, spans)], width, bs, self.model.device)
            packed = self._device_step(ints, limits, allowed, width, S, visible, D, varlen)
        host = packed.tolist()  # the one host read of the step (it waits for the forward)
        vocab = self.inputs.vocab
        for entry, (start, _), skip, row in zip(rows, spans, outside, host):
            decided = self.rule.read(row, skip, D, vocab)  # the row's own decisions; None: bad logits
            if decided is None:
                fail_on_bad_logits(entry.seq)
                continue
            events.append(Event(entry.id, draft=entry.seq.apply(start, decided)))
        self._count(rows)

    def _count(self, rows: list[_Entry]) -> None:
        self.stats.steps += 1
        self.stats.rows += len(rows)
        self.stats.batch_max = max(self.stats.batch_max, len(rows))

    def _device_step(self, ints: torch.Tensor, limits: torch.Tensor, allowed: torch.Tensor | None, width: int,
                     S: int, visible: bool, D: int, varlen: Packed | None = None) -> torch.Tensor:  # fmt: skip
        """One denoising step on the device, from StepInputs' tensors to the rule's rows for the last D
        queries of each row:
        static shapes for static (B, width, S, D), no host read, so torch.compile traces it whole and a
        CUDA graph can hold it (tests/engine/test_gpu_step.py checks both). D is a block, or more when a row
        checks a draft ahead (Sequence.ahead); a row that decides fewer positions has its first `outside`
        of the D frozen and never masked, so no step rule reaches them, and their decisions are dropped.
        What the step returns for each row is the block rule's (policy.BlockRule.device_step:
        step_layout's Decisions, or Candidates for LLaDA2.2). On the CPU (not under torch.compile) the
        tables are made on the host and, where the CPU kernels run, JointThreshold's decisions in numba
        (cpu_step.py): the same numbers in fewer torch ops."""
        layout = Ints(width)
        tables = paged_tables(layout.descriptors(ints), width, S, self.block_size, visible)
        view = PagedView(self.cache, *tables)
        view.packed = varlen
        logits = self.model(layout.ids(ints), kv=view, last_n=D)  # [B, D, V]
        if allowed is not None:
            constrain_first(logits, allowed, layout.column(ints, ALLOWED_AT))
        return self.rule.device_step(logits, ints, layout, D, limits, self.inputs.vocab)

    def _graphed(self, ints, limits, allowed, width: int, S: int, visible: bool, D: int) -> torch.Tensor:
        """_device_step replayed from the CUDA graph of its shapes, captured on first use (after two
        warm-up runs on a side stream, which compile the Triton kernels; they write the same K/V the
        replay writes). The inputs are StepInputs' persistent buffers: the graph reads them in place."""
        key = (ints.shape, width, S, visible, allowed is not None, D)
        if key not in self.graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._device_step(ints, limits, allowed, width, S, visible, D)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                out = self._device_step(ints, limits, allowed, width, S, visible, D)
            self.graphs[key] = (graph, out)
        graph, out = self.graphs[key]
        graph.replay()
        return out


PREFILL_CHUNK = 2048  # default prompt tokens per prefill forward (and per step)
BACKGROUND_PREFILL = 256  # a rewrite's or next edit's prompt tokens per step while others decode


def bucket(n: int) -> int:
    """The batch (or key-block) bucket of n: the next power of two, so a few graphs cover every size."""
    return 1 << max(0, n - 1).bit_length()


def key_bucket(n: int) -> int:
    """The key-block bucket of n blocks: n rounded up to a quarter of its power of two (33 -> 48), so
    padding keys cost at most a third more attention and a 32k context needs about 30 graphs."""
    step = max(1, bucket(n) // 4)
    return -(-n // step) * step


def constrain_first(logits: torch.Tensor, allowed: torch.Tensor, at: torch.Tensor) -> None:
    """logits [B, N, V] in place: row b's position at[b] keeps only the ids allowed[b] [V] allows
    (token healing); at[b] < 0: row b has no such position. Static shapes, no host read."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    pick = at.clamp(min=0)
    keep = allowed | (at < 0)[:, None]
    logits[rows, pick] = logits[rows, pick].masked_fill(~keep, float("-inf"))


class StepInputs:
    """The step's inputs in persistent buffers, updated in place: on CUDA a pinned host buffer per shape
    and its device twin, one non-blocking copy each (the host buffer is rewritten only after the step's
    host read, by which time the copy has run). `ints` and `limits` in step_layout's layouts."""

    def __init__(self, device: torch.device, vocab: int):
        self.device, self.vocab = torch.device(device), vocab
        self.pin = self.device.type == "cuda"
        self.buffers: dict[tuple, tuple] = {}  # (name, shape) -> _buffers' triple

    def _buffers(self, name: str, shape: tuple[int, ...], dtype: torch.dtype):
        """(host buffer, its device twin, the host buffer's numpy view) of `name` at `shape`: the host's
        values are written through the view (no torch op), the device twin read by the step."""
        key = (name, shape)
        if key not in self.buffers:
            host = torch.zeros(shape, dtype=dtype, pin_memory=self.pin)
            self.buffers[key] = (host, host.to(self.device) if self.device.type != "cpu" else host, host.numpy())
        return self.buffers[key]

    def fill(self, rows: list[_Entry], spans, width: int, S: int, B: int, constrained: bool, D: int,
             outside: list[int]):  # fmt: skip
        """-> (ints, limits, allowed [B, V] bool or None) on the device, for `rows` padded to B rows (a
        padding row: queries at 0..width-1 on the scratch page, all frozen, its decisions dropped); each
        row decides the last D of its queries' positions, the first `outside` of them not its own
        (Scheduler._device_step)."""
        bs = rows[0].seq.bs
        n_pages = -(-S // bs)
        ints_h, ints_d, ints_np = self._buffers("ints", (B, Ints.columns(width, n_pages)), torch.int64)
        limits_h, limits_d, limits_np = self._buffers("limits", (B, 2), torch.float32)
        table = []
        for entry, (start, hi), skip in zip(rows, spans, outside):
            seq = entry.seq
            ids = seq.host[start:hi]
            at = seq.allowed_row
            table.append(Ints.row(ids, width, min(max(seq.P - seq.lo, 0), bs), seq.settings.mask_id,
                                  -1 if at is None else skip + at, skip,
                                  row_descriptor(entry.pages, start, hi, n_pages, bs)))  # fmt: skip
        scratch = row_descriptor([SCRATCH] * n_pages, 0, width, n_pages, bs)
        pad = Ints.row([], width, D, rows[0].seq.settings.mask_id, -1, 0, scratch)
        table += [pad] * (B - len(rows))
        ints_np[...] = table
        policies = [entry.seq.settings.policy for entry in rows]
        limits = [limits_row(p.threshold, p.editing_threshold) for p in policies] + [limits_row(1.0, 1.0)] * (
            B - len(rows)
        )
        limits_np[...] = limits  # float32: rounded as torch.tensor rounds them
        if ints_d is not ints_h:
            ints_d.copy_(ints_h, non_blocking=True)
            limits_d.copy_(limits_h, non_blocking=True)
        if not constrained:
            return ints_d, limits_d, None
        allowed = self._buffers("allowed", (B, self.vocab), torch.bool)[1]
        for r, entry in enumerate(rows):
            if entry.seq.allowed_row is not None:
                allowed[r].copy_(entry.seq.settings.first_allowed, non_blocking=True)  # device to device
        return ints_d, limits_d, allowed


def fail_on_bad_logits(seq: Sequence) -> None:
    """A row whose logits were not all finite (the step's one host read says so): the sequence fails."""
    seq.fail(
        BadLogits(
            f"the model produced NaN or infinite logits at step {seq.result.steps + 1} (block {seq.b}): "
            "its weights or its precision are broken"
        )
    )
