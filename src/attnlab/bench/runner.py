"""Run benchmark suites and collect one JSON-ready result dict.

Suites (one module each): ``matmul``, ``lm``, ``seq2seq``, ``generate``, ``decode`` and
``quality`` (reduced-precision weights), ``attention``, ``memory``, ``profile``, ``inspect``,
``modern`` (GQA/MQA, real-model shapes), ``optim`` (Muon vs AdamW steps), ``recipe`` (only when
asked for: it trains two models).
Each module exposes ``run(settings, ctx) -> dict`` with a ``status`` of
"ok", "not_available" (with ``reason``: a piece of attnlab it needs has not landed, or an optional
library is missing) or "error" (with ``error``). A suite failing never stops the others.

Each suite of a full run starts in a fresh child process (``fresh_process_per_suite``): its
contenders share that process and are timed in interleaved rounds, and no suite inherits the heap,
thread pools or compiled caches an earlier suite left behind (which once made ``nn.Transformer``
faster inside the full run than alone). The parent only collects the children's results; quick and
tiny runs keep every suite in the calling process.

Modes: the default is the full run of issue 6; ``quick`` shortens it to about a minute (fewer
rounds, lengths, tokens; every reduction is recorded in ``settings``); ``tiny`` swaps in toy sizes
so the whole harness runs in seconds (tests; its numbers mean nothing).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from attnlab.bench.harness import setup_torch
from attnlab.bench.machine import machine_info
from attnlab.errors import ConfigValueError, UserError, blamed_fields
from attnlab.runtime import load_average

SUITES = (
    "matmul",
    "lm",
    "seq2seq",
    "generate",
    "decode",
    "quality",
    "attention",
    "memory",
    "profile",
    "inspect",
    "modern",
    "optim",
    "recipe",
)
DEFAULT_SUITES = tuple(s for s in SUITES if s != "recipe")
QUICK_SUITES = ("matmul", "lm", "seq2seq", "generate", "attention")
_MODULES = {
    "matmul": "matmul_peak",
    "lm": "lm_train",
    "seq2seq": "seq2seq_train",
    "generate": "generation",
    "decode": "decode",
    "quality": "quality",
    "attention": "attention_cost",
    "memory": "training_memory",
    "profile": "profile",
    "inspect": "inspect_cost",
    "recipe": "recipe",
    "optim": "optim_step",  # Muon vs AdamW training steps, on CUDA when there is one
    "modern": "modern",  # GQA/MQA at decode time; GPT-2- and Llama-shaped models vs transformers
}
SCHEMA_VERSION = 1
GIB = 1024**3


@dataclass(frozen=True)
class BenchSettings:
    """What to run and how hard. Build with :meth:`for_mode`; every field lands in the JSON."""

    suites: tuple[str, ...] = DEFAULT_SUITES
    quick: bool = False
    tiny: bool = False
    threads: int | None = None  # None = every available core
    rounds: int = 5  # timed rounds per contender (median reported)
    warmup: int = 1  # untimed calls per contender before round 0
    min_round_s: float = 1.0  # calibrate repeats so a round lasts at least this long
    hf_eager: bool = True  # also time GPT-2 with attn_implementation="eager"
    compile: bool = False  # lm, generate: also time attnlab under torch.compile (minutes)
    new_tokens: int = 500  # generate: new tokens per call
    contexts: tuple[int, ...] = (64, 512)  # generate: prompt lengths
    attention_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)
    memory_cap_gib: float = 8.0  # skip explicit-attention lengths predicted to need more
    fresh_process_per_case: bool = True  # memory: a new child per case (else one per suite)
    fresh_process_per_suite: bool = True  # every suite in its own child process (else in-process)
    text: str | None = None  # recipe, quality: the training text
    kv_cache: tuple[str, ...] = ("bf16",)  # decode, quality: extra KV cache dtypes measured
    recipe_presets: tuple[str, str] = ("baseline-char", "fast-char")

    def __post_init__(self) -> None:
        unknown = [s for s in self.suites if s not in SUITES]
        if unknown or not self.suites:
            raise ConfigValueError(
                f"unknown benchmark suite(s) {unknown or '(none given)'}; choose from "
                f"{', '.join(SUITES)} (e.g. suites=('lm', 'generate'))",
                fields=("suites",),
            )
        if self.threads is not None and self.threads < 1:
            raise ConfigValueError(f"threads must be >= 1, got {self.threads}", fields=("threads",))
        if self.rounds < 1:
            raise ConfigValueError(f"rounds must be >= 1, got {self.rounds}", fields=("rounds",))
        if self.memory_cap_gib <= 0:
            raise ConfigValueError(
                f"memory_cap_gib must be > 0, got {self.memory_cap_gib}",
                fields=("memory_cap_gib",),
            )
        bad = [c for c in self.kv_cache if c != "bf16"]
        if bad:
            raise ConfigValueError(
                f"kv_cache={bad}: the decode and quality suites add rows for a bf16 "
                "KV cache (the fp32 rows are always there); give bf16 or none",
                fields=("kv_cache",),
            )
        if "recipe" in self.suites and not self.text:
            raise ConfigValueError(
                "the recipe suite trains on a text file: give it as text (e.g. "
                "text='../shared/data/tinyshakespeare.txt')",
                fields=("text",),
            )

    @classmethod
    def for_mode(cls, *, quick: bool = False, tiny: bool = False, **overrides: Any):
        """Full (default), quick (~1 minute) or tiny (seconds, tests) settings, then overrides."""
        base: dict[str, Any] = {}
        if quick or tiny:
            base.update(
                suites=QUICK_SUITES,
                rounds=3,
                min_round_s=0.25,
                hf_eager=False,
                new_tokens=100,
                attention_lengths=(256, 512, 1024, 2048),
                fresh_process_per_case=False,
                fresh_process_per_suite=False,
            )
        if tiny:
            base.update(
                rounds=2,
                min_round_s=0.0,
                new_tokens=8,
                contexts=(8, 16),
                attention_lengths=(32, 64, 128),
            )
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(quick=quick, tiny=tiny, **base)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchSettings:
        """Inverse of :meth:`to_dict` after a JSON round trip (lists back to tuples)."""
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**fields)


@dataclass
class Context:
    """What suites share: settings, the progress callback, and results so far (matmul peak)."""

    settings: BenchSettings
    progress: Callable[[str], None] | None = None
    suites: dict[str, Any] = field(default_factory=dict)

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)

    def matmul_peak_gflops(self) -> float:
        """The run's fp32 matmul peak, measured now if the matmul suite has not run yet."""
        if "matmul" not in self.suites:
            self.suites["matmul"] = _run_suite("matmul", self)
        return self.suites["matmul"].get("peak_gflops", math.nan)


def run_bench(
    settings: BenchSettings,
    *,
    command: str = "",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the selected suites; return the JSON-ready result (see benchmarks/README.md)."""
    threads = setup_torch(settings.threads)
    ctx = Context(settings, progress)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mode": "tiny" if settings.tiny else "quick" if settings.quick else "full",
        "machine": machine_info(threads),
        "settings": settings.to_dict(),
    }
    ordered = [s for s in SUITES if s in settings.suites]
    for name in ordered:
        if name in ctx.suites:
            continue
        if settings.fresh_process_per_suite:
            ctx.suites.update(_run_suite_in_child(name, ctx))
        else:
            ctx.suites[name] = _run_suite(name, ctx)
    result["suites"] = {name: ctx.suites[name] for name in SUITES if name in ctx.suites}
    result["targets"] = [t for s in result["suites"].values() for t in s.get("targets", [])]
    result["machine"]["load_average_end"] = load_average()
    result["wall_seconds"] = time.perf_counter() - started
    return result


def to_json(result: dict[str, Any]) -> str:
    """Strict JSON text (NaN and infinities become null, tuples lists)."""
    return json.dumps(_clean(result), indent=1, allow_nan=False) + "\n"


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _run_suite(name: str, ctx: Context) -> dict[str, Any]:
    ctx.say(f"[{name}]")
    t0 = time.perf_counter()
    module = importlib.import_module(f"attnlab.bench.{_MODULES[name]}")
    try:
        out = module.run(ctx.settings, ctx)
    except ImportError as err:
        out = {"status": "not_available", "reason": f"{type(err).__name__}: {err}"}
    except UserError:
        raise  # the user's input is wrong (e.g. --text missing): stop and say so
    except Exception as err:  # one broken suite must not lose the others' numbers
        out = {
            "status": "error",
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc(limit=-6),
        }
    if out.get("status") != "ok":
        ctx.say(f"  {name}: {out['status']}: {out.get('reason') or out.get('error')}")
    out["suite_seconds"] = time.perf_counter() - t0
    return out


_RESULT_MARK = "attnlab-bench-suite-result "
# not ``-m attnlab.bench.runner``: the package imports this module, which would then load twice
_CHILD_CODE = "from attnlab.bench.runner import _child_main; raise SystemExit(_child_main())"


def _run_suite_in_child(name: str, ctx: Context) -> dict[str, dict[str, Any]]:
    """Run suite ``name`` in a fresh Python process; return every suite result it produced.

    The child gets the settings, the results so far (so it reuses the run's matmul peak) and
    prints progress on the shared stderr; it returns ``name``'s result and any suite it ran on
    the way (the matmul peak, when the parent had not measured it yet).
    """
    request = {
        "suite": name,
        "settings": ctx.settings.to_dict(),
        "done": ctx.suites,
        "progress": ctx.progress is not None,
    }
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD_CODE],
        input=json.dumps(request),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_MARK):
            reply = json.loads(line[len(_RESULT_MARK) :])
            if "user_error" in reply:
                raise UserError(reply["user_error"], fields=reply.get("fields", ()))
            return reply["suites"]
    failed = {
        "status": "error",
        "error": f"the {name} suite's child process died (exit code {proc.returncode}) "
        "before reporting; its stderr is above",
    }
    ctx.say(f"  {name}: {failed['error']}")
    return {name: failed}


def _child_main() -> int:
    """Child entry point: read one request (JSON) on stdin, print the result line on stdout."""
    request = json.loads(sys.stdin.read())
    settings = BenchSettings.from_dict(request["settings"])
    setup_torch(settings.threads)

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    ctx = Context(settings, progress if request["progress"] else None)
    ctx.suites.update(request["done"])
    before = set(ctx.suites)
    name = request["suite"]
    try:
        ctx.suites[name] = _run_suite(name, ctx)
    except UserError as err:
        reply = {"user_error": str(err), "fields": list(blamed_fields(err))}
        print(_RESULT_MARK + json.dumps(reply), flush=True)
        return 0
    new = {k: v for k, v in ctx.suites.items() if k not in before}
    print(_RESULT_MARK + json.dumps({"suites": new}), flush=True)
    return 0
