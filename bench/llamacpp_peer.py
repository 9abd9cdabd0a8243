"""llama.cpp (llama-cpp-python, the `peers` extra) driven through its C API for `engine_bench.py`:
the same GGUF, the same threads, greedy steps timed one by one as pdtop's are.

Two contexts, as llama.cpp's own tools make them: one sequence (`n_seq_max` 1, llama-cpp-python's
`Llama` default) for batch-1 decode and the prefill, and `n_seq_max` 32 with a unified KV cache for
batch 32 (one `llama_batch` of 32 tokens, one per sequence, a step). n_batch and n_ubatch are 512
(llama-cpp-python's defaults; a 2048-token prefill is four `llama_decode` calls), the KV cache is
llama.cpp's default (F16), flash attention at its default (auto).
"""
from __future__ import annotations

import ctypes
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
