"""llama.cpp (llama-cpp-python, the `peers` extra) driven through its C API for `engine_bench.py`:
the same GGUF, the same threads, greedy steps timed one by one as pdtop's are.

It runs in a process of its own (`Peer`, this file as a script, JSON lines over stdin/stdout), so
that its OpenMP threads wait as llama.cpp's own do (spinning, libgomp's default) and not as pdtop
sets them for its process (OMP_WAIT_POLICY=PASSIVE): libgomp reads that once per process, and on
a quiet 2-core machine passive waiting cut llama.cpp's batch-1 decode from 98 to 38 tok/s.
`engine_bench --llamacpp-wait shared` gives it pdtop's setting instead (better under load).

Two contexts, as llama.cpp's own tools make them: one sequence (`n_seq_max` 1, llama-cpp-python's
`Llama` default) for batch-1 decode and the prefill, and `n_seq_max` 32 with a unified KV cache for
batch 32 (one `llama_batch` of 32 tokens, one per sequence, a step). n_batch and n_ubatch are 512
(llama-cpp-python's defaults; a 2048-token prefill is four `llama_decode` calls), the KV cache is
llama.cpp's default (F16), flash attention at its default (auto).
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

N_BATCH = 512


class LlamaCpp:
    """One llama.cpp context on a GGUF file: `n_seq` sequences, `n_ctx` KV cells in all."""

    def __init__(self, path: str, threads: int, n_ctx: int, n_seq: int = 1, model: Any = None):
        import llama_cpp as lc

        self.lc = lc
        quiet()
        lc.llama_backend_init()
        self.model = model or lc.llama_model_load_from_file(path.encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        p = lc.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, N_BATCH, N_BATCH, n_seq
        p.n_threads = p.n_threads_batch = threads
        p.kv_unified = n_seq > 1  # else each sequence gets n_ctx / n_seq cells
        self.ctx = lc.llama_init_from_model(self.model, p)
        if not self.ctx:
            raise RuntimeError("llama.cpp cannot make a context")
        self.batch = lc.llama_batch_init(N_BATCH, 0, 1)
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))

    def clear(self) -> None:
        """Forget every sequence's KV."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)

    def decode(self, tokens: list[int], pos: list[int], seqs: list[int], logits: list[bool]) -> None:
        """One `llama_decode` of up to N_BATCH tokens."""
        b = self.batch
        b.n_tokens = len(tokens)
        for i, (t, p, s, want) in enumerate(zip(tokens, pos, seqs, logits, strict=True)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p, 1, want
            b.seq_id[i][0] = s
        rc = self.lc.llama_decode(self.ctx, b)
        if rc:
            raise RuntimeError(f"llama_decode returned {rc}")

    def argmax(self, i: int) -> int:
        """The greedy token of the batch's `i`-th token (one with logits)."""
        row = np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, i), shape=(self.vocab,))
        return int(row.argmax())

    def prompt(self, ids: list[int], seq: int = 0) -> int:
        """Prefill `ids` into sequence `seq` in N_BATCH chunks; the greedy next token."""
        for start in range(0, len(ids), N_BATCH):
            part = ids[start:start + N_BATCH]
            last = start + len(part) == len(ids)
            self.decode(part, list(range(start, start + len(part))), [seq] * len(part),
                        [last and i == len(part) - 1 for i in range(len(part))])
        return self.argmax(-1)

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)


_LOG_SINK: list[Any] = []  # the callback must outlive every call into llama.cpp


def quiet() -> None:
    """llama.cpp's log lines off (it prints every load detail to stderr otherwise)."""
    import llama_cpp as lc

    if not _LOG_SINK:
        _LOG_SINK.append(lc.llama_log_callback(lambda level, text, data: None))
        lc.llama_log_set(_LOG_SINK[0], ctypes.c_void_p())


def version() -> str:
    import llama_cpp as lc

    return f"llama-cpp-python {lc.__version__}"


def decode_steps(ctx: LlamaCpp, prompts: list[list[int]], steps: int) -> list[float]:
    """Each prompt into its own sequence, then `steps` greedy steps of all of them, each timed (the
    first step after the prefill is not)."""
    ctx.clear()
    nxt = [ctx.prompt(ids, seq=i) for i, ids in enumerate(prompts)]
    bs, pos, times = len(prompts), len(prompts[0]), []
    for i in range(steps + 1):
        t = time.perf_counter()
        ctx.decode(nxt, [pos] * bs, list(range(bs)), [True] * bs)
        nxt = [ctx.argmax(j) for j in range(bs)]
        if i:
            times.append(time.perf_counter() - t)
        pos += 1
    return times


def serve(path: str, threads: int, n_ctx: int) -> None:
    """The child: one request a line on stdin ({"prompts", "steps"} or {"prefill"}), the times on stdout."""
    one = LlamaCpp(path, threads, n_ctx)
    many: dict[int, LlamaCpp] = {}
    print(json.dumps({"version": version()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if "prefill" in req:
            one.clear()
            t = time.perf_counter()
            one.prompt(req["prefill"])
            out: Any = [time.perf_counter() - t]
        else:
            bs, prompts = len(req["prompts"]), req["prompts"]
            if bs > 1 and bs not in many:
                many[bs] = LlamaCpp(path, threads, bs * (len(prompts[0]) + req["steps"] + 8), bs, one.model)
            out = decode_steps(one if bs == 1 else many[bs], prompts, req["steps"])
        print(json.dumps(out), flush=True)


class Peer:
    """llama.cpp in its own process (`serve`); `own_wait`: its OpenMP threads wait as libgomp's default."""

    def __init__(self, path: str, threads: int, n_ctx: int, own_wait: bool = True):
        env = dict(os.environ)
        if own_wait:
            for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
                env.pop(key, None)
        self.proc = subprocess.Popen([sys.executable, __file__, path, str(threads), str(n_ctx)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline() if self.proc.stdout else ""
        if not first:
            raise RuntimeError("the llama.cpp process did not start (its stderr says why)")
        self.version = json.loads(first)["version"]
        self.wait = "own (libgomp default)" if own_wait else f"shared ({env.get('OMP_WAIT_POLICY', 'default')})"

    def ask(self, req: dict[str, Any]) -> list[float]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the llama.cpp process ended")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
