"""Recurrent pieces of the lineage before the Transformer (000 "Problems with RNN"; 004 eq. 2-8).

* :class:`RNNCell` and :class:`SimpleRNN`: the Elman RNN of 000, h_t = sigma(W h_{t-1} + U x_t + b),
  run as an explicit loop over time. The loop *is* 000's lesson: h_t cannot be computed before
  h_{t-1}. Only the input half U x_t + b has no serial dependency, so it is computed for all t at
  once before the loop.
* Alignment scores a(h, f) of 004 eq. 6: :class:`AdditiveScore` (Bahdanau et al. 2015,
  v^T tanh(W h + U f)), :class:`DotScore` and :class:`GeneralScore` (Luong et al. 2015). Each splits
  into ``project_keys`` (the part that depends on the source only, computed once per source) and
  ``forward`` (the part that depends on the decoder state, computed every step).
* :func:`attention_step`: eq. 6-8, alpha_l = softmax(e_l) over real source positions and the
  context v_l = sum_t alpha_lt f_t, returned with its weights (never stored).
* :func:`lstm_right_padded`: a ``torch.nn.LSTM`` over right-padded rows of different lengths, the
  result of packing them (``pack_padded_sequence``) but with one fused call per layer and
  direction instead of PyTorch's step-by-step packed path (why: benchmarks/ANALYSIS.md,
  "Measurements behind plain-path choices").
* :class:`StepHookPoint`: a hook point inside a recurrence (h_t of each RNN layer; e_l, alpha_l,
  v_l of the attention decoder). It fires once per step; ``attnlab.inspect`` stacks the steps on
  dim 1, so a cached alpha is (B, T, S) like a Transformer's weights.
* :class:`RecurrentCache`: the decoding state of a recurrent model (hidden states, step count and
  the per-source tensors), with the same ``length`` / ``reorder`` contract as the KV cache.

Shapes: B batch, T time steps (target length), S source length, D input width, H hidden width,
L layers, F feature width (f_t), A attention width (additive score), Q query width (decoder state).
Masks are bool with True = a real token (may attend / may update the state).

Deviations from the notes: 000 writes sigma without choosing it; we use tanh (Elman's and
``torch.nn.RNN``'s default) and add a bias b (zero-initialisable, so the note's form is a special
case).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple, cast

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigValueError
from attnlab.nn.attention import AttentionOutput
from attnlab.nn.dropout import Dropout, dropout
from attnlab.nn.hooks import HookPoint

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


class StepHookPoint(HookPoint):
    """A :class:`HookPoint` on a value computed once per time step, (B, ...) at each step.

    ``step_axis`` tells ``attnlab.inspect`` where to stack the steps of one call: (B, T, ...).
    """

    step_axis = 1


class RNNCell(nn.Module):
    """One Elman step of 000: h_t = sigma(W h_{t-1} + U x_t + b).

    Parameters are kept in the notes' column-vector form, W: (H, H), U: (H, D), b: (H,), which is
    also ``torch.nn.RNNCell``'s layout (W = weight_hh, U = weight_ih, b = bias_ih + bias_hh).
    Initialised like torch: every entry ~ Uniform(-1/sqrt(H), 1/sqrt(H)).
    """

    def __init__(self, d_input: int, d_hidden: int, *, bias: bool = True, activation: str = "tanh"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is not one of {list(_ACTIVATIONS)}")
        self.d_input, self.d_hidden, self.activation = d_input, d_hidden, activation
        self.W = nn.Parameter(torch.empty(d_hidden, d_hidden))
        self.U = nn.Parameter(torch.empty(d_hidden, d_input))
        self.b = nn.Parameter(torch.empty(d_hidden)) if bias else None
        self.hook_h = StepHookPoint()  # h_t, one step at a time (read by SimpleRNN's loop)
        bound = 1.0 / math.sqrt(d_hidden)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def project_inputs(self, x: Tensor) -> Tensor:
        """U x_t + b for every t at once (no serial dependency): (..., D) -> (..., H)."""
        return nn.functional.linear(x, self.U, self.b)

    def step(self, ux: Tensor, h_prev: Tensor) -> Tensor:
        """h_t = sigma(W h_{t-1} + ux_t) for a projected input ux_t (B, H); h_prev (B, H)."""
        return _ACTIVATIONS[self.activation](torch.addmm(ux, h_prev, self.W.t()))

    def forward(self, x: Tensor, h_prev: Tensor) -> Tensor:
        """One step on raw inputs, like ``torch.nn.RNNCell``: x (B, D), h_prev (B, H) -> (B, H)."""
        return self.step(self.project_inputs(x), h_prev)


class RecurrentOutput(NamedTuple):
    """Per-step top-layer states (B, T, H) and the final state of every layer (L, B, H)."""

    out: Tensor
    h_n: Tensor


class SimpleRNN(nn.Module):
    """A stack of L Elman cells unrolled over time; layer l > 1 reads layer l - 1's states as x_t.

    Padding steps (mask False) leave the state unchanged, so left padding in a batch gives the same
    states as no padding, and right padding leaves the final state at the last real token.
    """

    def __init__(
        self,
        d_input: int,
        d_hidden: int,
        n_layers: int = 1,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        activation: str = "tanh",
    ):
        super().__init__()
        self.d_hidden, self.n_layers = d_hidden, n_layers
        self.cells = nn.ModuleList(
            RNNCell(d_input if i == 0 else d_hidden, d_hidden, bias=bias, activation=activation)
            for i in range(n_layers)
        )
        self.drop = Dropout(dropout)  # between layers, as in torch.nn.RNN

    def forward(
        self, x: Tensor, h0: Tensor | None = None, mask: Tensor | None = None
    ) -> RecurrentOutput:
        """x (B, T, D); h0 (L, B, H) or None (zeros); mask (B, T) True = real step.

        Returns per-step states of the top layer (B, T, H) and the final states (L, B, H).
        """
        b, t, _ = x.shape
        if h0 is None:
            h0 = x.new_zeros(self.n_layers, b, self.d_hidden)
        if h0.shape != (self.n_layers, b, self.d_hidden):
            raise ValueError(
                f"h0 must have shape {(self.n_layers, b, self.d_hidden)} "
                f"(L, B, H), got {tuple(h0.shape)}"
            )
        keep = None if mask is None or bool(mask.all()) else mask[:, :, None]  # (B, T, 1)
        finals = []
        for i, cell in enumerate(cast("Iterable[RNNCell]", self.cells)):
            if i > 0:
                x = self.drop(x)
            ux = cell.project_inputs(x)  # (B, T, H), all steps in parallel
            h, states = h0[i], []
            for step in range(t):  # the serial dependency of 000
                h_new = cell.step(ux[:, step], h)  # (B, H)
                h = h_new if keep is None else torch.where(keep[:, step], h_new, h)
                h = cell.hook_h(h)  # (B, H) h_t: a replaced state feeds the next step
                states.append(h)
            x = torch.stack(states, dim=1)  # (B, T, H)
            finals.append(h)
        return RecurrentOutput(x, torch.stack(finals))  # (B, T, H), (L, B, H)


# ------------------------------------------------------------------ alignment scores, 004 eq. 6


def lstm_right_padded(lstm: nn.LSTM, x: Tensor, lengths: Tensor) -> Tensor:
    """``lstm`` (batch_first, from a zero state) over right-padded rows, as if each row b were run
    alone for its first ``lengths[b]`` steps.

    x (B, S, D), lengths (B,) -> outputs (B, S, H * directions), zero at padding steps. The forward
    direction reads the padding only after the real tokens, so its outputs there are exact; the
    backward direction reads each row's real tokens reversed (x_{n:1}, then the padding), which is
    x gathered with a per-row flip, and its outputs are flipped back. Dropout between layers as in
    ``torch.nn.LSTM``.
    """
    if lstm.proj_size or not lstm.batch_first:
        raise ValueError("lstm_right_padded needs a batch_first nn.LSTM without proj_size")
    b, s, _ = x.shape
    step = torch.arange(s, device=x.device)[None, :]  # (1, S)
    real = step < lengths[:, None]  # (B, S)
    if not lstm.bidirectional:  # one fused call for every layer; padding comes last
        return lstm(x)[0] * real[..., None]
    flip = torch.where(real, lengths[:, None] - 1 - step, step)  # (B, S), its own inverse
    zeros = x.new_zeros(1, b, lstm.hidden_size)
    names = ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if lstm.bias else ())
    h = x
    for layer in range(lstm.num_layers):
        outs = []
        for suffix, order in ((f"_l{layer}", None), (f"_l{layer}_reverse", flip)):
            weights = [getattr(lstm, name + suffix) for name in names]
            inp = h if order is None else _gather_steps(h, order)
            out = torch.lstm(
                inp, (zeros, zeros), weights, lstm.bias, 1, 0.0, lstm.training, False, True
            )[0]  # (B, S, H)
            outs.append(out if order is None else _gather_steps(out, order))
        h = torch.cat(outs, dim=-1)  # (B, S, 2H)
        if layer < lstm.num_layers - 1:
            h = dropout(h, lstm.dropout, lstm.training)
    return h * real[..., None]


def _gather_steps(x: Tensor, order: Tensor) -> Tensor:
    """x (B, S, F), order (B, S) -> y with y[b, i] = x[b, order[b, i]]."""
    return x.gather(1, order[:, :, None].expand(-1, -1, x.size(-1)))


class AdditiveScore(nn.Module):
    """Bahdanau's score (004 eq. 6): a(h, f) = v^T tanh(W h + U f).

    U f depends only on the source, so ``project_keys`` computes it once per source; each decoder
    step then costs one (Q -> A) product for W h. W: (A, Q), U: (A, F), v: (A,), no biases.
    """

    def __init__(self, d_query: int, d_feature: int, d_attn: int):
        super().__init__()
        self.W = nn.Linear(d_query, d_attn, bias=False)
        self.U = nn.Linear(d_feature, d_attn, bias=False)
        self.v = nn.Linear(d_attn, 1, bias=False)

    def project_keys(self, features: Tensor) -> Tensor:
        """U f_t for every source position: (B, S, F) -> (B, S, A)."""
        return self.U(features)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        """e_t = v^T tanh(W h + U f_t): query h (B, Q), keys U f (B, S, A) -> scores (B, S)."""
        hidden = torch.tanh(self.W(query)[:, None, :] + keys)  # (B, S, A)
        return self.v(hidden).squeeze(-1)  # (B, S)


class DotScore(nn.Module):
    """Luong's dot score: a(h, f) = h^T f (needs Q == F). No parameters."""

    def __init__(self, d_query: int, d_feature: int):
        super().__init__()
        if d_query != d_feature:
            raise ValueError(
                f"the dot score needs equal decoder and feature widths, got "
                f"{d_query} and {d_feature}; use score 'general' or 'additive'"
            )

    def project_keys(self, features: Tensor) -> Tensor:
        return features  # (B, S, F)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        """query (B, Q), keys (B, S, Q) -> scores (B, S)."""
        return torch.bmm(keys, query[:, :, None]).squeeze(-1)  # (B, S)


class GeneralScore(nn.Module):
    """Luong's general score: a(h, f) = h^T W f, with W f projected once per source. W: (Q, F)."""

    def __init__(self, d_query: int, d_feature: int):
        super().__init__()
        self.W = nn.Linear(d_feature, d_query, bias=False)

    def project_keys(self, features: Tensor) -> Tensor:
        """W f_t for every source position: (B, S, F) -> (B, S, Q)."""
        return self.W(features)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        """query (B, Q), keys W f (B, S, Q) -> scores (B, S)."""
        return torch.bmm(keys, query[:, :, None]).squeeze(-1)  # (B, S)


SCORES = ("additive", "dot", "general")
Score = AdditiveScore | DotScore | GeneralScore  # a(h, f), with project_keys for the f half


def make_score(name: str, d_query: int, d_feature: int, d_attn: int) -> Score:
    """The alignment score named ``name`` (one of :data:`SCORES`)."""
    if name == "additive":
        return AdditiveScore(d_query, d_feature, d_attn)
    if name == "dot":
        return DotScore(d_query, d_feature)
    if name == "general":
        return GeneralScore(d_query, d_feature)
    raise ValueError(f"unknown attention score {name!r}; choose one of {list(SCORES)}")


class AttentionPoints(NamedTuple):
    """The hook points of one attention step (owned by the model): e_l, alpha_l, v_l."""

    e: HookPoint
    alpha: HookPoint
    v_l: HookPoint


def attention_step(
    query: Tensor,
    features: Tensor,
    keys: Tensor,
    mask: Tensor | None,
    score: nn.Module,
    points: AttentionPoints | None = None,
) -> AttentionOutput:
    """One decoder step of 004 eq. 6-8 for a batch.

        e_lt = a(h^d_{l-1}, f_t)           (eq. 6, ``score(query, keys)``)
        alpha_l = softmax(e_l)             (eq. 7, over positions with mask True only)
        v_l = sum_t alpha_lt f_t           (eq. 8)

    query h^d_{l-1}: (B, Q); features f: (B, S, F); keys = score.project_keys(f); mask: (B, S).
    ``points``: hook points that read or replace e_l (before the mask, which still applies after
    a replacement), alpha_l and v_l.
    Returns AttentionOutput(context v_l (B, F), weights alpha_l (B, S)).
    """
    scores = score(query, keys)  # (B, S)
    if points is not None:
        scores = points.e(scores)  # (B, S) e_l
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)  # (B, S)
    if points is not None:
        weights = points.alpha(weights)  # (B, S) alpha_l
    context = torch.bmm(weights[:, None, :], features).squeeze(1)  # (B, F)
    if points is not None:
        context = points.v_l(context)  # (B, F) v_l
    return AttentionOutput(context, weights)


# ------------------------------------------------------------------------------ decoding state


def refuse_cache_dtype(model: str, dtype: object) -> None:
    """Recurrent models keep a hidden state, not keys and values: a KV cache dtype is refused."""
    if dtype is not None:
        raise ConfigValueError(
            f"{model} keeps a hidden state, not a KV cache, so a cache dtype (cache_dtype="
            f"{dtype!r}) does not apply; leave it unset (Transformer models take fp32 or bf16)",
            fields=("cache_dtype",),
        )


class RecurrentCache:
    """Mutable decoding state of a recurrent model; the model updates it in place.

    ``state``: hidden state tensors in ``torch.nn.LSTM`` layout, each (L, B, H) (h for an RNN,
    (h, c) for an LSTM). ``source``: per-source tensors with the batch first (features, projected
    keys, source mask), so beam search only has to call :meth:`reorder`. ``length`` counts the
    tokens consumed. A recurrent state has no length limit, so ``max_len`` is None.
    """

    max_len: int | None = None

    def __init__(self, state: tuple[Tensor, ...], source: dict[str, Tensor] | None = None):
        self.state = state
        self.source = dict(source or {})
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.state[0].size(1)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',) int64, e.g. the surviving beams."""
        self.state = tuple(s.index_select(1, index) for s in self.state)  # (L, B', H)
        self.source = {k: v.index_select(0, index) for k, v in self.source.items()}
