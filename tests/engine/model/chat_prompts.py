"""Test helpers: a chat prompt's token ids, and its last position's logits run through the layers in
slices (as layer-split prefill runs them)."""
from __future__ import annotations

import itertools

import torch

from pdtop.engine.model.llama import ForwardBatch, Segment
from pdtop.engine.request import Request
from pdtop.engine.runtime.runner import ModelRunner


def chat_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def prompt_logits(model, ids: list[int], cuts: list[int]) -> torch.Tensor:
    runner = ModelRunner(model, kv_capacity_tokens=256)
    seq = Request(0, ids)
    runner.admit(seq)
    slots = torch.as_tensor(runner.kv.slots(seq.table, 0, len(ids)))
    batch = ForwardBatch(kv=runner.kv, positions=torch.arange(len(ids)), slots=slots,
                         segments=[Segment(offset=0, length=len(ids), prefix=0)])
    with torch.inference_mode():
        h = model.embed(torch.tensor(ids))
        for a, b in itertools.pairwise([0, *cuts, model.num_layers]):
            h = model.forward_layers(h, batch, a, b)
        return model.logits(h[-1:])[0]
