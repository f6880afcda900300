"""`bertkit serve` and `bertkit predict` hardened (issue 51): an API key, numbers too long
for Python's ints, `/predict/`, SIGTERM while the model loads, empty texts, pairs of two
texts, and span QA's `n_best` checked as every per-request option is.

Three tiny runs (classification, a pair classifier, span QA; one layer, hidden size 16)
are trained once, in this process, and served by server threads here (as in
`tests/test_serve.py`); only the signal tests start a `bertkit serve` process.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import bertkit
from bertkit.cli import _parse
from bertkit.cli import main as bertkit_main
from bertkit.errors import UserError
from bertkit.testing import write_tiny_checkpoint

pytest.importorskip("uvicorn", reason="bertkit serve's extra is part of the dev install")

from bertkit.serving.routes import bearer_token  # noqa: E402
from bertkit.serving.server import ServeOptions, open_to_others_warning  # noqa: E402
from tests.test_serve import ServerThread, recipes  # noqa: E402

KEY = "s3cret-Key_42"
CONTEXT = "the film was warm and funny , the actors were fine and the music was dull"
QUESTION = {"question": "what was the film ?", "context": CONTEXT}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_hardening")
    write_tiny_checkpoint(folder / "ckpt", num_layers=1, hidden_size=16, intermediate_size=32)
    specs, common = recipes(folder)
    no_export = {"export": {"saved_model": False}}
    for name in ("classification", "pairs", "span_qa"):
        bertkit.finetune(
            {**common, **specs[name], **no_export}, output_dir=folder / name, verbose=0
        )
    return folder


@pytest.fixture(scope="module")
def servers(runs):
    started = {
        "classification": ServerThread(runs / "classification"),
        "keyed": ServerThread(runs / "classification", api_key=KEY),
        "pairs": ServerThread(runs / "pairs"),
        "span_qa": ServerThread(runs / "span_qa"),
    }
    yield started
    for server in started.values():
        server.stop()


def post(server, body, path="/predict", headers=None):
    """`(status, decoded JSON answer)` of a POST whose body is `body` (bytes, or JSON)."""
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    status, answer = server.request("POST", path, body, headers)
    assert answer.endswith(b"\n") and answer.count(b"\n") == 1, answer[:200]
    return status, json.loads(answer)


def predict_lines(run_dir, lines, tmp_path, *options):
    """What `bertkit predict RUN_DIR` writes for input `lines`, run here: (status, outputs)."""
    source, target = tmp_path / "inputs.txt", tmp_path / "predictions.jsonl"
    source.write_text("".join(line + "\n" for line in lines))
    arguments = ["predict", str(run_dir), "--input", str(source), "--output", str(target)]
    status = bertkit_main([*arguments, "--overwrite", *options])
    outputs = [json.loads(line) for line in target.read_text().splitlines()] if status == 0 else []
    return status, outputs


# ---------------------------------------------------------------- 1. the API key
def test_every_route_but_health_needs_the_key(servers):
    server = servers["keyed"]
    inputs = {"inputs": ["a warm and funny film"]}
    missing = "missing API key: send the header 'Authorization: Bearer <key>'"
    assert post(server, inputs) == (401, {"error": missing})
    for wrong in ("Bearer wrong", f"Bearer {KEY[:-1]}", f"Bearer {KEY}x", "Basic " + KEY):
        status, answer = post(server, inputs, headers={"Authorization": wrong})
        assert status == 401 and answer["error"] in ("wrong API key", missing), wrong
    for header in (f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY} "):
        status, answer = post(server, inputs, headers={"Authorization": header})
        assert status == 200 and answer["predictions"][0]["label"] in ("positive", "negative")
    assert server.request("GET", "/health") == (200, b'{"status": "ok"}\n')
    assert server.request("GET", "/health/")[0] == 200
    for path in ("/metadata", "/nowhere", "/predict/"):  # an unknown path tells nothing either
        status, answer = server.request("GET" if path != "/predict/" else "POST", path)
        assert status == 401 and json.loads(answer) == {"error": missing}, path
    assert server.request("GET", "/metadata", headers={"Authorization": f"Bearer {KEY}"})[0] == 200


def test_the_key_is_read_as_sent_and_never_shown():
    assert bearer_token([(b"host", b"x"), (b"authorization", b"Bearer  abc ")]) == b"abc"
    assert bearer_token([(b"authorization", b"Bearer")]) is None
    assert bearer_token([(b"authorization", b"Token abc")]) is None
    assert bearer_token([]) is None
    assert KEY not in repr(ServeOptions(api_key=KEY))


def test_the_flag_wins_over_the_environment_variable(monkeypatch):
    from bertkit.cli.serve import _api_key

    monkeypatch.setenv("BERTKIT_API_KEY", "from-env")
    assert _api_key(_parse(["serve", "run", "--api-key", "from-flag"])) == (
        "from-flag",
        "--api-key",
    )
    assert _api_key(_parse(["serve", "run"])) == ("from-env", "BERTKIT_API_KEY")
    monkeypatch.delenv("BERTKIT_API_KEY")
    assert _api_key(_parse(["serve", "run"]))[0] is None


@pytest.mark.parametrize(
    "flag, environment, message",
    [
        ([], "", "BERTKIT_API_KEY is empty; expected the key that requests must send"),
        (["--api-key", "two words"], "ok", "--api-key: the key must be visible ASCII"),
        (["--api-key", "clé"], None, "--api-key: the key must be visible ASCII"),
    ],
)
def test_a_key_a_header_cannot_carry_is_one_line(
    runs, monkeypatch, capsys, flag, environment, message
):
    if environment is None:
        monkeypatch.delenv("BERTKIT_API_KEY", raising=False)
    else:
        monkeypatch.setenv("BERTKIT_API_KEY", environment)
    assert bertkit_main(["serve", str(runs / "classification"), "--port", "0", *flag]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bertkit: error: {message}") and err.count("\n") == 1, err
    assert "two words" not in err and "clé" not in err  # the key is never printed


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org"])
def test_listening_beyond_this_machine_without_a_key_warns(host):
    warning = open_to_others_warning(host, None)
    assert warning == (
        f"bertkit serve: warning: listening on {host} without an API key: anyone who can "
        "reach this address can use the model; set BERTKIT_API_KEY (or pass --api-key KEY) "
        "to require the header 'Authorization: Bearer KEY'"
    )
    assert open_to_others_warning(host, KEY) is None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"])
def test_loopback_does_not_warn(host):
    assert open_to_others_warning(host, None) is None


def test_the_warning_is_one_line_on_stderr(capsys):
    from bertkit.serving.server import warn_if_open

    warn_if_open("0.0.0.0", None)
    warn_if_open("127.0.0.1", None)
    warn_if_open("0.0.0.0", KEY)
    out, err = capsys.readouterr()
    assert out == "" and err == open_to_others_warning("0.0.0.0", None) + "\n"


# ---------------------------------------------------------------- 2. numbers of 5,000 digits
def test_a_number_over_pythons_digit_limit_is_a_400(servers, caplog, capfd):
    server = servers["classification"]
    digits = "7" * 5000
    for body in (
        f'{{"inputs": [{digits}]}}',
        f'{{"inputs": ["a"], "top_k": {digits}}}',
        f'{{"inputs": ["a"], "other": -{digits}}}',
    ):
        status, answer = post(server, body.encode())
        assert status == 400, answer
        assert answer == {"error": "the body is not JSON we read: a number of over 4,300 digits"}
    status, answer = post(server, f'{{"inputs": [{"7" * 4000}]}}'.encode())  # within the limit
    assert status == 422 and answer["error"].startswith("input 1: expected a text")
    assert post(server, {"inputs": ["a fine film"]})[0] == 200
    assert not [record for record in caplog.records if record.levelname in ("ERROR", "CRITICAL")]
    assert capfd.readouterr().err == ""


def test_predict_reads_such_a_number_as_it_reads_other_broken_json(runs, tmp_path, capsys):
    run = runs / "classification"
    status, outputs = predict_lines(run, ["[" + "7" * 5000 + "]", "a fine film"], tmp_path)
    assert status == 0 and all("label" in output for output in outputs)  # a text, as "[1, 2"
    (tmp_path / "rows.jsonl").write_text(f'{{"sentence": "ok", "n": {"7" * 5000}}}\n')
    arguments = ["predict", str(run), "--input", str(tmp_path / "rows.jsonl")]
    assert bertkit_main([*arguments, "--column", "sentence"]) == 2
    err = capsys.readouterr().err
    assert err == "bertkit: error: " + str(tmp_path / "rows.jsonl") + (
        ":1: invalid JSON: a number of over 4,300 digits\n"
    )


# ---------------------------------------------------------------- 3. trailing slashes
def test_a_trailing_slash_is_the_same_route_and_any_other_path_a_json_404(servers):
    server = servers["classification"]
    inputs = {"inputs": ["a warm and funny film", "a dull film"]}
    assert post(server, inputs, "/predict/") == post(server, inputs, "/predict")
    assert server.request("GET", "/metadata/") == server.request("GET", "/metadata")
    for method, path in (("POST", "/nowhere/"), ("GET", "/predict//"), ("POST", "/predicts")):
        status, answer = server.request(method, path)
        assert (status, json.loads(answer)) == (404, {"error": "Not Found"}), path
    status, answer = server.request("GET", "/predict/")
    assert status == 405 and json.loads(answer) == {"error": "Method Not Allowed"}


# ---------------------------------------------------------------- 4. a signal while loading
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("number, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_the_model_loads_is_one_line(runs, number, status):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bertkit.cli", "serve", str(runs / "classification")]
        + ["--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # the port is bound before TensorFlow loads: that is the moment
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        process.send_signal(number)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    name = signal.Signals(number).name
    assert stderr == f"bertkit serve: stopped while loading the model ({name})\n"
    assert process.returncode == status  # no warning line either: 127.0.0.1 is loopback


# ---------------------------------------------------------------- 5. empty texts
def test_an_empty_or_blank_text_is_refused_by_serve_as_by_predict(servers, runs, tmp_path):
    for inputs, error in (
        (["a fine film", ""], "input 2: empty input"),
        (["   \t"], "input 1: empty input"),
        ([{"sentence": " "}], "input 1: 'sentence' is empty"),
    ):
        assert post(servers["classification"], {"inputs": inputs}) == (422, {"error": error})
    status, answer = post(servers["pairs"], {"inputs": [["a fine film", " "]]})
    assert (status, answer) == (422, {"error": "input 1: 'hypothesis' is empty"})
    status, answer = post(servers["span_qa"], {"inputs": [{"question": "?", "context": ""}]})
    assert (status, answer) == (422, {"error": "input 1: 'context' is empty"})
    lines = ["a fine film", '""', '"  "', '{"sentence": ""}', "", "   "]
    status, outputs = predict_lines(runs / "classification", lines, tmp_path)
    assert status == 0 and "label" in outputs[0]
    assert [output["error"] for output in outputs[1:]] == [
        "input 2: empty input",
        "input 3: empty input",
        "input 4: 'sentence' is empty",
        "input 5: empty input",
        "input 6: empty input",
    ]


def test_every_task_refuses_an_empty_text_of_an_input():
    from bertkit_tasks.mlm.task import MaskedLMTask
    from bertkit_tasks.tagging.task import TaggingTask

    tagging = TaggingTask(TaggingTask.Options(), TaggingTask.Data(), None, 32)
    mlm = MaskedLMTask(MaskedLMTask.Options(), MaskedLMTask.Data(), None, 32)
    for task, value, message in (
        (tagging, [], "'words' is empty"),
        (tagging, ["New", " ", "York"], "'word 2' is empty"),
        (tagging, {"text": ""}, "'text' is empty"),
        (mlm, ["a [MASK] .", ""], "'text_pair' is empty"),
        (mlm, {"text": "a [MASK] .", "text_pair": " "}, "'text_pair' is empty"),
    ):
        with pytest.raises(UserError) as raised:
            task.parse_input(value)
        assert str(raised.value) == message, value
    assert tagging.parse_input(["New", "York"]).words == ("New", "York")
    assert mlm.parse_input({"text": "a [MASK] .", "text_pair": None}).text == "a [MASK] ."


# ---------------------------------------------------------------- 6. a pair is two texts
PAIR_OF_TWO = "a [text, text_pair] pair must be two texts, got "


def test_a_pair_with_null_or_a_number_is_refused(servers, runs, tmp_path):
    server = servers["pairs"]
    for pair in (["a", None], [None, "a"], ["a", 7], [["a"], "b"]):
        status, answer = post(server, {"inputs": [["fine", "ok"], pair]})
        assert (status, answer) == (422, {"error": f"input 2: {PAIR_OF_TWO}{pair!r}"}), pair
    status, answer = post(server, {"inputs": [{"premise": "a", "hypothesis": 7}]})
    assert (status, answer) == (422, {"error": "input 1: 'hypothesis' must be a text, got 7"})
    status, answer = post(servers["span_qa"], {"inputs": [["what ?", None]]})
    assert (status, answer) == (422, {"error": "input 1: 'context' must be a text, got None"})
    status, outputs = predict_lines(runs / "pairs", ['["fine", "ok"]', '["a", null]'], tmp_path)
    assert status == 0 and "label" in outputs[0]
    assert outputs[1] == {"error": f"input 2: {PAIR_OF_TWO}['a', None]"}


def test_mlm_refuses_a_pair_with_null():
    from bertkit_tasks.mlm.task import MaskedLMTask

    mlm = MaskedLMTask(MaskedLMTask.Options(), MaskedLMTask.Data(), None, 32)
    with pytest.raises(UserError, match=r"^'text_pair' must be a text, got None$"):
        mlm.parse_input(["a [MASK] .", None])


# ---------------------------------------------------------------- 7. per-request options
def spans(server, n_best):
    status, answer = post(server, {"inputs": [{**QUESTION, "n_best": n_best}]})
    assert status == 200, answer
    return answer["predictions"][0].get("n_best")


def test_n_best_is_honoured(servers):
    server = servers["span_qa"]
    every = spans(server, True)  # as documented: all the spans the model decodes
    assert 3 < len(every) <= 20
    assert spans(server, 3) == every[:3] and spans(server, 1) == every[:1]
    assert spans(server, 20) == every
    assert spans(server, False) is None and spans(server, None) is None


@pytest.mark.parametrize("n_best", [-1, 0, 21, "3", 3.0, [3], {"n": 3}])
def test_n_best_out_of_range_or_of_the_wrong_type_is_a_422(servers, n_best):
    status, answer = post(
        servers["span_qa"], {"inputs": [QUESTION, {**QUESTION, "n_best": n_best}]}
    )
    assert status == 422
    assert answer["error"] == (
        "input 2: 'n_best' must be true, false or a whole number from 1 to 20 (the model's "
        f"task.n_best_size), got {n_best!r}"
    )


def test_predict_checks_n_best_and_a_question_id_as_serve_does(runs, tmp_path):
    lines = [
        json.dumps({**QUESTION, "n_best": 2}),
        json.dumps({**QUESTION, "n_best": "2"}),
        json.dumps({**QUESTION, "id": {"a": 1}}),
        json.dumps({**QUESTION, "id": 17}),
    ]
    status, outputs = predict_lines(runs / "span_qa", lines, tmp_path)
    assert status == 0 and len(outputs[0]["n_best"]) == 2
    assert outputs[1]["error"].startswith("input 2: 'n_best' must be true, false or a whole")
    assert outputs[2] == {"error": "input 3: 'id' must be a text or a whole number, got {'a': 1}"}
    assert "answer" in outputs[3]


@pytest.mark.parametrize("top_k", [0, -1, True, "2", 2.0, None, [2]])
def test_top_k_of_the_wrong_type_or_below_one_is_a_400(servers, top_k):
    status, answer = post(servers["classification"], {"inputs": ["a fine film"], "top_k": top_k})
    assert (status, answer) == (
        400,
        {"error": f"'top_k' must be a whole number of at least 1, got {top_k!r}"},
    )


def test_top_k_over_the_labels_gives_every_label(servers):
    status, answer = post(servers["classification"], {"inputs": ["a fine film"], "top_k": 10**9})
    assert status == 200 and len(answer["predictions"][0]["top_k"]) == 2


def test_a_signal_that_a_library_swallows_while_loading_still_stops_the_server(runs, monkeypatch):
    from bertkit.serving import server

    def load_that_swallows_signals(run_dir, embed):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs here, at the latest
        except BaseException:  # as an import with a bare `except:` would
            pass
        return object()

    monkeypatch.setattr(server, "_load", load_that_swallows_signals)
    monkeypatch.setattr(server, "warm_up", lambda model: None)
    monkeypatch.setattr(server, "_SIGNALS_WHILE_LOADING", [])
    handler = signal.getsignal(signal.SIGINT)
    listening = server.bind_socket("127.0.0.1", 0)
    with pytest.raises(server.StoppedLoading) as stopped, server.stop_while_loading():
        server.serve(runs / "classification", listening=listening)
    listening.close()
    assert (stopped.value.code, stopped.value.signal_name) == (130, "SIGINT")
    assert signal.getsignal(signal.SIGINT) is handler  # handed back
