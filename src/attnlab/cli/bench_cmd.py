"""``attnlab bench``: side-by-side benchmarks (issue 6) -> table, JSON, RESULTS.md with plots.

attnlab bench --quick                                   # about a minute, table on stdout
attnlab bench --json benchmarks/results.json --report benchmarks/RESULTS.md   # full run
attnlab bench --suite lm,generate --threads 1
attnlab bench --suite recipe --text ../shared/data/tinyshakespeare.txt
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from attnlab.cli.options import positive_number
from attnlab.errors import DataError, UserError


def register(sub: argparse._SubParsersAction) -> None:
    from attnlab.bench.runner import SUITES

    p = sub.add_parser(
        "bench",
        help="benchmark attnlab against transformers / torch.nn side by side",
        description="Time attnlab against Hugging Face GPT-2, torch.nn.Transformer(Encoder) and "
        "transformers' generate in one process, interleaving contenders and reporting medians, "
        "ratios and the issue-6 targets. See "
        "https://github.com/attnlab/attnlab/blob/main/benchmarks/README.md.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a ~1-minute run: 3 rounds, 100 new tokens, attention up to N=2048, no "
        "GPT-2 eager, no memory and no profile suites",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="toy model sizes so the whole harness runs in seconds (for tests; the "
        "numbers mean nothing)",
    )
    p.add_argument(
        "--suite",
        metavar="NAME[,NAME]",
        help=f"suites to run, comma-separated, from: {', '.join(SUITES)} (default: all but recipe)",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch intra-op threads for every contender (default: all cores)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="timed rounds per contender; the median is reported (default 5, quick 3; recipe: "
        "rounds of both presets, ~105 s each on 2 cores)",
    )
    p.add_argument("--json", metavar="FILE", help="write the full results as JSON to FILE")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="write a Markdown report (e.g. RESULTS.md) with PNG plots next to it",
    )
    p.add_argument(
        "--notes",
        metavar="FILE",
        help="a Markdown file included verbatim as the report's Analysis section",
    )
    p.add_argument(
        "--text",
        metavar="FILE",
        help="training text for --suite recipe and quality (e.g. tinyshakespeare.txt)",
    )
    p.add_argument(
        "--max-attention-len",
        type=int,
        metavar="N",
        help="longest sequence of the attention suite (default 16384, quick 2048)",
    )
    p.add_argument(
        "--memory-cap-gib",
        type=positive_number,
        metavar="GIB",
        help="skip explicit-attention lengths predicted to need more (default 8)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="lm and generate suites: also time attnlab under torch.compile (the training "
        "step; the decode step) and report its compile time; decode suite: every attnlab mode "
        "compiled; optim suite: the model of the two full-step contenders compiled",
    )
    p.add_argument(
        "--kv-cache",
        choices=("bf16", "none"),
        help="decode and quality suites: also measure int8/int4 weights with a KV cache of this "
        "dtype (default: bf16; none: only the compute-dtype cache)",
    )
    p.add_argument(
        "--from-json",
        metavar="FILE",
        help="measure nothing: re-render the table and --report from a result saved by --json "
        "(e.g. after editing --notes)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)


def _writable(path: str, flag: str, ours: Callable[[Path], bool], what: str) -> Path:
    """``path`` as a file this run may write: a new file, or one an earlier run wrote (``ours``);
    a file of the user's is never replaced."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{flag} {path!r} is a directory; give a file name, e.g. {path}/out")
    if out.exists() and not ours(out):
        raise UserError(
            f"{flag} {path!r} already exists and is not {what}; attnlab bench replaces only its "
            "own files, so choose another path or move that file away"
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create the folder of {flag} {path!r}: {err.strerror}") from None
    if not os.access(out.parent, os.W_OK):
        raise UserError(
            f"cannot write {flag} {path!r}: its folder is not writable; choose another location"
        )
    return out


def _bench_json(path: Path) -> bool:
    """Whether ``path`` holds a result written by ``--json`` (of any schema version)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and "schema_version" in data and "suites" in data


def _bench_report(path: Path) -> bool:
    """Whether ``path`` holds a report written by ``--report`` (it starts with REPORT_TITLE)."""
    from attnlab.bench.report import REPORT_TITLE

    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().rstrip("\n") == REPORT_TITLE
    except (OSError, UnicodeDecodeError):
        return False


def command_line(args: argparse.Namespace) -> str:
    """The canonical ``attnlab bench ...`` command that reproduces ``args``."""
    parts = ["attnlab", "bench"]
    for flag in ("quick", "tiny", "compile"):
        if getattr(args, flag):
            parts.append(f"--{flag}")
    for flag in (
        "suite",
        "threads",
        "rounds",
        "max_attention_len",
        "memory_cap_gib",
        "text",
        "kv_cache",
        "json",
        "report",
        "notes",
    ):
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    return shlex.join(parts)


def build_settings(args: argparse.Namespace):
    from attnlab.bench.runner import BenchSettings

    overrides = {
        "threads": args.threads,
        "rounds": args.rounds,
        "text": args.text,
        "memory_cap_gib": args.memory_cap_gib,
        "compile": args.compile or None,
    }
    if args.kv_cache is not None:
        overrides["kv_cache"] = () if args.kv_cache == "none" else (args.kv_cache,)
    if args.suite is not None:
        overrides["suites"] = tuple(s.strip() for s in args.suite.split(",") if s.strip())
    settings = BenchSettings.for_mode(quick=args.quick, tiny=args.tiny, **overrides)
    if args.max_attention_len is not None:
        if args.max_attention_len < 2:
            raise ValueError(f"--max-attention-len must be >= 2, got {args.max_attention_len}")
        lengths = tuple(n for n in settings.attention_lengths if n <= args.max_attention_len)
        settings = settings.__class__(
            **{**settings.to_dict(), "attention_lengths": lengths or (args.max_attention_len,)}
        )
    return settings


def read_result(path: str) -> dict:
    """A result written by ``--json`` (to re-render tables and the report without measuring)."""
    from attnlab.bench.runner import SCHEMA_VERSION

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(
            f"--from-json {path!r} does not exist; give a file written by --json"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read --from-json {path!r} as JSON: {err}") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        found = data.get("schema_version") if isinstance(data, dict) else None
        raise DataError(
            f"--from-json {path!r} is not an attnlab bench result with schema_version "
            f"{SCHEMA_VERSION} (found {found!r}); write one with attnlab bench --json FILE"
        )
    return data


def check_flag_use(args: argparse.Namespace, settings) -> None:
    """Flags that would be silently ignored are errors that say which suite or flag uses them."""
    unused = [
        (
            args.text is not None and not {"recipe", "quality"} & set(settings.suites),
            "--text",
            "--suite recipe or quality",
        ),
        (
            args.compile and not {"lm", "generate", "decode", "optim"} & set(settings.suites),
            "--compile",
            "--suite lm, generate, decode or optim",
        ),
        (
            args.kv_cache is not None and not {"decode", "quality"} & set(settings.suites),
            "--kv-cache",
            "--suite decode or quality",
        ),
        (args.notes is not None and args.report is None, "--notes", "--report FILE"),
        (
            args.max_attention_len is not None and "attention" not in settings.suites,
            "--max-attention-len",
            "--suite attention",
        ),
    ]
    if args.from_json is not None:
        measuring = [
            "quick",
            "tiny",
            "suite",
            "threads",
            "rounds",
            "text",
            "compile",
            "max_attention_len",
            "memory_cap_gib",
            "kv_cache",
        ]
        given = [
            f"--{m.replace('_', '-')}" for m in measuring if getattr(args, m) not in (None, False)
        ]
        if given:
            raise UserError(
                f"--from-json re-renders a saved result and measures nothing, so "
                f"{', '.join(given)} would be ignored; drop them or drop --from-json"
            )
    for bad, flag, needs in unused:
        if bad:
            raise UserError(f"{flag} has no effect here: it is used only with {needs}; add that")


def run(args: argparse.Namespace) -> int:
    from attnlab.bench.plots import make_plots
    from attnlab.bench.report import format_text, write_markdown
    from attnlab.bench.runner import run_bench, to_json

    settings = build_settings(args)
    check_flag_use(args, settings)
    if args.text is not None and not Path(args.text).is_file():
        raise DataError(
            f"--text {args.text!r} is not a file; give a plain-text corpus, e.g. "
            "../shared/data/tinyshakespeare.txt"
        )
    notes = None
    if args.notes is not None:
        try:
            notes = Path(args.notes).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise DataError(f"cannot read --notes {args.notes!r}: {err}") from None
    json_path = report_path = None
    if args.json:
        json_path = _writable(args.json, "--json", _bench_json, "an attnlab bench result")
    if args.report:
        report_path = _writable(args.report, "--report", _bench_report, "an attnlab bench report")

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.from_json is not None:
        result = read_result(args.from_json)
    else:
        result = run_bench(
            settings, command=command_line(args), progress=None if args.quiet else progress
        )
    print(format_text(result), end="")
    if json_path is not None:
        json_path.write_text(to_json(result))
    if report_path is not None:
        plots = make_plots(result, report_path.parent)
        write_markdown(result, report_path, plots, notes)
    return 0
