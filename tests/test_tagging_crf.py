"""Tagging's CRF head (`task.head: crf`): the loss and Viterbi decoding against brute force,
the loss and its gradient on JAX, and one tiny trained run: evaluated, exported (the
SavedModel's entities are `predict`'s), loaded back. (tests/test_tagging.py serves a tagging
SavedModel in a fresh process; here it is loaded in this one, to keep the file fast.)"""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bertkit.errors import UserError
from bertkit.model.tokenizer import WordPieceTokenizer
from bertkit.testing import tiny_vocabulary, write_tiny_checkpoint
from bertkit_tasks.tagging import TaggingData, TaggingOptions, TaggingTask
from bertkit_tasks.tagging.crf import CrfLoss, TransitionScores, crf_negative_log_likelihood
from bertkit_tasks.tagging.decoding import choose_tags
from bertkit_tasks.tagging.schemes import allowed_transitions
from tests.test_tagging import same_entities, write_conll

IGNORED = -100


# ---------------------------------------------------------------- numpy references
def sequence_score(tags, emissions, transitions) -> float:
    """A tag sequence's CRF score: emissions, start (row L), neighbours, end (column L)."""
    edge = len(transitions) - 1
    path = [edge, *tags, edge]
    return sum(emissions[t, tag] for t, tag in enumerate(tags)) + sum(
        transitions[a, b] for a, b in zip(path, path[1:], strict=False)
    )


def brute_force_nll(row_tags, row_emissions, transitions) -> float:
    """`-log p(tags)` by enumerating every sequence over the row's labelled positions."""
    labelled = [t for t, tag in enumerate(row_tags) if tag >= 0]
    if not labelled:
        return 0.0
    tags, emissions = [row_tags[t] for t in labelled], row_emissions[labelled]
    num_labels = emissions.shape[1]
    scores = [
        sequence_score(seq, emissions, transitions)
        for seq in itertools.product(range(num_labels), repeat=len(tags))
    ]
    return float(np.logaddexp.reduce(scores) - sequence_score(tags, emissions, transitions))


def random_batch(seed: int, rows=4, length=6, num_labels=3):
    rng = np.random.default_rng(seed)
    tags = rng.integers(0, num_labels, (rows, length))
    tags[rng.random((rows, length)) < 0.4] = IGNORED  # unlabelled pieces, anywhere
    tags[-1] = IGNORED  # a row without labels (a filler row, an unlabelled window)
    emissions = rng.normal(0, 2, (rows, length, num_labels)).astype("float32")
    transitions = rng.normal(0, 2, (num_labels + 1, num_labels + 1)).astype("float32")
    return tags, emissions, transitions


# ---------------------------------------------------------------- the loss
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_is_the_brute_force_negative_log_likelihood(seed):
    tags, emissions, transitions = random_batch(seed)
    got = np.asarray(crf_negative_log_likelihood(tags, emissions, transitions))
    want = [brute_force_nll(t, e, transitions) for t, e in zip(tags, emissions, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got[-1] == 0.0 and (got[:-1] > 0).all()


def test_loss_shares_each_row_over_its_labelled_pieces_and_takes_the_weights():
    tags, emissions, transitions = random_batch(3)
    layer = TransitionScores(3)
    layer.transitions.assign(transitions)
    labelled = (tags >= 0).astype("float32")
    weights = labelled * np.random.default_rng(0).uniform(0.5, 2.0, tags.shape)  # class weights
    nll = [brute_force_nll(t, e, transitions) for t, e in zip(tags, emissions, strict=True)]
    counts = np.maximum(labelled.sum(1), 1)
    want = sum(weights[r] @ labelled[r] * nll[r] / counts[r] for r in range(len(tags)))
    got = float(CrfLoss(layer)(tags, emissions, sample_weight=weights))
    np.testing.assert_allclose(got, want / tags.size, rtol=1e-5)


JAX_FIT = """
import json, sys
import numpy as np, keras
assert keras.backend.backend() == "jax"
from bertkit_tasks.tagging.crf import CrfLoss, TransitionScores
data = json.loads(sys.argv[1])
features, tags = np.array(data["features"], "float32"), np.array(data["tags"])
inputs = keras.Input(features.shape[1:])
dense = keras.layers.Dense(3, name="tagger")
layer = TransitionScores(3, name="crf")
model = keras.Model(inputs, layer(dense(inputs)))
dense.set_weights([np.array(data["kernel"], "float32"), np.zeros(3, "float32")])
model.compile(keras.optimizers.Adam(0.1), CrfLoss(layer), jit_compile=True)
weights = (tags >= 0).astype("float32")
# one batch an epoch: an epoch's loss is the loss before its update (the first: at the start)
fit = model.fit(features, tags, sample_weight=weights, epochs=30, batch_size=len(tags), verbose=0)
before, after = fit.history["loss"][0], fit.history["loss"][-1]
print(json.dumps({"before": before, "after": after,
                  "transitions": keras.ops.convert_to_numpy(layer.transitions).tolist()}))
"""


def test_on_jax_the_loss_is_the_reference_and_trains_the_transitions():
    pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(8, 6, 4)).astype("float32")  # noise: only transitions help
    tags = np.tile([0, 1, 2, 0, 1, 2], (8, 1))  # 0 -> 1 -> 2 -> 0 ...
    tags[:, 2] = IGNORED  # a continuation piece: the CRF links positions 1 and 3
    kernel = rng.normal(0, 0.1, (4, 3)).astype("float32")
    data = {"features": features.tolist(), "tags": tags.tolist(), "kernel": kernel.tolist()}
    result = subprocess.run(
        [sys.executable, "-c", JAX_FIT, json.dumps(data)],
        env={**os.environ, "KERAS_BACKEND": "jax"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    zero = np.zeros((4, 4))
    nll = [brute_force_nll(t, e, zero) for t, e in zip(tags, features @ kernel, strict=True)]
    labelled = (tags >= 0).sum()  # the loss is per labelled piece (weights 1 here)
    np.testing.assert_allclose(out["before"], sum(nll) / tags.size, rtol=1e-4)
    assert labelled < tags.size and out["after"] < out["before"] / 3
    learned = np.array(out["transitions"])
    assert learned[0, 1] > learned[0, 2] and learned[1, 0] > learned[1, 1]  # 0->1, 1->(2)->0
    assert learned[3, 0] == learned[3].max()  # every sentence starts with 0


# ---------------------------------------------------------------- decoding
LABELS = ["O", "B-PER", "I-PER"]


def brute_force_path(log_probabilities, allowed, transitions) -> list[int]:
    best, edge = None, len(LABELS)
    for seq in itertools.product(range(edge), repeat=len(log_probabilities)):
        path = [edge, *seq, edge]
        if not all(allowed[a, b] for a, b in zip(path, path[1:], strict=False)):
            continue
        score = sequence_score(seq, log_probabilities, transitions)
        if best is None or score > best[0]:
            best = (score, list(seq))
    return best[1]


def ragged(probabilities):
    return tf.RaggedTensor.from_row_lengths(
        np.concatenate(probabilities).astype("float32"), [len(p) for p in probabilities]
    )


def test_decoding_with_zero_transitions_is_constrained_decoding():
    rng = np.random.default_rng(0)
    sentences = [rng.dirichlet(np.ones(3), size=n) for n in (1, 4, 5, 3)]
    allowed = allowed_transitions(LABELS, "iob2")
    assert (
        choose_tags(ragged(sentences), allowed, np.zeros((4, 4))).to_list()
        == choose_tags(ragged(sentences), allowed).to_list()
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_decoding_adds_the_learned_transitions_as_brute_force_says(seed):
    rng = np.random.default_rng(seed)
    sentences = [rng.dirichlet(np.ones(3), size=n) for n in (2, 4, 5)]
    transitions = rng.normal(0, 2, (4, 4)).astype("float32")
    transitions[0, 0] = 4.0  # O after O: strong enough to change paths
    allowed = allowed_transitions(LABELS, "iob2")
    got = choose_tags(ragged(sentences), allowed, transitions).to_list()
    assert got == [brute_force_path(np.log(p), allowed, transitions) for p in sentences]
    assert got != choose_tags(ragged(sentences), allowed).to_list()
    free = np.ones((4, 4), bool)  # `decoding: argmax`: the learned scores, no scheme mask
    assert choose_tags(ragged(sentences), None, transitions).to_list() == [
        brute_force_path(np.log(p), free, transitions) for p in sentences
    ]


# ---------------------------------------------------------------- options
def crf_task(**options) -> TaggingTask:
    tokenizer = WordPieceTokenizer(tiny_vocabulary(), lowercase=True)
    return TaggingTask(TaggingOptions(**options), TaggingData(), tokenizer, 16, {"labels": ["O"]})


def test_options_that_contradict_the_crf_head_are_refused():
    with pytest.raises(UserError, match="label_all_subtokens would link a word's pieces"):
        crf_task(head="crf", label_all_subtokens=True)
    with pytest.raises(UserError, match="only head: crf has transition scores") as error:
        crf_task(crf_learning_rate=0.01)
    assert error.value.key == "task.crf_learning_rate"
    assert TaggingOptions().head == "softmax"  # runs saved before the option: softmax


# ---------------------------------------------------------------- one tiny trained run
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One CRF run for the tests below: trained, evaluated, exported, loaded back."""
    import bertkit

    tmp = tmp_path_factory.mktemp("crf")
    write_conll(tmp / "train.txt", 160, seed=0)
    write_conll(tmp / "dev.txt", 24, seed=1)
    recipe = {
        "schema": 1,
        "task": {"name": "tagging", "head": "crf", "crf_learning_rate": 0.05},
        "backbone": {
            "preset": str(write_tiny_checkpoint(tmp / "ckpt", num_layers=1)),
            "sequence_length": 32,
        },
        "data": {"train": "train.txt", "validation": "dev.txt", "scheme": "iob1"},
        "training": {"epochs": 3, "batch_size": 16, "learning_rate": 5e-3},
    }
    (tmp / "crf.yaml").write_text(json.dumps(recipe))
    bertkit.finetune(str(tmp / "crf.yaml"), output_dir=tmp / "run", verbose=0)
    return tmp, bertkit.load(tmp / "run")


def test_a_crf_run_learns_transitions_and_decodes_with_them(run):
    tmp, model = run
    task = model.task
    assert task.options.head == "crf" and task.labels == ["O", "B-LOC", "B-ORG", "I-ORG", "B-PER"]
    final = json.loads((tmp / "run" / "metrics.json").read_text())["final"]["validation"]
    assert final["f1"] > 0.5, final
    transitions = task.transitions(model.model)
    o, b_org, i_org = (task.labels.index(tag) for tag in ("O", "B-ORG", "I-ORG"))
    assert transitions[b_org, i_org] > transitions[o, i_org]  # acme corp: B-ORG I-ORG
    np.testing.assert_array_equal(transitions, task.transitions())  # decode's: the same


def test_the_saved_model_finds_the_entities_predict_finds(run):
    tmp, model = run
    texts = ["Mr Smith visited Paris.", "mr ann in rome and acme corp", "the film was ok"]
    signature = tf.saved_model.load(str(tmp / "run" / "saved_model")).signatures
    served = signature["serving_default"](text=tf.constant(texts))
    served = {key: value.numpy().tolist() for key, value in served.items()}
    for key in ("entity_type", "entity_text"):
        served[key] = [[value.decode() for value in row] for row in served[key]]
    same_entities(model.predict(texts), served)


def test_the_crf_transitions_train_as_head_weights_at_their_own_rate(run):
    from bertkit.model.backbone import load_pretrained
    from bertkit.recipes.sections import TrainingConfig
    from bertkit.training.optimization import head_variables, make_optimizer

    tmp, model = run
    backbone = load_pretrained(str(tmp / "ckpt"), sequence_length=32).backbone
    built = model.task.build_model(backbone)
    layer = built.get_layer("crf")
    head = head_variables(built, backbone)  # LoRA keeps these trainable (the head's)
    assert [v.path for v in head] == ["tagger/kernel", "tagger/bias", "crf/transitions"]
    training = TrainingConfig(learning_rate=1e-3, head_learning_rate=1e-2)
    optimizer = make_optimizer(training, 10, head, model.task.learning_rates(built))
    assert float(optimizer._learning_rate_of(layer.transitions, 1.0)) == pytest.approx(50.0)
    assert float(optimizer._learning_rate_of(head[0], 1.0)) == pytest.approx(10.0)


def test_the_transformers_export_says_the_transitions_are_dropped(run):
    _, model = run
    head = model.task.transformers_head()
    assert "CRF head's learned transition scores" in head.not_represented[0]
    assert head.settings["head"] == "crf"


def test_packing_is_refused_with_head_crf(run):
    from bertkit.recipes.recipe import load_recipe

    tmp, _ = run
    recipe = {
        "schema": 1,
        "task": {"name": "tagging", "head": "crf"},
        "backbone": {"preset": str(tmp / "ckpt"), "sequence_length": 32},
        "data": {"train": str(tmp / "train.txt")},
        "training": {"packing": True, "batch_order": "random"},
    }
    with pytest.raises(UserError, match=r"cannot pack rows \(packing: true\): with head: crf"):
        load_recipe(recipe)
