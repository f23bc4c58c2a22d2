"""Floor 3 of the house (docs: ARCHITECTURE.md): files that must survive a crash.

* :mod:`~attnlab.checkpoint.atomic`: the one atomic writer every layer above uses (training
  checkpoints, reports, figures, and the Hugging Face and safetensors exports of ``interop``);
* :mod:`~attnlab.checkpoint.save`: a checkpoint directory written (layout and crash safety there);
* :mod:`~attnlab.checkpoint.load`: read back, every file verified, with the fallback to an older
  checkpoint of the run; other formats load one floor up (:func:`attnlab.interop.load_checkpoint`);
* :mod:`~attnlab.checkpoint.rundir`: the run directory (pointers, listing, retention, cleanup);
* :mod:`~attnlab.checkpoint.state`: optimizer, scheduler and random-number states as files.
"""

from attnlab.checkpoint.load import (
    Checkpoint,
    check_same_model,
    load_checkpoint,
    read_config,
    restore_training,
)
from attnlab.checkpoint.rundir import best_checkpoint, latest_checkpoint, list_checkpoints
from attnlab.checkpoint.save import (
    model_tensors,
    save_checkpoint,
    save_inference_checkpoint,
    unwrap_model,
)

__all__ = [
    "Checkpoint",
    "best_checkpoint",
    "check_same_model",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "model_tensors",
    "read_config",
    "restore_training",
    "save_checkpoint",
    "save_inference_checkpoint",
    "unwrap_model",
]
