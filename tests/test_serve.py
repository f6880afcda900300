"""`bertkit serve` over real HTTP on loopback (issue 32): `bertkit predict`'s answers for
every task, each client its own answers under batching, a bad request one JSON line and
a 4xx, and the command's start-up errors and clean stop.

Tiny runs (one layer, hidden size 16) are trained once, in this process; each is served
by a server thread here, so that only the command tests start a process of their own.
"""

import concurrent.futures
import http.client
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import types

import pytest

import bertkit
from bertkit.cli import main as bertkit_main
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint
from bertkit.testing.tiny import FILLER, NEGATIVE, POSITIVE
from tests.test_long_documents import write_documents
from tests.test_mlm import add_head_tensors, write_corpus
from tests.test_multiple_choice import CSQA_KEYS, questions, write_questions
from tests.test_span_qa import qa_lines, write_lines
from tests.test_tagging import write_conll

pytest.importorskip("uvicorn", reason="bertkit serve's extra is part of the dev install")

from bertkit.serving.server import ServeOptions, serve  # noqa: E402

TASKS = ("classification", "pairs", "tagging", "span_qa", "mlm", "windows", "multiple_choice")


# ---------------------------------------------------------------- runs and servers
def recipes(folder) -> dict:
    write_sentiment_tsv(folder / "train.tsv", 32, seed=0)
    pairs = [f"the film was {w}\tit is {w}\t{'yes' if w in POSITIVE else 'no'}" for w in WORDS]
    (folder / "pairs.tsv").write_text("premise\thypothesis\tlabel\n" + "\n".join(pairs) + "\n")
    write_conll(folder / "train.txt", 32, seed=0)
    write_lines(folder / "train.jsonl", qa_lines(16, seed=1))
    write_documents(folder / "documents.tsv", 16)
    write_questions(folder / "questions.jsonl", questions(16))
    common = {"schema": 1, "backbone": {"preset": str(folder / "ckpt"), "sequence_length": 32}}
    training = {"training": {"epochs": 1, "batch_size": 8, "learning_rate": 3e-3}}
    data = {"text": "sentence"}
    return {
        "classification": {
            "task": "classification",
            "data": {"train": str(folder / "train.tsv"), **data},
        },
        "pairs": {
            "task": "classification",
            "data": {
                "train": str(folder / "pairs.tsv"),
                "text": "premise",
                "text_pair": "hypothesis",
            },
        },
        "tagging": {
            "task": {"name": "tagging", "window_stride": 10},
            "data": {"train": str(folder / "train.txt")},
        },
        "span_qa": {
            "task": {"name": "span_qa", "version": "2.0", "max_query_length": 8, "doc_stride": 8},
            "data": {"train": str(folder / "train.jsonl")},
        },
        "windows": {
            "task": {"name": "classification", "long_text": "windows", "window_stride": 6},
            "backbone": {"preset": str(folder / "ckpt"), "sequence_length": 16},
            "data": {"train": str(folder / "documents.tsv")},
        },
        "multiple_choice": {
            "task": "multiple_choice",
            "data": {"train": str(folder / "questions.jsonl"), **CSQA_KEYS},
        },
        "mlm": {
            "task": "mlm",
            "backbone": {"preset": str(folder / "mlm_ckpt"), "sequence_length": 32},
            "data": {"train": str(folder / "corpus.txt")},
        },
    }, {**common, **training}


WORDS = POSITIVE + NEGATIVE


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    write_tiny_checkpoint(folder / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    write_tiny_checkpoint(folder / "mlm_ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    add_head_tensors(folder / "mlm_ckpt")
    write_corpus(folder / "corpus.txt", 20)
    specs, common = recipes(folder)
    # The server answers with the run's model, not its saved_model/: not exported here
    no_export = {"export": {"saved_model": False}}
    for name, spec in specs.items():
        bertkit.finetune({**common, **spec, **no_export}, output_dir=folder / name, verbose=0)
    return folder


class ServerThread:
    """`serve(run_dir)` in a thread on a free loopback port, until `stop()`."""

    def __init__(self, run_dir, **options):
        self.ready, self.failed = threading.Event(), None
        self.thread = threading.Thread(target=self._serve, args=(run_dir, options), daemon=True)
        self.thread.start()
        assert self.ready.wait(120) and self.failed is None, self.failed
        self.batcher = self.server.config.app.state.batcher

    def _serve(self, run_dir, options):
        try:
            serve(run_dir, ServeOptions(port=0, **options), ready=self._started)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            self.failed = error
            self.ready.set()

    def _started(self, server, address):
        self.server, self.address = server, address
        self.ready.set()

    def request(self, method, path, body=None, headers=None):
        """`(status, body)` of one request on a new connection."""
        connection = http.client.HTTPConnection(*self.address, timeout=120)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def predict(self, inputs, **options) -> list:
        status, body = self.request("POST", "/predict", json.dumps({"inputs": inputs, **options}))
        assert status == 200, body
        return json.loads(body)["predictions"]

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def servers(runs):
    started = {task: ServerThread(runs / task) for task in TASKS}
    yield started
    for server in started.values():
        server.stop()


# ---------------------------------------------------------------- the answers
def inputs_of(task: str, count: int = 50, seed: int = 0) -> list:
    """`count` inputs of each form `bertkit predict` takes for the task."""
    rng = random.Random(seed)

    def text(low=2, high=12):
        return " ".join(rng.choices(WORDS + FILLER, k=rng.randint(low, high)))

    forms = {
        "classification": [lambda: text(), lambda: {"sentence": text()}],
        "pairs": [lambda: [text(), text()], lambda: {"premise": text(), "hypothesis": text()}],
        "tagging": [lambda: text(), lambda: text().split()],
        "span_qa": [
            lambda: {"question": "what is it ?", "context": text(4, 40)},
            lambda: ["what is it ?", text(4, 40)],
            lambda: {"id": "q", "question": "what is it ?", "context": text(), "n_best": True},
        ],
        "mlm": [lambda: text() + " [MASK] .", lambda: [text() + " [MASK]", text()]],
        "windows": [lambda: text(10, 50), lambda: {"text": text(10, 50)}],
        "multiple_choice": [
            lambda: {"question": text(2, 8), "choices": rng.sample(WORDS, 3)},
            lambda: {
                "question": text(2, 8),
                "choices": [
                    {"label": x, "text": w}
                    for x, w in zip("ABC", rng.sample(WORDS, 3), strict=True)
                ],
            },
        ],
    }[task]
    return [forms[i % len(forms)]() for i in range(count)]


def predict_command(run_dir, inputs, tmp_path, *options) -> list:
    """What `bertkit predict RUN_DIR` prints for `inputs` (one JSON line each), run here."""
    source, target = tmp_path / "inputs.jsonl", tmp_path / "predictions.jsonl"
    source.write_text("".join(json.dumps(value) + "\n" for value in inputs))
    arguments = ["predict", str(run_dir), "--input", str(source), "--output", str(target)]
    assert bertkit_main([*arguments, "--overwrite", *options]) == 0
    return [json.loads(line) for line in target.read_text().splitlines()]


@pytest.mark.parametrize("task", TASKS)
def test_answers_are_bertkit_predicts(runs, servers, task, tmp_path):
    inputs = inputs_of(task)
    expected = predict_command(runs / task, inputs, tmp_path)
    assert all("error" not in answer for answer in expected), expected
    # requests of 1 to 9 inputs, all at once: the server batches them together
    requests, start = [], 0
    while start < len(inputs):
        requests.append(inputs[start : start + 1 + len(requests) % 9])
        start += len(requests[-1])
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as clients:
        answers = [p for answer in clients.map(servers[task].predict, requests) for p in answer]
    assert_same_answers(answers, expected)


def assert_same_answers(got, expected):
    """The same labels, entities, answers and keys; the same scores to float32 rounding:
    `bertkit predict`'s own scores for an input vary in their 8th digit with the other
    inputs of its batch (the padded width changes the float32 sums' order)."""
    if isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same_answers(got[key], expected[key])
    elif isinstance(expected, list):
        assert len(got) == len(expected)
        for one, other in zip(got, expected, strict=True):
            assert_same_answers(one, other)
    else:
        assert got == expected


def test_concurrent_clients_get_their_own_answers(servers):
    server = servers["classification"]
    jobs = [inputs_of("classification", count=1 + i % 5, seed=i) for i in range(64)]
    alone = [server.predict(job) for job in jobs]  # each request a batch of its own
    batches_before = len(server.batcher.batch_sizes)
    with concurrent.futures.ThreadPoolExecutor(32) as clients:
        together = list(clients.map(server.predict, jobs))
    assert_same_answers(together, alone)
    sizes = server.batcher.batch_sizes[batches_before:]
    assert sum(sizes) == sum(map(len, jobs)) and len(sizes) < len(jobs)  # batched
    assert max(sizes) <= 64


def test_predict_options_are_bertkit_predicts(runs, servers, tmp_path):
    inputs = inputs_of("classification", count=5)
    expected = predict_command(runs / "classification", inputs, tmp_path, "--top-k", "2")
    assert_same_answers(servers["classification"].predict(inputs, top_k=2), expected)


def test_health_and_metadata(servers):
    assert servers["pairs"].request("GET", "/health") == (200, b'{"status": "ok"}\n')
    status, body = servers["pairs"].request("GET", "/metadata")
    about = json.loads(body)
    assert status == 200 and about["task"] == "classification" and about["takes_text_pairs"]
    assert about["labels"] == ["no", "yes"] and about["predict_options"] == ["top_k"]
    card = about["model_card"]
    assert card["name"] == "pairs" and card["sequence_length"] == 32
    assert card["training"]["epochs"] == 1 and card["base_model"].endswith("ckpt")
    assert about["limits"]["max_batch"] == 64


# ---------------------------------------------------------------- bad requests
MEGABYTE_TEXT = json.dumps({"inputs": ["word " * 200_000]})
BAD_REQUESTS = [  # (body, status, the error's words)
    (b"not json", 400, "the body is not JSON: Expecting value"),
    (b"\xff\xfe{}", 400, "the body is not JSON"),
    (b"[" * 100_000, 400, "not JSON"),
    (b'["a text"]', 400, 'expected a JSON object {"inputs": [...]}, got a list'),
    (b"{}", 400, "missing field 'inputs'"),
    (b'{"texts": ["a"]}', 400, "unknown field 'texts'; expected 'inputs', 'top_k'"),
    (b'{"inputs": "a text"}', 400, "'inputs' must be a list of inputs, got a text"),
    (b'{"inputs": []}', 400, "'inputs' is empty"),
    (b'{"inputs": ["a"], "top_k": 0}', 400, "'top_k' must be a whole number of at least 1"),
    (b'{"inputs": ["a", 7]}', 422, "input 2: expected a text, a [text, text_pair] pair"),
    (b'{"inputs": ["a", null]}', 422, "input 2: empty input"),
    (b'{"inputs": [{"sentence": "ok", "text_pair": 7}]}', 422, "input 1: "),
    (b'{"inputs": ["a\\u0000b"]}', 422, "input 1: a NUL byte"),
    (b'{"inputs": [["a", "b"]]}', 422, "input 1: this model reads single texts"),
    (MEGABYTE_TEXT.encode(), 422, "input 1: longer than 100,000 characters (1,000,000)"),
    (json.dumps({"inputs": ["ok"] * 10_000}).encode(), 413, "10,000 inputs, over the limit"),
    (json.dumps({"inputs": ["word " * 19_000] * 11}).encode(), 413, "over the limit of 1,000,000"),
    (b" " * (9 * 1024 * 1024), 413, "the body is over 8,388,608 bytes"),
]


def test_bad_requests_are_one_json_line_and_the_server_serves_on(servers):
    server = servers["classification"]
    for body, status, words in BAD_REQUESTS:
        got, answer = server.request("POST", "/predict", body)
        assert answer.endswith(b"\n") and answer.count(b"\n") == 1, answer[:200]
        error = json.loads(answer)["error"]
        assert (got, list(json.loads(answer))) == (status, ["error"]) and words in error, (
            body[:80],
            got,
            error,
        )
    assert server.request("GET", "/predict")[0] == 405
    assert json.loads(server.request("GET", "/nowhere")[1]) == {"error": "Not Found"}
    assert server.predict(["a warm and funny film"])[0]["label"] in ("positive", "negative")


def test_a_single_text_to_a_pair_model_is_a_422(servers):
    status, body = servers["pairs"].request("POST", "/predict", b'{"inputs": ["one text"]}')
    assert status == 422
    assert json.loads(body)["error"].startswith("input 1: this model reads text pairs")


# ---------------------------------------------------------------- the command
def command(*args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "bertkit.cli", "serve", *args],
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_start_up_errors_are_one_line_before_tensorflow_loads(runs, tmp_path):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(runs / "classification", unfinished)
    (unfinished / "run.json").write_text('{"status": "running"}')
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = str(taken.getsockname()[1])
    cases = [
        ([str(tmp_path / "nowhere")], "nowhere: run directory not found"),
        ([str(unfinished)], "not a finished run (its run.json says 'running')"),
        ([str(runs / "classification"), "--port", port], f"cannot listen on 127.0.0.1:{port}"),
    ]
    for args, message in cases:
        process = command(*args)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 2 and stderr.count("\n") == 1, stderr
        assert message in stderr and "Traceback" not in stderr, stderr
    taken.close()


def test_the_command_serves_until_sigterm_then_stops_cleanly(runs):
    process = command(str(runs / "span_qa"), "--port", "0", "--max-batch", "4")
    try:
        line = process.stderr.readline()  # printed once it accepts requests
        assert line.startswith("bertkit serve: http://127.0.0.1:"), line
        host, port = line.split("http://")[1].split(" ")[0].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("POST", "/predict", json.dumps({"inputs": [["what ?", "it is ok"]]}))
        assert set(json.loads(connection.getresponse().read())["predictions"][0]) >= {"answer"}
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0 and rest == "bertkit serve: stopped (SIGTERM)\n", rest


# ---------------------------------------------------------------- the batcher alone
def batched(submissions, predict, **options):
    """`(answers or exceptions, batch sizes)` of `submissions` (lists of items) sent at once."""
    import asyncio

    from bertkit.serving.batcher import DynamicBatcher

    async def main():
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            batcher = DynamicBatcher(predict, thread, **options)
            running = asyncio.create_task(batcher.run())
            sent = [batcher.submit(items) for items in submissions]
            answers = await asyncio.gather(*sent, return_exceptions=True)
            running.cancel()
            return answers, batcher.batch_sizes

    return asyncio.run(main())


def test_connections_send_without_waiting_for_the_clients_ack():
    """The server's connections have Nagle's algorithm off (TCP_NODELAY), as asyncio sets it
    on TCP sockets: with it on, each response's body waited for the client's delayed ACK
    of its headers (44 ms a /health request, 60 against 21 ms a /predict on the CPU)."""
    import asyncio

    from bertkit.serving.server import bind_socket

    async def main():
        accepted = asyncio.get_running_loop().create_future()

        async def handle(reader, writer):
            connection = writer.get_extra_info("socket")
            accepted.set_result(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listening = bind_socket("127.0.0.1", 0)
        server = await asyncio.start_server(handle, sock=listening)  # as uvicorn serves it
        _, writer = await asyncio.open_connection(*listening.getsockname()[:2])
        nodelay = await accepted
        writer.close()
        server.close()
        return nodelay

    assert asyncio.run(main()) != 0


def test_the_batcher_fills_batches_in_arrival_order_up_to_max_batch():
    answers, sizes = batched([[1, 2], [3], [4, 5, 6], [7] * 5], lambda items: items, max_batch=4)
    assert answers == [[1, 2], [3], [4, 5, 6], [7] * 5] and sizes == [3, 3, 5]


def test_a_failing_request_fails_alone():
    def predict(items):
        if "bad" in items:
            raise ValueError("cannot")
        return [item.upper() for item in items]

    answers, sizes = batched([["a"], ["bad"], ["b", "c"]], predict)
    assert answers[0] == ["A"] and answers[2] == ["B", "C"] and isinstance(answers[1], ValueError)
    assert sizes == [4]  # then each request again on its own


def test_the_token_budget_bounds_the_padded_batch():
    """Rows x the batch's longest row stay within max_batch_tokens; a request past it alone."""
    import asyncio

    from bertkit.serving.batcher import DynamicBatcher

    requests = [("a", 2, 10), ("b", 2, 30), ("c", 1, 10), ("d", 8, 100), ("e", 1, 5)]

    async def main():
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            batcher = DynamicBatcher(
                lambda items: [item.upper() for item in items], thread, max_batch_tokens=100
            )
            sent = [batcher.submit([name], rows, longest) for name, rows, longest in requests]
            running = asyncio.create_task(batcher.run())
            answers = await asyncio.gather(*sent)
            running.cancel()
            return answers, batcher.batch_sizes

    answers, sizes = asyncio.run(main())
    # a+b: 4 rows x 30 = 120 > 100, so a alone; b+c: 3 x 30 = 90; d (800) alone; e
    assert answers == [["A"], ["B"], ["C"], ["D"], ["E"]] and sizes == [2, 3, 8, 1]


def test_a_lone_request_does_not_wait_for_company(monkeypatch):
    """The server's default wait is none: a lone request's batch runs as soon as it arrives,
    never waiting for more (with a wait, each would wait it out)."""
    import asyncio

    from bertkit.serving import batcher as batching
    from bertkit.serving.worker import ServeOptions

    waits = []

    async def counted_wait(awaitable, timeout):
        waits.append(timeout)
        return await asyncio.wait_for(awaitable, timeout)

    async def main(seconds):
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            batcher = batching.DynamicBatcher(lambda items: items, thread, max_wait_seconds=seconds)
            running = asyncio.create_task(batcher.run())
            answers = [await batcher.submit([i]) for i in range(5)]
            running.cancel()
            return answers

    monkeypatch.setattr(
        batching,
        "asyncio",
        types.SimpleNamespace(
            **{name: getattr(asyncio, name) for name in dir(asyncio) if not name.startswith("_")}
            | {"wait_for": counted_wait}
        ),
    )
    assert asyncio.run(main(0.002)) == [[0], [1], [2], [3], [4]] and len(waits) == 5
    waits.clear()
    assert asyncio.run(main(ServeOptions().max_wait_ms / 1000)) == [[i] for i in range(5)]
    assert waits == []
