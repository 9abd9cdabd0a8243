"""SGLang 0.5.23's own scheduler code on a CPU, for the plugin's tests: what is real, what stands in.

Real, from the released wheel: `load_plugins()` and `HookRegistry`, `Scheduler.set_internal_state`,
`SchedulerMultiplexMixin` (`init_pdmux`, `update_split_prefill_batch`, `adjust_stream_groups`,
`event_loop_pdmux`), `Scheduler.event_loop_normal`, `load_pdmux_config` and `PDMuxConfig`,
`divide_sm`, the stream index of `pdmux_context`, the runtime context (`publish` of a real
`ServerArgs`), `ForwardMode`, `NextBatchPlan`, the finish reasons, `SetInternalStateReq`.

Standing in, each named so, for what needs a GPU, a model or SGLang's other processes, registered
through SGLang's own `HookRegistry` as REPLACE hooks (which it applies before, and so beneath,
pdtop's AROUND/BEFORE/AFTER hooks):
- `cuda_stream_groups_on_cpu` for `initialize_stream_groups` (green contexts need CUDA): SGLang's
  `divide_sm` for an H100's 132 SMs, plain objects for the streams;
- `CpuModel` for the tokenizer's requests (`ingest_requests`, `process_input_requests`,
  `_add_request_to_queue`), batch building and the forward pass (`get_new_batch_prefill`,
  `get_next_batch_to_run`, `update_running_batch`, `run_batch`, `process_batch_result`, `on_idle`):
  every decode step samples one token, a prompt's first token comes when its prefill finishes;
- a `torchvision` module with the names `sglang.srt.configs` imports (no torchvision build matches
  the CPU torch 2.13 here).

`SchedulerThread` runs SGLang's real event loop on its own thread, one round per permit, so a test
steps it while clients talk to pdtop's server.
"""
from __future__ import annotations

import enum
import importlib.util
import json
import logging
import os
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SMS, CC = 132, (9, 0)  # an H100
NUM_LAYERS = 28


def sglang_or_skip() -> None:
    """Import SGLang's scheduler modules (once per process), or skip: it is not installed here."""
    if sys.version_info < (3, 11):
        pytest.skip("SGLang 0.5.23 has wheels for Python 3.11 and later only")
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang 0.5.23 is not installed here (make install puts it in, from "
                    "tests/sglang_plugin/requirements.txt)")
    if "sglang.srt.managers.scheduler" in sys.modules:
        return
    stand_in = "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is None
    if stand_in:
        _torchvision_stand_in()
    # importing SGLang sets cache directories in the environment, a handler on the root logger and the
    # levels of other libraries' loggers: the rest of the test session gets them back as they were, and
    # no torchvision (SGLang's modules keep the stand-in they imported)
    env, handlers = dict(os.environ), list(logging.root.handlers)
    levels = {name: logger.level for name, logger in logging.Logger.manager.loggerDict.items()
              if isinstance(logger, logging.Logger)}
    try:
        import sglang.srt.managers.scheduler  # noqa: F401  (the modules the plugin hooks)
    finally:
        os.environ.clear()
        os.environ.update(env)
        logging.root.handlers[:] = handlers
        for name, logger in logging.Logger.manager.loggerDict.items():
            if isinstance(logger, logging.Logger):
                logger.setLevel(levels.get(name, logging.NOTSET))
        if stand_in:
            for name in [m for m in sys.modules if m.partition(".")[0] == "torchvision"]:
                del sys.modules[name]


def _torchvision_stand_in() -> None:
    """A `torchvision` with the names SGLang's model configs import (`transforms.InterpolationMode`,
    `transforms.functional`), put in `sys.modules` after transformers has found that torchvision is
    absent (it caches that; a torchvision it saw would make it import `torchvision.io`)."""
    from transformers.utils import import_utils

    assert not import_utils.is_torchvision_available()

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"

    tv = types.ModuleType("torchvision", "stand-in: the names sglang.srt.configs imports")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    transforms.InterpolationMode = functional.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
    transforms.functional = functional  # type: ignore[attr-defined]
    tv.transforms = transforms  # type: ignore[attr-defined]
    sys.modules.update({"torchvision": tv, "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": functional})


# -- stand-ins for CUDA objects ------------------------------------------------------------------------
class Stream:
    """Where a CUDA stream of a green context would be (torch.cuda.stream() accepts it on a CPU build)."""

    def synchronize(self) -> None:
        pass

    def record_event(self) -> Event:
        return Event()


class Event:
    def query(self) -> bool:
        return True


class CpuGroup:
    """Where SGLang's TP CPU group would be: one rank, so an all-reduce leaves the flags as they are."""

    def allreduce(self, flags: Any, op: Any) -> CpuGroup:
        return self

    def wait(self) -> None:
        pass


class ModelRunner:
    """Where SGLang's model runner would be: remembers which stream group decode attention was set for."""

    def __init__(self) -> None:
        self.decode_attn_backend: list[int] = []

    def update_decode_attn_backend(self, stream_idx: int) -> None:
        self.decode_attn_backend.append(stream_idx)


def cuda_stream_groups_on_cpu(gpu_id: int, config: Any) -> None:
    """Stand-in for `pdmux_context.initialize_stream_groups`: the same levels (SGLang's own `divide_sm`
    for 132 SMs at compute capability 9.0, or the config's manual divisions), plain streams."""
    from sglang.srt.multiplex import pdmux_context as ctx

    if config.manual_divisions:
        divisions = [(p, d) for p, d, _ in config.manual_divisions]
    else:
        divisions = ctx.divide_sm(SMS, CC, config.sm_group_num - 2)
    ctx.SM_COUNTS = [(SMS, 0), *divisions, (0, SMS)]
    ctx.STREAM_GROUPS = [(Stream(), Stream()) for _ in ctx.SM_COUNTS]
    ctx.CURRENT_STREAM_IDX = 0
    ctx.CURRENT_STREAM_GROUP = ctx.STREAM_GROUPS[0]


# -- stand-ins for SGLang's requests and batches ---------------------------------------------------------
@dataclass(eq=False)
class Req:
    """SGLang's `Req`, the fields the scheduler loop and the plugin read."""

    rid: str
    origin_input_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    finished_reason: Any = None
    is_chunked: int = 0


class Batch:
    """SGLang's `ScheduleBatch`, the methods and fields its pdmux and normal loops use."""

    def __init__(self, reqs: list[Req], mode: Any) -> None:
        self.reqs = reqs
        self.forward_mode = mode
        self.extend_num_tokens = sum(len(r.origin_input_ids) for r in reqs)
        self.split_index = 0
        self.split_forward_count = 0
        self.split_prefill_finished = False

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)

    def merge_batch(self, other: Batch) -> None:
        self.reqs.extend(other.reqs)


class CpuModel:
    """Stand-ins for the tokenizer's requests, batch building and the forward pass (REPLACE hooks)."""

    TARGETS = ("ingest_requests", "process_input_requests", "_add_request_to_queue", "get_new_batch_prefill",
               "get_next_batch_to_run", "update_running_batch", "run_batch", "process_batch_result", "on_idle")

    @staticmethod
    def ingest_requests(self: Any, stop_at_pause: bool = False) -> list[Any]:
        thread: SchedulerThread = self.cpu_thread
        thread.next_round()
        recv = list(thread.inbox)
        thread.inbox.clear()
        self.process_input_requests(recv)
        return recv

    @staticmethod
    def process_input_requests(self: Any, recv_reqs: list[Any]) -> None:
        from sglang.srt.managers.io_struct import SetInternalStateReq

        for recv in recv_reqs:
            if isinstance(recv, SetInternalStateReq):
                self.cpu_thread.outputs.append(self.set_internal_state(recv))
            else:
                self._add_request_to_queue(recv)

    @staticmethod
    def _add_request_to_queue(self: Any, req: Req, is_retracted: bool = False) -> None:
        self.waiting_queue.append(req)

    @staticmethod
    def get_new_batch_prefill(self: Any, running_batch: Batch) -> Any:
        from sglang.srt.managers.schedule_batch import NextBatchPlan
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        if not self.waiting_queue:
            return NextBatchPlan(batch_to_run=None, running_batch=running_batch)
        batch = Batch(list(self.waiting_queue), ForwardMode.EXTEND)
        self.waiting_queue.clear()
        self.token_to_kv_pool_allocator.free -= batch.extend_num_tokens
        return NextBatchPlan(batch_to_run=batch, running_batch=running_batch)

    @staticmethod
    def get_next_batch_to_run(self: Any, running_batch: Batch, last_batch: Any) -> Any:
        """The normal loop: a prefill of every waiting request, else a decode step of the running batch."""
        from sglang.srt.managers.schedule_batch import NextBatchPlan

        if last_batch is not None and last_batch.forward_mode.is_extend():
            running_batch.merge_batch(last_batch)
        plan = self.get_new_batch_prefill(running_batch)
        if plan.batch_to_run is not None:
            return plan
        running_batch = self.update_running_batch(running_batch)
        return NextBatchPlan(batch_to_run=None if running_batch.is_empty() else running_batch,
                             running_batch=running_batch)

    @staticmethod
    def update_running_batch(self: Any, batch: Batch) -> Batch:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        done = [r for r in batch.reqs if r.finished_reason is not None]
        if done:
            batch.reqs = [r for r in batch.reqs if r.finished_reason is None]
            self.token_to_kv_pool_allocator.free += sum(len(r.origin_input_ids) + len(r.output_ids) for r in done)
        batch.forward_mode = ForwardMode.DECODE  # SGLang's prepare_for_decode
        return batch

    @staticmethod
    def run_batch(self: Any, batch: Batch) -> str:
        self.cpu_thread.forwards.append((batch.forward_mode.name, batch.batch_size(), batch.split_forward_count))
        if batch.forward_mode.is_decode():
            self.token_to_kv_pool_allocator.free -= batch.batch_size()
        return "result"

    @staticmethod
    def process_batch_result(self: Any, batch: Batch, result: Any) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH

        for req in batch.reqs:
            if batch.forward_mode.is_decode() or not req.output_ids:
                req.output_ids.append(1)
            if len(req.output_ids) >= req.max_new_tokens:
                req.finished_reason = FINISH_LENGTH(length=req.max_new_tokens)

    @staticmethod
    def on_idle(self: Any) -> None:
        pass


def register_stand_ins() -> None:
    """Register the stand-ins with SGLang's HookRegistry (applied by `load_plugins()`)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.multiplex.pdmux_context.initialize_stream_groups", cuda_stream_groups_on_cpu,
                          HookType.REPLACE)
    for name in CpuModel.TARGETS:
        HookRegistry.register(f"sglang.srt.managers.scheduler.Scheduler.{name}", getattr(CpuModel, name),
                              HookType.REPLACE)


class Pool:
    """SGLang's KV allocator and radix cache, as its `token usage` reads them: a count of free token slots,
    taken by a prompt when its prefill is scheduled and by each decode step, given back when a request
    finishes (SGLang's allocator counts its free pages; reading the count costs nothing)."""

    def __init__(self, capacity: int) -> None:
        self.free = capacity

    def available_size(self) -> int:
        return self.free

    def evictable_size(self) -> int:
        return 0


MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
                "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4,
                "num_hidden_layers": NUM_LAYERS, "max_position_embeddings": 8192, "vocab_size": 32000}


def publish_server_args(tmp: Path, pdmux_yaml: str | None, **extra: Any) -> Any:
    """SGLang's real runtime context for one scheduler process (rank 0 of 1): `publish(ServerArgs(...))` of a
    model directory holding only its config.json (SGLang reads it at start; no weights are loaded)."""
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    kwargs: dict[str, Any] = dict(model_path=str(model), device="cpu", **extra)
    if pdmux_yaml is not None:
        path = tmp / "pdmux.yaml"
        path.write_text(pdmux_yaml)
        kwargs.update(enable_pdmux=True, pdmux_config_path=str(path), disable_overlap_schedule=True,
                      chunked_prefill_size=-1)
    args = ServerArgs(**kwargs)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    return args


def make_scheduler(server_args: Any) -> Any:
    """A real `Scheduler` object without its GPU set-up (`__init__` builds the model): the fields SGLang's
    loops read, set as its `__init__` would; `init_pdmux()` is left to the test (it is hooked)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    s = Scheduler.__new__(Scheduler)
    s.server_args = server_args
    s.enable_pdmux = server_args.enable_pdmux
    s.model_config = types.SimpleNamespace(num_hidden_layers=NUM_LAYERS, context_len=8192)  # SGLang's ModelConfig
    s.running_batch = Batch([], ForwardMode.DECODE)
    s.waiting_queue = []
    s.split_prefill_batch = None
    s.tp_worker = types.SimpleNamespace(model_runner=ModelRunner())
    s.tp_cpu_group = CpuGroup()
    s.max_total_num_tokens = 100_000
    s.token_to_kv_pool_allocator = s.tree_cache = Pool(s.max_total_num_tokens)
    s.gracefully_exit = False
    s._engine_paused = False
    s.last_batch = None
    if parallel_state._PDMUX_PREFILL_TP_GROUP is None:  # where the duplicate TP communicator would be
        parallel_state._PDMUX_PREFILL_TP_GROUP = types.SimpleNamespace(name="stand-in prefill TP group")
    return s


class Stop(Exception):
    """Ends the scheduler's event loop (raised from the stand-in for the tokenizer's requests)."""


class SchedulerThread:
    """SGLang's real event loop of `scheduler` on a thread, one round per permit (`rounds`)."""

    def __init__(self, scheduler: Any, loop: str = "event_loop_pdmux") -> None:
        self.scheduler = scheduler
        scheduler.cpu_thread = self
        self.inbox: list[Any] = []  # requests for the next round
        self.outputs: list[Any] = []  # what set_internal_state answered
        self.forwards: list[tuple[str, int, int]] = []  # (mode, batch size, layers) of each run_batch
        self.entered = 0  # rounds begun
        self.error: BaseException | None = None
        self._permits = threading.Semaphore(0)
        self._entered = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(getattr(scheduler, loop),), daemon=True,
                                        name="sglang-scheduler")

    def _run(self, loop: Any) -> None:
        try:
            loop()
        except Stop:
            pass
        except BaseException as exc:
            self.error = exc
        finally:
            with self._entered:
                self.entered = -1
                self._entered.notify_all()

    def next_round(self) -> None:
        """At the start of each round (in the loop's thread): wait for a permit."""
        with self._entered:
            self.entered += 1
            self._entered.notify_all()
        self._permits.acquire()
        if self._stop:
            raise Stop

    def start(self) -> SchedulerThread:
        self._thread.start()
        self._wait(1)
        return self

    def rounds(self, n: int, arrivals: list[Any] | None = None) -> None:
        """Run `n` rounds (the first takes `arrivals`) and wait until the next one is about to begin."""
        self.inbox.extend(arrivals or [])
        target = self.entered + n
        for _ in range(n):
            self._permits.release()
        self._wait(target)

    def _wait(self, target: int) -> None:
        with self._entered:
            if not self._entered.wait_for(lambda: self.entered >= target or self.entered < 0, timeout=30):
                raise TimeoutError(f"the scheduler loop did not reach round {target}")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stop = True
        self._permits.release()
        self._thread.join(10)
