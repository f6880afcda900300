"""A fine-tuned model loaded from its run directory: predict, evaluate, export."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bertkit.errors import UserError
from bertkit.files import MAX_INPUT_CHARACTERS, MAX_REQUEST_CHARACTERS, arriving_chunks
from bertkit.model.backbone import load_architecture
from bertkit.model.feature_layers import with_feature_layers
from bertkit.model.lora import enable_lora, merged_model
from bertkit.progress import CountProgress
from bertkit.recipes import schema
from bertkit.report import write_task_report
from bertkit.run_dir import RunDirectory, read_json
from bertkit.serving import inputs as checks
from bertkit.serving import prepared
from bertkit.serving.inference import predict_examples
from bertkit.serving.run_task import build_task  # noqa: F401 (public here too)


def task_description(task, sequence_length: int, batch_size: int, buckets) -> dict:
    """What `model/task.json` holds: enough to rebuild the task without the recipe."""
    return {
        "task": task.name,
        "options": schema.to_plain(task.options),
        "data": schema.to_plain(task.data),
        "state": task.state,
        "sequence_length": sequence_length,
        "batch_size": batch_size,
        "bucket_lengths": list(buckets),
    }


class FineTunedModel:
    """A trained task model; get one with `bertkit.load(run_dir)` or from `bertkit.finetune`.

    Example:
        >>> model = bertkit.load("runs/quickstart")           # doctest: +SKIP
        >>> model.predict(["a warm, funny film"])[0]["label"]  # doctest: +SKIP
        'positive'
    """

    def __init__(self, run: RunDirectory, task, model, description: dict):
        self.run, self.task, self.description = run, task, description
        features = description.get("features")
        self.model = merged_model(task, model, run.model_dir, features)  # LoRA: served merged

    @classmethod
    def load(cls, run_dir) -> FineTunedModel:
        run = RunDirectory.open(run_dir)
        description = read_json(run.task_file, "task description")
        pretrained = load_architecture(run.model_dir)
        task = build_task(description, pretrained.tokenizer, run.task_file)
        features = description.get("features")
        model = task.build_model(with_feature_layers(pretrained.backbone, features))
        enable_lora(model, pretrained.backbone, description.get("lora"), description)
        try:
            model.load_weights(run.weights_file)
        except (OSError, ValueError) as error:  # h5py's errors for a truncated file
            problem = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UserError(
                f"cannot read the model weights (truncated or corrupt file?): {problem}",
                source=run.weights_file,
            ) from None
        pretrained.tokenizer.trace_repeated_calls()  # a loaded model serves many small calls
        return cls(run, task, model, description)

    @property
    def buckets(self) -> tuple:
        """The widths this model's inference batches are padded to (see `padding_lengths`)."""
        from bertkit.padding import compiles_each_shape, padding_lengths

        return padding_lengths(
            tuple(self.description["bucket_lengths"]), compiles_each_shape(self.model)
        )

    @property
    def takes_text_pairs(self) -> bool:
        """Whether every input must be a pair of texts (a premise-hypothesis classifier,
        span QA): the task takes a [text, text] pair but not a single text."""
        return checks.takes_text_pairs(self.task)

    @property
    def accepts_text_pairs(self) -> bool:
        """Whether a [text, text] pair is an input this model takes."""
        return checks.parses(self.task, ["text", "text"])

    def predict(
        self,
        inputs,
        batch_size: int | None = None,
        *,
        errors: str = "raise",
        max_input_characters: int = MAX_INPUT_CHARACTERS,
    ) -> list[dict]:
        """Predictions for raw inputs: texts, text pairs or dicts, as the task takes them.

        Args:
            inputs: a list of inputs; a single string is one input.
            batch_size: rows per model call (default: twice the training batch size).
            errors: what an invalid input (None, an empty or blank text, wrong type, not valid
                Unicode, a NUL byte, too long, a single text for a pair model) gives: "raise" a
                `UserError` naming it, or "report" `{"error": "input N: ..."}` in its
                place, so that prediction N always belongs to input N.
            max_input_characters: the most characters one input's texts may hold
                together; a longer input is invalid.
        """
        if isinstance(inputs, str):
            inputs = [inputs]
        return self._predict_chunk(list(inputs), 0, batch_size, errors, max_input_characters)

    def predict_stream(
        self,
        inputs,
        batch_size: int | None = None,
        *,
        errors: str = "raise",
        progress=None,
        max_input_characters: int = MAX_INPUT_CHARACTERS,
    ):
        """`predict`, yielding predictions in input order as each batch of inputs is done.

        For long inputs (the CLI): the first results come after one batch, not
        after all of them. `inputs` may also be an iterator over inputs that come
        over time (the lines of a pipe): a batch is predicted as soon as it is full
        or no further input has come for a moment (`bertkit.files.arriving_chunks`).
        `progress`, if given, is called with the inputs done.
        """
        if isinstance(inputs, str):
            inputs = [inputs]
        step = batch_size or 2 * self.description["batch_size"]
        if isinstance(inputs, Iterator):
            chunks = arriving_chunks(inputs, step)
        else:  # all there already
            inputs = list(inputs)
            chunks = (inputs[start : start + step] for start in range(0, len(inputs), step))
        done = 0
        for chunk in chunks:
            yield from self._predict_chunk(chunk, done, batch_size, errors, max_input_characters)
            done += len(chunk)
            if progress is not None:
                progress(done)

    def parse_inputs(self, inputs: list, *, max_input_characters: int = MAX_INPUT_CHARACTERS):
        """The task's examples for `inputs`, each checked as `predict` checks it; the first
        that cannot be predicted is a `UserError` naming it (`input 3: ...`). A server
        checks a request whole this way, then predicts the examples of several requests
        together with `predict_examples`."""
        return checks.parse_inputs(self.task, inputs, max_input_characters)

    def predict_examples(self, examples: list, batch_size: int | None = None) -> list[dict]:
        """Predictions for examples from `parse_inputs`, in order: what `predict` gives
        for their inputs. Each depends only on its own example, so the examples of
        several requests may be predicted together."""
        return predict_examples(
            self.task,
            self.model,
            examples,
            batch_size or 2 * self.description["batch_size"],
            self.buckets,
        )

    # A server's three stages (`bertkit.serving.prepared`): only `run_prepared` needs the
    # model thread.
    def prepare(self, examples: list):
        return prepared.prepare(self.task, examples)

    def run_prepared(self, requests: list, batch_size: int | None = None) -> list[dict]:
        batch_size = batch_size or 2 * self.description["batch_size"]
        return prepared.run_prepared(self.task, self.model, requests, batch_size, self.buckets)

    def finish(self, request, outputs: dict) -> list[dict]:
        return prepared.finish(self.task, request, outputs)

    def _predict_chunk(
        self, inputs: list, offset: int, batch_size, errors: str, max_input_characters: int
    ) -> list:
        results: list = [None] * len(inputs)
        positions, examples = [], []
        for position, value in enumerate(inputs):
            try:
                examples.append(checks.parse_input(self.task, value, max_input_characters))
                positions.append(position)
            except UserError as error:
                error = UserError(error.message, source=f"input {offset + position + 1}")
                if errors == "raise":
                    raise error from None
                results[position] = {"error": str(error)}
        predictions = predict_examples(
            self.task,
            self.model,
            examples,
            batch_size or 2 * self.description["batch_size"],
            self.buckets,
        )
        for position, prediction in zip(positions, predictions, strict=True):
            results[position] = prediction
        return results

    def evaluate(
        self, path=None, batch_size: int | None = None, predictions_dir=None, progress: bool = False
    ) -> dict:
        """The task's metrics on a labelled file (default: the recipe's validation file).

        With `predictions_dir`, the task also writes its predictions there in its
        field's format where it has one (e.g. SQuAD's `{id: answer}` JSON), and its
        error analysis (`Task.report`: per-class report, confusion matrix, errors)
        as `report.md` with its figures. `progress` shows progress on stderr.
        """
        if path is None:
            key = "data.validation" if self.task.data.validation else "data.test"
            named = self.task.data.validation or self.task.data.test
            if named is None:
                raise UserError("no evaluation file: pass --data FILE")
            path = self.run.data_file(named, key)
        examples = self.task.read(str(path))
        if not examples:
            raise UserError("no examples to evaluate (only a header, or empty)", source=path)
        batch_size = batch_size or 2 * self.description["batch_size"]
        shown = None
        if progress:
            counter = CountProgress("evaluate", len(examples), quiet_below=batch_size + 1)
            shown = lambda fraction: counter.update(round(fraction * len(examples)))  # noqa: E731
        predictions = predict_examples(
            self.task, self.model, examples, batch_size, self.buckets, shown
        )
        metrics = self.task.evaluate(examples, predictions)
        if predictions_dir is not None:
            self.task.write_predictions(examples, predictions, Path(predictions_dir))
            write_task_report(
                self.task,
                examples,
                predictions,
                Path(predictions_dir),
                title=f"Evaluation on `{path}`",
                metrics=metrics,
            )
        return metrics

    def export(
        self,
        directory,
        *,
        max_input_characters: int = MAX_INPUT_CHARACTERS,
        max_request_characters: int = MAX_REQUEST_CHARACTERS,
        quantize: str | None = None,
        max_metric_drop: float | None = None,
    ) -> Path:
        """Writes a raw-text SavedModel (see `bertkit.serving.export`), which refuses an
        input over `max_input_characters` or a request over `max_request_characters`.
        `quantize="int8"`: an int8 model, written only if it loses at most
        `max_metric_drop` points of the validation metric (`bertkit.serving.quantize`)."""
        from bertkit.serving.export import check_finite_weights, export_saved_model

        check_finite_weights(self.model, self.run.weights_file)
        limits = {
            "max_input_characters": max_input_characters,
            "max_request_characters": max_request_characters,
        }
        if quantize is None and max_metric_drop is not None:
            raise UserError("max_metric_drop applies to an int8 export only (quantize='int8')")
        if quantize is not None:
            from bertkit.serving.quantize import export_quantized

            return export_quantized(
                self, directory, quantize, max_metric_drop=max_metric_drop, **limits
            )
        return export_saved_model(
            self.task,
            self.model,
            directory,
            self.description,
            **limits,
        )
