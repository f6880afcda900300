"""`bertkit embed SOURCE`: sentence vectors (or word-piece vectors) for raw texts.

SOURCE is any `backbone.preset` or a finished run; the texts come one per line (or from a
column) as `bertkit predict` reads them; the vectors go out as JSON lines
(`{"embedding": [...]}`) or, with `--output FILE.npy`, as one float32 array. Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from bertkit.cli.arguments import add_command, positive
from bertkit.cli.output import atomic_output
from bertkit.errors import UserError

_CHUNK = 256  # inputs embedded (and written) at a time


def add_to(commands) -> None:
    sub = add_command(
        commands,
        "embed",
        run,
        "vectors of raw texts from a pretrained or fine-tuned encoder",
        needs_model=True,
    )
    sub.add_argument("source", help="a backbone preset (as backbone.preset takes it) or a run")
    sub.add_argument("--input", metavar="FILE", default="-", help="one text per line; '-': stdin")
    sub.add_argument("--column", metavar="NAME", help="the texts of this TSV/CSV/JSONL column")
    sub.add_argument(
        "--format",
        choices=("auto", "tsv", "csv", "jsonl"),
        default="auto",
        help="with --column: the file format (default: from the file name)",
    )
    _add_vector_options(sub)
    sub.add_argument("--batch-size", type=positive, default=32, metavar="N", help="default: 32")
    sub.add_argument(
        "--output",
        metavar="FILE",
        help="FILE.npy: one (texts, dimension) float32 array; another name: the JSON lines",
    )
    sub.add_argument("--overwrite", action="store_true", help="replace an existing --output")


def _add_vector_options(sub) -> None:
    sub.add_argument(
        "--pooling",
        metavar="NAME",
        help="cls, mean, max, mean_sqrt_len, or several joined by + (default: what a "
        "sentence-transformers folder declares, else mean)",
    )
    sub.add_argument(
        "--layers",
        metavar="SPEC",
        help="hidden layers: -1 (the last, default), -4: (the last four), -4,-3,-2,-1; "
        "0 is the embeddings",
    )
    sub.add_argument(
        "--combine",
        choices=("concat", "mean"),
        default="concat",
        help="several --layers: concatenated (default) or averaged",
    )
    sub.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vectors of length 1 (default: what the folder declares; --no-normalize: never)",
    )
    sub.add_argument(
        "--sequence-length",
        type=positive,
        metavar="N",
        help="word pieces per text, longer ones cut (default: the folder's max_seq_length, "
        "the run's, or the model's positions)",
    )
    sub.add_argument(
        "--token-level",
        action="store_true",
        help="each word piece's vector with its character offsets (JSON lines only)",
    )


def run(args) -> None:
    from bertkit.progress import CountProgress
    from bertkit.serving.embedder import Embedder
    from bertkit.tabular import prediction_inputs

    _check_flags(args)
    inputs = prediction_inputs(args.input, column=args.column, file_format=args.format)
    embedder = Embedder.load(
        args.source,
        pooling=args.pooling,
        layers=args.layers,
        combine=args.combine,
        normalize=args.normalize,
        sequence_length=args.sequence_length,
    )
    total = len(inputs) if isinstance(inputs, list) else None
    progress = CountProgress("embed", total, quiet_below=args.batch_size + 1) if total else None
    chunks = _numbered_chunks(inputs)
    if args.output and Path(args.output).suffix == ".npy":
        _write_array(embedder, chunks, args, progress)
        return
    with atomic_output(args.output) as out:
        for first, texts in chunks:
            for line in _json_lines(embedder, texts, args):
                print(line, file=out, flush=out is sys.stdout)
            if progress:
                progress.update(first + len(texts) - 1)


def _check_flags(args) -> None:
    if args.output and os.path.isdir(args.output):
        raise UserError("is a folder", source=args.output)
    if args.output and os.path.exists(args.output) and not args.overwrite:
        raise UserError("exists; pass --overwrite to replace it", source=args.output)
    if args.token_level and args.output and Path(args.output).suffix == ".npy":
        raise UserError("--token-level writes JSON lines, not a .npy array", source=args.output)


def _numbered_chunks(inputs):
    """(number of the chunk's first input, its texts) with every input checked a text."""
    chunk, first = [], 1
    for number, value in enumerate(inputs, 1):
        if not isinstance(value, str):
            problem = "an empty line" if value is None else f"expected a text, got {value!r:.40}"
            raise UserError(problem, source=f"input {number}")
        chunk.append(value)
        if len(chunk) == _CHUNK:
            yield first, chunk
            chunk, first = [], number + 1
    if chunk:
        yield first, chunk
    elif first == 1:
        raise UserError("no texts to embed", source="--input")


def _json_lines(embedder, texts: list, args):
    if args.token_level:
        for pieces in embedder.embed_tokens(texts, args.batch_size):
            tokens = [{**piece, "embedding": piece["embedding"].tolist()} for piece in pieces]
            yield json.dumps({"tokens": tokens}, ensure_ascii=False)
        return
    for vector in embedder.embed(texts, args.batch_size):
        yield json.dumps({"embedding": vector.tolist()})


def _write_array(embedder, chunks, args, progress) -> None:
    """All vectors as one .npy file, in place of `args.output` only once all are done."""
    parts = []
    for first, texts in chunks:
        parts.append(embedder.embed(texts, args.batch_size))
        if progress:
            progress.update(first + len(texts) - 1)
    target = Path(args.output)
    if not target.parent.is_dir():
        raise UserError("folder not found", source=target)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            np.save(file, np.concatenate(parts))
        os.replace(temporary, target)
    except OSError as error:  # a full disk: the error names the file, no partial file stays
        raise OSError(error.errno, error.strerror, str(target)) from None
    finally:
        Path(temporary).unlink(missing_ok=True)
