"""What the decoder-only Hugging Face families (GPT-2, Llama-like, Gemma) share beyond their
:class:`~attnlab.interop.family.Family` tables: writing config.json with the token ids, and
copying a ``...ForCausalLM`` state dict into a :class:`DecoderLM` and back.

A :class:`CausalLM` names, as data, the families that share one file layout (Llama, Qwen2 and
Qwen3 do; so do Gemma 2 and 3), the embedding tensor a tied output head equals, and the
family's config reader. The output head is ``lm_head.weight`` in every one of them:

    logits = LN_f(x_N) W_head,   W_head = E (tied) or lm_head.weight (untied)

A tied file may store the head (it must then equal the embedding) or leave it out; export always
writes it, as the same tensor as the embedding (as ``transformers`` does).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.interop.family import Family, closest_family
from attnlab.interop.weights_map import export_mapped, load_mapped, model_to_load, tied_head
from attnlab.models.lm import DecoderLM

HEAD = "lm_head.weight"


class CausalLM(NamedTuple):
    """Decoder-only families that share one file layout, and how their files are read."""

    families: tuple[Family, ...]  # the first names them in errors before one is chosen
    embedding: str  # the token embedding E that a tied head equals: "model.embed_tokens.weight"
    convert: Callable[[Any], ModelConfig]  # a transformers config / config.json dict -> ours
    loader: str  # the public loader's name, for its errors: "load_gpt2_state_dict"
    ignored: re.Pattern | None = None  # buffers that files store beside the weights

    def family(self, cfg: ModelConfig) -> Family:
        """The family whose round trip keeps ``cfg`` (ConfigError naming what it cannot hold)."""
        return closest_family(cfg, self.families)

    def config_json(self, cfg: ModelConfig, ids: Mapping[str, int | None]) -> dict[str, Any]:
        """The config.json dict of ``cfg`` with the tokenizer's special ``ids`` (``bos_id``,
        ``eos_id``, ``pad_id``: each may be None or absent); ConfigError, before anything is
        written, when no family holds ``cfg``."""
        out = self.family(cfg).write(cfg)
        out.update(bos_token_id=ids.get("bos_id"), eos_token_id=ids.get("eos_id"))
        if ids.get("pad_id") is not None:
            out["pad_token_id"] = ids["pad_id"]
        return out

    def load(
        self, model: DecoderLM | None, state_dict: Mapping[str, Tensor], config: Any = None
    ) -> DecoderLM:
        """Copy a Hugging Face state dict into ``model``, or into a new DecoderLM built from
        ``config`` (an attnlab ModelConfig, a transformers config, or config.json's dict). Every
        tensor is shape-checked; missing and unexpected keys are errors. Eval mode."""
        model = model_to_load(
            model,
            config,
            loader=self.loader,
            convert=self.convert,
            check=self.family,
            build=DecoderLM,
            family=self.families[0].name,
            cls=DecoderLM,
        )
        family = self.family(model.cfg)
        tensors = dict(state_dict)
        tied_head(tensors, HEAD, self.embedding, model.cfg.tie_embeddings, family.name)
        table = family.table(model.cfg)
        return load_mapped(model, tensors, table, family.name, ignored=self.ignored)

    def export(self, model: nn.Module) -> dict[str, Tensor]:
        """The Hugging Face state dict of ``model`` (fresh tensors; with tied embeddings the head
        is the same tensor as the embedding)."""
        if not isinstance(model, DecoderLM):
            name = self.families[0].name
            raise TypeError(f"only a DecoderLM exports to {name}, got {type(model).__name__}")
        family = self.family(model.cfg)
        out = export_mapped(model, family.table(model.cfg), family.name)
        if model.cfg.tie_embeddings:
            out[HEAD] = out[self.embedding]
        return out
