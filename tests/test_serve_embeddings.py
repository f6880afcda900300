"""`bertkit serve` on an embedding run: TEI's `POST /embed` and OpenAI's `POST /v1/embeddings`
give `predict`'s vectors, and their bad requests are a 4xx while the server serves on."""

import base64
import json

import numpy as np
import pytest

import bertkit
from bertkit.testing import write_tiny_checkpoint
from tests.test_embedding_task import write_pairs
from tests.test_serve import ServerThread

TEXTS = ["the good film", "a dull meal", "funny story of paris"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_embeddings")
    write_tiny_checkpoint(folder / "ckpt")
    bertkit.finetune(
        {
            "schema": 1,
            "task": "embedding",
            "backbone": {"preset": str(folder / "ckpt"), "sequence_length": 16},
            "data": {"train": str(write_pairs(folder / "pairs.tsv", 32))},
            "training": {"epochs": 1, "batch_size": 8, "learning_rate": 1e-3},
            "export": {"saved_model": False},
            "output_dir": str(folder / "run"),
        }
    )
    return folder / "run"


@pytest.fixture(scope="module")
def server(run):
    started = ServerThread(run)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def expected(run):
    model = bertkit.load(run)
    return model, np.array([p["embedding"] for p in model.predict(TEXTS)], np.float32)


def post(server, path, body):
    status, answer = server.request("POST", path, json.dumps(body))
    return status, json.loads(answer)


def test_embed_answers_predicts_vectors_as_tei_does(server, expected):
    _, vectors = expected
    status, raw = post(server, "/embed", {"inputs": TEXTS, "normalize": False})
    assert status == 200
    np.testing.assert_allclose(raw, vectors, atol=1e-5)
    status, unit = post(server, "/embed", {"inputs": TEXTS[0]})  # TEI normalizes by default
    assert status == 200 and len(unit) == 1
    np.testing.assert_allclose(unit[0], vectors[0] / np.linalg.norm(vectors[0]), atol=1e-5)
    assert post(server, "/embed/", {"inputs": "x"})[0] == 200


def test_openai_embeddings_in_float_and_base64(server, expected):
    model, vectors = expected
    status, answer = post(server, "/v1/embeddings", {"input": TEXTS, "model": "mine"})
    assert status == 200 and answer["object"] == "list" and answer["model"] == "mine"
    assert [item["index"] for item in answer["data"]] == [0, 1, 2]
    np.testing.assert_allclose([item["embedding"] for item in answer["data"]], vectors, atol=1e-5)
    token_ids, _ = model.task.tokenizer.encode(TEXTS, sequence_length=16)
    assert answer["usage"] == {"prompt_tokens": sum(map(len, token_ids))} | {
        "total_tokens": sum(map(len, token_ids))
    }
    status, packed = post(
        server, "/v1/embeddings", {"input": "the good film", "encoding_format": "base64"}
    )
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), "<f4")
    assert status == 200 and packed["model"] == "run"  # the run's name when none is asked
    np.testing.assert_allclose(decoded, vectors[0], atol=1e-5)


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        (
            "/embed",
            {"texts": ["a"]},
            400,
            "unknown field 'texts'; expected 'inputs', 'normalize', 'truncate'",
        ),
        ("/embed", {"inputs": []}, 400, "'inputs' must be a text or a non-empty list of texts"),
        ("/embed", {"inputs": ["a", 7]}, 422, "input 2: expected a text, got a number"),
        ("/embed", {"inputs": ["a", "  "]}, 422, "input 2: empty input"),
        (
            "/embed",
            {"inputs": "a", "normalize": "yes"},
            400,
            "'normalize' must be true or false, got a text",
        ),
        ("/v1/embeddings", {"model": "m"}, 400, "missing field 'input': a text or a list of texts"),
        ("/v1/embeddings", {"input": [[101, 102]]}, 422, "input 1: expected a text, got a list"),
        (
            "/v1/embeddings",
            {"input": "a", "encoding_format": "hex"},
            400,
            "'encoding_format' must be 'float' or 'base64', got 'hex'",
        ),
        (
            "/v1/embeddings",
            {"input": "a", "dimensions": 8},
            400,
            "'dimensions': this model's vectors have 32, got 8",
        ),
    ],
)
def test_bad_requests_are_a_4xx_and_the_server_serves_on(server, path, body, status, message):
    assert post(server, path, body) == (status, {"error": message})
    assert post(server, path, {"inputs" if path == "/embed" else "input": "ok"})[0] == 200


class EncoderServerThread(ServerThread):
    """`serve(SOURCE, embed=True)`: a preset served without a run."""

    def _serve(self, source, options):
        from bertkit.serving.server import ServeOptions, serve

        try:
            serve(source, ServeOptions(port=0, **options), ready=self._started, embed=True)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            self.failed = error
            self.ready.set()


def test_any_preset_is_served_as_an_encoder_with_embed(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt")
    server = EncoderServerThread(folder)
    try:
        vectors = bertkit.embed(folder, TEXTS)  # a plain checkpoint: mean pooling, as is
        status, raw = post(server, "/embed", {"inputs": TEXTS, "normalize": False})
        assert status == 200
        np.testing.assert_allclose(raw, vectors, atol=1e-5)
        status, answer = post(server, "/v1/embeddings", {"input": TEXTS[:1]})
        assert status == 200 and answer["model"] == "ckpt"
        np.testing.assert_allclose(answer["data"][0]["embedding"], vectors[0], atol=1e-5)
        status, predicted = post(server, "/predict", {"inputs": TEXTS[1:2]})
        np.testing.assert_allclose(predicted["predictions"][0]["embedding"], vectors[1], atol=1e-5)
        status, about = server.request("GET", "/metadata")
        about = json.loads(about)
        assert (about["task"], about["pooling"], about["dimension"]) == ("embedding", "mean", 32)
        assert post(server, "/embed", {"inputs": ["ok", ""]}) == (
            422,
            {"error": "input 2: empty input"},
        )
    finally:
        server.stop()
