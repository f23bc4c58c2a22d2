"""One switch per fast path of the engine, all on. ``benchmarks/fast_ab.py`` turns them off one at
a time to measure what each path gives on a real workload (benchmarks/ANALYSIS.md)."""

PATHS = {"packing": True, "replay": True, "one_query": True}
