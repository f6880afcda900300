"""`bertkit export RUN --format transformers`: a run as a Hugging Face transformers folder.

The folder holds what `BertForSequenceClassification.from_pretrained` (or the token
classification and question answering models) and `BertTokenizer` read: `config.json` with
`id2label`, `model.safetensors` under transformers' names (`bertkit.model.hf_weights`, LoRA
already merged), `vocab.txt`, `tokenizer_config.json`, `special_tokens_map.json`, and a
`README.md`. A task says how its head maps onto transformers' in `Task.transformers_head`;
what bertkit does beyond the bare model (constrained tag decoding, span QA's tuned no-answer
threshold, windows over long inputs) is documented in the README and in config.json's
`bertkit` field, and said in `TransformersExport.summary`. The folder is also a backbone
preset bertkit reads back (`backbone.preset: DIR`).

Example:
    >>> export = export_transformers("runs/ner", "exported/ner")  # doctest: +SKIP
    >>> print(export.summary)                                      # doctest: +SKIP
    exported exported/ner (transformers BertForTokenClassification); not represented: ...
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bertkit.errors import UserError
from bertkit.model.hf_files import SAFETENSORS_FILE, VOCAB_FILE, write_json, write_tokenizer_config
from bertkit.run_dir import RunDirectory, read_json
from bertkit.serving.staging import finished_run, new_export_folder, os_error_of, staging_folder

SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


@dataclasses.dataclass(frozen=True)
class TransformersHead:
    """How a task's head is a transformers BERT task model (`Task.transformers_head`).

    Args:
        architecture: the transformers class, e.g. "BertForTokenClassification".
        layer: the name of the task model's Dense head layer, e.g. "tagger".
        module: its name in transformers, e.g. "classifier" or "qa_outputs".
        labels: the head's outputs in order (`id2label`).
        pipeline: the transformers pipeline that decodes it, e.g. "token-classification".
        call_options: the pipeline's options closest to bertkit's decoding, for the README.
        settings: bertkit settings the model was trained and decodes with, documented in
            config.json's `bertkit` field and the README.
        not_represented: what bertkit does that transformers will not, one short phrase each.
        use_note: a line for the README under the pipeline call (e.g. where a transformers
            version lacks that pipeline).
        problem_type: config.json's `problem_type` of a `BertForSequenceClassification`
            (default "single_label_classification"; "regression", "multi_label_classification").
        output_affine: (scale, shift) of the task's outputs, folded into the head's weights
            (regression's target statistics): transformers' logits are the task's answers.
    """

    architecture: str
    layer: str
    module: str
    labels: tuple[str, ...]
    pipeline: str
    call_options: dict = dataclasses.field(default_factory=dict)
    settings: dict = dataclasses.field(default_factory=dict)
    not_represented: tuple[str, ...] = ()
    use_note: str = ""
    problem_type: str = "single_label_classification"
    output_affine: tuple[float, float] = (1.0, 0.0)


@dataclasses.dataclass(frozen=True)
class TransformersExport:
    """What `export_transformers` wrote: the folder and the task's head."""

    path: Path
    head: TransformersHead

    @property
    def summary(self) -> str:
        """One line: the folder, the class, and what the format does not hold."""
        lost = "; ".join(self.head.not_represented) or "nothing"
        return (
            f"exported {self.path} (transformers {self.head.architecture}); not represented: {lost}"
        )


def export_transformers(run_dir, directory) -> TransformersExport:
    """Writes a finished run's model into `directory` (new or empty) in the transformers
    format; see the module docstring.

    Raises:
        UserError: the run is not finished, `directory` is a file or holds files, the
            task has no transformers counterpart (MLM), or the weights are not finite.
    """
    from bertkit.serving.export import check_finite_weights
    from bertkit.serving.finetuned import FineTunedModel

    run = finished_run(run_dir)
    directory = new_export_folder(directory)
    head = _transformers_head(run)  # refused before the model loads
    model = FineTunedModel.load(run.path)
    check_finite_weights(model.model, run.weights_file)
    with staging_folder(directory, "the transformers folder") as staging:
        write_transformers_folder(model, head, staging)
    return TransformersExport(directory, head)


def _transformers_head(run: RunDirectory) -> TransformersHead:
    """The run's task's `transformers_head`, read from `model/task.json` and the vocabulary."""
    from bertkit.model.tokenizer import WordPieceTokenizer
    from bertkit.serving.finetuned import build_task

    description = read_json(run.task_file, "task description")
    task = build_task(description, WordPieceTokenizer.load(run.model_dir), run.task_file)
    head = task.transformers_head()
    if description.get("features"):
        raise UserError(
            "its head reads several hidden layers (backbone.features), and a transformers "
            "task model reads the last one; export it as a SavedModel (without --format)",
            source=run.path,
        )
    if head is None:
        raise UserError(
            f"a {task.name} model has no transformers format (its task declares no "
            "transformers head); export it as a SavedModel (without --format)",
            source=run.path,
        )
    return head


def write_transformers_folder(model, head: TransformersHead, directory: Path) -> None:
    """Writes the folder's files for a loaded `FineTunedModel` and its task's head."""
    import numpy as np

    from bertkit.model.hf_weights import backbone_tensors, linear_tensors

    architecture = read_json(model.run.model_dir / "backbone.json", "backbone architecture")
    backbone = architecture["bert_backbone"]
    tensors = backbone_tensors(model.model, backbone["num_layers"])
    scale, shift = head.output_affine
    linear = linear_tensors(model.model.get_layer(head.layer), head.module)
    tensors[f"{head.module}.weight"] = linear[f"{head.module}.weight"] * np.float32(scale)
    tensors[f"{head.module}.bias"] = linear[f"{head.module}.bias"] * np.float32(scale) + shift
    save_safetensors(tensors, directory / SAFETENSORS_FILE)
    config = transformers_config(model, head, backbone, architecture["hidden_act"])
    write_json(directory / "config.json", config)
    _write_tokenizer(model.task.tokenizer, model.task.sequence_length, directory)
    (directory / "README.md").write_text(folder_readme(model, head, config), encoding="utf-8")


def save_safetensors(tensors: dict, path: Path) -> None:
    """`safetensors.numpy.save_file`, whose `SafetensorError` for a full disk or a folder
    it may not write is raised as the `OSError` it reports, naming `path`."""
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as error:
        os_error = os_error_of(str(error), str(path))
        if os_error is None:
            raise
        raise os_error from None


def transformers_config(model, head: TransformersHead, backbone: dict, hidden_act: str) -> dict:
    """config.json: the backbone's sizes, the head's labels and the documentation field."""
    from bertkit.model.hf_weights import hf_backbone_config

    task = model.task
    config = {
        "architectures": [head.architecture],
        **hf_backbone_config(backbone, hidden_act, task.tokenizer.pad_id),
        "id2label": {str(index): label for index, label in enumerate(head.labels)},
        "label2id": {label: index for index, label in enumerate(head.labels)},
        "torch_dtype": "float32",
    }
    dropout = getattr(task.options, "dropout", None)
    if dropout is not None:  # the head's own dropout (transformers: hidden_dropout_prob)
        config["classifier_dropout"] = dropout
    if head.architecture == "BertForSequenceClassification":
        config["problem_type"] = head.problem_type
    config["bertkit"] = {
        "task": task.name,
        "run": model.run.path.name,
        "sequence_length": task.sequence_length,
        "lora": "merged into the weights" if model.description.get("lora") else None,
        "settings": head.settings,
        "not_represented": list(head.not_represented),
    }
    return config


def _write_tokenizer(tokenizer, sequence_length: int, directory: Path) -> None:
    """vocab.txt, tokenizer_config.json (`do_lower_case`, and `model_max_length` the run's
    sequence length, so that `truncation=True` cuts where bertkit does) and the special
    tokens."""
    text = "\n".join(tokenizer.vocabulary) + "\n"
    (directory / VOCAB_FILE).write_text(text, encoding="utf-8")
    write_tokenizer_config(directory, sequence_length, tokenizer.lowercase)
    write_json(directory / "special_tokens_map.json", SPECIAL_TOKENS)


def folder_readme(model, head: TransformersHead, config: dict) -> str:
    """The folder's README: what it is, how transformers uses it, what it leaves out."""
    task, name = model.task, model.run.path.name
    options = "".join(f", {key}={value!r}" for key, value in head.call_options.items())
    lines = [
        f"# {name}: a bertkit {task.name} model in the transformers format",
        "",
        f"Exported by `bertkit export {name} --format transformers` from the run's best "
        f"weights{' (LoRA adapters merged into them)' if config['bertkit']['lora'] else ''}: "
        f"`{head.architecture}` over a {config['num_hidden_layers']}-layer BERT "
        f"(hidden size {config['hidden_size']}, `hidden_act: {config['hidden_act']}`), "
        f"inputs cut at {task.sequence_length} word pieces (`model_max_length`).",
        "",
        f"Outputs, in order: {', '.join(f'`{label}`' for label in head.labels)}.",
        "",
        "## Use",
        "",
        *_use_lines(head, options),
        "",
        *([head.use_note, ""] if head.use_note else []),
        "## Not represented in this format",
        "",
        *(f"- {phrase}" for phrase in head.not_represented or ["nothing"]),
        "",
        "## bertkit settings (config.json's `bertkit` field)",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| `{key}` | `{value}` |" for key, value in head.settings.items()),
        "",
    ]
    return "\n".join(lines)


def _use_lines(head: TransformersHead, options: str) -> list[str]:
    """The README's code: the pipeline call, or loading the class where there is no pipeline."""
    if not head.pipeline:
        return [
            "```python",
            f"from transformers import BertTokenizer, {head.architecture}",
            "",
            f'model = {head.architecture}.from_pretrained("path/to/this/folder")',
            'tokenizer = BertTokenizer.from_pretrained("path/to/this/folder")',
            "```",
        ]
    return [
        "```python",
        "from transformers import pipeline",
        "",
        f'model = pipeline("{head.pipeline}", model="path/to/this/folder")',
        f"# call it with{options[1:] or ' its defaults'}",
        "```",
    ]
