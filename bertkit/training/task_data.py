"""A run's data: its task, backbone and featurized rows (`prepare`, the first run step).

`TaskData.read` reads the recipe's files, loads the backbone and featurizes;
`TaskData.from_file` takes the rows of a features file (`bertkit featurize`) instead.
The task is made by one factory, `make_task`, with keyword arguments.
"""

from __future__ import annotations

import dataclasses

from bertkit.errors import UserError
from bertkit.progress import say
from bertkit.recipes.recipe import Recipe


@dataclasses.dataclass
class TaskData:
    """A run's task, backbone and featurized data, from the files or from a features file.

    `TaskData.read(recipe)` prepares what `finetune` trains on, for tools that time or
    inspect it (the benchmarks).
    """

    task: object
    pretrained: object
    description: dict
    train_features: object
    validation: list | None
    validation_features: object
    unknown_pieces: object = None  # bertkit.model.vocabulary_checks.UnknownPieces (training)

    @classmethod
    def read(cls, recipe: Recipe, state: dict | None = None, phases=None) -> TaskData:
        """Reads, loads the backbone and featurizes; `phases` (a `Phases`) times each."""
        from bertkit.model.backbone import load_pretrained
        from bertkit.training.phases import Phases

        phases = phases or Phases()
        # Reading needs only the options: it runs before the model loads, so data errors
        # come fast; the task that featurizes is then made complete, tokenizer and state.
        with phases("read"):
            train, validation, state = _read_examples(recipe, state)
        with phases("load_backbone"):
            pretrained = cls._backbone(recipe, load_pretrained)
        with phases("featurize"):
            task = make_task(recipe, tokenizer=pretrained.tokenizer, state=state)
            say(
                f"featurizing {len(train)} training and {len(validation or ())} validation examples"
            )
            validation_features = task.featurize(validation, training=False) if validation else None
            train_features = task.featurize(train, training=True)
            unknown = report_unknown_pieces(pretrained.tokenizer, train_features, train)
        return cls(
            task,
            pretrained,
            description_of(task, recipe),
            train_features,
            validation,
            validation_features,
            unknown,
        )

    @classmethod
    def from_file(cls, recipe: Recipe, path) -> TaskData:
        """The data of a features file written by `featurize` for this recipe."""
        from bertkit.model.backbone import load_pretrained
        from bertkit.training.feature_file import read_feature_file
        from bertkit.training.feature_file_data import check_same_recipe, check_vocabulary

        reader = make_task(recipe)
        stored = read_feature_file(path, example_type=reader.Example)  # every array checked
        expected = description_of(reader, recipe)
        # the rows depend on the task, options, data and sequence_length; batch_size and
        # bucket_lengths are the recipe's to change
        check_same_recipe(stored.description, stored.data_files, recipe, expected, path)
        if recipe.data.validation and stored.validation is None:  # said before training
            say(
                f"the features file holds no validation split (the {recipe.task} task decodes "
                "with TensorFlow): training without per-epoch validation; evaluate the run "
                "with 'bertkit evaluate RUN_DIR' where TensorFlow is installed"
            )
        pretrained = cls._backbone(recipe, load_pretrained)
        check_vocabulary(stored.vocabulary, pretrained, path)
        state = stored.description["state"]
        return cls(
            make_task(recipe, tokenizer=pretrained.tokenizer, state=state),
            pretrained,
            {**expected, "state": state},
            stored.train,
            stored.validation_examples,
            stored.validation,
            report_unknown_pieces(pretrained.tokenizer, stored.train),
        )

    @staticmethod
    def _backbone(recipe, load_pretrained):
        from bertkit.model.attention import set_attention_dropout, training_attention_dropout
        from bertkit.model.sizes import BackboneSizes
        from bertkit.recipes.preflight import check_backbone_fits

        say(f"loading the backbone {recipe.backbone.preset}")
        loaded = load_pretrained(
            recipe.backbone.preset,
            sequence_length=recipe.backbone.sequence_length,
            lowercase=recipe.backbone.lowercase,
            normalize_punctuation=recipe.backbone.normalize_punctuation,
            source=recipe.source,
        )
        # what `bertkit check` checks from a folder's config; a named preset's only now
        check_backbone_fits(recipe, BackboneSizes.of(loaded.backbone))
        rate = training_attention_dropout(recipe.backbone.attention_dropout)
        if rate != recipe.backbone.attention_dropout:
            say(
                f"attention dropout {rate:g} on this GPU, so training takes fused attention "
                "(backbone.attention_dropout: 0.1 keeps BERT's)"
            )
        set_attention_dropout(loaded.backbone, rate)
        return loaded


def report_unknown_pieces(tokenizer, features, examples=None):
    """Says the share of [UNK] pieces in the training rows (counted in their token ids)
    and, over 5%, warns with the most frequent unknown words of (up to 2,000 of) the
    `examples`, tokenized again. Returns the `UnknownPieces`."""
    import sys

    from bertkit.model.vocabulary_checks import (
        WARN_SHARE,
        UnknownPieces,
        example_texts,
        unknown_warning,
        unknown_words,
    )

    special = (tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id)
    counted = UnknownPieces.count(features.columns["token_ids"], tokenizer.unk_id, special)
    say(counted.line())
    if counted.share > WARN_SHARE:
        words = unknown_words(tokenizer, example_texts(examples or ()))
        print(f"bertkit: warning: {unknown_warning(counted, words)}", file=sys.stderr)
    return counted


def _read_examples(recipe: Recipe, state: dict | None) -> tuple[list, list | None, dict]:
    """The training and validation examples (split off the training data when the recipe
    names no validation file) and the task's state (`fit_state`, unless given), by a task
    of the options alone."""
    reader = make_task(recipe)
    train = reader.read(recipe.data.train)
    if not train:
        raise UserError("no training examples", source=recipe.data.train)
    if recipe.data.validation:
        validation = reader.read(recipe.data.validation)
    else:
        train, validation = reader.split_validation(train)
    state = state if state is not None else reader.fit_state(train)
    labels = state.get("labels") if isinstance(state, dict) else None
    if labels is not None and len(labels) < 2:
        raise UserError(
            f"the training data has only one label ({', '.join(labels)}) "
            "and the model would learn nothing; a task needs at least two",
            source=recipe.data.train,
        )
    return train, validation, state


def make_task(recipe: Recipe, *, tokenizer=None, state: dict | None = None):
    """The recipe's task; without a tokenizer it can read files, but not featurize."""
    task = recipe.task_class()(
        recipe.task_options, recipe.data, tokenizer, recipe.backbone.sequence_length, state
    )
    task.backbone_preset = recipe.backbone.preset  # set, not passed: plugins keep __init__
    return task


def description_of(task, recipe: Recipe) -> dict:
    """What `model/task.json` holds for `recipe`'s run (see `task_description`)."""
    from bertkit.padding import bucket_lengths
    from bertkit.serving.finetuned import task_description

    buckets = bucket_lengths(recipe.backbone.sequence_length, recipe.training.bucket_lengths)
    return task_description(
        task, recipe.backbone.sequence_length, recipe.training.batch_size, buckets
    )
