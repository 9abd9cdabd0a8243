"""An SGLang server's scheduler log, read line by line: its PD-multiplexing split and its batch figures.

The lines (SGLang 0.5.23, `python/sglang/srt/`; older releases in brackets):

    PD-Multiplexing enabled with 8 stream groups, sm_counts (prefill_sm, decode_sm): [(132, 0), (112, 20), ...]
    Adjusting stream groups: 3, prefill sm: 88, decode sm: 44                        (--log-level debug)
    Decode batch, #running-req: 12, #token: 4096, token usage: 0.03, cuda graph: True, gen throughput
        (token/s): 812.45, #queue-req: 3                                             ("Decode batch. #running-req: ...")
    Prefill batch, #new-seq: 1, #new-token: 9, #cached-token: 0, token usage: 0.03, #running-req: 4,
        #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 1204.51

(`multiplexing_mixin.py`; `managers/scheduler_components/metrics_reporter.py` and `pool_stats_observer.py`).
A hybrid model writes `#full token`/`full token usage` (and `#swa token`/`swa token usage` or `mamba num`/
`mamba usage`) where others write `#token`/`token usage`; an NPU `npu graph` where CUDA writes `cuda graph`;
a PD prefill server adds `#bootstrap-req`, `#inflight-req` (older: `#unbootstrapped-req`,
`#transferring-req`), a PD decode server `#prealloc-req`, `#transfer-req`, `#host-receive-req`. A field is
read wherever it stands in the line; fields pdtop does not know are passed over.

Each line carries SGLang's prefix, `[2026-12-01 10:00:01 DP0 TP0] ` (`[%(asctime)s{.msecs}{tags}]`), whose
rank tags are, in this order when present, `DPn`, `PPn`, `ATTN_CPn`, `MOE_DPn`, `TPn`, `EPn`
(`scheduler.py`, `configure_scheduler_process`). `SGLANG_LOGGING_CONFIG_PATH` replaces the whole format:
any prefix (no brackets, other timestamps), and no tags at all. So the message is found by what it says,
not by the prefix's shape, and tags are looked for among the prefix's words. The split counts the first
rank's lines only (a tag with n > 0 is another rank's). Batch lines come from each DP rank's
logging scheduler (SGLang logs them on attention-TP rank 0 only): their figures are kept per DP rank and
summed (KV use averaged); a PP or ATTN_CP rank above 0 is another copy. Without tags every line is one
rank's, the latest line wins.

A new start-up line is a restarted server: its levels replace the old ones. A custom format without tags
writes the same start-up line once per TP rank: one that repeats the levels in force before the server
ran anything (no batch or `Adjusting` line since) is the same start, not a restart.

Linear time on any line, whatever it holds (a hostile line must not stall the dashboard: a quadratic
regular expression here took 15 s on one 64 KB line). No regular expression is used: each step is one
of `str.find`, `split` with a bounded count, `partition`, `translate` or a scan that looks at each
character once, so the work is O(length) for the line's first `MAX_LINE` characters (the rest is not
read), with the prefix's words looked at only in its last `MAX_PREFIX` characters and at most
`MAX_FIELDS` fields split out of a batch line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_LINE = 64 << 10  # characters of a line read (the log follower drops longer lines)
MAX_PREFIX = 256  # characters before the message where rank tags are looked for (SGLang's: about 60)
MAX_FIELDS = 64  # fields of a batch line (SGLang writes 10 to 25)
MAX_NUMBER = 32  # characters of a field's value
MAX_LEVELS = 256  # SGLang's sm_group_num is far below; a longer list is not SGLang's line
MAX_SMS = 1 << 16
MAX_RANKS = 256  # DP ranks kept

RANK_TAGS = ("ATTN_CP", "MOE_DP", "DP", "PP", "TP", "EP")  # longest first: a word is matched once
START, ADJUST, DECODE, PREFILL = "start", "adjust", "decode", "prefill"
_MARKERS = ((START, "PD-Multiplexing enabled with "), (ADJUST, "Adjusting stream groups: "),
            (DECODE, "Decode batch"), (PREFILL, "Prefill batch"))
_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_NOT_WORD = {i: " " for i in range(128) if chr(i) not in _WORD_CHARS}  # ASCII outside tags -> space
_CSI_PARAMS = frozenset("0123456789;")

# batch line field -> what it fills (SGLang's words, then older releases' and other devices')
_COUNTS = {"#running-req": "running", "#queue-req": "queued",
           "#bootstrap-req": "bootstrap", "#unbootstrapped-req": "bootstrap",
           "#inflight-req": "inflight", "#transferring-req": "inflight",
           "#prealloc-req": "prealloc", "#transfer-req": "transfer", "#host-receive-req": "host_receive"}
_USAGE = ("token usage", "full token usage", "swa token usage", "gpu token usage")  # KV use: the fullest pool
_GRAPH = ("cuda graph", "npu graph", "cpu graph", "musa graph")


@dataclass(frozen=True)
class LogLine:
    kind: str  # START, ADJUST, DECODE or PREFILL
    ranks: dict[str, int]  # the rank tags of its prefix
    rest: str  # the message after its marker


def plain_text(line: str) -> str:
    """`line` without terminal colour codes (CSI sequences: ESC [ parameters final-byte), in one pass."""
    if "\x1b" not in line:
        return line
    parts = line.split("\x1b")
    out = [parts[0]]
    for part in parts[1:]:
        if part.startswith("["):
            k = 1
            while k < len(part) and part[k] in _CSI_PARAMS:
                k += 1
            if k < len(part) and "@" <= part[k] <= "~":
                part = part[k + 1:]
        out.append(part)
    return "".join(out)


def rank_tags(prefix: str) -> dict[str, int]:
    """The rank tags (`DP0`, `ATTN_CP1`, ...) among the words of a line's prefix (its last MAX_PREFIX
    characters); a word is letters, digits and `_`."""
    tags: dict[str, int] = {}
    for word in prefix[-MAX_PREFIX:].translate(_NOT_WORD).split():
        for tag in RANK_TAGS:
            if word.startswith(tag):
                number = word[len(tag):]
                if number.isascii() and number.isdigit() and len(number) <= 6:
                    tags.setdefault(tag, int(number))
                break
    return tags


def parse_line(line: str) -> LogLine | None:
    """The line's kind, rank tags and message, or None for a line pdtop does not read."""
    text = plain_text(line[:MAX_LINE]).rstrip("\r\n")
    for kind, marker in _MARKERS:
        at = text.find(marker)
        if at >= 0:
            return LogLine(kind, rank_tags(text[:at]), text[at + len(marker):])
    return None


def first_rank_message(line: str) -> str | None:
    """The message of a line pdtop reads from the first rank (or from a line without rank tags); None
    for another rank's line or one pdtop does not read."""
    parsed = parse_line(line)
    if parsed is None or any(parsed.ranks.values()):
        return None
    return parsed.rest


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if len(text) <= MAX_NUMBER and text.isascii() and text.isdigit() else None


def _float(text: str) -> float | None:
    text = text.strip()
    if len(text) > MAX_NUMBER:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


@dataclass
class Batch:
    """One DP rank's latest batch figures, as its Decode/Prefill batch lines wrote them."""

    running: int | None = None
    queued: int | None = None
    kv_usage: float | None = None  # 0 to 1: the fullest KV pool (SGLang's `token usage`)
    gen_tokens_per_s: float | None = None  # from Decode batch lines
    input_tokens_per_s: float | None = None  # from Prefill batch lines
    graph: bool | None = None  # the batch ran as a CUDA (NPU, ...) graph
    bootstrap: int | None = None  # PD prefill server's queues
    inflight: int | None = None
    prealloc: int | None = None  # PD decode server's queues
    transfer: int | None = None
    host_receive: int | None = None
    read_at: float = 0.0  # when its latest line was read

    def take(self, kind: str, rest: str, now: float) -> bool:
        """Read a batch line's fields; False if it had none pdtop reads (not SGLang's line)."""
        if rest.startswith(" ["):  # LOG_FORWARD_ITERS: " [iter]"
            rest = rest.partition("]")[2]
        if not rest.startswith((",", ".")):
            return False
        usage: list[float] = []
        known = 0
        for item in rest[1:].split(", ", MAX_FIELDS)[:MAX_FIELDS]:
            key, sep, value = item.strip(" ,").partition(": ")  # older lines end in ", " or ","
            if not sep:
                continue
            if key in _COUNTS:
                number = _int(value)
                if number is not None:
                    setattr(self, _COUNTS[key], number)
                    known += 1
            elif key in _USAGE:
                fraction = _float(value)
                if fraction is not None:
                    usage.append(fraction)
            elif key in _GRAPH and value.strip() in ("True", "False"):
                self.graph = value.strip() == "True"
            elif key in ("gen throughput (token/s)", "input throughput (token/s)"):
                rate = _float(value)
                if rate is not None:
                    if key.startswith("gen"):
                        self.gen_tokens_per_s = rate
                    else:
                        self.input_tokens_per_s = rate
                    known += 1
        if usage:
            self.kv_usage = max(usage)
            known += 1
        if known:
            self.read_at = now
        return bool(known)


@dataclass
class SglangLog:
    """What the log said so far: the levels of the latest start-up, the level in force, the seconds spent
    at each level (from when each `Adjusting` line was read to the next), and each DP rank's latest
    batch figures."""

    levels: list[tuple[int, int]] = field(default_factory=list)  # (prefill SMs, decode SMs); index = level
    level: int | None = None  # from the latest `Adjusting stream groups` line since the start-up
    prefill_sm: int | None = None
    decode_sm: int | None = None
    level_time_s: dict[int, float] = field(default_factory=dict)  # seconds at each level, since the start-up
    starts: int = 0  # start-up lines read (more than one: the server restarted)
    changes: int = 0  # level changes read since the start-up
    lines: int = 0  # lines read that pdtop reads
    batches: dict[int, Batch] = field(default_factory=dict)  # by DP rank (0 without tags)
    _since: float | None = None  # when the level in force was read
    _ran: bool = False  # a batch or an `Adjusting` line since the latest start-up

    def feed(self, line: str, now: float) -> bool:
        """Take one log line read at `now` (seconds, any clock); True if it changed the split or a batch."""
        parsed = parse_line(line)
        if parsed is None:
            return False
        ranks = parsed.ranks
        if parsed.kind in (DECODE, PREFILL):
            if ranks.get("PP", 0) or ranks.get("ATTN_CP", 0):
                return False
            return self._batch(ranks.get("DP", 0), parsed.kind, parsed.rest, now)
        if any(ranks.values()):
            return False
        self.lines += 1
        if parsed.kind == START:
            return self._start(parsed.rest)
        return self._adjust(parsed.rest, now)

    def _batch(self, dp: int, kind: str, rest: str, now: float) -> bool:
        batch = self.batches.get(dp)
        if batch is None:
            if len(self.batches) >= MAX_RANKS:
                return False
            batch = Batch()
        if not batch.take(kind, rest, now):
            return False
        self.batches[dp] = batch
        self.lines += 1
        self._ran = True
        return True

    def _start(self, rest: str) -> bool:
        groups, sep, counts = rest.partition(" stream groups, sm_counts (prefill_sm, decode_sm): ")
        if not sep or _int(groups) is None:
            return False
        pairs = _pairs(counts)
        if not pairs:
            return False
        if pairs == self.levels and not self._ran:  # another rank's copy (no tags), or a repeat
            return False
        self.levels, self.level, self.prefill_sm, self.decode_sm = pairs, None, None, None
        self.level_time_s, self.changes, self._since, self._ran = {}, 0, None, False
        self.batches = {}  # the old server's figures
        self.starts += 1
        return True

    def _adjust(self, rest: str, now: float) -> bool:
        level_text, sep1, rest = rest.partition(", prefill sm: ")
        p_text, sep2, d_text = rest.partition(", decode sm: ")
        level, p, d = _int(level_text), _int(p_text), _int(d_text)
        if not (sep1 and sep2) or level is None or p is None or d is None:
            return False
        if level >= MAX_LEVELS or p + d > MAX_SMS:
            return False
        self._ran = True
        if (level, p, d) == (self.level, self.prefill_sm, self.decode_sm):
            return False  # the level in force again (or another rank's copy of the line)
        self._account(now)
        self.level, self.prefill_sm, self.decode_sm = level, p, d
        self.changes += 1
        return True

    def _account(self, now: float) -> None:
        if self.level is not None and self._since is not None:
            self.level_time_s[self.level] = self.level_time_s.get(self.level, 0.0) + max(0.0, now - self._since)
        self._since = now

    def times(self, now: float) -> list[float]:
        """Seconds at each level of `levels` since the start-up, the level in force counted up to `now`."""
        self._account(now)
        return [round(self.level_time_s.get(i, 0.0), 3) for i in range(len(self.levels))]

    def totals(self) -> Batch | None:
        """The DP ranks' latest batch figures together (counts and rates summed, KV use averaged, the
        latest read time); None before the first batch line."""
        if not self.batches:
            return None
        ranks = list(self.batches.values())
        out = Batch(read_at=max(b.read_at for b in ranks))
        for name in ("running", "queued", "gen_tokens_per_s", "input_tokens_per_s", "bootstrap", "inflight",
                     "prealloc", "transfer", "host_receive"):
            values = [getattr(b, name) for b in ranks if getattr(b, name) is not None]
            setattr(out, name, sum(values) if values else None)
        usage = [b.kv_usage for b in ranks if b.kv_usage is not None]
        out.kv_usage = sum(usage) / len(usage) if usage else None
        graphs = {b.graph for b in ranks if b.graph is not None}
        out.graph = graphs.pop() if len(graphs) == 1 else None
        return out

    @property
    def sms(self) -> int | None:
        """The device's SM count: what a level gives both sides together (the whole-device levels)."""
        return max(p + d for p, d in self.levels) if self.levels else None


def _pairs(counts: str) -> list[tuple[int, int]] | None:
    """`[(132, 0), (112, 20), ...]` -> the pairs; None for anything else, or more than MAX_LEVELS."""
    counts = counts.strip()
    if not (counts.startswith("[") and counts.endswith("]")):
        return None
    inner = counts[1:-1].strip()
    if not inner.endswith(")"):
        return None
    pieces = inner[:-1].split(")", MAX_LEVELS)
    if len(pieces) > MAX_LEVELS:
        return None
    pairs = []
    for i, piece in enumerate(pieces):
        piece = piece.strip()
        if i:  # the separator before each pair after the first
            if not piece.startswith(","):
                return None
            piece = piece[1:].strip()
        if not piece.startswith("("):
            return None
        p_text, sep, d_text = piece[1:].partition(",")
        p, d = _int(p_text), _int(d_text)
        if not sep or p is None or d is None or p + d > MAX_SMS:
            return None
        pairs.append((p, d))
    return pairs
