"""How to generate: one frozen, validated :class:`GenerationConfig` and the result types.

Strategies (003 "Decoding"; Holtzman et al. 2020; Keskar et al. 2019; Wu et al. 2016):

    greedy          w_t = argmax_w p(w | w_{<t})               temperature == 0 or do_sample=False
    sampling        w_t ~ softmax(z_t / tau)                    temperature tau > 0 (the default)
    top-k / top-p   sample from the k most likely / the smallest set with mass >= p
    beam search     keep the num_beams best prefixes by sum log p, rank finished ones by
                    sum log p / |y|^alpha (alpha = length_penalty)

Every field is checked in ``__post_init__``; messages name the field (and carry it in
``err.fields``, from which ``attnlab generate`` adds the flag). Shapes: R rows (prompts x
beams), V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch import Tensor

from attnlab.errors import ConfigValueError
from attnlab.nn.cache import CACHE_DTYPES

FINISH_REASONS = ("stop_token", "stop_string", "length")
MIN_TEMPERATURE = 1e-4  # logits / tau stay finite in fp32 for |logits| up to ~1e34
MAX_LENGTH_PENALTY = 100.0  # len^alpha stays finite for outputs up to ~1e3 tokens


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding settings. ``GenerationConfig()`` samples 100 tokens at temperature 1."""

    max_new_tokens: int = 100
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    repetition_penalty: float = 1.0  # 1 = off (CTRL, Keskar et al. 2019)
    num_beams: int = 1  # 1 = no beam search
    length_penalty: float = 1.0  # alpha in score / len^alpha (beams only)
    early_stopping: bool = False  # beams stop once num_beams are finished
    stop_token_ids: tuple[int, ...] | None = None  # None = the tokenizer's EOS, () = none
    stop_strings: tuple[str, ...] = ()  # needs a tokenizer
    seed: int | None = None  # None draws a fresh seed (reported in the result)
    do_sample: bool | None = None  # None: sample iff temperature > 0 and num_beams == 1
    use_cache: bool = True  # False: recompute the whole context each step (reference)
    compile: bool = False  # True: the one-token decode step under torch.compile
    cache_dtype: str | None = None  # "fp32" or "bf16"; None = the compute dtype
    bos_token_id: int | None = None  # default: the tokenizer's BOS
    pad_token_id: int | None = None  # default: the tokenizer's pad, else 0

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise _bad(
                f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}",
                "max_new_tokens",
            )
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise _bad(
                f"temperature must be >= 0 (0 = greedy), got {self.temperature}", "temperature"
            )
        if 0 < self.temperature < MIN_TEMPERATURE:  # z / tau overflows: every row NaN
            raise _bad(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, "
                f"got {self.temperature}; below that sampling is greedy anyway, so use 0",
                "temperature",
            )
        if not _is_int(self.top_k) or self.top_k < 0:
            raise _bad(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}", "top_k")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise _bad(f"top_p must be in (0, 1] (1 = off), got {self.top_p}", "top_p")
        _check_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise _bad(
                "repetition_penalty must be > 0 (1 = off, > 1 discourages "
                f"repeats), got {self.repetition_penalty}",
                "repetition_penalty",
            )
        if not _is_int(self.num_beams) or self.num_beams < 1:
            raise _bad(f"num_beams must be an int >= 1, got {self.num_beams!r}", "num_beams")
        _check_number("length_penalty", self.length_penalty)
        if abs(self.length_penalty) > MAX_LENGTH_PENALTY:  # |y|^alpha overflows
            raise _bad(
                f"length_penalty must be between -{MAX_LENGTH_PENALTY} and "
                f"{MAX_LENGTH_PENALTY} (1 = average log-probability per token, 0 = the plain "
                f"sum), got {self.length_penalty}",
                "length_penalty",
            )
        if self.stop_token_ids is not None:
            ids = tuple(self.stop_token_ids)
            if not all(_is_int(i) and i >= 0 for i in ids):
                raise _bad(
                    f"stop_token_ids must be non-negative ints, got {ids!r}", "stop_token_ids"
                )
            object.__setattr__(self, "stop_token_ids", ids)
        strings = (self.stop_strings,) if isinstance(self.stop_strings, str) else self.stop_strings
        strings = tuple(strings)
        if not all(isinstance(s, str) and s for s in strings):
            raise _bad(f"stop_strings must be non-empty strings, got {strings!r}", "stop_strings")
        object.__setattr__(self, "stop_strings", strings)
        if self.compile and not self.use_cache:
            raise _bad(
                "compile=True speeds up the cached one-token decode step; it does nothing "
                "with use_cache=False, so choose one",
                "compile",
                "use_cache",
            )
        if self.cache_dtype is not None:
            if self.cache_dtype not in CACHE_DTYPES:
                raise _bad(
                    f"cache_dtype={self.cache_dtype!r} is not supported; choose "
                    f"from {', '.join(CACHE_DTYPES)} (unset: the model's compute dtype)",
                    "cache_dtype",
                )
            if not self.use_cache:
                raise _bad(
                    "cache_dtype sets the KV cache's dtype, and use_cache=False "
                    "has no cache; choose one",
                    "cache_dtype",
                    "use_cache",
                )
        if self.seed is not None and not _is_int(self.seed):
            raise _bad(f"seed must be an int, got {self.seed!r}", "seed")
        for name in ("bos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise _bad(f"{name} must be a non-negative int, got {value!r}", name)
        self._check_strategy()

    def _check_strategy(self) -> None:
        beam_only = [
            name
            for name, given in (
                ("length_penalty", self.length_penalty != 1.0),
                ("early_stopping", bool(self.early_stopping)),
            )
            if given
        ]
        if beam_only and self.num_beams == 1:
            raise _bad(
                f"{' and '.join(beam_only)} act only in beam search; set num_beams > 1, or drop "
                f"{'them' if len(beam_only) > 1 else 'it'}",
                *beam_only,
                "num_beams",
            )
        if self.do_sample and self.temperature == 0:
            raise _bad(
                "do_sample=True contradicts temperature=0, which means greedy decoding; "
                "use a temperature > 0 to sample",
                "temperature",
            )
        if self.num_beams > 1:
            if self.do_sample:
                raise _bad(
                    "beam search (num_beams > 1) is deterministic and does not sample; drop "
                    "do_sample, or use num_beams=1 to sample",
                    "num_beams",
                )
            if self.top_k or self.top_p < 1.0:
                raise _bad(
                    "top_k/top_p filter what is sampled and do nothing in beam "
                    "search (num_beams > 1); use one or the other",
                    "top_k",
                    "top_p",
                    "num_beams",
                )
            if self.stop_strings:
                raise _bad(
                    "stop strings (stop_strings) are not supported with beam search; stop on "
                    "token ids (stop_token_ids) or use num_beams=1",
                    "stop_strings",
                    "num_beams",
                )

    # Derived -------------------------------------------------------------------------------
    @property
    def sampling(self) -> bool:
        """True if tokens are drawn at random (not greedy, not beam search)."""
        if self.num_beams > 1 or self.temperature == 0:
            return False
        return self.do_sample is not False

    def replace(self, **changes: Any) -> GenerationConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{name} must be a finite number, got {value!r}", name)


def _bad(message: str, *fields: str) -> ConfigValueError:
    """A bad setting: a ValueError naming ``fields`` (the CLI adds their flags)."""
    return ConfigValueError(message, fields=fields)


class Hypothesis(NamedTuple):
    """One finished beam: its new tokens and length-penalised score sum log p / len^alpha."""

    tokens: list[int]
    score: float
    finish_reason: str


class GenerationResult(NamedTuple):
    """What :func:`generate` / :func:`generate_seq2seq` return, one entry per prompt or source.

    ``tokens`` are the new tokens only (no prompt, no padding, no stop token); ``texts`` decode
    them (cut before a stop string) when a tokenizer was given. ``finish_reasons`` are
    "stop_token", "stop_string" or "length". ``prompts`` are the ids actually fed (after BOS and
    cropping; the source ids for seq2seq). ``scores``/``nbest`` come from beam search (best first);
    ``logits`` (R, V) per step are the raw model logits when asked for; ``seed`` is the sampling
    seed used, to reproduce the run.
    """

    tokens: list[list[int]]
    texts: list[str] | None
    finish_reasons: list[str]
    prompts: list[list[int]]
    scores: list[float] | None = None
    nbest: list[list[Hypothesis]] | None = None
    logits: list[Tensor] | None = None
    seed: int | None = None


class SpecialIds(NamedTuple):
    """The token ids generation needs, resolved from the config, then the tokenizer."""

    bos: int | None  # prepended to an empty LM prompt; the first decoder input of seq2seq
    pad: int  # fills left padding and the rows that have finished
    stop: tuple[int, ...]  # ending a row (not part of its output)


def as_config(config: Any) -> GenerationConfig:
    """``config``, or the default GenerationConfig for None; anything else is a TypeError."""
    if config is None:
        return GenerationConfig()
    if not isinstance(config, GenerationConfig):
        hint = "GenerationConfig(**settings)" if isinstance(config, dict) else "GenerationConfig()"
        raise TypeError(
            f"config must be a GenerationConfig, got {type(config).__name__}; build one with "
            f"{hint} (attnlab.generate.GenerationConfig)"
        )
    return config


def check_special_ids(specials: SpecialIds, vocab_size: int) -> None:
    """The ids fed to the model (bos, pad) must be tokens of its vocabulary (a stop id outside it
    is harmless: it never occurs)."""
    for name, value in (("bos_token_id", specials.bos), ("pad_token_id", specials.pad)):
        if value is not None and value >= vocab_size:
            raise ValueError(
                f"{name}={value} is not a token of the model, whose vocabulary has "
                f"{vocab_size} ids (0 to {vocab_size - 1}); use the tokenizer's ids"
            )


def special_ids(config: GenerationConfig, tokenizer: Any | None) -> SpecialIds:
    """Config values win; then the tokenizer's BOS/pad/EOS; pad defaults to 0, stop to none."""
    bos = config.bos_token_id
    if bos is None and tokenizer is not None:
        bos = getattr(tokenizer, "bos_id", None)
    pad = config.pad_token_id
    if pad is None:
        pad = getattr(tokenizer, "pad_id", None) if tokenizer is not None else None
        pad = 0 if pad is None else pad
    stop = config.stop_token_ids
    if stop is None:
        eos = getattr(tokenizer, "eos_id", None) if tokenizer is not None else None
        stop = () if eos is None else (eos,)
    return SpecialIds(bos, pad, tuple(stop))
