"""Training: the loop, optimisers and schedule, evaluation, checkpoints, resume, multi-process.

Plain functions first; ``attnlab train`` / ``attnlab evaluate`` only parse flags and call them::

    from attnlab.train import RunConfig, TrainConfig, train
    from attnlab.config import ModelConfig
    result = train(RunConfig(ModelConfig(kind="encoder_decoder", d_model=64),
                             TrainConfig(task="seq2seq", data="dates", steps=600)),
                   run_dir="runs/dates")
    print(result.metrics["val_exact_match"])
"""

from attnlab.train.evaluate import EvalResult, Prediction, evaluate, greedy_decode
from attnlab.train.loop import TrainingDiverged, TrainResult, train
from attnlab.train.optim import build_optimizers, lr_at, parameter_groups, split_parameters
from attnlab.train.run_config import RunConfig, TrainConfig, dump_toml, load_toml, merge_overrides

__all__ = [
    "EvalResult",
    "Prediction",
    "RunConfig",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "build_optimizers",
    "dump_toml",
    "evaluate",
    "greedy_decode",
    "load_toml",
    "lr_at",
    "merge_overrides",
    "parameter_groups",
    "split_parameters",
    "train",
]
