"""Peak memory on CPU: the process's resident-set high-water mark, reset per case, in a child.

``tracemalloc`` does not see PyTorch's allocations and ``torch.cuda`` counters do not exist on
CPU, so we read what the operating system charges the process: Linux's VmHWM (peak resident set
size, /proc/self/status). Writing "5" to /proc/self/clear_refs resets VmHWM to the current RSS,
which gives a per-case peak without a new process. One measurement is

    build inputs/model  ->  ``warmup`` untimed steps  ->  gc + malloc_trim  ->  RSS_ready
    ->  reset VmHWM  ->  one step  ->  peak = VmHWM

and reports ``step_extra_bytes = peak - RSS_ready`` (activations, gradients, temporaries: the
memory a step needs on top of what already lives) and ``peak_bytes = peak - RSS_start`` where
RSS_start is taken after imports, before building anything (parameters + optimizer state + the
step: the training footprint). The warm-up step keeps one-off costs (library code paged in,
optimizer state creation) out of ``step_extra_bytes``.

Honesty conditions, enforced by running the cases in a **child process** started with
``MALLOC_MMAP_THRESHOLD_=65536``: glibc then serves every block >= 64 KiB with mmap and returns
it on free, so freed tensors leave the resident set and VmHWM tracks live memory (the default
dynamic threshold can keep freed blocks resident and hide a peak behind a previous one). The
timing process keeps the default allocator so the setting cannot slow the timed contenders.

Before a case's RSS_start the child runs it once (at n <= 256 when the case has a length ``n``)
so library imports and code pages are not charged to the case.

Cases are dicts naming a bench module that exposes ``memory_case(spec) -> step`` (a zero-argument
callable doing one step; it is called once to build, see :func:`measure_case`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

# Bench modules a memory case may name (the child imports nothing else on a spec's say-so).
CASE_MODULES = ("attention_cost", "lm_train")
METHOD = "linux VmHWM reset per case (clear_refs=5), child process, MALLOC_MMAP_THRESHOLD_=65536"


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            text = fh.read()
    except OSError:
        return None
    found = re.search(rf"^{field_name}:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def rss_bytes() -> int | None:
    """Current resident set size of this process."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def hwm_bytes() -> int | None:
    """Resident set high-water mark since start or the last :func:`reset_hwm`."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def _trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure_case(make_step: Callable[[], Callable[[], Any]], warmup: int = 1) -> dict[str, Any]:
    """Peak memory of one step built by ``make_step`` (see the module docstring for the fields)."""
    _trim()
    start = rss_bytes()
    step = make_step()
    for _ in range(max(1, warmup)):
        step()
    _trim()
    ready = rss_bytes()
    if start is None or ready is None or not reset_hwm():
        return {"status": "not_available", "reason": "needs Linux /proc/self/clear_refs"}
    step()
    peak = hwm_bytes()
    del step
    if peak is None:  # /proc/self/status readable a moment ago: only if it vanished mid-case
        return {"status": "not_available", "reason": "needs Linux /proc/self/status"}
    return {
        "status": "ok",
        "rss_start_bytes": start,
        "rss_ready_bytes": ready,
        "hwm_bytes": peak,
        "peak_bytes": peak - start,
        "step_extra_bytes": peak - ready,
    }


def run_cases(cases: list[dict[str, Any]], *, timeout_s: float = 1800.0) -> list[dict[str, Any]]:
    """Measure ``cases`` in ONE fresh child process (sequentially, VmHWM reset per case).

    Returns one result dict per case (``status`` "ok", "not_available" or "error" with
    ``reason``). Call once per case for one fresh process per case.
    """
    if not cases:
        return []
    for case in cases:
        if case.get("module") not in CASE_MODULES:
            raise ValueError(f"memory case module must be one of {CASE_MODULES}, got {case!r}")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "attnlab.bench.memory"]
    try:
        proc = subprocess.run(
            cmd,
            input=json.dumps(cases),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [_failed(f"memory child timed out after {timeout_s:.0f} s")] * len(cases)
    results = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            results.append(json.loads(line))
    if len(results) < len(cases):  # the child died (e.g. killed by the OOM killer) mid-way
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        results += [_failed(f"memory child failed: {tail[0]}")] * (len(cases) - len(results))
    return results


def _failed(reason: str) -> dict[str, Any]:
    return {"status": "error", "reason": reason}


def _child_main() -> int:
    """Child entry point: read a JSON list of cases on stdin, print one JSON result per line."""
    import torch  # in the child alone: the parent measures without torch loaded

    cases = json.loads(sys.stdin.read())
    primed: set[str] = set()
    for case in cases:
        torch.set_num_threads(int(case.get("threads", 1)))
        torch.set_flush_denormal(True)
        try:
            module = importlib.import_module(f"attnlab.bench.{case['module']}")
            key = json.dumps({k: v for k, v in case.items() if k != "n"}, sort_keys=True)
            if key not in primed:  # import and page in the code before RSS_start
                prime = dict(case, n=min(int(case["n"]), 256)) if "n" in case else case
                module.memory_case(prime)()
                primed.add(key)
            result = measure_case(functools.partial(module.memory_case, case))
        except Exception as err:  # reported per case; the parent shows it in the table
            result = _failed(f"{type(err).__name__}: {err}")
        result["method"] = METHOD
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main())
