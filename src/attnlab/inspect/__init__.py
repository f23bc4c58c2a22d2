"""Look inside any model: cache named activations, change them, attribute the output to heads.

    from attnlab import inspect
    out, cache = inspect.run_with_cache(model, ids)          # every quantity of the notes, by name
    cache["blocks.0.self_attn.A"]                            # (B, H, T, S) attention weights
    with inspect.ablate_heads(model, [(0, 1)]):              # layer 0, head 1 zeroed
        ablated = model(ids).logits
    with inspect.patch(model, cache_b, "blocks.1.*"):       # activation patching
        patched = model(ids_a).logits
    out, cache = inspect.run_with_cache(model, ids, grads=True)  # cache.grads: dM/da by name
    inspect.attribution_patching(model, ids_a, source=cache_b)  # patching, to first order

Names, shapes and the equations they belong to: docs/inspect.md. The modules: ``names``
(discovery and selection), ``cache`` (run_with_cache, capture), ``interventions`` (intervene,
patch, positions), ``heads`` (attention layers, ablation), ``attribution`` (ablation effects,
direct logit attribution), ``gradients`` (gradient cache, attribution patching).
attnlab.inspect knows models only through their hook points (:class:`attnlab.nn.hooks.HookPoint`)
and the three model interfaces.
"""

from attnlab.inspect.attribution import (
    HeadEffects,
    LogitAttribution,
    direct_logit_attribution,
    head_ablation_effects,
    make_metric,
)
from attnlab.inspect.cache import ActivationCache, capture, run_with_cache
from attnlab.inspect.gradients import (
    GradientRun,
    PatchingEstimate,
    attribution_patching,
    run_with_grads,
)
from attnlab.inspect.heads import AttentionLayer, ablate_heads, attention_layers
from attnlab.inspect.interventions import (
    compose,
    intervene,
    patch,
    position_names,
    replace_positions,
    scale_positions,
)
from attnlab.inspect.names import InspectError, activation_names, hook_points

__all__ = [
    "ActivationCache",
    "AttentionLayer",
    "GradientRun",
    "PatchingEstimate",
    "attribution_patching",
    "run_with_grads",
    "HeadEffects",
    "InspectError",
    "LogitAttribution",
    "ablate_heads",
    "activation_names",
    "attention_layers",
    "capture",
    "compose",
    "direct_logit_attribution",
    "head_ablation_effects",
    "hook_points",
    "intervene",
    "make_metric",
    "patch",
    "position_names",
    "replace_positions",
    "run_with_cache",
    "scale_positions",
]
