"""``attnlab generate``: sample from a trained language model or translate with a seq2seq model.

    attnlab generate --checkpoint runs/x --prompt "ROMEO:" --temperature 0.8 --top-k 40
    attnlab generate --checkpoint runs/x --prompt "" --seed 1 --num-samples 3   (from BOS)
    attnlab generate --checkpoint runs/mt --source "hello world" --beams 4
    attnlab generate --checkpoint runs/mt --source-file sources.txt --temperature 0 > out.txt
    attnlab generate --checkpoint ~/models/SmolLM2-135M --prompt "Once upon a time"  (HF dir)
    attnlab generate --checkpoint ~/models/bert-base-uncased --prompt "the [MASK] sat down."

Language-model output streams to stdout as it is produced (the prompt first, then each piece);
seq2seq outputs are one line per source. Warnings (a cropped prompt, a capped target length) go
to stderr. Every flag maps onto a field of :class:`attnlab.generate.GenerationConfig`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab.cli import load_checkpoint_lazily, plain_warnings
from attnlab.cli.options import add_checkpoint, add_device, add_fast, add_kv_cache, add_weights
from attnlab.errors import CheckpointError, ConfigError, DataError, UserError, blamed_fields
from attnlab.generate import GenerationConfig, generate, generate_seq2seq, stream
from attnlab.generate.fill_mask import fill_mask
from attnlab.generate.sampling import fresh_seed
from attnlab.generate.weights import check_cache_dtype, quantize_weights
from attnlab.models.base import LanguageModel, Seq2SeqModel

SEQ2SEQ_BATCH = 32  # sources decoded together from --source-file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a trained LM (--prompt) or seq2seq model (--source)",
        description="Generate from a checkpoint. Strategies: greedy (--temperature 0), sampling "
        "(--temperature, --top-k, --top-p, --repetition-penalty), beam search (--beams, "
        "--length-penalty). LM text streams to stdout as it is produced.",
    )
    add_checkpoint(
        p,
        also=" (a BERT fills its [MASK] tokens)",
    )
    add_device(p, default="cpu")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        metavar="TEXT",
        help="LM prompt to continue; '' starts from the BOS token (default: '')",
    )
    src.add_argument("--source", metavar="TEXT", help="seq2seq: one source text to transform")
    src.add_argument(
        "--source-file",
        metavar="FILE",
        help="seq2seq: a UTF-8 file with one source per line; one output line each",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=200,
        metavar="N",
        help="most tokens to generate per output (default: %(default)s)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        metavar="T",
        help="softmax temperature; 0 = greedy (default: %(default)s)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=0,
        metavar="K",
        help="sample only from the K most likely tokens; 0 = off (default)",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        metavar="P",
        help="nucleus sampling: the smallest set of tokens with mass >= P; 1 = off",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        metavar="R",
        help="CTRL penalty on tokens already present; 1 = off, 1.2 is typical",
    )
    p.add_argument(
        "--beams",
        type=int,
        default=1,
        metavar="K",
        help="beam search with K beams (deterministic); 1 = off (default)",
    )
    p.add_argument(
        "--length-penalty",
        type=float,
        default=1.0,
        metavar="A",
        help="beam score = sum log p / length^A (default: %(default)s)",
    )
    p.add_argument(
        "--early-stopping",
        action="store_true",
        help="beam search stops as soon as K hypotheses have finished",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop when this text appears (output cut before it); repeatable",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="N",
        help="sampling seed (sample i uses N + i); default: a fresh seed, printed",
    )
    p.add_argument(
        "--num-samples",
        type=int,
        default=1,
        metavar="N",
        help="number of samples per prompt/source; with --beams, the N best beams",
    )
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="print each output when complete instead of piece by piece",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute the whole context every step (slow; a reference check)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="run the one-token decode step under torch.compile: 2.4-4x faster per token on the "
        "benchmark models (less per-op overhead; at batch 1 the weight reads use every core) "
        "after a one-off compile of seconds to tens of seconds; pays off for long outputs",
    )
    add_fast(p, also="; with --compile the compiled step is replayed without dynamo's guards")
    add_weights(p, purpose="faster decoding")
    add_kv_cache(p, purpose="decoding")
    p.set_defaults(func=run, default_of=p.get_default)


# What a masked LM's one forward pass does not use: it fills every mask at once, greedily.
NOT_FOR_MASKS = (
    "source",
    "source_file",
    "max_new_tokens",
    "temperature",
    "top_p",
    "repetition_penalty",
    "beams",
    "length_penalty",
    "early_stopping",
    "stop",
    "num_samples",
    "no_stream",
    "no_cache",
    "compile",
    "weights",
    "kv_cache",
)


def refuse_unused(args: argparse.Namespace, dests: tuple[str, ...], why: str) -> None:
    """One error naming every flag the user set (away from its default) that ``why`` ignores."""
    default_of = getattr(args, "default_of", lambda dest: None)
    given = [d for d in dests if hasattr(args, d) and getattr(args, d) != default_of(d)]
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        raise UserError(f"{why}, so {flags} would be ignored: drop {flags}")


def run(args: argparse.Namespace) -> int:
    if args.num_samples < 1:
        raise UserError(f"--num-samples must be >= 1, got {args.num_samples}")
    if args.beams > 1 and args.num_samples > args.beams:
        raise UserError(
            f"--num-samples {args.num_samples} asks for more beams than --beams "
            f"{args.beams} keeps; raise --beams or lower --num-samples"
        )
    try:
        config = GenerationConfig(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            repetition_penalty=args.repetition_penalty,
            num_beams=args.beams,
            length_penalty=args.length_penalty,
            early_stopping=args.early_stopping,
            stop_strings=tuple(args.stop),
            seed=args.seed,
            use_cache=not args.no_cache,
            compile=args.compile,
            cache_dtype=args.kv_cache,
        )
    except ValueError as err:  # names the fields: the error printer adds their flags
        raise ConfigError(str(err), fields=blamed_fields(err)) from None
    ckpt = load_checkpoint_lazily(args.checkpoint, revision=args.revision, device=args.device)
    model, tok = ckpt.model, ckpt.tokenizer
    if args.fast:
        from attnlab.fast import accelerate

        accelerate(model)
    if tok is None:
        raise CheckpointError(
            f"{str(ckpt.path)!r} has no tokenizer (tokenizer.json in a checkpoint or Hugging "
            "Face directory, attnlab_tokenizer.json in an export), so text cannot be encoded; "
            "copy the tokenizer file of the model next to its config.json"
        )
    with plain_warnings("generate"):
        if isinstance(model, LanguageModel):
            if args.source is not None or args.source_file is not None:
                raise UserError(
                    f"{ckpt.config.kind!r} is a language model: give --prompt TEXT, "
                    "not --source/--source-file"
                )
            _reduce_weights(model, args.weights)
            _check_cache_dtype(model, args.kv_cache)
            _run_lm(model, tok, args, config)
        elif isinstance(model, Seq2SeqModel):
            if args.source is None and args.source_file is None:
                raise UserError(
                    f"{ckpt.config.kind!r} is a sequence-to-sequence model: give "
                    "--source TEXT or --source-file FILE (not --prompt)"
                )
            if args.weights != "fp32":
                raise UserError(
                    f"--weights {args.weights} applies to language models; "
                    f"{ckpt.config.kind!r} is a sequence-to-sequence model: drop --weights"
                )
            _check_cache_dtype(model, args.kv_cache)
            _run_seq2seq(model, tok, args, config)
        elif ckpt.config.kind == "masked_lm":
            refuse_unused(
                args,
                NOT_FOR_MASKS,
                f"{ckpt.config.kind!r} is a masked language model: it fills every [MASK] of "
                "--prompt in one pass (--top-k: candidates shown per mask)",
            )
            _run_fill_mask(model, tok, args)
        else:
            raise UserError(
                f"the checkpoint holds a {ckpt.config.kind!r} model, which predicts labels, not "
                "text; `attnlab generate` needs a decoder_lm, rnn_lm, encoder_decoder or "
                "lstm_seq2seq checkpoint (use `attnlab evaluate` for classifiers)"
            )
    return 0


def _reduce_weights(model, mode: str) -> None:
    try:
        quantize_weights(model, mode)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"--weights {mode}: {err}") from None


def _check_cache_dtype(model, cache_dtype: str | None) -> None:
    try:
        check_cache_dtype(model, cache_dtype)
    except ValueError as err:
        raise ConfigError(f"--kv-cache {cache_dtype}: {err}") from None


def _run_lm(model, tok, args: argparse.Namespace, config) -> None:
    prompt = args.prompt if args.prompt is not None else ""
    if config.num_beams > 1:
        res = generate(model, prompt, config, tokenizer=tok)
        assert res.nbest is not None  # beam search keeps every hypothesis
        for hyp in res.nbest[0][: args.num_samples]:
            print(f"{prompt}{tok.decode(hyp.tokens)}")
            print(f"[score {hyp.score:.4f}, {hyp.finish_reason}]", file=sys.stderr)
        return
    for i, seed in enumerate(_seeds(args, config)):
        cfg = config.replace(seed=seed)
        if i:
            print("---")
        if args.no_stream:
            texts = generate(model, prompt, cfg, tokenizer=tok).texts
            assert texts is not None  # decoded: a tokenizer was given
            print(prompt + texts[0])
            continue
        pieces = stream(model, prompt, cfg, tokenizer=tok, text=True)
        sys.stdout.write(prompt)
        for piece in pieces:
            assert isinstance(piece, str)  # text=True: text pieces, not ids
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()


def _seeds(args: argparse.Namespace, config) -> list[int | None]:
    """One seed per sample, N, N + 1, ... from --seed N, or from a fresh seed that is printed (so
    any sampled output can be repeated)."""

    base = args.seed
    if config.sampling and base is None:
        base = fresh_seed()
        print(f"attnlab: seed {base} (pass --seed {base} to repeat)", file=sys.stderr)
    return [None if base is None else base + i for i in range(args.num_samples)]


def _run_fill_mask(model, tok, args: argparse.Namespace) -> None:
    """A masked LM (BERT): the prompt with every mask filled, then the top candidates per mask."""

    if args.prompt is None:
        raise UserError("a masked language model fills in masks: give --prompt 'the [MASK] sat'")
    try:
        res = fill_mask(model, tok, args.prompt, top_k=args.top_k or 5)
    except ValueError as err:
        raise UserError(str(err)) from None
    print(res.text)
    for i, cands in enumerate(res.candidates, 1):
        shown = ", ".join(f"{c.token!r} {c.probability:.3f}" for c in cands)
        print(f"mask {i}: {shown}", file=sys.stderr)


def _run_seq2seq(model, tok, args: argparse.Namespace, config) -> None:
    sources = [args.source] if args.source is not None else _read_sources(args.source_file)
    streaming = args.source is not None and not args.no_stream and config.num_beams == 1
    seeds = [config.seed] if config.num_beams > 1 else _seeds(args, config)
    for seed in seeds:
        cfg = config.replace(seed=seed)
        if streaming:
            for piece in stream(model, sources[0], cfg, tokenizer=tok, text=True):
                assert isinstance(piece, str)  # text=True: text pieces, not ids
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            continue
        for start in range(0, len(sources), SEQ2SEQ_BATCH):
            res = generate_seq2seq(
                model, sources[start : start + SEQ2SEQ_BATCH], cfg, tokenizer=tok
            )
            if config.num_beams > 1:
                assert res.nbest is not None  # beam search keeps every hypothesis
                for hyps in res.nbest:
                    print("\t".join(tok.decode(h.tokens) for h in hyps[: args.num_samples]))
            else:
                assert res.texts is not None  # decoded: a tokenizer was given
                for text in res.texts:
                    print(text)
            sys.stdout.flush()


def _read_sources(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"--source-file {path!r} does not exist or is not a file")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(
            f"--source-file {path!r} is not valid UTF-8 ({err.reason} at byte "
            f"{err.start}); re-save it as UTF-8"
        ) from None
    if not lines:
        raise DataError(f"--source-file {path!r} is empty; give one source per line")
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    if empty:
        raise DataError(
            f"--source-file {path!r} has empty line(s) {empty[:5]}; every line must hold a source"
        )
    return lines
