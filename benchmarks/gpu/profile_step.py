"""Where a training step of bertkit's model spends its time on a GPU (issue 30, item 3).

Runs `jax_train_throughput.py`'s model (keras-hub BertBackbone, bertkit's head and AdamW,
mixed_bfloat16) on synthetic full-length rows, one variant per process so that no setting
leaks into the next, and prints one table:

    on_batch     `train_on_batch` per step (the GPU check's "bertkit steps" row): the host
                 waits for every step
    fit          Keras `fit` on in-memory arrays: steps are dispatched ahead; also traced
                 with jax.profiler, the device's kernel time per step and the costliest
                 XLA ops written out. The model as `bertkit finetune` builds it: on a GPU
                 attention dropout 0 and fused attention
    bert_attention_dropout
                 `fit` with BERT's attention dropout 0.1, so Keras' unfused attention
                 (bertkit's default before fused attention was measured)
    no_dropout   `fit` with every dropout rate 0 (what dropout's random bits cost)
    keras_segment_lookup
                 `fit` with keras-hub's own segment-embedding lookup, whose gradient is a
                 scatter-add (bertkit.model.segment_embedding says why bertkit replaces it)
    fused_attention
                 `fit` with attention dropout 0 (`backbone.attention_dropout: 0`), so that
                 training takes bertkit.model.attention's fused kernel (cuDNN): on a GPU
                 the same as `fit`, on a CPU the attention dropout alone
    unfused_attention
                 the same without the fused kernel: Keras' attention, dropout 0 (what the
                 kernel gives, apart from dropping the attention dropout)

    python benchmarks/gpu/profile_step.py --shape base --out $OUT      # on the GPU
    python benchmarks/gpu/profile_step.py --shape tiny --out /tmp/prof  # CPU dry run
    python benchmarks/gpu/profile_step.py --plan fused_attention:384+,fit:384  # two only

`--dump-hlo` writes the optimized HLO of the first traced variant at the longest length as
one .tar.gz, so that the op names of the profile can be read against the program. `--plan`
picks the variants and lengths (`fused_attention:384+,fit:128`; `+` traces one).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULT = "PROFILE_STEP_RESULT "

VARIANTS = (
    "fit",
    "bert_attention_dropout",
    "fused_attention",
    "unfused_attention",
    "no_dropout",
    "keras_segment_lookup",
    "on_batch",
)
# (variant, sequence length) on a GPU; a CPU dry run (--shape tiny) runs each variant at 32
PLAN = [  # the most telling first: a time limit cuts the last
    ("fit", 384),
    ("fit", 128),
    ("bert_attention_dropout", 384),
    ("unfused_attention", 384),
    ("no_dropout", 384),
    ("keras_segment_lookup", 384),
    ("on_batch", 384),
]


def worker(args) -> None:
    """One variant in this process; prints one result line."""
    sys.modules["tensorflow"] = None
    os.environ["KERAS_BACKEND"] = "jax"
    import jax
    import keras
    import numpy as np

    sys.path.insert(1, str(HERE.parent))
    from jax_train_throughput import (
        SHAPES,
        build_model,
        synthetic_rows,
        time_fit,
        training_flops_per_sequence,
    )

    from bertkit.model.attention import CUDNN_REFUSALS, set_attention_dropout

    keras.config.set_dtype_policy("mixed_bfloat16")
    shape = dict(SHAPES[args.shape])
    if args.variant == "no_dropout":
        shape["dropout"] = 0.0
    batch, length = args.batch_size, args.sequence_length
    model = build_model(shape, length)
    if args.variant == "keras_segment_lookup":
        del model.get_layer("segment_embedding").call  # back to keras.layers.Embedding.call
    if args.variant in ("fused_attention", "unfused_attention"):
        without_attention_dropout(model, fused=args.variant == "fused_attention")
    if args.variant == "bert_attention_dropout":
        set_attention_dropout(transformer_layers(model), 0.1)  # unfused in training
    rows = batch * args.steps
    x, y = synthetic_rows(rows, length)
    started = time.perf_counter()
    if args.variant == "on_batch":
        one = ({k: v[:batch] for k, v in x.items()}, y[:batch])
        for _ in range(args.warmup):
            model.train_on_batch(*one)
        keras.ops.convert_to_numpy(model.trainable_variables[0])
        warm = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(args.steps):
            loss = model.train_on_batch(*one)
        float(np.asarray(loss))
        seconds = time.perf_counter() - started
    else:
        seconds = time_fit(model, x, y, batch, args.warmup)
        warm = time.perf_counter() - started - seconds
    result = {
        "variant": args.variant,
        "sequence_length": length,
        "batch_size": batch,
        "step_ms": 1000 * seconds / args.steps,
        "sequences_per_second": rows / seconds,
        "tflops": rows / seconds * training_flops_per_sequence(SHAPES[args.shape], length) / 1e12,
        "compile_and_warmup_seconds": warm,
        "device": str(jax.devices()[0].device_kind),
        "cudnn_refused": sorted(set(CUDNN_REFUSALS)),  # fused attention fell back to XLA's
    }
    if args.trace:
        try:
            result["trace"] = trace(model, x, y, batch, args.trace_steps, Path(args.trace))
        except Exception as error:  # noqa: BLE001 (the timings above still count)
            result["trace_failed"] = f"{type(error).__name__}: {error}"
    print(RESULT + json.dumps(result), flush=True)


def without_attention_dropout(model, fused: bool) -> None:
    """Attention dropout 0 in every encoder layer; with `fused`, bertkit's fused attention
    (installed on a GPU when the backbone was prepared), else Keras' own computation."""
    from bertkit.model.attention import set_attention_dropout

    backbone = transformer_layers(model)
    set_attention_dropout(backbone, 0.0)
    for layer in backbone.transformer_layers:
        attention = layer._self_attention_layer
        if not fused and "_compute_attention" in vars(attention):
            del attention._compute_attention  # back to MultiHeadAttention's


def transformer_layers(model):
    """The encoder layers of `model`, as `set_attention_dropout` takes a backbone's."""
    import types

    layers = [layer for layer in model.layers if layer.name.startswith("transformer_layer")]
    return types.SimpleNamespace(transformer_layers=layers)


def trace(model, x, y, batch, steps, out: Path) -> dict:
    """`steps` fit steps under jax.profiler; the device's busy time per step and its
    costliest ops, aggregated with jax.profiler.ProfileData (no TensorBoard needed)."""
    import jax
    from jax.profiler import ProfileData

    rows = batch * steps
    part = {k: v[:rows] for k, v in x.items()}
    folder = tempfile.mkdtemp(prefix="bertkit-trace-")
    started = time.perf_counter()
    with jax.profiler.trace(folder):
        model.fit(part, y[:rows], batch_size=batch, epochs=1, verbose=0, shuffle=False)
        jax.numpy.asarray(model.trainable_variables[0].value).block_until_ready()
    wall = time.perf_counter() - started
    files = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
    raw = Path(files[0]).read_bytes()
    if len(raw) < 40 * 2**20:  # kept (compressed) for a closer look, where it fits
        out.with_suffix(".xplane.pb.gz").write_bytes(gzip.compress(raw))
    data = ProfileData.from_serialized_xspace(raw)
    devices = [plane for plane in data.planes if plane.name.startswith("/device:")]
    lines = {}
    for plane in devices or [p for p in data.planes if p.name == "/host:CPU"]:
        for line in plane.lines:
            totals, counts = collections.Counter(), collections.Counter()
            for event in line.events:
                totals[event.name] += event.duration_ns / 1e6
                counts[event.name] += 1
            if totals:
                lines[f"{plane.name} | {line.name}"] = {
                    "ms_per_step": sum(totals.values()) / steps,
                    "events_per_step": sum(counts.values()) / steps,
                    "top": [
                        (name, round(ms / steps, 4), counts[name] // max(steps, 1))
                        for name, ms in totals.most_common(60)
                    ],
                }
    return {"wall_ms_per_step": 1000 * wall / steps, "lines": lines}


def parse_plan(text: str) -> list[tuple]:
    """`fused_attention:384+,fit:128` -> [("fused_attention", 384, "trace"), ("fit", 128)]."""
    known, plan = set(VARIANTS), []
    for part in filter(None, text.split(",")):
        variant, _, length = part.partition(":")
        traced = length.endswith("+")
        if variant not in known or not length.rstrip("+").isdigit():
            raise argparse.ArgumentTypeError(
                f"{part!r}: want VARIANT:LENGTH, VARIANT one of {', '.join(sorted(known))}"
            )
        plan.append((variant, int(length.rstrip("+"))) + (("trace",) if traced else ()))
    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["base", "tiny"], default="base")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "profile-out")))
    parser.add_argument("--dump-hlo", action="store_true")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per variant")
    parser.add_argument(
        "--plan",
        type=parse_plan,
        help="variant:length pairs to run, in order, e.g. fused_attention:384,fit:384 "
        "(default: every variant, the most telling first); 'fit' and any pair marked "
        "with a trailing '+' (fused_attention:384+) are traced",
    )
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # a worker's
    parser.add_argument("--sequence-length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=30, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    parser.add_argument("--trace-steps", type=int, default=8, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        return worker(args)

    args.out.mkdir(parents=True, exist_ok=True)
    plan = args.plan or (
        PLAN
        if args.shape == "base"
        else list(dict.fromkeys((variant, 32) for variant, _ in PLAN if variant != "no_dropout"))
    )
    traced = {pair[:2] for pair in plan if len(pair) == 3} | {p[:2] for p in plan if p[0] == "fit"}
    plan = [pair[:2] for pair in plan]
    small = ["--batch-size", "4", "--steps", "3", "--warmup", "1", "--trace-steps", "2"]
    results, dumped = [], False
    for variant, length in plan:
        argv = [sys.executable, __file__, "--shape", args.shape, "--variant", variant]
        argv += ["--sequence-length", str(length)] + (small if args.shape == "tiny" else [])
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
        dump = None
        if (variant, length) in traced:
            argv += ["--trace", str(args.out / f"trace_{variant}_{length}")]
            longest = max(n for pair in traced for n in pair[1:])
            if args.dump_hlo and not dumped and length == longest:
                dump, dumped = tempfile.mkdtemp(prefix="bertkit-hlo-"), True
                env["XLA_FLAGS"] = (
                    f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump} --xla_dump_hlo_as_text"
                ).strip()
        print(f"--- {variant} seq {length}", flush=True)
        started = time.perf_counter()
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=args.timeout
            )
            log = done.stdout + done.stderr
            found = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
            result = (
                json.loads(found[-1][len(RESULT) :])
                if found
                else {"variant": variant, "sequence_length": length, "failed": log[-1500:]}
            )
        except subprocess.TimeoutExpired as expired:
            log = str(expired.stdout or "") + str(expired.stderr or "")
            result = {"variant": variant, "sequence_length": length, "failed": "timed out"}
        result["process_seconds"] = round(time.perf_counter() - started, 1)
        result["log_tail"] = log[-6000:]
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k not in ("trace", "log_tail")}))
        for name, line in (result.get("trace") or {}).get("lines", {}).items():
            print(
                f"  {name}: {line['ms_per_step']:.2f} ms/step, {line['events_per_step']:.0f} events"
            )
            for op, ms, count in line["top"][:12]:
                print(f"    {ms:8.3f} ms x{count:<4d} {op[:90]}")
        (args.out / "profile_step.json").write_text(json.dumps(results, indent=1))
        if dump:
            with tarfile.open(args.out / "hlo.tar.gz", "w:gz") as archive:
                for path in Path(dump).iterdir():
                    # module_N.jit_train_step.<target>_after_optimizations.txt
                    if "train_step" in path.name and path.name.endswith("after_optimizations.txt"):
                        archive.add(path, arcname=path.name)
    print("\n| variant | seq | step ms | seq/s | TFLOP/s | device busy ms/step (busiest line) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        busy = max(
            (line["ms_per_step"] for line in (r.get("trace") or {}).get("lines", {}).values()),
            default=None,
        )
        print(
            f"| {r['variant']} | {r['sequence_length']} | {r.get('step_ms', 0):.1f} | "
            f"{r.get('sequences_per_second', 0):.0f} | {r.get('tflops', 0):.1f} | {busy} |"
        )


if __name__ == "__main__":
    main()
