"""`bertkit export --format onnx` (bertkit/serving/onnx_export.py, onnx_int8.py) and its
TensorFlow-free runtime (onnx_runtime.py, onnx_tokenizer.py, onnx_decoding.py): in a fresh
process where TensorFlow cannot be imported, the ONNX folder's predictions equal `predict`'s
(labels, entities, answers); the tokenizer gives bertkit's pieces; the int8 gate passes and
refuses as the SavedModel's; bad uses are one line.

The runs are written directly (the task's model on a tiny random checkpoint, its head
scaled up so that predictions are decided, saved as `finetune` saves it), as in
tests/test_transformers_export.py: a tiny `finetune` costs a minute here.
"""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.model.architecture import save_architecture
from bertkit.model.backbone import load_pretrained
from bertkit.run_dir import FINISHED, RunDirectory
from bertkit.serving import onnx_export, onnx_int8
from bertkit.serving.finetuned import FineTunedModel, build_task, task_description
from bertkit.testing import write_sentiment_tsv, write_tiny_checkpoint

SEQUENCE_LENGTH = 24
HEADS = {"classification": "classifier", "tagging": "tagger", "span_qa": "span_logits"}
TASKS = {  # name -> (options, state)
    "classification": ({}, {"labels": ["negative", "positive"]}),
    "tagging": ({}, {"labels": ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]}),
    "span_qa": (
        {"version": "2.0", "max_query_length": 6, "doc_stride": 4, "n_best_size": 3},
        {"null_score_threshold": 0.5},
    ),
}
CONTEXTS = [
    "John Smith visited Paris in 1990 .",
    "The film was good and very funny, really; Zoë loved it.",
    "Anna met Renée Dupont at the café in New York and they talked about the weather for a "
    "long time before leaving.",
]
INPUTS = {
    "classification": [*CONTEXTS, "a warm , funny film"],
    "tagging": [*CONTEXTS, ["John", "Smith", "visited", "New", "York"]],
    "span_qa": [
        ["who visited paris?", CONTEXTS[0]],
        {"question": "who loved it?", "context": CONTEXTS[1], "n_best": 2},
        ["what did anna and renée talk about at the café?", CONTEXTS[2]],
    ],
}


def write_run(folder, name, data=None):
    """A finished run of task `name` with random weights (the head's times 30), as
    `finetune` leaves it."""
    options, state = TASKS[name]
    checkpoint = write_tiny_checkpoint(folder / "ckpt", hidden_size=16, intermediate_size=32)
    pretrained = load_pretrained(str(checkpoint), sequence_length=SEQUENCE_LENGTH)
    description = {"task": name, "options": options, "data": data or {}, "state": state}
    description["sequence_length"] = SEQUENCE_LENGTH
    task = build_task(description, pretrained.tokenizer, folder)
    model = task.build_model(pretrained.backbone)
    head = model.get_layer(HEADS[name])
    head.kernel.assign(head.kernel * 30.0)
    run = RunDirectory(folder / "run")
    save_architecture(pretrained, run.model_dir)
    run.write_task_description(task_description(task, SEQUENCE_LENGTH, 4, [SEQUENCE_LENGTH]))
    model.save_weights(run.weights_file)
    run.recipe_file.write_text("schema: 1\n")
    run.set_status(FINISHED)
    return run.path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (run, ONNX folder) of each task, exported by the command."""
    folders = {}
    for name in TASKS:
        folder = tmp_path_factory.mktemp(name)
        data = None
        if name == "classification":  # validation data for the int8 gate
            data = {
                "validation": str(write_sentiment_tsv(folder / "dev.tsv", 24)),
                "text": "sentence",
            }
        run_dir = write_run(folder, name, data)
        assert (
            main(["export", str(run_dir), "--out", str(folder / "onnx"), "--format", "onnx"]) == 0
        )
        folders[name] = (run_dir, folder / "onnx")
    return folders


FRESH_PROCESS = """
import json, sys
for name in ("tensorflow", "tensorflow_text", "keras", "keras_hub", "jax"):
    sys.modules[name] = None  # importing any of them fails
from bertkit.serving.onnx_runtime import OnnxModel
folders, inputs = json.loads(sys.stdin.read())
print(json.dumps({name: OnnxModel.load(folder).predict(inputs[name])
                  for name, folder in folders.items()}))
"""


def test_onnx_predictions_equal_predict_in_a_process_without_tensorflow(exported):
    folders = {name: str(folder) for name, (_, folder) in exported.items()}
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS],
        input=json.dumps([folders, INPUTS]),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout)
    for name, (run_dir, _) in exported.items():
        expected = FineTunedModel.load(run_dir).predict(INPUTS[name])
        assert_same_predictions(name, served[name], expected)


def assert_same_predictions(name, got: list, want: list) -> None:
    """Labels, tags, entities and answers equal; scores within float32 noise."""
    assert len(got) == len(want)
    for one, other in zip(got, want, strict=True):
        assert sorted(one) == sorted(other), name
        for key, value in other.items():
            if isinstance(value, float):
                assert one[key] == pytest.approx(value, abs=1e-4), (name, key)
            elif key in ("entities", "n_best"):
                assert [{**e, "score": 0} for e in one[key]] == [
                    {**e, "score": 0} for e in value
                ], (name, key)
                assert [e["score"] for e in one[key]] == pytest.approx(
                    [e["score"] for e in value], abs=1e-4
                )
            elif key == "probabilities":
                assert one[key] == pytest.approx(value, abs=1e-4)
            else:
                assert one[key] == value, (name, key)
    if name == "tagging":  # the constrained decoder found entities to compare
        assert any(p["entities"] for p in want)
    if name == "span_qa":  # windows: the last context is longer than one window
        assert any(p["answer"] for p in want)


def test_folder_files_and_metadata(exported):
    _, folder = exported["tagging"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "bertkit_onnx.json",
        "model.onnx",
        "tokenizer.json",
        "vocab.txt",
    ]
    values = json.loads((folder / "bertkit_onnx.json").read_text())
    assert values["opset"] == 17 and values["task"]["task"] == "tagging"
    assert values["task"]["state"]["labels"][0] == "O" and values["quantization"] is None
    import onnx

    model = onnx.load(str(folder / "model.onnx"))
    assert [i.name for i in model.graph.input] == ["padding_mask", "segment_ids", "token_ids"]
    assert [o.name for o in model.graph.output] == ["logits"]
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence"]
    assert any(o.domain in ("", "ai.onnx") and o.version == 17 for o in model.opset_import)


def test_tokenizer_gives_bertkits_pieces_and_pairs(exported):
    from bertkit.model.tokenizer import WordPieceTokenizer
    from bertkit.serving.onnx_tokenizer import PieceTokenizer

    run_dir, folder = exported["classification"]
    bertkit_tokenizer = WordPieceTokenizer.load(run_dir / "model")
    tokenizer = PieceTokenizer.load(folder)
    texts = [*CONTEXTS, "ﬁne ½ Ｆull-width ™ \u200b tabs\tand\x07bells", "naïve CAFÉ 東京"]
    pairs = [text[::-1] * 3 for text in texts]
    token_ids, segment_ids = bertkit_tokenizer.encode(texts, pairs, sequence_length=19)
    for i, (text, pair) in enumerate(zip(texts, pairs, strict=True)):
        first, second = (p.ids for p in tokenizer.pieces([text, pair]))
        ids, segments = tokenizer.pack([first, second], 19)
        assert ids.tolist() == token_ids[i].tolist(), text
        assert segments.tolist() == segment_ids[i].tolist(), text


def reuse_float_export(monkeypatch, folder) -> None:
    """The int8 exports below start from the fixture's float folder (a conversion is 10-20 s
    here): what they check is the quantizer and the gate."""
    copy = lambda model, directory: shutil.copytree(folder, directory, dirs_exist_ok=True)  # noqa: E731
    monkeypatch.setattr(onnx_export, "write_onnx_folder", copy)


def test_int8_export_passes_the_gate_and_records_it(exported, tmp_path, capsys, monkeypatch):
    run_dir, folder = exported["classification"]
    reuse_float_export(monkeypatch, folder)
    out = tmp_path / "int8"
    arguments = ["--format", "onnx", "--quantize", "int8", "--max-drop", "100"]
    assert main(["export", str(run_dir), "--out", str(out), *arguments]) == 0
    printed = capsys.readouterr().out
    assert "int8 within the budget of 100: passed" in printed and f"exported {out}" in printed
    record = json.loads((out / "bertkit_onnx.json").read_text())["quantization"]
    assert record["monitor"] == "accuracy" and record["budget_points"] == 100
    assert record["int8"]["size_bytes"] > 0 and record["float"]["size_bytes"] > 0
    assert record["int8"]["latency_p50_ms"] > 0 and record["float"]["latency_p50_ms"] > 0
    assert sorted(p.name for p in out.iterdir())[1] == "model.onnx"  # no float model left
    assert "QuantizeLinear" in {n.op_type.removeprefix("Dynamic") for n in _nodes(out)}


def _nodes(folder):
    import onnx

    return onnx.load(str(folder / "model.onnx")).graph.node


def test_int8_over_budget_is_refused_in_one_line(exported, tmp_path, capsys, monkeypatch):
    run_dir, folder = exported["classification"]
    reuse_float_export(monkeypatch, folder)
    evaluate = onnx_int8.evaluate_onnx
    monkeypatch.setattr(  # the int8 model as scored, minus 25 points of accuracy
        onnx_int8,
        "evaluate_onnx",
        lambda model, path: {"accuracy": evaluate(model, path)["accuracy"] - 0.25},
    )
    out = tmp_path / "int8"
    code = main(
        ["export", str(run_dir), "--out", str(out), "--format", "onnx", "--quantize", "int8"]
    )
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1, error
    assert (
        "int8 export refused: validation accuracy " in error and "over the budget of 0.5" in error
    )
    assert list(tmp_path.iterdir()) == []  # nothing written, no staging folder left


def test_unsupported_task_and_missing_extra_are_one_line(exported, tmp_path, capsys, monkeypatch):
    run_dir, _ = exported["tagging"]
    mlm = shutil.copytree(run_dir, tmp_path / "mlm-run")
    task_file = mlm / "model" / "task.json"
    task_file.write_text(json.dumps({**json.loads(task_file.read_text()), "task": "mlm"}))
    out = tmp_path / "out"
    assert main(["export", str(mlm), "--out", str(out), "--format", "onnx"]) == 2
    assert capsys.readouterr().err == (
        f"bertkit: error: {mlm}: a mlm model has no ONNX export (bertkit decodes ONNX logits "
        "for classification, tagging, span_qa); export it as a SavedModel (without --format)\n"
    )
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tf2onnx" else find_spec(name, *a),
    )
    assert main(["export", str(run_dir), "--out", str(out), "--format", "onnx"]) == 2
    assert capsys.readouterr().err == (
        "bertkit: error: --format onnx needs the onnx extra (missing: tf2onnx): "
        "pip install 'bertkit[onnx]'\n"
    )
    assert not out.exists()


@pytest.mark.parametrize("scheme", ["iob2", "bioes"])
def test_viterbi_chooses_bertkits_tags(scheme):
    """On random sentences, and on sentences full of ties, the NumPy Viterbi picks what
    bertkit's (tf-text's) does."""
    import tensorflow as tf

    from bertkit.serving.onnx_decoding import viterbi_tags
    from bertkit_tasks.tagging.decoding import choose_tags
    from bertkit_tasks.tagging.schemes import allowed_transitions

    prefixes = "BIES" if scheme == "bioes" else "BI"
    labels = ["O", *(f"{p}-{t}" for t in ("PER", "LOC") for p in prefixes)]
    allowed = allowed_transitions(labels, scheme)
    rng = np.random.default_rng(0)
    sentences = []
    for count in rng.integers(0, 7, 200):
        ties = rng.choice([0.1, 0.2, 0.3], size=(count, len(labels)))
        p = ties if len(sentences) % 2 else rng.dirichlet(np.full(len(labels), 0.3), count)
        sentences.append((p / p.sum(axis=1, keepdims=True)).reshape(count, len(labels)))
    batch = tf.RaggedTensor.from_row_lengths(
        np.concatenate(sentences).astype(np.float32), [len(p) for p in sentences]
    )
    expected = choose_tags(batch, allowed).to_list()
    assert [viterbi_tags(p, allowed).tolist() for p in sentences] == expected


SERVE_WITHOUT_TENSORFLOW = """
import sys
for name in ("tensorflow", "tensorflow_text", "keras", "keras_hub", "jax"):
    sys.modules[name] = None  # importing any of them fails
from bertkit.cli import main
sys.exit(main(["serve", sys.argv[1], "--port", "0"]))
"""


def test_bertkit_serve_answers_from_an_onnx_folder_without_tensorflow(exported):
    """`bertkit serve ONNX_DIR` in a process where TensorFlow cannot be imported: requests
    sent together (batched into shared onnxruntime calls) get `predict`'s answers, a bad
    input is a 422 and the server answers on, /metadata names the folder's task."""
    import concurrent.futures
    import functools

    for name, (run_dir, folder) in exported.items():
        server = subprocess.Popen(
            [sys.executable, "-c", SERVE_WITHOUT_TENSORFLOW, str(folder)],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = server.stderr.readline()
            assert "http://" in line, line + server.stderr.read()
            host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
            post = functools.partial(_request, (host, int(port)), "POST", "/predict")
            with concurrent.futures.ThreadPoolExecutor(len(INPUTS[name])) as clients:
                bodies = [{"inputs": [value]} for value in INPUTS[name]]
                answers = list(clients.map(post, bodies))
            assert all(status == 200 for status, _ in answers)
            served = [body["predictions"][0] for _, body in answers]
            assert_same_predictions(
                name, served, FineTunedModel.load(run_dir).predict(INPUTS[name])
            )
            status, body = post({"inputs": ["   "]})
            assert status == 422 and body == {"error": "input 1: empty input"}
            metadata = _request((host, int(port)), "GET", "/metadata")[1]
            assert (
                metadata["task"] == name and metadata["model_card"]["format"] == "onnx (opset 17)"
            )
            assert post({"inputs": [INPUTS[name][0]]})[0] == 200  # still serving
        finally:
            server.send_signal(subprocess.signal.SIGTERM)
            server.communicate(timeout=60)


def _request(address, method: str, path: str, body=None) -> tuple:
    import http.client

    connection = http.client.HTTPConnection(*address, timeout=60)
    connection.request(method, path, None if body is None else json.dumps(body))
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_onnx_service_batches_requests_as_predict_answers_each(exported):
    """Several requests' rows in one onnxruntime call: each request gets what
    `OnnxModel.predict` gives it alone (tagging and span QA with windows)."""
    from bertkit.serving.onnx_service import OnnxService

    for name, (_, folder) in exported.items():
        service = OnnxService.load(folder)
        requests = [service.prepare(service.parse_inputs([v])) for v in INPUTS[name]]
        requests.append(service.prepare([]))
        outputs = service.run_prepared(requests, batch_size=64)
        together = [service.finish(r, o) for r, o in zip(requests, outputs, strict=True)]
        assert together[-1] == [] and [r.rows for r in requests[:-1]] == [
            len(service.model.featurize(service.parse_inputs([v]))) for v in INPUTS[name]
        ]
        alone = [service.model.predict([v]) for v in INPUTS[name]]
        for got, want in zip(together[:-1], alone, strict=True):
            assert got == want


def test_punctuation_normalizing_tokenizer_needs_no_tensorflow():
    """`normalize_punctuation` (the quickstart's checkpoint has it on) builds its table from
    BERT's character normalization, which once came with TensorFlow's normalizer module."""
    script = (
        "import sys\n"
        "for name in ('tensorflow', 'tensorflow_text', 'keras', 'keras_hub', 'jax'):\n"
        "    sys.modules[name] = None\n"
        "from bertkit.serving.onnx_tokenizer import PieceTokenizer\n"
        "vocabulary = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '\"', '.', 'oh']\n"
        "tokenizer = PieceTokenizer(vocabulary, lowercase=True, normalize_punctuation=True)\n"
        "print([vocabulary[i] for i in tokenizer.pieces(['“Oh…”'])[0].ids])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['\"', 'oh', '.', '.', '.', '\"']"
