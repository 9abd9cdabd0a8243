"""The PD multiplexing knobs, compatible with SGLang's `--pdmux-config-path` YAML.

SGLang's fields, in its order: `sm_group_num`, `manual_divisions` (a list of
`[prefill_sm, decode_sm, decode_bs_threshold]`), `split_forward_token_budget`,
`max_split_forward_layers`, `decode_bs_divisor`, `overlap_decode_full_sm`; the latest release
(`SGLANG_RELEASE`, 0.5.23) reads four of them (`RELEASE_KEYS`), newer SGLang (`SGLANG_MAIN`) all six.
pdtop adds `chunk_size` for its chunked-prefill policy, `chunked_prefill_size`, SGLang's server flag
`--chunked-prefill-size` (which pdmux follows in newer SGLang: `pdmux.py`), and
`level_rule` (`sglang`, or `slo`: the fewest decode units that meet `slo_itl_ms`,
`level_rule.py`). Every value passes `validate`, whether it comes from a file, the constructor,
or a live override through `PdmuxConfig.replace`: its type through pdtop's one decoder
(`pdtop.typed_json.decode_field`, from the field's type hint), then `check_value`'s range; and
the fields together pass `_check_together`. A live `set` command checks its values the same way.

A file is read as the release reads it (`load_pdmux_config`): it refuses only what the release
refuses, and says in one warning line each where newer SGLang reads it otherwise or where the
release would fail at run time; docs/levels.md names the SGLang source of each rule.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdtop.engine.errors import ConfigError
from pdtop.plain_yaml import YamlError, read_yaml
from pdtop.typed_json import DecodeError, decode_field, show, show_key

INT_MAX = 2**31 - 1


def in_range(name: str, value: int, minimum: int, maximum: int = INT_MAX) -> int:
    """`value` (an integer: the decoder checked its type) if in `minimum..maximum`, else ConfigError naming
    `name`."""
    if not minimum <= value <= maximum:
        raise ConfigError(name, f"must be in {minimum}..{maximum}, got {value}")
    return value


def _manual_divisions(rows: list[list[int]]) -> list[list[int]]:
    """Rows of three, SM counts non-negative; thresholds any integer, in any order: SGLang takes the last
    row whose threshold the decode batch reaches (equal, zero or negative thresholds are legal)."""
    name = "manual_divisions"
    for i, row in enumerate(rows):
        if len(row) != 3:
            raise ConfigError(name, f"entry {i} must be [prefill_sm, decode_sm, decode_bs_threshold], got "
                                    f"{len(row)} number{'s' if len(row) != 1 else ''}")
        if row[0] < 0 or row[1] < 0:
            raise ConfigError(name, f"entry {i} must have non-negative SM counts, got {row}")
    return rows


SGLANG_TOKEN_BUDGET = 65536
# split_forward_token_budget when the config leaves it out, per device kind (others: SGLang's GPU
# default). On the CPU a prefill is slow, so a smaller budget lets a ~1,024-token prompt advance
# a few layers a round (4096 // 1024 = 4 of SmolLM2's 30) instead of all of them in one slice.
DEVICE_TOKEN_BUDGET = {"cpu": 4096}

LEVEL_RULES = ("sglang", "slo")


def _level_rule(value: str) -> str:
    if value not in LEVEL_RULES:
        raise ConfigError("level_rule", f"must be one of {', '.join(LEVEL_RULES)}, got {show(value)}")
    return value


def _slo_itl_ms(value: float | None) -> float | None:
    if value is not None and not 0 < value < 1e6:
        raise ConfigError("slo_itl_ms", f"must be a number of milliseconds > 0, got {value}")
    return value


def _budget(value: int | None) -> int:
    # a file's 0 or less is read as 1 (`load_pdmux_config`); a live change must be at least 1
    if value is None:
        raise ConfigError("split_forward_token_budget", "unset only by leaving it out (the device's default)")
    return in_range("split_forward_token_budget", value, 1)


# Each field's value check, once the decoder has checked its type (an int is an int, a bool a bool: SGLang
# takes any truthy value, so the string "false" would switch overlap on).
_VALUES: dict[str, Callable[[Any], Any]] = {
    "sm_group_num": lambda v: in_range("sm_group_num", v, 3),
    "manual_divisions": _manual_divisions,
    "split_forward_token_budget": _budget,
    "max_split_forward_layers": lambda v: in_range("max_split_forward_layers", v, 0),
    "decode_bs_divisor": lambda v: in_range("decode_bs_divisor", v, 1),
    "overlap_decode_full_sm": lambda v: v,
    "chunk_size": lambda v: in_range("chunk_size", v, 1),
    "level_rule": _level_rule,
    "slo_itl_ms": _slo_itl_ms,
    "chunked_prefill_size": lambda v: max(0, in_range("chunked_prefill_size", v, -1)),  # SGLang's -1: off
}
FIELDS: tuple[str, ...] = tuple(_VALUES)


def typed(name: str, value: Any) -> Any:
    """`value` as field `name`'s type (pdtop's decoder, from `PdmuxConfig`'s type hint); ConfigError naming
    the field otherwise. A null `manual_divisions` (YAML's key with nothing after it) is none."""
    if name not in _VALUES:
        raise ConfigError(name, f"unknown field; known: {', '.join(FIELDS)}")
    if name == "manual_divisions" and value is None:
        return []
    try:
        return decode_field(PdmuxConfig, name, value)
    except DecodeError as exc:
        inside = (exc.field or name).removeprefix(name)  # `[0][2]` within manual_divisions
        raise ConfigError(name, f"at {inside}: {exc.reason}" if inside else exc.reason) from None


def check_value(name: str, value: Any) -> Any:
    """A typed value of field `name` checked (its range) and normalized; ConfigError names the field."""
    return _VALUES[name](value)


def validate(name: str, value: Any) -> Any:
    """Check one field's value, its type then its range, and return it normalized; ConfigError names the
    field otherwise."""
    return check_value(name, typed(name, value))


@dataclass(frozen=True)
class PdmuxConfig:
    sm_group_num: int = 8  # levels incl. the two whole-device ones; ignored when manual_divisions is set
    manual_divisions: list[list[int]] = field(default_factory=list)  # [prefill, decode, decode_bs_threshold]
    # layers per round = max(1, budget // prefill tokens); None: the device's default (`for_device`)
    split_forward_token_budget: int | None = None
    # while decode runs, a slice is at most this many layers (0: no cap); a prefill alone is never capped
    max_split_forward_layers: int = 0
    decode_bs_divisor: int = 36
    # prefill keeps its manual division's SMs, decode runs on the whole device beside it (the SM sets
    # overlap; decode_sm is ignored); needs manual_divisions
    overlap_decode_full_sm: bool = False
    chunk_size: int = 512  # pdtop's own: tokens per chunk under the chunked policy
    level_rule: str = "sglang"  # pdtop's own: "slo" meets slo_itl_ms with the fewest decode units
    slo_itl_ms: float | None = None  # pdtop's own: the ITL SLO of level_rule slo
    # pdmux prefills a longer prompt in chunks of this many tokens, each layer-sliced (SGLang's server flag
    # --chunked-prefill-size; 0 or -1: off, whole prompts)
    chunked_prefill_size: int = 0
    # the file it was read from, named by errors found later (manual divisions that do not fit a device)
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            if not (name == "split_forward_token_budget" and value is None):
                object.__setattr__(self, name, validate(name, value))
        _check_together(self.manual_divisions, self.overlap_decode_full_sm)
        if self.level_rule == "slo" and self.slo_itl_ms is None:
            raise ConfigError("level_rule", "slo needs slo_itl_ms (the ITL SLO in milliseconds)")

    def for_device(self, kind: str) -> PdmuxConfig:
        """This config with an unset `split_forward_token_budget` set to device kind `kind`'s default."""
        if self.split_forward_token_budget is not None:
            return self
        return dataclasses.replace(self, split_forward_token_budget=DEVICE_TOKEN_BUDGET.get(kind, SGLANG_TOKEN_BUDGET))

    @property
    def token_budget(self) -> int:
        """`split_forward_token_budget`, or SGLang's default where it is unset."""
        budget = self.split_forward_token_budget
        return SGLANG_TOKEN_BUDGET if budget is None else budget

    def replace(self, **changes: Any) -> PdmuxConfig:
        """A new config with `changes` applied, each validated first (nothing changes on error)."""
        checked = {name: validate(name, value) for name, value in changes.items()}
        return dataclasses.replace(self, **checked, source=None)  # no longer what the file says

    def to_dict(self) -> dict[str, Any]:
        return {name: ([list(e) for e in v] if name == "manual_divisions" else v)
                for name, v in ((n, getattr(self, n)) for n in FIELDS)}


def _check_together(divisions: list[list[int]], overlap: bool) -> None:
    """SGLang's loader checks that read two fields: overlap needs manual divisions; each division's
    prefill_sm is at least 1, and its decode_sm too unless overlap ignores it."""
    if overlap and not divisions:
        raise ConfigError("overlap_decode_full_sm", "needs manual_divisions: the automatic split gives "
                          "prefill and decode disjoint SMs, which does not describe an overlapped one")
    for i, (p, d, _) in enumerate(divisions):
        if p < 1:
            raise ConfigError("manual_divisions", f"entry {i} [{p}, {d}]: prefill_sm must be at least 1")
        if d < 1 and not overlap:
            raise ConfigError("manual_divisions", f"entry {i} [{p}, {d}]: decode_sm must be at least 1 "
                              "(0 only with overlap_decode_full_sm, which ignores it)")


# The SGLang pdtop reads and writes files for by default: the latest release on PyPI, whose code
# (`srt/multiplex/pdmux_context.py`, `multiplexing_mixin.py`) the rules below follow; and newer
# SGLang, whose two more keys pdtop runs (docs/levels.md).
SGLANG_RELEASE = "0.5.23"
SGLANG_MAIN = "main"  # sgl-project/sglang at 337ee8ed
SGLANG_MAIN_NAME = "sgl-project/sglang main (337ee8ed)"
SGLANG_TARGETS = (SGLANG_RELEASE, SGLANG_MAIN)
RELEASE_KEYS = ("sm_group_num", "manual_divisions", "split_forward_token_budget", "decode_bs_divisor")
NEWER_KEYS = ("max_split_forward_layers", "overlap_decode_full_sm")
SGLANG_KEYS = ("sm_group_num", "manual_divisions", "split_forward_token_budget", "max_split_forward_layers",
               "decode_bs_divisor", "overlap_decode_full_sm")
# What the release does with a value pdtop refuses, said with the refusal.
_REFUSED_BY = {
    "sm_group_num": f"SGLang {SGLANG_RELEASE} refuses it too: an integer >= 3",
    "manual_divisions": f"SGLang {SGLANG_RELEASE} fails on it when it builds the levels",
    "split_forward_token_budget": f"SGLang {SGLANG_RELEASE} fails on it at the first split (budget // tokens)",
    "decode_bs_divisor": f"SGLang {SGLANG_RELEASE} divides by it at each automatic split: 0 fails there, a "
                         "negative one always gives split level 1",
}
_warned: set[str] = set()


def warn_once(text: str) -> None:
    """One line on stderr, once per process: what a file means to another SGLang, or where it fails."""
    if text not in _warned:
        _warned.add(text)
        import sys

        print(f"pdtop: warning: {text}", file=sys.stderr, flush=True)


def load_pdmux_config(path: str, warn: Callable[[str], None] = warn_once) -> PdmuxConfig:
    """Read an SGLang pdmux YAML file as SGLang 0.5.23 reads it (`load_pdmux_config` in
    `srt/multiplex/pdmux_context.py`), refusing only what it refuses or cannot run:

    - a file with any of SGLang's keys needs `sm_group_num` (>= 3), and with `manual_divisions`
      exactly `sm_group_num - 2` of them; a file of pdtop's own keys only (or an empty one) is
      pdtop's configuration, all defaults but those;
    - unknown keys are ignored; thresholds may repeat, be 0 or go down (the last division whose
      threshold the decode batch reaches wins);
    - the newer keys (`max_split_forward_layers`, `overlap_decode_full_sm`), which the release skips,
      are run as newer SGLang runs them when it would take them, else skipped as the release does.

    `warn` gets one line for each place where newer SGLang reads the file otherwise, or where the
    release would fail at run time (a first threshold above 1).
    """
    try:
        raw = read_yaml(path)
    except OSError as exc:
        raise ConfigError("file", f"cannot read it ({exc.strerror or exc})", path) from None
    except YamlError as exc:
        raise ConfigError("file", str(exc), path) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("file", f"must be a YAML mapping of fields, got {show(raw)}", path)
    notes: list[str] = []

    def note(field_name: str, what: str) -> None:
        notes.append(f"pdmux config {path}: {field_name}: {what}")

    if any(k in SGLANG_KEYS for k in raw) and "sm_group_num" not in raw:
        raise ConfigError("sm_group_num", f"missing: SGLang {SGLANG_RELEASE} refuses a file without it "
                          "(\"Missing required field\"); with manual_divisions it is their count + 2", path)
    unknown = [k for k in raw if k not in _VALUES]
    if unknown:
        named = ", ".join(show_key(k) for k in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5
                                                                 else "")
        note(named, f"unknown key{'s' if len(unknown) > 1 else ''}, ignored as SGLang {SGLANG_RELEASE} "
             "ignores keys it does not know")
    values: dict[str, Any] = {}
    for key, value in ((k, v) for k, v in raw.items() if k in _VALUES):
        try:
            value = typed(key, value)
            if key == "split_forward_token_budget" and value is not None and value < 1:
                # SGLang's slice is max(1, budget // tokens) layers: 0 or less is a layer a slice, as 1 is
                note(key, f"{value} is read as 1 (one layer a slice), as SGLang {SGLANG_RELEASE}'s "
                     "max(1, budget // tokens) makes it")
                value = 1
            values[key] = check_value(key, value)
        except ConfigError as exc:
            if key in NEWER_KEYS:
                note(key, f"{exc.reason}: {SGLANG_MAIN_NAME} refuses the file, SGLang {SGLANG_RELEASE} skips the "
                     "key, and so does pdtop")
            elif key == "decode_bs_divisor" and raw.get("manual_divisions"):
                note(key, f"{exc.reason}: unused beside manual_divisions (SGLang {SGLANG_RELEASE} reads it only "
                     "for the automatic split), so pdtop keeps its default")
            else:
                rule = _REFUSED_BY.get(key, "pdtop's own key")
                raise ConfigError(key, f"{exc.reason} ({rule})", path) from None
    divisions = values.get("manual_divisions") or []
    if divisions and len(divisions) != values["sm_group_num"] - 2:
        raise ConfigError("manual_divisions", f"has {len(divisions)} entries, sm_group_num {values['sm_group_num']} "
                          f"needs {values['sm_group_num'] - 2} (sm_group_num - 2, SGLang {SGLANG_RELEASE}'s rule)",
                          path)
    if values.get("overlap_decode_full_sm") and not divisions:
        del values["overlap_decode_full_sm"]
        note("overlap_decode_full_sm", f"needs manual_divisions: {SGLANG_MAIN_NAME} refuses the file, SGLang "
             f"{SGLANG_RELEASE} skips the key, and so does pdtop")
    for key in NEWER_KEYS:
        if key in values and values[key] != getattr(PdmuxConfig(), key):
            note(key, f"SGLang {SGLANG_RELEASE} skips this key; pdtop runs it as {SGLANG_MAIN_NAME} does")
    thresholds = [t for _, _, t in divisions]
    if any(b <= a for a, b in itertools.pairwise(thresholds)):
        note("manual_divisions", f"thresholds {thresholds} do not increase: {SGLANG_MAIN_NAME} refuses that; SGLang "
             f"{SGLANG_RELEASE} and pdtop take the last division whose threshold the decode batch reaches")
    if thresholds and min(thresholds) > 1:
        note("manual_divisions", f"no threshold is 1 or less: SGLang {SGLANG_RELEASE} fails (UnboundLocalError in "
             f"adjust_stream_groups) when a prefill is split beside fewer than {min(thresholds)} decoding requests; "
             "pdtop runs the first division then")
    try:
        config = PdmuxConfig(**values, source=path)
    except ConfigError as exc:
        raise ConfigError(exc.field, f"{exc.reason} ({_REFUSED_BY.get(exc.field, 'pdtop refuses it')})", path) from None
    for line in notes:
        warn(line)
    return config


def dump_pdmux_config(config: PdmuxConfig, comment: str = "", sglang: str = SGLANG_RELEASE) -> str:
    """`config` as the `--pdmux-config-path` YAML that SGLang `sglang` (a `SGLANG_TARGETS` name) reads
    as pdtop runs it; `load_pdmux_config` reads it back equal (with the budget set).

    The release's four keys (`RELEASE_KEYS`), or for newer SGLang its six (`SGLANG_KEYS`), in SGLang's
    order; `manual_divisions` as a list of `[prefill_sm, decode_sm, decode_bs_threshold]` with
    `sm_group_num` = their count + 2 (SGLang requires the key and that count); an unset
    `split_forward_token_budget` as SGLang's default, which is what SGLang would use; pdtop's own
    keys only when they are not the default. ConfigError when the release would read the
    configuration otherwise (a layer cap or overlapped divisions: newer SGLang's). `comment` goes
    first as `#` lines.
    """
    import yaml

    if sglang not in SGLANG_TARGETS:
        raise ConfigError("sglang", f"unknown SGLang {sglang!r}; pdtop writes for {' or '.join(SGLANG_TARGETS)}")
    keys = SGLANG_KEYS if sglang == SGLANG_MAIN else RELEASE_KEYS
    for key in NEWER_KEYS:
        if sglang != SGLANG_MAIN and getattr(config, key) != getattr(PdmuxConfig(), key):
            raise ConfigError(key, f"SGLang {sglang} does not read it: write for SGLang {SGLANG_MAIN}")
    values = config.to_dict() | {"split_forward_token_budget": config.token_budget}
    defaults = PdmuxConfig().to_dict()
    pdtop_own = [k for k in FIELDS if k not in SGLANG_KEYS]
    data = {k: values[k] for k in (*keys, *pdtop_own) if k in keys or values[k] != defaults[k]}
    if config.manual_divisions:
        data["sm_group_num"] = len(config.manual_divisions) + 2
    head = "".join(f"# {line}\n".replace("# \n", "#\n") for line in comment.splitlines())
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
