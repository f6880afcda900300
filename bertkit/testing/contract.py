"""The contract test of a task plugin: one call checks it end to end on a tiny random
backbone, as the core drives it, in the spirit of keras-hub's `run_task_test`.

`run_task_contract_test` checks, in order, that:

1. the task resolves through the `bertkit.tasks` entry point and reads `train_file`;
2. `featurize` gives rows with `token_ids` and `segment_ids` of at most
   `sequence_length` word pieces; for a task with a preprocessor
   (`Task.preprocessor`), its Python and TensorFlow paths make the same rows
   for `inputs` (`check_preprocessor`);
3. a few `fit` steps on one repeated batch (`make_batch`, `loss`) lower the loss;
4. `bertkit.finetune` writes a run and a SavedModel;
5. predictions for the raw `inputs` in one batch equal those of each input
   featurized and decoded alone (padding and batching change nothing);
6. the SavedModel, in a fresh process with only TensorFlow and tf-text, agrees
   with `predict`;
7. `bad_input` is refused with a `UserError`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

import bertkit
from bertkit.testing.preprocessor_check import check_preprocessor, default_serving_inputs
from bertkit.testing.serving import serve_in_fresh_process
from bertkit.testing.tiny import write_tiny_checkpoint

_SCALARS = (str, int, float, bool)


def run_task_contract_test(
    task,
    train_file,
    *,
    inputs: list,
    bad_input,
    serving_inputs=None,
    compare=None,
    task_options: dict | None = None,
    data: dict | None = None,
    training: dict | None = None,
    sequence_length: int = 32,
    directory=None,
    fit_steps: int = 10,
    atol: float = 1e-4,
) -> dict:
    """Checks a task plugin end to end on a tiny random backbone, as the core drives it:
    the seven checks in this module's docstring.

    Args:
        task: a registered task name, or its class.
        train_file: a small labelled file in a format the task reads.
        inputs: raw inputs `FineTunedModel.predict` takes (texts, pairs, dicts).
        bad_input: an input the task must refuse with `UserError`.
        serving_inputs: name -> list of strings, the same inputs as the SavedModel
            takes them; default: `inputs` under the signature's only name.
        compare: `compare(predictions, served)` asserts that the SavedModel's
            outputs (name -> list) agree with `predict`'s; default: every output
            named like a prediction key is equal (numbers within `atol`).
        task_options, data, training: recipe `task:`, `data:` and `training:` keys
            beyond the defaults (one epoch, batch size 8).
        sequence_length: the tiny backbone's sequence length.
        directory: where to write the checkpoint and the run (default: a temporary folder).
        fit_steps: steps of the repeated-batch fit.

    Returns:
        `{"run_dir": Path, "predictions": [...], "served": {...}, "preprocessor": [...]}`
        for further checks (`preprocessor`: the names `check_preprocessor` compared).
    """
    name = _registered_name(task)
    directory = Path(directory or tempfile.mkdtemp(prefix=f"bertkit-contract-{name}-"))
    recipe = _contract_recipe(
        name,
        train_file,
        directory,
        sequence_length,
        task_options=task_options,
        data=data,
        training=training,
    )
    serving_inputs, compared = _check_before_the_run(
        recipe, inputs, serving_inputs, sequence_length, fit_steps
    )  # 1-3
    model = bertkit.finetune(recipe, output_dir=directory / "run", verbose=0)  # 4
    predictions = _check_batched_predictions(model, inputs, atol)  # 5
    served = serve_in_fresh_process(directory / "run" / "saved_model", serving_inputs)  # 6
    (compare or _default_compare(atol))(predictions, served)
    _check_refuses(model, bad_input)  # 7
    return {
        "run_dir": directory / "run",
        "predictions": predictions,
        "served": served,
        "preprocessor": compared,
    }


# ---------------------------------------------------------------- the recipe
def _registered_name(task) -> str:
    """The name `task` is registered under; a class must be the one registered."""
    from bertkit.registry import load_task

    name = task if isinstance(task, str) else task.name
    task_class = load_task(name)
    assert isinstance(task, str) or task_class is task, f"'{name}' names another class"
    return name


def _contract_recipe(
    name: str,
    train_file,
    directory: Path,
    sequence_length: int,
    *,
    task_options: dict | None,
    data: dict | None,
    training: dict | None,
) -> dict:
    """The recipe of the test: a one-layer random checkpoint written under `directory`."""
    return {
        "schema": 1,
        "task": {"name": name, **(task_options or {})},
        "backbone": {
            "preset": str(write_tiny_checkpoint(directory / "ckpt", num_layers=1)),
            "sequence_length": sequence_length,
        },
        "data": {"train": str(train_file), **(data or {})},
        "training": {"epochs": 1, "batch_size": 8, "learning_rate": 3e-3, **(training or {})},
    }


# ---------------------------------------------------------------- 1-3: before the run
def _check_before_the_run(
    recipe: dict, inputs: list, serving_inputs: dict | None, sequence_length: int, fit_steps: int
) -> tuple[dict, list[str]]:
    """Checks 1-3: read, featurize (both paths of a preprocessor), fit on one repeated
    batch. Returns the serving inputs (defaulted) and the names `check_preprocessor`
    compared."""
    trainer, examples, backbone = _contract_task(recipe)
    features = _check_features(trainer, examples, sequence_length)
    if serving_inputs is None:
        serving_inputs = default_serving_inputs(trainer, inputs)
    compared = check_preprocessor(trainer, inputs, serving_inputs)
    _check_fit_lowers_the_loss(trainer, backbone, features, fit_steps)
    return serving_inputs, compared


def _contract_task(recipe: dict):
    from bertkit.model.backbone import load_pretrained
    from bertkit.recipes.recipe import load_recipe
    from bertkit.training.task_data import make_task

    loaded = load_recipe(recipe)
    pretrained = load_pretrained(
        loaded.backbone.preset, sequence_length=loaded.backbone.sequence_length
    )
    reader = make_task(loaded)
    examples = reader.read(loaded.data.train)
    assert examples, "read returned no examples"
    task = make_task(loaded, tokenizer=pretrained.tokenizer, state=reader.fit_state(examples))
    return task, examples, pretrained.backbone


def _check_features(task, examples: list, sequence_length: int):
    features = task.featurize(examples, training=True)
    assert len(features) > 0, "featurize gave no rows"
    assert {"token_ids", "segment_ids"} <= set(features.columns), sorted(features.columns)
    assert features.lengths().max() <= sequence_length, "a row is longer than sequence_length"
    assert len(features.example_index) == len(features)
    return features


def _check_fit_lowers_the_loss(task, backbone, features, steps: int) -> None:
    import keras

    from bertkit.padding import pad_batch

    batch = pad_batch(features, np.arange(min(8, len(features))), (features.lengths().max(),))
    inputs, targets, weights = task.make_batch(batch, training=True, rng=np.random.default_rng(0))
    model = task.build_model(backbone)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=task.loss())
    size = len(batch["token_ids"])

    def loss() -> float:  # without dropout, so that the comparison is not noise
        return model.evaluate(inputs, targets, sample_weight=weights, batch_size=size, verbose=0)

    before = loss()
    model.fit(
        inputs,
        targets,
        sample_weight=weights,
        epochs=steps,
        batch_size=size,
        shuffle=False,
        verbose=0,
    )
    after = loss()
    assert after < before, f"the loss did not go down on one repeated batch: {before} -> {after}"


# ---------------------------------------------------------------- 5-7: the run
def _check_batched_predictions(model, inputs: list, atol: float) -> list:
    """Check 5: `predict` on `inputs` in one batch equals `predict` on each alone."""
    predictions = model.predict(inputs)
    alone = [model.predict([value], batch_size=1)[0] for value in inputs]
    _assert_close(predictions, alone, atol, "predict in a batch vs alone")
    return predictions


def _default_compare(atol: float):
    """Check 6 by default: every SavedModel output named like a plain prediction value."""

    def compare(predictions: list[dict], served: dict) -> None:
        shared = [key for key in served if isinstance(predictions[0].get(key), _SCALARS)]
        assert shared, (
            f"no SavedModel output ({', '.join(served)}) is named like a "
            f"plain prediction value ({', '.join(predictions[0])}); pass compare="
        )
        for key in shared:
            _assert_close([p[key] for p in predictions], served[key], atol, f"output '{key}'")

    return compare


def _check_refuses(model, bad_input) -> None:
    """Check 7: `bad_input` is the user's error."""
    from bertkit.errors import UserError

    try:
        model.predict([bad_input])
    except UserError:
        pass
    else:
        raise AssertionError(f"{bad_input!r} was accepted; expected a UserError")


# ---------------------------------------------------------------- comparing outputs
def _assert_close(expected, got, atol: float, what: str) -> None:
    """Equal structures and texts; numbers within `atol`."""
    np.testing.assert_equal(_strings(got), _strings(expected), err_msg=what)
    np.testing.assert_allclose(_numbers(got), _numbers(expected), atol=atol, err_msg=what)


def _strings(value):
    """Nested structures with floats rounded away, to compare everything else exactly."""
    if isinstance(value, dict):
        return {key: _strings(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strings(item) for item in value]
    return "<number>" if isinstance(value, float) else value


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [number for item in value.values() for number in _numbers(item)]
    if isinstance(value, (list, tuple)):
        return [number for item in value for number in _numbers(item)]
    return [float(value)] if isinstance(value, (int, float)) else []
