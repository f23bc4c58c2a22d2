"""attnlab's benchmark suites (``attnlab bench``): attnlab against what users would otherwise pick.

    from attnlab.bench import BenchSettings, run_bench, format_text, to_json
    result = run_bench(BenchSettings.for_mode(quick=True))
    print(format_text(result))

Modules: ``harness`` (interleaved timing, medians, ratios, targets), ``memory`` (peak RSS per
case in a child process), ``machine``, one module per suite (``matmul_peak``, ``lm_train``,
``seq2seq_train``, ``generation``, ``attention_cost``, ``training_memory``, ``profile``,
``recipe``), and the outputs (``tables``, ``report``, ``plots``). See benchmarks/README.md.
"""

from attnlab.bench.harness import Timing, interleave, ratio, setup_torch, target_entry
from attnlab.bench.report import format_text, write_markdown
from attnlab.bench.runner import SUITES, BenchSettings, run_bench, to_json

__all__ = [
    "SUITES",
    "BenchSettings",
    "Timing",
    "format_text",
    "interleave",
    "ratio",
    "run_bench",
    "setup_torch",
    "target_entry",
    "to_json",
    "write_markdown",
]
