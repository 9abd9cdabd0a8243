"""The `pdmux` policy: decode on its own units while the prefill advances layer by layer beside it.

Each round runs one decode step on the decode side while the in-flight prefill batch advances
`k = min(L, max(1, budget // tokens))` layers on the prefill side, at most
`max_split_forward_layers` while decode runs (all the layers left when nothing decodes, but on
the CPU); the round waits for decode only. Finished prefills join the decode batch. The level is
chosen again (`level_rule.SloRule`: SGLang's rule, or `level_rule: slo`) only while the prefill
side is idle (a level change syncs both sides, as SGLang's does).

Newer SGLang (docs/levels.md names the commit) forms pdmux's split prefill batch with its usual
prefill adder, so its server flag `--chunked-prefill-size` applies here too: a prompt longer than
the chunk size is prefilled one chunk at a time, each chunk a split prefill of its own (`k =
min(L, max(1, budget // chunk tokens))` layers a slice, capped while decode runs), its K/V cached
before the next chunk starts, the level chosen again between chunks; the first token comes from
the last chunk. pdtop reads the size from the pdmux config's `chunked_prefill_size` (0, the
default: whole prompts); its `chunk_size` stays the chunked policy's. pdtop's one difference: a
chunked prompt is prefilled alone (SGLang's adder may pack whole short prompts before it in the
same chunk's budget); prompts that fit the size are batched whole, at most the size's tokens a batch.

A request aborted while its batch is in flight ends when that batch completes (its layers still
write its blocks until then), unless every request of the batch was aborted: then no further
slice is submitted, and it ends, its KV freed, at the first round boundary with none of its
slices running. A chunked prompt aborted between two chunks ends at once.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic

from pdtop.engine.devices.base import Work
from pdtop.engine.records import PrefillProgress
from pdtop.engine.request import Request
from pdtop.engine.runtime.executor import Executor, S
from pdtop.engine.scheduling.level_rule import decode_context
from pdtop.engine.scheduling.policy import Policy, RoundStats
from pdtop.engine.scheduling.splits import prefill_layers_per_step, slice_layers

if TYPE_CHECKING:
    from pdtop.engine.scheduling.scheduler import Scheduler

Span = tuple[int, int]  # a chunk: (its first prompt token, its tokens)


@dataclass
class PrefillBatch(Generic[S]):
    reqs: list[Request]
    state: S  # what the executor's `prefill_begin` made; only the executor reads it
    tokens: int  # the tokens this prefill runs (a chunk's own)
    layers_per_round: int  # the current slice's: `budget_layers`, capped while decode runs
    budget_layers: int = 0  # min(L, max(1, budget // tokens)), set when the batch starts
    layers_done: int = 0  # of its own tokens (a chunk's)
    submitted_end: int = 0  # layers submitted so far (>= layers_done while slices are in flight)
    in_flight: deque[tuple[int, Work]] = field(default_factory=deque)  # (end layer, work) of each unfinished slice
    charged: float = 0.0  # the fraction of the oldest slice in flight charged to rounds so far
    span: Span | None = None  # a chunk of its one request's prompt; None: whole prompts

    def progress(self, num_layers: int) -> PrefillProgress:
        """Its `round.prefills` entry; a chunk's tells the prompt's tokens, those cached before this
        chunk (`tokens_done`), and as `layers_done` the prompt's share done: the cached tokens through
        every layer, this chunk's through the layers it has run."""
        if self.span is None:
            return PrefillProgress([r.id for r in self.reqs], self.tokens, self.layers_done, num_layers,
                                   self.layers_per_round)
        r, (start, n) = self.reqs[0], self.span
        done = (num_layers * start + n * self.layers_done) // r.prompt_len
        return PrefillProgress([r.id], r.prompt_len, done, num_layers, self.layers_per_round, start)


def next_slice(pf: PrefillBatch[S], num_layers: int, cap: int, decoding: bool, whole_alone: bool) -> int:
    """Layers of `pf`'s next slice: the budget's, capped at `cap` while decode runs (`slice_layers`).
    With nothing decoding and `whole_alone`, all the layers left in one slice (newer SGLang: splitting
    only helps decode run between slices); the CPU device keeps slicing, so a lone prompt's progress shows."""
    if whole_alone and not decoding:
        return num_layers - pf.submitted_end
    return slice_layers(pf.budget_layers, cap, decoding)


def chunk_tokens(req: Request, chunk_size: int) -> int | None:
    """The tokens of `req`'s next chunk under `chunk_size` (0: off); None when its prompt goes whole."""
    left = req.prompt_len - req.num_cached
    if req.num_cached == 0 and (chunk_size <= 0 or left <= chunk_size):
        return None
    return min(chunk_size, left) if chunk_size > 0 else left


def between_chunks(req: Request, num_layers: int, chunk_size: int, budget: int) -> PrefillProgress:
    """The `round.prefills` entry of a chunked prompt whose next chunk starts next round."""
    n = chunk_tokens(req, chunk_size) or req.prompt_len - req.num_cached
    return PrefillProgress([req.id], req.prompt_len, num_layers * req.num_cached // req.prompt_len, num_layers,
                           prefill_layers_per_step(n, num_layers, budget), req.num_cached)


def begin(executor: Executor[S], reqs: list[Request], num_layers: int, budget: int,
          chunk_size: int = 0) -> PrefillBatch[S]:
    """The split prefill of `reqs`: whole prompts, or the next chunk of a lone prompt longer than `chunk_size`."""
    n = chunk_tokens(reqs[0], chunk_size) if len(reqs) == 1 else None
    tokens = sum(r.prompt_len for r in reqs) if n is None else n
    k = prefill_layers_per_step(tokens, num_layers, budget)
    span = None if n is None else (reqs[0].num_cached, n)
    return PrefillBatch(reqs, executor.prefill_begin(reqs, n), tokens, k, k, span=span)


class Pdmux(Policy, Generic[S]):
    name = "pdmux"

    def __init__(self, scheduler: Scheduler[S]) -> None:
        self.scheduler = scheduler
        self.batch: PrefillBatch[S] | None = None
        self.chunked: Request | None = None  # a prompt prefilled chunk by chunk, from its first chunk to its last

    def in_flight(self) -> bool:
        return self.batch is not None or self.chunked is not None

    def abort(self, req: Request) -> bool:
        if self.batch is not None and req in self.batch.reqs:
            return True
        if req is self.chunked:  # between two of its chunks
            self.chunked = None
        return False

    def progress(self) -> list[PrefillProgress]:
        s = self.scheduler
        if self.batch is not None:
            return [self.batch.progress(s.num_layers)]
        if self.chunked is not None:
            return [between_chunks(self.chunked, s.num_layers, s.config.chunked_prefill_size, s.config.token_budget)]
        return []

    def step(self, stats: RoundStats) -> None:
        s, dev, layers = self.scheduler, self.scheduler.device, self.scheduler.num_layers
        t0 = dev.now()
        self._collect(stats)  # a real device's chunk may have finished between rounds
        size = s.config.chunked_prefill_size
        if self.batch is None and (self.chunked is not None or (s.waiting and not s.draining)):
            # a chunked prompt's next chunk first (SGLang: its chunked request), else new prompts
            reqs = [self.chunked] if self.chunked is not None else s.admit(
                min(s.max_prefill_tokens, size or s.max_prefill_tokens))
            if reqs:
                self.batch = begin(s.executor, reqs, layers, s.config.token_budget, size)
                self.chunked = reqs[0] if self.batch.span is not None else None
        if not dev.prefill_busy():
            s.set_level(s.pinned if s.pinned is not None else s.levels.choose(
                s.table, len(s.running), self.batch is not None, s.config, decode_context(s.running)))
        pf = self.batch
        # A slice every round while the device takes more (SGLang launches one per loop iteration;
        # CUDA queues up to two, so the prefill SMs never wait for the next round to get work).
        if pf is not None and pf.submitted_end < layers and (
                not dev.prefill_busy() or len(pf.in_flight) < dev.max_prefill_in_flight):
            k = next_slice(pf, layers, s.config.max_split_forward_layers, bool(s.running),
                           whole_alone=dev.kind != "cpu")  # SGLang's; the SLO rule may take more
            pf.layers_per_round = s.levels.slice_layers(k, pf.submitted_end, layers, s.config)
            end = min(layers, pf.submitted_end + pf.layers_per_round)
            work = s.executor.prefill_work(pf.state, pf.reqs, pf.submitted_end, end, pf.span)
            dev.submit_prefill(work)
            pf.submitted_end = end
            pf.in_flight.append((end, work))
        stats.split = split = dev.split
        if s.running:
            s.decode(stats, whole=False)
        self._collect(stats, block=not s.running)
        self._charge(stats)
        self._pace(split[0], dev.now() - t0)

    def _charge(self, stats: RoundStats) -> None:
        """Charge this round the part of a lone slice in flight done since the last charge, by the
        device's progress: a slice's cost is spread over the rounds it runs in. (With several in
        flight, each is charged whole when it is collected.)"""
        pf = self.batch
        if pf is None or len(pf.in_flight) != 1:
            return
        done = self.scheduler.device.prefill_progress()
        stats.charge(pf.in_flight[0][1], done - pf.charged)
        pf.charged = done

    def _collect(self, stats: RoundStats, block: bool = False) -> None:
        """Take finished prefill slices; `block` waits for them (a round with nothing to decode)."""
        s, pf = self.scheduler, self.batch
        if pf is None:
            return
        for _ in range(s.device.collect_prefill(len(pf.in_flight), block) if pf.in_flight else 0):
            pf.layers_done, work = pf.in_flight.popleft()
            stats.charge(work, 1.0 - pf.charged)
            pf.charged = 0.0
        if pf.layers_done == s.num_layers:
            self.batch = None
            tokens = s.executor.prefill_finish(pf.state)
            if tokens:
                self.chunked = None
                s.join_decode(pf.reqs, tokens, stats)
            elif (reason := s.ending.pop(pf.reqs[0].id, None)) is not None:  # aborted during a chunk
                self.chunked = None
                stats.requests.append(s.end(pf.reqs[0], reason, s.device.now()))
        elif not pf.in_flight and all(r.id in s.ending for r in pf.reqs):  # all its clients left:
            self.batch, self.chunked, now = None, None, s.device.now()  # no more of it runs, KV freed
            s.executor.prefill_drop(pf.state)
            stats.requests += [s.end(r, s.ending.pop(r.id), now) for r in pf.reqs]

    def _pace(self, units: int, round_s: float) -> None:
        """Under level_rule slo, the in-flight prefill's pace (`level_rule.PrefillPace`): this round's
        prefill unit-seconds and the layers its piece (the batch, or the chunk) has done."""
        s, pf, req = self.scheduler, self.batch, self.chunked
        if s.config.level_rule != "slo" or not units:
            return
        if pf is not None:
            ids = tuple(r.id for r in pf.reqs)
            key = (ids, None, pf.tokens) if pf.span is None else (ids, pf.span[0], pf.reqs[0].prompt_len)
            s.levels.pace.add(key, round_s * units, pf.layers_done)
        elif req is not None:  # between chunks: the next chunk's, none of its layers done
            s.levels.pace.add(((req.id,), req.num_cached, req.prompt_len), round_s * units, 0)
