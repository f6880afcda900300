"""The Task contract: everything that differs between fine-tuning tasks.

A task plugin is one class deriving from `Task`, registered in the
`bertkit.tasks` entry-point group. The core owns the rest: recipes, backbone
loading, tokenizer, batching, the Keras `fit()` loop, checkpoints, evaluation
schedule, run directories, the CLI and SavedModel export.

What a task declares, each as a small piece:

=====================  ====================================================
`name`, `description`  registry name and the one line `bertkit tasks` shows
`Options`              frozen dataclass of task options (recipe `task:` keys)
`Data`                 frozen dataclass of data options, subclass of `DataFiles`
`monitor`, `mode`      the evaluation metric that picks the best checkpoint
`int8_max_drop`,       optional: the points of `monitor` an int8 export may lose (`bertkit export
`monitor_points`       --quantize int8`), and the points in one unit of it (100 for a fraction such
                       as accuracy, 1 for a percentage); `int8_max_drop` None: no int8 export
`sequence_outputs`     names of model outputs with one value per token; `decode` gets them cut to
                       each row's length
`read`                 file -> examples (raise `UserError` with file and line)
`Example`              optional: the dataclass `read` returns; a features file stores validation
                       examples only of this type and rebuilds only this type from one (never a
                       class a file names)
`split_validation`     optional: hold out part of the training data when there is no validation
                       file (MLM holds out documents)
`fit_state`            train examples -> JSON state saved with the model (labels)
`featurize`            examples -> `Features` (tokenized rows, windows included)
`make_batch`           padded batch -> (inputs, targets, sample_weights); weights are relative (0
                       skips a target): training scales them so that each update's loss is their
                       weighted mean over its batch
`build_model`          backbone -> Keras model with the head (keras.ops only)
`packs`,               whether training may pack rows (`training.packing`): the head reads
`cannot_pack`          per-token outputs or `pooled_output`, and its loss never spans a row's
                       positions (`bertkit.batching.packing`); `cannot_pack`: why not, by options
`loss_spans_batch`     optional: a row's loss reads its batch (in-batch negatives), below
`initialize_head`      optional: load head weights shipped with the pretrained checkpoint (MLM's
                       pretraining heads)
`loss`, `metrics`,     Keras loss and progress-bar metrics; both get make_batch's sample weights;
`learning_rates`       optional: head weights with peak learning rates of their own
`reduce_outputs`       optional: shrink a batch's outputs before they are kept (MLM keeps per-row
                       loss and top-k, not vocabulary logits)
`decode`               model outputs -> user-facing predictions per example
`evaluate`             examples + predictions -> metrics dict
`baseline`             optional: validation examples -> the `monitor` of learning nothing
`format_metrics`       optional: metrics as `bertkit evaluate` prints them
`calibrate`            optional: validation examples + the best weights' predictions -> a state
                       update (span QA's no-answer threshold); the core saves it, decodes again and
                       only then computes the final metrics
`write_predictions`    optional: predictions in the field's file format (SQuAD JSON), written by
                       `finetune` (validation) and `evaluate`
`write_artifacts`      optional: extra files for the run directory at the end of training (MLM's
                       adapted backbone preset)
`report`               optional: examples + predictions -> a Markdown section of error analysis
                       (`## ` headings), its figures and files written into a given folder: in
                       `report.md` at the end of `finetune` (validation, best weights) and in
                       `bertkit evaluate`'s output (confusion matrix, per-type P/R/F1, ...)
`parse_input`          one raw user input (str, pair, dict) -> example
`predict_options`      optional: flags the task adds to `bertkit predict`, each a `PredictOption`
                       taking a whole number of at least 1, and `apply_predict_options`, what they
                       do to one prediction (classification's `--top-k`)
`serving_inputs`,      the exported SavedModel signature: raw strings in, decoded outputs out, in
`serve`                TensorFlow ops
`transformers_head`    optional: the head as a transformers BERT task model, for `bertkit export
                       --format transformers`
`preprocessor`         optional: one object holding both paths from inputs to rows, Python
                       (`featurize`) and TensorFlow (`serve`), over one tokenizer and window rule;
                       the contract test checks that they agree (tagging's and span QA's windows)
=====================  ====================================================

Rows are the unit of the contract: a row's loss reads that row only. `Features` has no group axis
for a loss over several rows: the batching reorders rows one by one (length buckets, random
micro-batches) and packs several into one (`training.packing`), so the rows of one example may
land in different batches. Multiple choice (a softmax over an example's choices) lays its choices
side by side in one row (`bertkit_tasks.multiple_choice.rows`). A loss over its batch as a set
(in-batch negatives) keeps an example one row holding all its texts and declares
`loss_spans_batch`: the core refuses micro-batches and TensorFlow replicas (a row would see fewer
rows), and the loss must skip filler rows (`bertkit.padding.fill_rows`). Windowed tasks need no
such axis: each window's loss is its own, and an example's windows meet again only in `decode`.

Heavy imports (TensorFlow, Keras) belong inside methods, so that validating a
recipe, which imports the task class, stays fast.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from bertkit.features import Features  # noqa: F401 (public here: `bertkit.task.Features`)


@dataclasses.dataclass(frozen=True)
class DataFiles:
    """The `data:` section every task shares; tasks subclass it to add reader options."""

    train: str | None = dataclasses.field(
        default=None, metadata={"path": True, "help": "training file"}
    )
    validation: str | None = dataclasses.field(
        default=None, metadata={"path": True, "help": "validation file, evaluated every epoch"}
    )
    test: str | None = dataclasses.field(
        default=None, metadata={"path": True, "help": "test file, evaluated once at the end"}
    )
    format: str = dataclasses.field(
        default="auto", metadata={"help": "file format; 'auto' picks it from the file name"}
    )


@dataclasses.dataclass(frozen=True)
class PredictOption:
    """A long flag a task adds to `bertkit predict`, taking a whole number of at least 1;
    `Task.apply_predict_options` gets its value as a keyword (`--top-k 3` -> `top_k=3`).

    Example:
        >>> option = PredictOption("--top-k", "add the K most probable labels", "K")
        >>> option.keyword
        'top_k'
    """

    flag: str
    help: str
    metavar: str = "N"

    @property
    def keyword(self) -> str:
        """The keyword `apply_predict_options` gets the value as."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A task without options."""


def string_inputs(*names: str) -> dict:
    """`serving_inputs` of a signature taking batches of raw strings, one per name.

    Example:
        >>> sorted(string_inputs("question", "context"))
        ['context', 'question']
    """
    import tensorflow as tf

    return {name: tf.TensorSpec([None], tf.string, name=name) for name in names}


def head_initializer():
    """The kernel initializer of a head's new layers: normal, standard deviation 0.02.

    That is how transformers initializes the heads it adds to BERT (`normal_(0,
    initializer_range)`). keras-hub's heads use a truncated normal of the same stddev, whose
    values are 12% smaller (std 0.0175): on the first 4,000 CoNLL-2003 sentences (MiniLM, seeds
    1-3) the truncated head left the dev F1 after the first epoch at 62.0 / 58.8 / 58.4 against
    65.3 / 61.3 / 63.9 with this one (transformers: 63.1 / 65.3 / 61.6), and at 2 epochs 3 test
    points behind transformers (`benchmarks/learning_curve.py`, README "Small data").

    Example:
        >>> head_initializer().get_config()["stddev"]
        0.02
    """
    import keras

    return keras.initializers.RandomNormal(stddev=0.02)


class Task:
    """Base class of task plugins; see the module docstring for the contract.

    Args:
        options: an instance of `Options`.
        data: an instance of `Data`.
        tokenizer: the backbone's `bertkit.model.tokenizer.WordPieceTokenizer`.
        sequence_length: longest model input, in word pieces.
        state: what `fit_state` returned at training time (empty before).

    `backbone_preset`: the recipe's `backbone.preset`, set by the core once the task is made
    (None when rebuilt from a run), for defaults read from the checkpoint's own files.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    Data: ClassVar[type] = DataFiles
    monitor: ClassVar[str] = "loss"
    mode: ClassVar[str] = "max"
    sequence_outputs: ClassVar[tuple] = ()
    packs: ClassVar[bool] = False
    int8_max_drop: ClassVar[float | None] = None
    monitor_points: ClassVar[float] = 100.0
    # The dataclass `read` returns (None: other values): features files store and rebuild
    # validation examples of this type only, so a file cannot name code to run.
    Example: ClassVar[type | None] = None
    # Flags this task adds to `bertkit predict` (see `PredictOption`, `apply_predict_options`).
    predict_options: ClassVar[tuple[PredictOption, ...]] = ()

    backbone_preset: str | None = None

    def __init__(self, options, data, tokenizer, sequence_length: int, state: dict | None = None):
        self.options, self.data, self.tokenizer = options, data, tokenizer
        self.sequence_length, self.state = sequence_length, dict(state or {})

    @classmethod
    def loss_spans_batch(cls, options) -> bool:
        """Whether a row's loss reads other rows of its batch with these `options`."""
        return False

    @classmethod
    def cannot_pack(cls, options) -> str | None:
        """Why training cannot pack rows with these `options` (`packs`), or None if it can."""
        return None if cls.packs else "only tasks that declare `packs` can"

    # ---- data
    def read(self, path: str) -> list:
        raise NotImplementedError

    def split_validation(self, train_examples: list) -> tuple[list, list | None]:
        """(train, validation) when the recipe names no validation file; default: no split."""
        return train_examples, None

    def fit_state(self, train_examples: list) -> dict:
        return {}

    def featurize(self, examples: list, training: bool) -> Features:
        raise NotImplementedError

    def make_batch(self, batch: dict, training: bool, rng: np.random.Generator):
        """(inputs, targets, sample_weights) for Keras from a padded batch of columns."""
        inputs = {key: batch[key] for key in ("token_ids", "segment_ids", "padding_mask")}
        return inputs, batch.get("labels"), None

    # ---- model
    def build_model(self, backbone):
        raise NotImplementedError

    def initialize_head(self, model, checkpoint_tensors: dict) -> None:
        """Loads head weights shipped with the pretrained checkpoint, if the task has any."""

    def loss(self):
        raise NotImplementedError

    def learning_rates(self, model) -> list:
        """`(variables, peak learning rate)` pairs of `model`'s head trained at their own."""
        return []

    def metrics(self) -> list:
        return []

    # ---- outputs
    def reduce_outputs(self, batch: dict, outputs: dict) -> dict:
        """A batch's model outputs (numpy, name -> (batch, ...)) as they should be kept."""
        return outputs

    def decode(self, examples: list, features: Features, outputs: dict) -> list[dict]:
        raise NotImplementedError

    def evaluate(self, examples: list, predictions: list[dict]) -> dict:
        raise NotImplementedError

    def baseline(self, examples: list) -> tuple[float, str] | None:
        """(value, name), e.g. `(0.5, "majority-class")`; `training.seeds` flags a seed at it."""
        return None

    def calibrate(self, examples: list, predictions: list[dict]) -> dict | None:
        """A state update tuned on the validation predictions of the best weights, or None.

        The core merges it into `state`, saves it with the model, decodes the same
        outputs again and computes the final metrics from those predictions.
        """
        return None

    def write_predictions(self, examples: list, predictions: list[dict], directory) -> None:
        """Writes evaluation predictions in the field's own format, if it has one."""

    def report(self, examples: list, predictions: list[dict], directory) -> str | None:
        """Error analysis as Markdown (`## ` sections), or None for none.

        Figures and files it writes go into `directory` (a `pathlib.Path`) and are
        linked by their bare names, e.g. `![confusion matrix](confusion_matrix.png)`.
        Helpers: `bertkit.report.markdown_table`, `bertkit.report.pyplot`.
        """
        return None

    def format_metrics(self, metrics: dict) -> str:
        return "\n".join(
            f"{key}: {value:.4f}"
            for key, value in metrics.items()
            if isinstance(value, (int, float))
        )

    def parse_input(self, value):
        """One user input (a string, a pair, a dict) -> an example `decode` can answer."""
        raise NotImplementedError

    def apply_predict_options(self, prediction: dict, **values) -> dict:
        """One prediction (not an error object) as `bertkit predict` prints it, given the
        values of the `predict_options` flags passed (read from the run's task before the
        model loads; a flag not passed is absent). Default: the prediction unchanged.

        Example:
            >>> Task(None, None, None, 8).apply_predict_options({"label": "positive"})
            {'label': 'positive'}
        """
        return prediction

    def write_artifacts(self, backbone, directory) -> None:
        """Extra files written into the run directory at the end of training.

        Args:
            backbone: the trained backbone (best weights).
            directory: the run directory (a `pathlib.Path`).
        """

    # ---- export
    def serving_inputs(self) -> dict:
        """name -> tf.TensorSpec of the raw inputs of the exported signature (see
        `string_inputs`)."""
        raise NotImplementedError

    def serve(self, model, inputs: dict) -> dict:
        """Raw string tensors -> decoded output tensors, in TensorFlow ops."""
        raise NotImplementedError

    def transformers_head(self):
        """A `bertkit.serving.transformers_export.TransformersHead`, or None (default): the
        task has no transformers counterpart and `export --format transformers` refuses it."""
        return None

    # ---- preprocessor (optional)
    def preprocessor(self):
        """The object that makes this task's model rows in both paths, or None (default).

        keras-hub's preprocessors keep `_call_python` and `_call_tf` side by side
        over one tokenizer; a task whose rows need more than packing (windows over
        long inputs) returns one object with:

        - `featurize(examples) -> Features`: numpy, for training, evaluation and
          `predict` (the task's `featurize` delegates to it);
        - `serve(inputs) -> dict`: TensorFlow ops on the signature's string
          tensors (`serving_inputs`), for the SavedModel (the task's `serve` feeds
          its rows to the model): at least `token_ids` and `segment_ids`, (rows,
          (tokens)) ragged, and `example_index`, (rows,).

        `bertkit.testing.check_preprocessor`, part of the contract test, checks
        that every output of `serve` named like a column, an extra or
        `example_index` of `featurize`'s `Features` holds the same values.
        """
        return None
