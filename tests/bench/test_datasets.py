"""The dataset readers (issue 38 item 12): ShareGPT read one entry at a time gives what vLLM's `json.load` and
shuffle give, a file costs what its entries keep rather than 26x its size, and deep nesting, an oversized
entry or line, and too much kept text are one line each; vLLM 0.33's custom `output_tokens`."""
from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from pdtop.bench import datasets
from pdtop.bench.datasets import DatasetError, custom_prompts, is_valid_sequence, sharegpt_prompts
from pdtop.cli import main

TURNS = ["Name three colors of the rainbow.", "Red, orange and yellow are three of them.",
         "Write a haiku about rain on a tin roof.", "Tin roof sings at night, soft rain taps a steady drum.",
         "Why is the sky blue?", "Sunlight scatters off air molecules; blue scatters the most."]


def vllm_sharegpt(path, encode, num, seed):
    """vLLM 0.33's ShareGPTDataset: json.load, keep entries with two turns, seeded shuffle, sample."""
    with open(path, encoding="utf-8") as f:
        data = [e for e in json.load(f) if "conversations" in e and len(e["conversations"]) >= 2]
    random.seed(seed)
    random.shuffle(data)
    out = []
    for entry in data:
        if len(out) >= num:
            break
        prompt, completion = entry["conversations"][0]["value"], entry["conversations"][1]["value"]
        p, c = len(encode(prompt)), len(encode(completion))
        if is_valid_sequence(p, c):
            out.append((prompt, c, p))
    return out


def sharegpt_file(path, n: int, indent: int | None) -> None:
    rng = random.Random(n)
    entries = [{"id": f"c{i}", "conversations": [{"from": "human", "value": rng.choice(TURNS) + f" ({i}) \u00e9\\\""},
                                                 {"from": "gpt", "value": rng.choice(TURNS) + " \U0001f327"},
                                                 {"from": "human", "value": "more"}][:rng.choice((1, 2, 3))],
                "score": [1.5e3, -2, True, None]} for i in range(n)]
    path.write_text(json.dumps(entries, indent=indent, ensure_ascii=indent is None), encoding="utf-8")


@pytest.mark.parametrize("indent", [None, 2])
def test_sharegpt_read_entry_by_entry_samples_what_vllm_samples(indent, tmp_path, tokenizer, monkeypatch):
    path = tmp_path / "sharegpt.json"
    sharegpt_file(path, 300, indent)
    want = vllm_sharegpt(path, tokenizer.encode, 40, seed=5)
    assert len(want) == 40
    assert sharegpt_prompts(str(path), tokenizer.encode, 40, seed=5) == want
    monkeypatch.setattr(datasets, "READ_CHARS", 7)  # every entry, escape and number cut across reads
    assert sharegpt_prompts(str(path), tokenizer.encode, 40, seed=5) == want


def test_a_file_of_empty_objects_costs_a_read_buffer_not_26_times_its_size(tmp_path, tokenizer, monkeypatch):
    """vLLM's json.load holds every `{}` of the file at once (72 bytes each, 3.9 MB for this 200 kB file);
    here one entry and the read buffer are held (64 KiB reads in this test: 1 MiB by default)."""
    path = tmp_path / "sharegpt.json"
    real = {"conversations": [{"from": "human", "value": TURNS[0]}, {"from": "gpt", "value": TURNS[1]}]}
    path.write_text("[" + json.dumps(real) + ", {}" * 50_000 + "]")
    monkeypatch.setattr(datasets, "READ_CHARS", 64 << 10, raising=False)  # main read the file whole
    tracemalloc.start()
    try:
        samples = sharegpt_prompts(str(path), tokenizer.encode, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert samples[0][0] == TURNS[0] and len(samples) == 2  # the one conversation, oversampled
    assert peak < 600_000, peak


def test_deep_nesting_is_one_line_naming_the_file(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" + "[" * 100_000 + "]" * 100_000 + "]")
    deep_line = tmp_path / "deep.jsonl"
    deep_line.write_text('{"prompt": "hi"}\n' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "\n")
    for name, path, where in (("sharegpt", deep, "entry 0 is nested deeper than the JSON parser goes"),
                              ("custom", deep_line, "deep.jsonl:2: nested deeper than the JSON parser goes")):
        assert main(["bench", "--url", "http://127.0.0.1:9", "--dataset-name", name, "--dataset-path", str(path),
                     "--skip-chat-template"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and where in err and str(path) in err


def test_an_entry_or_line_over_4_mib_is_one_line(tmp_path):
    big = "x" * (datasets.MAX_ENTRY_CHARS + 10)
    sharegpt, custom = tmp_path / "big.json", tmp_path / "big.jsonl"
    sharegpt.write_text(json.dumps([{"conversations": [{"value": "a b c d e"}, {"value": big}]}]))
    custom.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt": big}) + "\n")
    with pytest.raises(DatasetError, match=r"big\.json: entry 0 is over 4194304 characters"):
        sharegpt_prompts(str(sharegpt), str.split, 1)
    with pytest.raises(DatasetError, match=r"big\.jsonl:2: over 4194304 characters"):
        custom_prompts(str(custom), str.split, 1)


def test_what_a_file_keeps_is_bounded(tmp_path, monkeypatch):
    path = tmp_path / "many.json"
    path.write_text(json.dumps([{"conversations": [{"value": TURNS[0]}, {"value": TURNS[1]}]}] * 400))
    assert len(sharegpt_prompts(str(path), str.split, 3)) == 3
    monkeypatch.setattr(datasets, "MAX_ENTRIES", 399)
    with pytest.raises(DatasetError, match="over 399 entries"):
        sharegpt_prompts(str(path), str.split, 3)
    monkeypatch.setattr(datasets, "MAX_ENTRIES", 400)
    monkeypatch.setattr(datasets, "MAX_KEPT_BYTES", 50_000)  # 400 pairs keep about 90 kB
    with pytest.raises(DatasetError, match="its prompts take over 50000 bytes in memory"):
        sharegpt_prompts(str(path), str.split, 3)


def test_not_a_list_trailing_data_and_a_bad_separator_are_one_line(tmp_path):
    for text, message in (('{"conversations": []}', "is a JSON list"), ("[{}] []", "more after the list"),
                          ("[{} {}]", "expected ',' or ']'"), ("[{},]", "entry 1 is not JSON"), ("[{}", "not JSON")):
        path = tmp_path / "bad.json"
        path.write_text(text)
        with pytest.raises(DatasetError, match=message):
            sharegpt_prompts(str(path), str.split, 1)


def test_custom_output_len_minus_one_reads_vllm_033s_output_tokens(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": "one two", "output_tokens": 7}\n{"prompt": "three", "output_tokens": 9}\n')
    got = custom_prompts(str(path), str.split, 2, output_len=-1)
    assert sorted((p, n) for p, n, _ in got) == [("one two", 7), ("three", 9)]
    assert {n for _, n, _ in custom_prompts(str(path), str.split, 2)} == {256}  # vLLM's default 256 otherwise
    path.write_text('{"prompt": "one", "output_tokens": 7}\n{"prompt": "two"}\n')
    with pytest.raises(DatasetError, match=r"c\.jsonl:2: no \"output_tokens\" \(--custom-output-len -1"):
        custom_prompts(str(path), str.split, 2, output_len=-1)
