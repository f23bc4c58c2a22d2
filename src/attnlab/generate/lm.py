"""Generation from a language model: w_t ~ p(w_t | w_{<t}) one token at a time (000, 003).

``generate(model, prompts, config, tokenizer=...)`` accepts a string, a list of ids, a (B, T)
tensor, or a list of strings/id lists, and returns one output per prompt. The recipe:

  1. encode, replace an empty prompt by [BOS], crop a prompt longer than the context window to its
     end (with a warning), left-pad the batch (positions from the padding mask; ``prompts.py``);
  2. prefill every prompt in one call into a preallocated KV cache (``model.new_cache``);
  3. one token per row per step: greedy / sampling (``loop.py``) or beam search (``beam.py``);
  4. stop on a stop token, a stop string, or after ``max_new_tokens``; slide the window when the
     context fills up (``steppers.py``).

A batch of prompts gives the same tokens as each prompt alone (greedy; sampling draws from one
generator for the whole batch, so seeded samples depend on the batch). Shapes: B prompts, P
longest prompt, V vocabulary.
"""

from __future__ import annotations

from typing import Any

from attnlab.generate.config import (
    GenerationConfig,
    GenerationResult,
    as_config,
    check_special_ids,
    special_ids,
)
from attnlab.generate.loop import Prepared
from attnlab.generate.prompts import as_id_lists, left_pad, prepare_lm_prompts
from attnlab.generate.steppers import LMStepper, check_model, eval_mode
from attnlab.models.base import LanguageModel

PromptInput = Any  # str | list[int] | Tensor | list[str | list[int]]


def generate(
    model: LanguageModel,
    prompts: PromptInput,
    config: GenerationConfig | None = None,
    *,
    tokenizer: Any | None = None,
    return_logits: bool = False,
) -> GenerationResult:
    """Continue each prompt; see the module docstring. ``return_logits`` keeps the raw model
    logits of every step (R, V) in ``result.logits`` (greedy/sampling only)."""
    config = as_config(config)
    check_model(model, LanguageModel, "generate")
    with eval_mode(model):
        return prepare_lm(model, prompts, config, tokenizer).decode(
            tokenizer, keep_logits=return_logits
        )


def prepare_lm(
    model: LanguageModel, prompts: PromptInput, config: GenerationConfig, tokenizer: Any | None
) -> Prepared:
    """Checked, left-padded prompts and an :class:`LMStepper` over them, ready to decode."""
    specials = special_ids(config, tokenizer)
    check_special_ids(specials, model.vocab_size)
    ids = as_id_lists(prompts, tokenizer, "prompt")
    ids = prepare_lm_prompts(
        ids,
        bos_id=specials.bos,
        vocab_size=model.vocab_size,
        window=getattr(model, "max_len", None),
    )
    batch = left_pad(ids, specials.pad)
    stepper = LMStepper(model, batch.ids, batch.mask, config, pad_id=specials.pad)
    return Prepared(stepper, batch, specials, config, model.vocab_size)
