"""Steppers: feed a model one step at a time, with or without a KV cache, behind one interface.

A stepper owns the token history of R rows and the model's decoding cache. ``start()`` runs the
prompt (LM) or the start token (seq2seq) and returns the logits of the first new token;
``advance(next)`` appends one token per row and returns the logits of the following one;
``reorder(index)`` keeps rows ``index`` (beam search). Both loops -- sampling and beam search --
talk only to this interface and to the model interfaces of ``attnlab.models.base``, so they never
branch on the model family (Transformer or recurrent).

With a cache (the default) the prompt is prefilled in one call and each step feeds only the new
token: p(w_t | w_{<t}) needs the keys/values of w_{<t}, which never change in a causal model. With
``use_cache=False`` the whole context is recomputed every step (the reference the tests compare
against; O(T^2) work per sequence instead of O(T)).

Sliding window (LMs whose context window max_len is finite): when a row's context is full, it
keeps its last ``max_len // 2`` tokens, the cache is rebuilt from every row's context (one prefill
call), that row's positions restart at 0, and decoding continues. Each row slides on its own
schedule, the one it would have alone, so a batch still equals one prompt at a time. The
trade-off: a new token sees between max_len/2 and max_len tokens of context, instead of exactly
max_len as when recomputing the cropped window every step (nanoGPT's ``sample.py``), but the cost
stays one prefill per max_len/2 tokens instead of a full forward per token. The uncached reference
crops each row to its last max_len tokens every step.

``compile=True`` runs the cached one-token step (``model.forward`` for LMs, ``model.decode`` for
seq2seq) through ``torch.compile`` (see :func:`compiled_step`); the prefill stays eager. The
compiled step is kept per model class and reused by later calls in the same process, so only the
first generation pays the compile time (seconds to tens of seconds on CPU). It removes per-op
dispatch and Python overhead, which is what a small model's decode step is made of, and at batch
1 turns each weight product into a loop that streams the weights on every core, which is what a
wider model's step is made of. A fast model (``attnlab.fast``) carries the engine's
:class:`~attnlab.fast.replay.ReplayingStep` (its ``decode_step``), which replaces
:class:`CompiledStep`: once two steps in a row have shown that only the token and the cache
length change, it calls the compiled graph without dynamo's per-call guards.

Shapes: R rows, P prompt columns, N max new tokens, V vocabulary, S source length.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from attnlab.generate.config import GenerationConfig
from attnlab.generate.prompts import position_ids
from attnlab.models.base import Encoded, LanguageModel, Seq2SeqModel


class Stepper(Protocol):
    """What the decoding loops (sampling, beam search) see of a stepper."""

    ids: Tensor  # (R, columns) the token history buffer

    @property
    def rows(self) -> int: ...

    def history(self) -> tuple[Tensor, Tensor | None]: ...

    def start(self) -> Tensor: ...

    def advance(self, next_ids: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor) -> None: ...


class LMStepper:
    """Feeds a :class:`LanguageModel`; prompts are left-padded (see ``prompts.py``).

    ``ctx[r]`` counts the tokens of row r in the cache: its context. Every row slides on its own
    schedule, exactly as it would alone: when a row's context is full (``window`` tokens) and a
    token must be added, it keeps its last ``window // 2`` tokens. Any slide rebuilds the batch
    cache from each row's current context (one prefill), left-padded to the longest.
    """

    def __init__(
        self,
        model: LanguageModel,
        ids: Tensor,
        mask: Tensor | None,
        config: GenerationConfig,
        pad_id: int = 0,
    ):
        """ids, mask (R, P): the left-padded prompts; ``config`` gives max_new_tokens (N),
        use_cache, compile and cache_dtype."""
        self.model, self.use_cache, self.cache_dtype = model, config.use_cache, config.cache_dtype
        self.compiled = make_compiled_step(model, "forward") if config.compile else None
        max_new_tokens = config.max_new_tokens
        self.window: int | None = getattr(model, "max_len", None)
        rows, p = ids.shape
        device = _device(model)
        total = p + max_new_tokens
        self.ids = torch.full((rows, total), pad_id, dtype=torch.long, device=device)  # (R, P+N)
        self.ids[:, :p] = ids
        self.mask: Tensor | None = None
        if mask is not None:
            self.mask = torch.ones(rows, total, dtype=torch.bool, device=device)  # (R, P+N)
            self.mask[:, :p] = mask
        self.t = p  # filled columns
        lengths = mask.sum(dim=1) if mask is not None else torch.full((rows,), p)
        self.ctx = lengths.to(device)  # (R,) tokens of each row in the cache
        # The last new token is never fed back, so the history holds at most P + N - 1 tokens;
        # one spare slot means the buffer is never exactly full, a shape case that would make a
        # compiled step (``compile=True``) recompile at the last token.
        self.cache_len = total if self.window is None else min(total, self.window)
        self.may_slide = self.window is not None and total - 1 > self.window
        self.cache = None
        self.next_pos: Tensor | None = None  # (R,) position of the next token (padded rows)

    @property
    def rows(self) -> int:
        return self.ids.size(0)

    def history(self) -> tuple[Tensor, Tensor | None]:
        """The tokens so far (R, t) and their real-token mask (R, t) or None."""
        mask = None if self.mask is None else self.mask[:, : self.t]
        return self.ids[:, : self.t], mask

    def start(self) -> Tensor:
        """Logits (R, V) of the first new token."""
        if not self.use_cache:
            return self._recompute()
        return self._prefill()

    def advance(self, next_ids: Tensor) -> Tensor:
        """Append next_ids (R,) and return the logits (R, V) of the token after them."""
        self.ids[:, self.t] = next_ids
        self.t += 1
        if not self.use_cache:
            return self._recompute()
        if self.may_slide:
            assert self.window is not None  # only a finite window slides
            full = self.ctx >= self.window  # (R,) rows whose context cannot take one more token
            self.ctx = torch.where(full, max(1, self.window // 2), self.ctx + 1)
            if bool(full.any()):
                return self._prefill()
        ids = next_ids[:, None]  # (R, 1)
        if self.next_pos is not None:  # padded rows: positions from each row's own count
            positions = self.next_pos[:, None]  # (R, 1)
            self.next_pos = self.next_pos + 1  # not in place: ``positions`` is a view
            step = self.model if self.compiled is None else self.compiled.traced
            return step(ids, positions=positions, cache=self.cache).logits[:, -1]
        if self.compiled is not None:
            return self.compiled(ids, cache=self.cache)[:, -1]  # (R, V)
        return self.model(ids, cache=self.cache).logits[:, -1]

    def reorder(self, index: Tensor) -> None:
        if self.compiled is not None:
            self.compiled.reset()
        self.ids = self.ids.index_select(0, index)
        self.ctx = self.ctx.index_select(0, index)
        if self.mask is not None:
            self.mask = self.mask.index_select(0, index)
        if self.next_pos is not None:
            self.next_pos = self.next_pos.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)

    def _prefill(self) -> Tensor:
        """A fresh cache holding each row's last ``ctx[r]`` tokens, in one forward call.

        The buffer keeps every row's real tokens contiguous at its right end, so those are the
        last ``ctx[r]`` columns; the rest of the window (W = max ctx columns) is masked out.
        """
        if self.compiled is not None:
            self.compiled.reset()  # a new cache: replays of the old one are void
        width = int(self.ctx.max())
        ids = self.ids[:, self.t - width : self.t]  # (R, W)
        mask = positions = self.next_pos = None
        if not bool((self.ctx == width).all()):
            cols = torch.arange(width, device=ids.device)  # (W,)
            mask = cols[None, :] >= (width - self.ctx)[:, None]  # (R, W), True = in context
            positions = position_ids(mask)  # (R, W)
            self.next_pos = positions[:, -1] + 1  # (R,)
        self.cache = new_cache(self.model, self.rows, self.cache_len, dtype=self.cache_dtype)
        out = self.model(ids, key_padding_mask=mask, positions=positions, cache=self.cache)
        return out.logits[:, -1]  # (R, V)

    def _recompute(self) -> Tensor:
        """No cache: run the whole context again, each row cropped to its last ``window``."""
        start = 0 if self.window is None else max(0, self.t - self.window)
        ids = self.ids[:, start : self.t]  # (R, K)
        if self.mask is None:
            return self.model(ids).logits[:, -1]
        mask = self.mask[:, start : self.t]  # (R, K)
        out = self.model(ids, key_padding_mask=mask, positions=position_ids(mask))
        return out.logits[:, -1]  # (R, V)


class Seq2SeqStepper:
    """Feeds a :class:`Seq2SeqModel`: encode the sources once, then decode from BOS."""

    def __init__(
        self,
        model: Seq2SeqModel,
        src: Tensor,
        src_mask: Tensor,
        bos_id: int,
        config: GenerationConfig,
        pad_id: int = 0,
    ):
        """src, src_mask (R, S): the right-padded sources; ``config`` as for :class:`LMStepper`."""
        self.model, self.use_cache, self.cache_dtype = model, config.use_cache, config.cache_dtype
        self.compiled = make_compiled_step(model, "decode") if config.compile else None
        max_new_tokens = config.max_new_tokens
        device = _device(model)
        self.src, self.src_mask = src.to(device), src_mask.to(device)  # (R, S)
        self.encoded: Encoded | None = None  # encoded in start(), under inference mode
        rows = src.size(0)
        self.ids = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
        self.ids[:, 0] = bos_id  # (R, N): decoder inputs [BOS, y_1, ..., y_{N-1}]
        self.t = 1
        self.cache_len = max_new_tokens + 1  # inputs [BOS, y_1..y_{N-1}], plus a spare slot
        self.cache = None

    @property
    def rows(self) -> int:
        return self.ids.size(0)

    def history(self) -> tuple[Tensor, Tensor | None]:
        return self.ids[:, : self.t], None

    @property
    def source(self) -> Encoded:
        """The encoded sources (from :meth:`start`)."""
        if self.encoded is None:
            raise RuntimeError("the seq2seq stepper decodes after start(), which encodes")
        return self.encoded

    def start(self) -> Tensor:
        self.encoded = self.model.encode(self.src, self.src_mask)  # h^(x), once per source
        if self.use_cache:
            self.cache = new_cache(self.model, self.encoded, self.cache_len, dtype=self.cache_dtype)
        return self._decode(self.ids[:, :1])

    def advance(self, next_ids: Tensor) -> Tensor:
        self.ids[:, self.t] = next_ids
        self.t += 1
        if not self.use_cache:
            return self._decode(self.ids[:, : self.t])
        ids = next_ids[:, None]  # (R, 1)
        if self.compiled is not None:
            return self.compiled(ids, self.source, cache=self.cache)[:, -1]  # (R, V)
        return self.model.decode(ids, self.source, cache=self.cache).logits[:, -1]

    def reorder(self, index: Tensor) -> None:
        if self.compiled is not None:
            self.compiled.reset()
        self.ids = self.ids.index_select(0, index)
        self.encoded = Encoded(*(x.index_select(0, index) for x in self.source))
        if self.cache is not None:
            self.cache.reorder(index)

    def _decode(self, tgt_in: Tensor) -> Tensor:
        out = self.model.decode(tgt_in, self.source, cache=self.cache)
        return out.logits[:, -1]  # (R, V)


def new_cache(
    model: LanguageModel | Seq2SeqModel, rows_or_source: Any, max_len: int, *, dtype: str | None
) -> Any:
    """``model.new_cache(rows_or_source, max_len)`` (an LM's row count, a seq2seq model's
    encoded source), in the KV cache dtype ``dtype`` when one is asked for (so a model written
    before cache dtypes existed still decodes with its default)."""
    if dtype is None:
        return model.new_cache(rows_or_source, max_len)
    return model.new_cache(rows_or_source, max_len, dtype=dtype)


_COMPILED: dict[tuple[type, str, Any], Callable[..., Any]] = {}

# Inductor settings for the one-token step (measured: benchmarks/ANALYSIS.md, generation):
#  * decompose_mm_pass: a (1, K) x (K, N) product becomes a multiply-and-sum loop in the generated
#    code, which streams the weights on every core; the BLAS call for a matrix-vector product
#    runs on one. This is what a batch-1 step of a wide model is made of.
#  * size_asserts=False: the wrapper otherwise re-checks every input's sizes and strides on each
#    call, which the guards have already checked.
STEP_OPTIONS: dict[str, Any] = {
    "post_grad_fusion_options": {"decompose_mm_pass": {}},
    "size_asserts": False,
}


class CompiledStep:
    """``model.<method>`` compiled (:func:`compiled_step`): call with ids (R, 1), the method's
    other arguments and ``cache=``; returns logits (R, 1, V). ``traced`` is the compiled callable.

    A fast model (``attnlab.fast``) carries the engine's drop-in replacement (its
    ``decode_step``), which calls the compiled graph without dynamo once its inputs are known
    (``attnlab.fast.replay``).
    """

    def __init__(self, model: torch.nn.Module, method: str):
        self.traced = compiled_step(model, method)

    def reset(self) -> None:
        """The cache or the batch changed (the engine's replay forgets its graph call)."""

    def __call__(self, ids: Tensor, *args: Any, cache: Any) -> Tensor:
        return self.traced(ids, *args, cache=cache).logits


def make_compiled_step(model: torch.nn.Module, method: str) -> CompiledStep:
    """The compiled one-token step of ``model.<method>``: the model's own kind when it carries
    one (``decode_step``: a fast model of ``attnlab.fast`` carries the engine's replaying step),
    else :class:`CompiledStep`."""
    return getattr(model, "decode_step", CompiledStep)(model, method)


def compiled_step(model: torch.nn.Module, method: str, backend: Any = None) -> Callable[..., Any]:
    """``model.<method>(...)`` through ``torch.compile`` (inductor with :data:`STEP_OPTIONS`, or
    the given ``backend``).

    The class's function is compiled once per process and shared by every model of that class
    (the model is an input of the compiled code, so nothing keeps a model alive). Shapes start
    static and become dynamic where they change (dynamo's automatic dynamic shapes): the growing
    cache length costs one recompilation, not one per token, and the buffer sizes stay static,
    which keeps the per-call shape guards smaller than with ``dynamic=True`` (profiles in
    docs/generation.md).
    """
    key = (type(model), method, backend)
    if key not in _COMPILED:
        fn = getattr(type(model), method)
        if backend is None:
            _COMPILED[key] = torch.compile(fn, options=STEP_OPTIONS)
        else:
            _COMPILED[key] = torch.compile(fn, backend=backend)
    return functools.partial(_with_step_config, _COMPILED[key], model)


# Graphs dynamo may keep for the step's function (per class, shared by its models). Each model
# shape needs 2-3 (the first step's static shapes, then a dynamic cache length, maybe a dynamic
# buffer size); dynamo's default of 8 is reached after a few models, and beyond it every new shape
# would silently run eager, with no error.
STEP_RECOMPILE_LIMIT = 64

# Recursive dict-tag guards for the compiled step (below). A switch only so that
# benchmarks/fast_ab.py can measure what they give (its generation workload, "plain - dict_tags").
DICT_TAG_GUARDS = True


def _with_step_config(step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``step`` with the dynamo settings of the decode step, switched on only around it.

    * Recursive dict-tag guards. Dynamo guards every parameter of the model on each call; with
      ``use_recursive_dict_tags_for_guards`` an unchanged module tree is checked by its
      dictionaries' version tags instead (about half the guard time, docs/generation.md). The
      setting is read when a graph's guards are built. A model changed in place between calls
      (``model.double()``, which swaps ``.data``; rescaled parameters) still gets its own result
      (tested).
    * A recompile limit of at least :data:`STEP_RECOMPILE_LIMIT` for the step's function.

    Neither is set for the process, only for these calls.
    """
    config = torch._dynamo.config
    changes: dict[str, Any] = {}
    if hasattr(config, "use_recursive_dict_tags_for_guards"):  # older torch: plain guards
        changes["use_recursive_dict_tags_for_guards"] = DICT_TAG_GUARDS
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    changes[limit] = max(getattr(config, limit), STEP_RECOMPILE_LIMIT)
    before = {name: getattr(config, name) for name in changes}
    for name, value in changes.items():
        setattr(config, name, value)
    try:
        return step(*args, **kwargs)
    finally:
        for name, value in before.items():
            setattr(config, name, value)


def _device(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def check_model(
    model: object, interface: type[LanguageModel] | type[Seq2SeqModel], use: str
) -> None:
    """A clear error when a model cannot be used this way (e.g. a classifier given to generate,
    or a model whose weights are still on the meta device)."""
    if isinstance(model, interface):
        meta = next((n for n, p in model.named_parameters() if p.is_meta), None)
        if meta is not None:
            raise ValueError(
                f"{use} needs a model with real weights, but {meta} (and maybe more) is on the "
                "meta device (shapes only, no values); materialise it first, e.g. "
                "model.to_empty(device='cpu') and then load_state_dict(...)"
            )
        return
    kinds: dict[type[nn.Module], str] = {
        LanguageModel: "language model",
        Seq2SeqModel: "sequence-to-sequence model",
    }
    has = next((name for cls, name in kinds.items() if isinstance(model, cls)), None)
    if has is not None:
        hint = "generate" if has == "language model" else "generate_seq2seq"
        raise TypeError(f"{use} needs a {kinds[interface]}, but this is a {has}; use {hint}()")
    raise TypeError(
        f"{use} needs a {kinds[interface]}, got {type(model).__name__}, which is not generative "
        "(a classifier or a bare encoder predicts labels or vectors, not tokens)"
    )


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Dropout off while generating; the model's previous mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
