"""Load test of the attention explorer: N concurrent clients on loopback against one server.

    python benchmarks/explore_load.py                       # 20 clients, 30 s, the default model
    python benchmarks/explore_load.py --path runs/dates --clients 20 --seconds 30

Starts ``attnlab explore`` in its own process (as a user would), then runs ``--clients`` clients
for ``--seconds``; each client repeats the page's requests in turn: info, tokens, attention (with
a random head switched off half of the time), walkthrough, positions, next token, and a streamed
continuation of 8 tokens (timed to its last event). Prints p50/p95 latency per endpoint and the
error count, and writes them to benchmarks/explore_load.json and explore_load.md.

The default model is a random-weight decoder LM the size of the ``char-lm`` preset's width
(d_model 128, 4 layers, 4 heads, character vocabulary), saved to a temporary run directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
TEXT = "the quick brown fox jumps over the lazy dog and the cat sat on the mat"


def default_run(root: Path) -> Path:
    import torch

    from attnlab import ModelConfig, build_model
    from attnlab.checkpoint import save_checkpoint
    from attnlab.data import CharTokenizer

    torch.manual_seed(0)
    tok = CharTokenizer.train([TEXT + "abcdefghijklmnopqrstuvwxyz .,"])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=128, n_heads=4, n_layers=4, max_len=256)
    save_checkpoint(root, model=build_model(cfg), config=cfg, tokenizer=tok, step=0)
    return root


def start_server(path: Path) -> tuple[subprocess.Popen, str]:
    src = str(HERE.parent / "src")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    }
    cmd = [sys.executable, "-m", "attnlab", "explore", str(path), "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if " at " not in line:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc, line.split(" at ")[1].split()[0]


async def client(url: str, info: dict, deadline: float, seed: int, times: dict, errors: list):
    rng = random.Random(seed)
    site = info["sites"][0]
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def timed(name, send, *args):
            start = time.perf_counter()
            try:
                ok = await send(*args)
            except httpx.HTTPError as err:
                ok = False
                errors.append(f"{name}: {type(err).__name__} {err}")
            if ok:
                times.setdefault(name, []).append(time.perf_counter() - start)

        async def post(name, payload):
            r = await http.post(f"api/{name}", json=payload)
            if r.status_code != 200:
                errors.append(f"{name}: HTTP {r.status_code} {r.text[:200]}")
            return r.status_code == 200

        async def stream(text):
            params = {"text": text, "strategy": "sample", "max_new_tokens": "8", "seed": "1"}
            async with http.stream("GET", "api/stream", params=params) as r:
                kinds = [ln[7:] async for ln in r.aiter_lines() if ln.startswith("event: ")]
            if kinds[-1:] != ["done"]:
                errors.append(f"stream: ended with {kinds[-1:]}")
            return kinds[-1:] == ["done"]

        while time.perf_counter() < deadline:
            text = TEXT[: rng.randint(8, len(TEXT))]
            head = {
                "site": site["name"],
                "layer": rng.randrange(site["layers"]),
                "head": rng.randrange(site["heads"]),
            }
            ablate = [head] if rng.random() < 0.5 else []
            await timed("info", _get_ok, http, "api/info", errors)
            await timed("tokens", post, "tokens", {"text": text})
            await timed("attention", post, "attention", {"text": text, "ablate": ablate})
            await timed("walkthrough", post, "walkthrough", {"text": text, **head})
            await timed("positions", post, "positions", {"text": text})
            await timed("next", post, "next", {"text": text, "top_k": 10, "ablate": ablate})
            await timed("stream", stream, text)


async def _get_ok(http, path, errors) -> bool:
    r = await http.get(path)
    if r.status_code != 200:
        errors.append(f"{path}: HTTP {r.status_code}")
    return r.status_code == 200


def percentile(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else (values[0])
    )


async def load_test(url: str, clients: int, seconds: float) -> tuple[dict, list]:
    info = httpx.get(url + "api/info", timeout=60).json()
    times: dict[str, list[float]] = {}
    errors: list[str] = []
    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(client(url, info, deadline, i, times, errors) for i in range(clients)))
    return times, errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--path", help="run dir, checkpoint or GPT-2 dir (default: a built-in model)")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--out", default=str(HERE / "explore_load"), help="output path without suffix")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.path) if args.path else default_run(Path(tmp) / "run")
        proc, url = start_server(path)
        try:
            started = time.time()
            times, errors = asyncio.run(load_test(url, args.clients, args.seconds))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    rows = {
        name: {
            "requests": len(v),
            "p50_ms": round(1000 * percentile(v, 50), 1),
            "p95_ms": round(1000 * percentile(v, 95), 1),
        }
        for name, v in sorted(times.items())
    }
    result = {
        "command": "python benchmarks/explore_load.py " + " ".join(argv or sys.argv[1:]),
        "clients": args.clients,
        "seconds": args.seconds,
        "errors": len(errors),
        "error_samples": errors[:5],
        "endpoints": rows,
        "model": args.path
        or "built-in decoder LM d_model 128, 4 layers x 4 heads, char vocabulary",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "machine": f"{platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
    }
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Explorer load test",
        "",
        f"`{result['command'].strip()}` — {args.clients} concurrent clients on loopback for "
        f"{args.seconds:g} s against one `attnlab explore` server ({result['model']}); "
        f"{result['date']} UTC, {result['machine']}.",
        "",
        f"**Errors: {len(errors)}** out of {sum(r['requests'] for r in rows.values())} requests.",
        "",
        "| endpoint | requests | p50 (ms) | p95 (ms) |",
        "|---|---:|---:|---:|",
        *(f"| {n} | {r['requests']} | {r['p50_ms']} | {r['p95_ms']} |" for n, r in rows.items()),
        "",
        "Latency includes queueing: model work is serialised by the session's lock, so with 20",
        "clients each request waits for the others' forward passes. `stream` is timed from the",
        "request to the last event of an 8-token sampled continuation. Clients and server share",
        "the machine's cores; the load average above says how busy it was with other work.",
    ]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
