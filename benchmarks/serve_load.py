"""Serving benchmark in one run: the run's model called directly, `bertkit serve` under load,
its ONNX float and int8 exports, and transformers + PyTorch on the same model.

Same machine, model and inputs (the quickstart dev set's sentences, one a request) for
every row:

- the run's SavedModel and `bertkit.load(RUN).predict` called directly in a loop, one
  sentence a call, and `predict` on batches of `--batch` sentences (the model's own
  batched throughput, what a server's batches can reach);
- `bertkit serve RUN` (a process of its own) with `--max-batch 64` (batching) and
  `--max-batch 1` (none), at each `--concurrency` (threads, one keep-alive connection
  each, one sentence a request);
- with `--onnx`: the run exported by `bertkit export --format onnx`, float and `--quantize
  int8`, called directly (`OnnxModel.predict`, one sentence a call, and batches), and the
  int8 folder behind `bertkit serve ONNX_DIR` at each concurrency;
- with `--torch-python PYTHON`: the run's `--format transformers` export in transformers +
  PyTorch (`benchmarks/torch_serving_reference.py`, in that interpreter): eager and
  `torch.compile`d, one sentence a call, and eager batches.

Each row: p50 and p99 latency of a call, sentences/s over the row's wall time, how many
CPUs every process kept busy meanwhile (`cores busy`: the clients share the 2 cores with the
server), and the dev accuracy of the model the row runs. `uptime` is printed before and after.

    python benchmarks/serve_load.py runs/quickstart --onnx --torch-python ../venv-torch/bin/python
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import http.client
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common  # first: it sets TensorFlow's environment

ROOT = Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", default=str(ROOT / "runs" / "quickstart"))
    parser.add_argument("--data", default=str(ROOT / "data" / "quickstart" / "dev.tsv"))
    parser.add_argument("--requests", type=int, default=300, help="requests per row")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--batch", type=int, default=32, help="sentences a batched direct call")
    parser.add_argument("--onnx", action="store_true", help="also the ONNX float and int8 models")
    parser.add_argument("--torch-python", help="an interpreter with torch and transformers")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    print("uptime before:", os.getloadavg(), flush=True)
    texts = sentences(args.data)
    rows = direct_rows(args, texts)
    for max_batch in (64, 1):
        name = f"bertkit serve --max-batch {max_batch}" + (" (no batching)" * (max_batch == 1))
        options = ["--max-batch", str(max_batch)]
        rows += served_rows(name, args.run_dir, options, texts, args, rows[0]["accuracy"])
    with tempfile.TemporaryDirectory() as work:
        if args.onnx:
            rows += onnx_rows(args, texts, Path(work))
        if args.torch_python:
            rows += torch_rows(args, Path(work))
    print("uptime after:", os.getloadavg(), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def sentences(path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["sentence"] for row in reader]


def measured(name: str, clients: int, latencies: list, result: dict, **row) -> dict:
    """A table row: p50 and p99 latency of a call in ms, sentences/s over the row's wall
    time (`sentences`: the row's count, one a call unless given)."""
    ordered = sorted(latencies)
    return {
        "how": name,
        "clients": clients,
        "requests": len(ordered),
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "requests_per_s": (row.pop("sentences", None) or len(ordered)) / result["wall_seconds"],
        "cores_busy": result.get("cores_busy"),
        **row,
    }


def timed_calls(name: str, call, inputs: list, accuracy: float, sentences: int = 0) -> dict:
    """One row of `call` over each of `inputs` in turn, after 5 unmeasured calls."""
    for value in inputs[:5]:  # warm up: traces
        call(value)
    latencies = []
    with common.timed({}) as result:
        for value in inputs:
            started = time.perf_counter()
            call(value)
            latencies.append(time.perf_counter() - started)
    return measured(name, 1, latencies, result, accuracy=accuracy, sentences=sentences or None)


def direct_rows(args, texts: list) -> list[dict]:
    """The SavedModel's signature and `FineTunedModel.predict`, one sentence a call, and
    `predict` on batches."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the tokenizer's ops)

    import bertkit

    serve = tf.saved_model.load(str(Path(args.run_dir) / "saved_model"))
    serve = serve.signatures["serving_default"]
    model = bertkit.load(args.run_dir)
    accuracy = model.evaluate()[model.task.monitor]
    one = [texts[i % len(texts)] for i in range(args.requests)]
    return [
        timed_calls(
            "SavedModel, called directly", lambda t: serve(text=tf.constant([t])), one, accuracy
        ),
        timed_calls("bertkit.load(RUN).predict, directly", one_sentence(model), one, accuracy),
        batched_row("bertkit.load(RUN).predict, directly", model, args, texts, accuracy),
    ]


def one_sentence(model):
    return lambda text: model.predict([text])


def batched_row(name: str, model, args, texts: list, accuracy) -> dict:
    """`model.predict` timed on batches of `--batch` sentences (the model's own throughput)."""
    return timed_calls(
        f"{name}, batches of {args.batch}",
        model.predict,
        batches(texts, args.requests, args.batch),
        accuracy,
        sentences=args.requests // args.batch * args.batch,
    )


def batches(texts: list, count: int, size: int) -> list[list]:
    """`count // size` batches of `size` sentences, in the data's order, round and round."""
    return [
        [texts[(first + j) % len(texts)] for j in range(size)]
        for first in range(0, count // size * size, size)
    ]


def onnx_rows(args, texts: list, work: Path) -> list[dict]:
    """The run's ONNX float and int8 exports called directly, and the int8 one served."""
    import bertkit
    from bertkit.serving.onnx_int8 import evaluate_onnx
    from bertkit.serving.onnx_runtime import OnnxModel

    folders = {"ONNX float": work / "onnx", "ONNX int8": work / "onnx-int8"}
    export = [sys.executable, "-m", "bertkit.cli", "export", args.run_dir, "--format", "onnx"]
    subprocess.run([*export, "--out", str(folders["ONNX float"])], check=True)
    quantize = ["--quantize", "int8", "--max-drop", "100"]  # reported whatever it loses
    subprocess.run([*export, "--out", str(folders["ONNX int8"]), *quantize], check=True)
    finetuned = bertkit.load(args.run_dir)
    one = [texts[i % len(texts)] for i in range(args.requests)]
    rows = []
    for name, folder in folders.items():
        accuracy = evaluate_onnx(finetuned, folder / "model.onnx")[finetuned.task.monitor]
        model = OnnxModel.load(folder)
        rows.append(timed_calls(f"{name}, OnnxModel.predict", one_sentence(model), one, accuracy))
        rows.append(batched_row(f"{name}, OnnxModel.predict", model, args, texts, accuracy))
    int8 = folders["ONNX int8"]
    rows += served_rows(
        "bertkit serve ONNX_DIR (int8)", int8, [], texts, args, rows[-1]["accuracy"]
    )
    return rows


def torch_rows(args, work: Path) -> list[dict]:
    """transformers + PyTorch on the run's transformers export, in `--torch-python`."""
    folder = work / "transformers"
    export = [sys.executable, "-m", "bertkit.cli", "export", args.run_dir]
    subprocess.run([*export, "--format", "transformers", "--out", str(folder)], check=True)
    script = Path(__file__).with_name("torch_serving_reference.py")
    command = [args.torch_python, str(script), str(folder), args.data, "--requests"]
    with common.timed({}):
        answer = subprocess.run(
            [*command, str(args.requests), "--batch", str(args.batch)],
            capture_output=True,
            text=True,
            check=True,
        )
    reference = json.loads(answer.stdout.strip().splitlines()[-1])
    rows = []
    for row in reference["rows"]:
        if "failed" in row:
            rows.append({"how": row["how"], "failed": row["failed"]})
            continue
        result = {"wall_seconds": row["wall_seconds"], "cores_busy": row["cores_used"]}
        extra = {"compile_seconds": row["compile_seconds"]} if "compile_seconds" in row else {}
        name = f"{row['how']} (torch {reference['torch']})"
        rows.append(
            measured(
                name,
                1,
                row["latencies"],
                result,
                accuracy=reference["accuracy"],
                sentences=row["sentences"],
                **extra,
            )
        )
    return rows


class server:
    """`bertkit serve SOURCE --port 0 [options]` in a process of its own; its address."""

    def __init__(self, source, options: list):
        self.command = [sys.executable, "-m", "bertkit.cli", "serve", str(source)]
        self.command += ["--port", "0", *options]

    def __enter__(self):
        self.process = subprocess.Popen(self.command, stderr=subprocess.PIPE, text=True)
        said = []
        while "http://" not in (line := self.process.stderr.readline()):
            said.append(line)
            if not line:  # it ended
                raise SystemExit("the server did not start: " + "".join(said[-20:]))
        threading.Thread(target=self.process.stderr.read, daemon=True).start()  # never full
        host, port = line.split("http://")[1].split(" ")[0].rsplit(":", 1)
        return host, int(port)

    def __exit__(self, *exc):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


def served_rows(name, source, options: list, texts: list, args, accuracy) -> list[dict]:
    """`bertkit serve SOURCE [options]` at each concurrency (`accuracy`: its model's)."""
    with server(source, options) as address:
        return [
            {**load_row(address, texts, args.requests, clients, name), "accuracy": accuracy}
            for clients in args.concurrency
        ]


def load_row(address, texts: list, count: int, clients: int, name: str) -> dict:
    """`count` requests of one sentence each from `clients` threads."""
    per_client = [list(range(i, count, clients)) for i in range(clients)]

    def client(indices: list) -> list:
        connection = http.client.HTTPConnection(*address, timeout=300)
        latencies = []
        for i in indices:
            body = json.dumps({"inputs": [texts[i % len(texts)]]})
            started = time.perf_counter()
            connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            latencies.append(time.perf_counter() - started)
            if response.status != 200:
                raise SystemExit(f"request failed ({response.status}): {answer[:200]}")
        connection.close()
        return latencies

    client(list(range(5)))  # warm up: the connection, the server's first batches
    with concurrent.futures.ThreadPoolExecutor(clients) as pool, common.timed({}) as result:
        latencies = [t for part in pool.map(client, per_client) for t in part]
    return measured(name, clients, latencies, result)


def table(rows: list) -> str:
    lines = [
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
        "one sentence a request unless batched",
        "",
        "| how | clients | p50 ms | p99 ms | sentences/s | cores busy | dev accuracy |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "failed" in row:
            lines.append(f"| {row['how']} | | failed: {row['failed'][:80]} | | | | |")
            continue
        name = row["how"] + (
            f" (compile {row['compile_seconds']} s)" if "compile_seconds" in row else ""
        )
        accuracy = "" if row.get("accuracy") is None else f"{row['accuracy']:.4f}"
        lines.append(
            f"| {name} | {row['clients']} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} "
            f"| {row['requests_per_s']:.1f} | {row['cores_busy']} | {accuracy} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
