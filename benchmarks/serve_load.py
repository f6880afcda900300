"""Load test of `bertkit serve` on loopback: latency and requests/s, with and without batching.

A fixed number of requests, each one sentence of the quickstart dev set, is sent by 1, 8
and 32 concurrent clients (threads, one keep-alive connection each) to `bertkit serve RUN`
(a process of its own) started with `--max-batch 64` (batching) and `--max-batch 1` (none);
next to them, the run's SavedModel and `bertkit.load(RUN).predict` called directly in a
loop, one sentence a call. Each row says how busy the machine's other processes kept its
CPUs meanwhile (`other_cores_busy`): the clients share the CPUs with the server.

    python benchmarks/serve_load.py runs/quickstart --requests 300
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
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    texts = sentences(args.data)
    rows = direct_rows(args.run_dir, texts, args.requests)
    for max_batch in (64, 1):
        with server(args.run_dir, max_batch) as address:
            for clients in args.concurrency:
                rows.append(load_row(address, texts, args.requests, clients, max_batch))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def sentences(path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["sentence"] for row in reader]


def measured(name: str, clients: int, latencies: list, result: dict) -> dict:
    """A table row: p50 and p99 latency in ms, requests/s over the row's wall time."""
    ordered = sorted(latencies)
    return {
        "how": name,
        "clients": clients,
        "requests": len(ordered),
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "requests_per_s": len(ordered) / result["wall_seconds"],
        "other_cores_busy": result.get("other_cores_busy"),
    }


def direct_rows(run_dir, texts: list, count: int) -> list[dict]:
    """The SavedModel's signature and `FineTunedModel.predict`, one sentence a call."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the tokenizer's ops)

    import bertkit

    serve = tf.saved_model.load(str(Path(run_dir) / "saved_model")).signatures["serving_default"]
    model = bertkit.load(run_dir)
    calls = {
        "SavedModel, called directly": lambda text: serve(text=tf.constant([text])),
        "bertkit.load(RUN).predict, directly": lambda text: model.predict([text]),
    }
    rows = []
    for name, call in calls.items():
        for text in texts[:5]:  # warm up: traces
            call(text)
        latencies = []
        with common.timed({}) as result:
            for i in range(count):
                started = time.perf_counter()
                call(texts[i % len(texts)])
                latencies.append(time.perf_counter() - started)
        rows.append(measured(name, 1, latencies, result))
    return rows


class server:
    """`bertkit serve RUN --port 0 --max-batch N` in a process of its own; its address."""

    def __init__(self, run_dir, max_batch: int):
        self.command = [sys.executable, "-m", "bertkit.cli", "serve", str(run_dir)]
        self.command += ["--port", "0", "--max-batch", str(max_batch)]

    def __enter__(self):
        self.process = subprocess.Popen(self.command, stderr=subprocess.PIPE, text=True)
        line = self.process.stderr.readline()
        if "http://" not in line:
            raise SystemExit(f"the server did not start: {line}{self.process.stderr.read()}")
        host, port = line.split("http://")[1].split(" ")[0].rsplit(":", 1)
        return host, int(port)

    def __exit__(self, *exc):
        self.process.send_signal(signal.SIGTERM)
        self.process.communicate(timeout=60)


def load_row(address, texts: list, count: int, clients: int, max_batch: int) -> dict:
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
    name = f"bertkit serve --max-batch {max_batch}" + (" (no batching)" if max_batch == 1 else "")
    return measured(name, clients, latencies, result)


def table(rows: list) -> str:
    lines = [
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
        f"one sentence a request",
        "",
        "| how | clients | p50 ms | p99 ms | requests/s | other cores busy |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['how']} | {row['clients']} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} "
            f"| {row['requests_per_s']:.1f} | {row['other_cores_busy']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
