"""The garbage collector and the rounds."""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive after start-up (model, tokenizer, modules: about 180k
    objects with the default model) out of the collector's reach. A full collection over them took
    120 ms here, a stall in whichever round it fell; after this it takes well under 1 ms."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Rounds driven one by one (a benchmark, a tune candidate) under the collector as `Engine.run` runs
    them: what is alive at entry frozen, so no full collection over it lands in a round; unfrozen at exit,
    so what is freed after (a closed engine's KV cache, in a cycle) is collected as before. A heap frozen
    already is left as it is."""
    mine = gc.get_freeze_count() == 0
    if mine:
        freeze_startup_heap()
    try:
        yield
    finally:
        if mine:
            gc.unfreeze()
