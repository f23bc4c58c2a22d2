"""Head attribution: what each head does to the output.

* :func:`head_ablation_effects`: for every head, the change of a metric (the loss, or a chosen
  token's log-probability) when that head alone is ablated: effect[l, h] = m(ablated) - m(clean).
* :func:`direct_logit_attribution` (decoder LMs, pre-norm): the final residual stream is a sum,
  r = x_0 + sum_l (attn_l + ffn_l) (000 "Residual connections", h = f(LN(h)) + h), and each
  attention output is a sum over heads, attn_l = sum_h head_h W^O_h + b^O (004 eq. 13, W^O split
  into per-head row blocks). The logit of token w is LN_f(r) . E_out[w]; with the final norm's
  scale frozen at its value on r (the usual linearisation; exact for the sum),

      logit_w = sum_c  g * (c - mean(c)) / sigma(r) . E_out[w]  +  b . E_out[w]

  over the components c (embedding, every head, every W^O bias, every feed-forward output), so
  each head gets its direct contribution to the logit, and the contributions add up to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.inspect.cache import ActivationCache, run_with_cache
from attnlab.inspect.heads import ablate_heads, attention_layers, n_heads_of
from attnlab.inspect.names import InspectError
from attnlab.models.base import LanguageModel
from attnlab.models.lm import DecoderLM
from attnlab.nn.norms import LayerNorm, RMSNorm

Metric = str | Callable[[object], Tensor]


class HeadEffects(NamedTuple):
    """clean: the metric without ablation (scalar); effects: (L, H) metric change per head."""

    clean: Tensor
    effects: Tensor


def _logits(output) -> Tensor:
    return output.logits if hasattr(output, "logits") else output


def make_metric(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    metric: Metric,
    *,
    targets: Tensor | None = None,
    token: int | None = None,
    position: int = -1,
) -> Callable[[object], Tensor]:
    """The scalar a head is judged by, as a function of the model output.

    "loss": mean cross-entropy against ``targets`` (B, T) (-100 = ignore), or for a language
    model the next tokens of its own input ids (padding ignored). "logprob": mean over the batch
    of log p(token) at ``position``. A callable is used as is.
    """
    if callable(metric):
        return metric
    if metric == "logprob":
        if token is None:
            raise InspectError("metric='logprob' needs token=<the token id to score>")

        def logprob(output) -> Tensor:
            logits = _logits(output)
            if logits.dim() == 3 and not -logits.size(1) <= position < logits.size(1):
                raise InspectError(f"position={position} is outside the {logits.size(1)} positions")
            logits = logits[:, position] if logits.dim() == 3 else logits
            if not 0 <= token < logits.size(-1):
                raise InspectError(f"token={token} is not an id of the {logits.size(-1)} outputs")
            return logits.float().log_softmax(-1)[:, token].mean()

        return logprob
    if metric != "loss":
        raise InspectError(f"metric must be 'loss', 'logprob' or a function, got {metric!r}")
    if targets is None:
        if not isinstance(model, LanguageModel):
            raise InspectError(
                "metric='loss' on a sequence-to-sequence model or classifier needs "
                "targets=<the target ids or labels>"
            )
        ids = args[0]
        targets = (
            ids[:, 1:].masked_fill(~kwargs["key_padding_mask"][:, 1:], -100)
            if kwargs.get("key_padding_mask") is not None
            else ids[:, 1:]
        )
        if not (targets != -100).any():  # one token, or padding only: a loss of nothing is NaN
            raise InspectError(
                "metric='loss' scores each next token, ids[:, 1:], and this input has none (one "
                "token, or padding after the first); give a longer input or targets="
            )

        def lm_loss(output) -> Tensor:
            logits = _logits(output)[:, :-1]  # (B, T-1, V) predicts ids[:, 1:]
            return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

        return lm_loss

    def loss(output) -> Tensor:
        logits = _logits(output)
        return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())

    return loss


@torch.no_grad()
def head_ablation_effects(
    model: nn.Module,
    *args,
    metric: Metric = "loss",
    targets: Tensor | None = None,
    token: int | None = None,
    position: int = -1,
    mode: str = "zero",
    site: str = "self",
    part: str | None = None,
    means: ActivationCache | None = None,
    **kwargs,
) -> HeadEffects:
    """effects[l, h] = metric(model with head (l, h) ablated) - metric(model), for every head.

    ``model(*args, **kwargs)`` is the run (ids for an LM; src, tgt_in for seq2seq); see
    :func:`make_metric` for ``metric``, :func:`attnlab.inspect.ablate_heads` for ``mode``,
    ``site``, ``part`` and ``means``. One forward pass per head, no gradients.
    """
    measure = make_metric(
        model, args, kwargs, metric, targets=targets, token=token, position=position
    )
    layers = attention_layers(model, site, part)
    clean = measure(model(*args, **kwargs)).detach()
    effects = torch.zeros(len(layers), max(n_heads_of(layer) for layer in layers))
    for row, layer in enumerate(layers):
        for h in range(n_heads_of(layer)):
            with ablate_heads(
                model, [(layer.index, h)], mode=mode, site=site, part=part, means=means
            ):
                effects[row, h] = measure(model(*args, **kwargs)).detach().cpu() - clean.cpu()
    return HeadEffects(clean, effects)


class LogitAttribution(NamedTuple):
    """Direct contributions to one logit per row, each (B, ...): heads (B, L, H), attn_bias and
    ffn (B, L), embed and bias (B,); ``total`` their sum and ``logit`` the model's logit (B,)
    (before a final soft-cap)."""

    heads: Tensor
    attn_bias: Tensor
    ffn: Tensor
    embed: Tensor
    bias: Tensor
    total: Tensor
    logit: Tensor


def _final_norm_map(norm: nn.Module, r: Tensor) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """The final norm linearised at r (B, D): (c -> its image with the scale frozen, the bias)."""
    gain: Tensor | float
    if isinstance(norm, nn.Identity):
        return (lambda c: c), r.new_zeros(r.shape)
    if isinstance(norm, (LayerNorm, nn.LayerNorm)):
        sigma = torch.sqrt(r.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # (B, 1)
        gain = norm.weight if norm.weight is not None else 1.0
        bias = norm.bias if norm.bias is not None else r.new_zeros(r.size(-1))
        return (lambda c: gain * (c - c.mean(dim=-1, keepdim=True)) / sigma), bias.expand_as(r)
    if isinstance(norm, RMSNorm):
        eps = norm.eps if norm.eps is not None else torch.finfo(r.dtype).eps
        rms = torch.sqrt(r.pow(2).mean(dim=-1, keepdim=True) + eps)  # (B, 1)
        gain = norm.weight if norm.weight is not None else 1.0
        return (lambda c: gain * c / rms), r.new_zeros(r.shape)
    raise InspectError(f"direct logit attribution does not know the final norm {type(norm)}")


@torch.no_grad()
def direct_logit_attribution(
    model: nn.Module,
    ids: Tensor,
    tokens: int | Tensor,
    *,
    position: int = -1,
    **kwargs,
) -> LogitAttribution:
    """Each head's direct contribution to the logit of ``tokens`` (int or (B,)) at ``position``
    of a pre-norm decoder LM (module docstring). The parts add up to the logit (tested). With a
    ``final_logit_softcap`` c, ``logit`` is the logit z before the cap (the model outputs
    c tanh(z / c), which is not a sum of parts). Without W^O (``out_proj=False``) head h's
    part is its own slice of the concatenation."""
    if not isinstance(model, DecoderLM):
        raise InspectError(
            f"direct logit attribution needs a decoder LM, got {type(model).__name__}; use "
            "head_ablation_effects for other models"
        )
    if model.cfg.norm_placement != "pre":
        raise InspectError(
            "direct logit attribution reads the residual stream as a sum of components, which "
            "post-norm blocks renormalise away; use a pre-norm model (norm_placement='pre') or "
            "head_ablation_effects"
        )
    layers = attention_layers(model, "self")
    blocks = [layer.path.rpartition(".")[0] for layer in layers]
    names = [f"{layer.path}.heads" for layer in layers]
    names += [f"{b}.resid_mid" for b in blocks] + [f"{b}.resid_post" for b in blocks]
    names += [f"{b}.x" for b in blocks[:1]]
    b, t, v = ids.size(0), ids.size(-1), model.lm_head.weight.size(0)
    if not -t <= position < t:
        raise InspectError(f"position={position} is outside the input's {t} positions")
    tokens = torch.as_tensor(tokens, device=ids.device)
    if tokens.is_floating_point() or tokens.dtype == torch.bool or tokens.dim() > 1:
        raise InspectError(f"tokens must be one token id or (B,) ids, got {tokens.dtype} "
                           f"{tuple(tokens.shape)}")  # fmt: skip
    if tokens.dim() == 1 and tokens.numel() != b:
        raise InspectError(f"tokens has {tokens.numel()} ids for a batch of {b}: give one per row")
    if ((tokens < 0) | (tokens >= v)).any():
        raise InspectError(f"tokens must be ids in [0, {v}), got {tokens.tolist()}")
    output, cache = run_with_cache(model, ids, names=names, **kwargs)
    tokens = tokens.expand(b)  # (B,)
    unembed = model.lm_head.weight[tokens]  # (B, D) E_out[w]
    r = cache[f"{blocks[-1]}.resid_post"][:, position]  # (B, D)
    capped = model.cfg.final_logit_softcap is not None
    logits = model.lm_head(model.final_norm(r)) if capped else output.logits[:, position]  # (B, V)
    norm, bias = _final_norm_map(model.final_norm, r)

    def logit_of(c: Tensor) -> Tensor:  # (B, D) -> (B,)
        return (norm(c) * unembed).sum(-1)

    resid_in = cache[f"{blocks[0]}.x"][:, position]  # (B, D) the first block's input
    head_parts, attn_bias, ffn = [], [], []
    for layer, block in zip(layers, blocks, strict=True):
        attn = layer.module
        heads = cache[f"{layer.path}.heads"][:, :, position]  # (B, H, Dv)
        n, dv = heads.size(1), heads.size(2)
        w_o = attn.out_proj.weight if attn.out_proj is not None else None  # (Do, H*Dv)
        per_head = []
        for h in range(n):
            if w_o is None:  # no W^O: head h is its own slice of the concatenation (B, H*Dv)
                part = heads.new_zeros(b, n * dv)
                part[:, h * dv : (h + 1) * dv] = heads[:, h]
            else:
                part = heads[:, h] @ w_o[:, h * dv : (h + 1) * dv].T  # (B, Dv) @ (Dv, Do)
            per_head.append(logit_of(part))  # (B,)
        head_parts.append(torch.stack(per_head, dim=1))  # (B, H)
        out_bias = attn.out_proj.bias if attn.out_proj is not None else None
        attn_bias.append(
            logit_of(out_bias.expand_as(resid_in)) if out_bias is not None else logits.new_zeros(b)
        )
        mid = cache[f"{block}.resid_mid"][:, position]
        post = cache[f"{block}.resid_post"][:, position]
        ffn.append(logit_of(post - mid))
    embed = logit_of(resid_in)
    bias_part = (bias * unembed).sum(-1)
    heads_t = torch.stack(head_parts, dim=1)  # (B, L, H)
    attn_bias_t, ffn_t = torch.stack(attn_bias, dim=1), torch.stack(ffn, dim=1)  # (B, L)
    total = heads_t.sum((1, 2)) + attn_bias_t.sum(1) + ffn_t.sum(1) + embed + bias_part
    return LogitAttribution(
        heads_t,
        attn_bias_t,
        ffn_t,
        embed,
        bias_part,
        total,
        logits.gather(1, tokens[:, None]).squeeze(1),
    )
