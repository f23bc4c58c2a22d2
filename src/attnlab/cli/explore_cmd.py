"""``attnlab explore``: the attention explorer, a local web page over a model.

    attnlab explore runs/dates                 # a run directory or checkpoint
    attnlab explore gpt2/ --port 8001          # a local Hugging Face directory

The page works offline (everything it needs ships in the package) and the server listens on
127.0.0.1 unless ``--host`` says otherwise. See docs/explorer.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from attnlab.cli.options import (
    CHECKPOINT_HELP,
    add_device,
    add_kv_cache,
    add_revision,
    add_weights,
    port_number,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explore",
        help="open a model in the attention explorer (a local web page)",
        description="Serve the attention explorer for a model: tokens, attention maps of every "
        "layer and head (inputs up to 1,024 tokens), a one-head walkthrough of the equations, the "
        "neuron view of one weight, positions, the next-token distribution (a classifier's "
        "classes, a masked LM's [MASK] fillers), streamed continuations and head ablation.",
    )
    p.add_argument(
        "path",
        metavar="PATH",
        help=CHECKPOINT_HELP,
    )
    add_revision(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s, this machine only; ::1 for IPv6 "
        "loopback; 0.0.0.0 serves every interface: anyone who can reach it can use the model)",
    )
    p.add_argument(
        "--port",
        type=port_number,
        default=8000,
        help="port to listen on (default: %(default)s; 0: any free port)",
    )
    add_device(p, default="cpu")
    add_weights(p, purpose="faster continuations")
    add_kv_cache(p, purpose="continuations")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.explore import LoadOptions, Session, load
    from attnlab.explore.server import serve
    from attnlab.train.distributed import resolve_device  # auto -> cuda or cpu; errors named

    device = str(resolve_device(args.device))
    options = LoadOptions(device=device, weights=args.weights, kv_cache=args.kv_cache)
    from attnlab.cli import local_model_path

    local = local_model_path(args.path, revision=args.revision)
    loaded = load(local, options)
    if not os.path.exists(args.path):  # a hub id (main() expanded ~ and $VARS already)
        loaded = loaded._replace(name=args.path + (f"@{args.revision}" if args.revision else ""))
    session = Session.from_loaded(loaded, cache_dtype=args.kv_cache)

    def ready(url: str) -> None:
        print(f"attnlab explore: {loaded.name} at {url}  (Ctrl-C to stop)", flush=True)

    serve(session, args.host, args.port, on_ready=ready)
    print("attnlab explore: stopped", file=sys.stderr)
    return 0
