"""Interoperability: Hugging Face models (GPT-2, Llama/Mistral/Qwen2/Qwen3, Gemma 1, 2 and 3, BERT)
in and out, and plain safetensors export. Importing the package registers every family's table
(``family.REGISTRY``), so an export error can name the family that would hold a setting."""

from attnlab.interop import bert, gemma, llama  # noqa: F401  (registers their families)
from attnlab.interop.export import FORMATS, export_as
from attnlab.interop.gpt2 import (
    check_gpt2_compatible,
    gpt2_config_to_model_config,
    load_gpt2_state_dict,
    model_config_to_gpt2_config,
    to_gpt2_state_dict,
)
from attnlab.interop.gpt2_files import from_pretrained_dir, from_transformers, save_gpt2_dir
from attnlab.interop.loading import load_checkpoint
from attnlab.interop.safetensors_io import (
    load_safetensors,
    read_safetensors_config,
    read_safetensors_labels,
    read_safetensors_tokenizer,
    save_safetensors,
)

__all__ = [
    "FORMATS",
    "check_gpt2_compatible",
    "export_as",
    "from_pretrained_dir",
    "from_transformers",
    "gpt2_config_to_model_config",
    "load_checkpoint",
    "load_gpt2_state_dict",
    "load_safetensors",
    "model_config_to_gpt2_config",
    "read_safetensors_config",
    "read_safetensors_labels",
    "read_safetensors_tokenizer",
    "save_gpt2_dir",
    "save_safetensors",
    "to_gpt2_state_dict",
]
