"""The explorer at long inputs: server and browser time per view on a GPT-2-small-shaped model.

    python benchmarks/explore_scale.py                  # sizes 64 256 512 1024, 2 threads
    python benchmarks/explore_scale.py --sizes 64 256 --threads 2 --out benchmarks/explore_scale.md

A random-weight decoder LM of GPT-2 small's shape (12 layers x 12 heads, d_model 768, d_ff 3072,
vocabulary 50,257, 1,024 positions; random weights are fine: the cost does not depend on them)
behind a byte tokenizer (one token per character). For each input length it measures

- server (``Session`` called directly): the overview of a new input (one forward pass up to the
  last attention, every head's thumbnail made on the way), one head (its module run again on the
  recorded inputs), the walkthrough (likewise), and the bytes each answer sends (JSON, and gzip
  as served);
- browser (headless Chromium via Playwright, against a live server): "Show attention" from the
  Enter key until the head view is drawn and until every view has settled, switching head until
  the new head view is drawn, and one hover (the mousemove handler, read from the array).

Targets (issue 34): "Show attention" <= 1.5 s at 512 tokens and <= 3 s at 1,024; switching head
<= 200 ms; hover <= 50 ms; bytes per head view <= 2 MB. Writes a Markdown table (``--out``).
Not a test: numbers depend on the machine (say which in the report).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")


def gpt2_small_session():
    import torch

    from attnlab.config import ModelConfig
    from attnlab.data import ByteTokenizer
    from attnlab.explore import Session
    from attnlab.models import build_model

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=50257, d_model=768, n_heads=12, n_layers=12, d_ff=3072, max_len=1024,
        activation="gelu",
    )  # fmt: skip
    return Session(build_model(cfg).eval(), ByteTokenizer(), name="GPT-2-small shape (random)")


def text_of(n: int) -> str:
    words = "the quick brown fox jumps over the lazy dog while the cat sat on the mat "
    return (words * (n // len(words) + 1))[:n]


def timed(fn, rounds: int = 3):
    times, result = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def sizes_of(result) -> tuple[int, int]:
    raw = json.dumps(result).encode()
    return len(raw), len(gzip.compress(raw, compresslevel=1))


def server_side(session, n: int, rounds: int) -> dict:
    text = text_of(n)
    row = {}

    def cold_overview():  # a new input: the forward pass, not the kept one
        session._recorded = None
        return session.overview(text)

    row["overview_s"], ov = timed(cold_overview, rounds)
    row["overview_bytes"] = sizes_of(ov)
    heads = iter(range(10_000))

    def one_head():  # a different head each time, as a user switching heads
        k = next(heads)
        return session.head(text, site="decoder", layer=k % 12, head=(k // 12) % 12)

    row["head_s"], hd = timed(one_head, rounds)
    row["head_bytes"] = sizes_of(hd)
    row["walk_s"], wk = timed(
        lambda: session.walkthrough(text, site="decoder", layer=5, head=3, compact=True), rounds
    )
    row["walk_bytes"] = sizes_of(wk)
    return row


def browser_side(url: str, n: int) -> dict:
    from playwright.sync_api import sync_playwright

    text = text_of(n)
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url + "?text=ab")
        page.wait_for_function("document.getElementById('app').dataset.busy === '0'")
        page.fill("#ax-text", text)
        shape = f"{n},{n}"
        t0 = time.perf_counter()
        page.press("#ax-text", "Enter")
        page.wait_for_function(
            f"document.querySelector('#ax-heatmap')?.dataset.shape === '{shape}'", timeout=300_000
        )
        out["show_head_s"] = time.perf_counter() - t0
        page.wait_for_function(
            "document.getElementById('app').dataset.busy === '0'", timeout=300_000
        )
        out["show_all_s"] = time.perf_counter() - t0
        switches = []
        for head in (1, 2, 3):
            t0 = time.perf_counter()
            page.select_option("#ax-head", str(head))
            page.wait_for_function(
                f"document.getElementById('ax-head-view').dataset.head === 'decoder:0:{head}'",
                timeout=300_000,
            )
            switches.append(time.perf_counter() - t0)
            page.wait_for_function(
                "document.getElementById('app').dataset.busy === '0'", timeout=300_000
            )
        out["switch_s"] = statistics.median(switches)
        out["hover_ms"] = page.evaluate(
            """(n) => {
              const m = document.querySelector('#ax-heatmap');
              const o = m.querySelector('.ax-map-overlay');
              const r = o.getBoundingClientRect();
              const times = [];
              for (let k = 0; k < 20; k++) {
                const at = m.axCellAt(n - 1 - k, Math.floor((n - 1 - k) / 2));
                const t0 = performance.now();
                const e = { clientX: r.left + at.x, clientY: r.top + at.y };
                o.dispatchEvent(new MouseEvent('mousemove', e));
                times.push(performance.now() - t0);
              }
              times.sort((a, b) => a - b);
              return times[10];
            }""",
            n,
        )
        browser.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 512, 1024])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="server rounds per view (median)")
    parser.add_argument("--no-browser", action="store_true", help="server times only")
    parser.add_argument("--out", type=Path, default=HERE / "explore_scale.md")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    session = gpt2_small_session()
    session.overview(text_of(16))  # one-time costs (allocator, thread pool) out of the table
    browser = not args.no_browser and os.path.exists(CHROMIUM)
    running = None
    if browser:
        from attnlab.explore.server import start_in_thread

        running = start_in_thread(session)
    rows = []
    try:
        for n in args.sizes:
            row = {"tokens": n, **server_side(session, n, args.rounds)}
            if running is not None:
                row.update(browser_side(running.url, n))
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if running is not None:
            running.stop()
    write_report(args, rows, os.getloadavg() if hasattr(os, "getloadavg") else None)
    return 0


def mb(pair) -> str:
    raw, zipped = pair
    return f"{raw / 1e6:.2f} ({zipped / 1e6:.2f})"


def write_report(args, rows, load) -> None:
    cpu = platform.processor() or platform.machine()
    busy = f" Load average at the end: {load[0]:.1f} (1 min)." if load else ""
    lines = [
        "# The explorer at long inputs (issue 34)",
        "",
        "Regenerate with:",
        "",
        f"    python benchmarks/explore_scale.py --sizes {' '.join(map(str, args.sizes))} "
        f"--threads {args.threads}",
        "",
        f"GPT-2-small-shaped decoder LM (12 x 12 heads, d_model 768, vocabulary 50,257, random "
        f"weights), byte tokenizer; torch {args.threads} threads on {os.cpu_count()} visible "
        f"cores ({cpu}, {platform.system()}). Server: `Session` calls, median of {args.rounds}. "
        "Browser: headless Chromium against a live server on loopback (its time includes the "
        "server's). Bytes: the JSON answer, (gzip level 1 as served)." + busy,
        "",
        "Targets: Show attention <= 1.5 s at 512 and <= 3 s at 1,024; switching head <= 200 ms;"
        " hover <= 50 ms; bytes per head view <= 2 MB.",
        "",
        "| tokens | server: overview s | head s | walkthrough s | MB overview | MB head | "
        "MB walkthrough | browser: Show attention, head drawn s | all views s | switch head s "
        "| hover ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        b = (
            [f"{r['show_head_s']:.2f}", f"{r['show_all_s']:.2f}", f"{r['switch_s']:.3f}",
             f"{r['hover_ms']:.2f}"]
            if "show_head_s" in r else ["-"] * 4
        )  # fmt: skip
        lines.append(
            f"| {r['tokens']} | {r['overview_s']:.3f} | {r['head_s']:.3f} | {r['walk_s']:.3f} | "
            f"{mb(r['overview_bytes'])} | {mb(r['head_bytes'])} | {mb(r['walk_bytes'])} | "
            + " | ".join(b)
            + " |"
        )
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    raise SystemExit(main())
