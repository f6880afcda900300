"""What a features file's rows were made from, recorded portably and compared with a recipe.

The header names data files relative to the recipe's folder (the working folder for a
recipe given as a mapping) and identifies each by size and sha256, and the checkpoint's
vocabulary by its digest: never a path of the machine that featurized. So a features
file, its recipe and checkpoint copied anywhere train the same; the data files need not
come along, and where they are present they must be the files the rows came from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from bertkit.errors import UserError
from bertkit.progress import say

IDENTIFIED = ("train", "validation")  # the data files the rows are made from
_COMPARED = ("task", "options", "sequence_length")  # the rows depend on these too


def recipe_folder(recipe) -> Path:
    """The folder the recipe's relative data paths start from."""
    source = Path(recipe.source)
    return source.resolve().parent if source.is_file() else Path.cwd()


def _path_fields(recipe) -> list[str]:
    return [f.name for f in dataclasses.fields(recipe.data) if f.metadata.get("path")]


def _relative(value: str, folder: Path) -> str:
    return Path(os.path.relpath(value, folder)).as_posix()


def portable_description(description: dict, recipe) -> dict:
    """`description` with the data section's paths relative to the recipe's folder."""
    folder, data = recipe_folder(recipe), dict(description["data"])
    for name in _path_fields(recipe):
        if isinstance(data.get(name), str):
            data[name] = _relative(data[name], folder)
    return {**description, "data": data}


def data_files(recipe) -> dict:
    """{field: {"path", "size", "sha256"}} of the data files the rows are made from."""
    folder, files = recipe_folder(recipe), {}
    for name in IDENTIFIED:
        value = getattr(recipe.data, name, None)
        if isinstance(value, str):
            files[name] = {
                "path": _relative(value, folder),
                "size": os.path.getsize(value),
                "sha256": sha256_of(value),
            }
    return files


def sha256_of(path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def vocabulary_of(pretrained) -> dict:
    """What identifies the tokenization: the vocabulary, its casing and punctuation mapping,
    the segment ids."""
    tokenizer = pretrained.tokenizer
    words = "\n".join(tokenizer.vocabulary).encode("utf-8")
    return {
        "size": len(tokenizer.vocabulary),
        "sha256": hashlib.sha256(words).hexdigest(),
        "lowercase": bool(tokenizer.lowercase),
        "normalize_punctuation": bool(tokenizer.normalize_punctuation),
        "segments": int(getattr(pretrained.backbone, "num_segments", 2)),
    }


def check_vocabulary(stored: dict, pretrained, path) -> None:
    """The rows were tokenized with the recipe's checkpoint vocabulary."""
    here = vocabulary_of(pretrained)
    compared = (("size", "vocabulary"), ("sha256", "vocabulary"), ("lowercase", "lowercasing"))
    compared += (("normalize_punctuation", "backbone.normalize_punctuation"),)
    stored = {"normalize_punctuation": False, **stored}  # files made before it existed: off
    for key, what in (*compared, ("segments", "")):
        if stored.get(key) != here[key]:
            differs = what or f"segment ids ({stored.get(key)}; the checkpoint's {here[key]})"
            raise UserError(
                f"was tokenized with another {differs} than this recipe's backbone "
                f"({stored.get('size')} word pieces; the backbone's {here['size']}); run "
                "'bertkit featurize' on this recipe",
                source=path,
            )


def check_same_recipe(stored: dict, files: dict, recipe, expected: dict, path) -> None:
    """The file's description is the recipe's (`expected`) wherever the rows depend on it;
    present data files are the ones the rows were made from."""
    for key in _COMPARED:
        if stored.get(key) != expected[key]:
            raise _another_recipe(key, path)
    folder, identified = recipe_folder(recipe), set(IDENTIFIED) | {"test"}
    mine = portable_description(expected, recipe)["data"]
    for key in set(mine) | set(stored["data"]):
        if key not in identified and stored["data"].get(key) != mine.get(key):
            raise _another_recipe(f"data.{key}", path)
    for name in IDENTIFIED:
        _check_data_file(name, files.get(name), getattr(recipe.data, name, None), folder, path)


def _another_recipe(key: str, path) -> UserError:
    return UserError(
        f"was made from another recipe ({key} differs); run 'bertkit featurize' on this recipe",
        source=path,
    )


def _check_data_file(name: str, record, value, folder: Path, path) -> None:
    if (record is None) != (value is None):
        raise _another_recipe(f"data.{name}", path)
    if value is None:
        return
    if not (
        isinstance(record, dict)
        and isinstance(record.get("path"), str)
        and isinstance(record.get("size"), int)
        and isinstance(record.get("sha256"), str)
    ):
        raise UserError(f"header: data_files.{name} is damaged; featurize again", source=path)
    if Path(value).is_file():
        if os.path.getsize(value) != record["size"] or sha256_of(value) != record["sha256"]:
            raise UserError(
                f"was made from other data: data.{name} {value} is not the file it was "
                f"featurized from (its size or sha256 differs); run 'bertkit featurize' on "
                "this recipe",
                source=path,
            )
        return
    if _relative(value, folder) != record["path"]:
        raise _another_recipe(f"data.{name}", path)
    say(f"data.{name} ({record['path']}) is not here: training on the features file's own rows")


def same_recipe(header: dict, recipe) -> bool:
    """Whether a features file's header (any format) is of this recipe's task and training
    file: replacing it is the expected rerun of `featurize`."""
    description = header.get("description")
    data = description.get("data") if isinstance(description, dict) else None
    stored = data.get("train") if isinstance(data, dict) else None
    if not isinstance(stored, str) or description.get("task") != recipe.task:
        return False
    train = getattr(recipe.data, "train", None)
    return isinstance(train, str) and (
        (recipe_folder(recipe) / stored).resolve() == Path(train).resolve()
    )


def portable_examples(examples: list | None, recipe) -> list | None:
    """The examples with their `source` (a data file's path) relative to the recipe's folder."""
    folder = recipe_folder(recipe)
    return [
        dataclasses.replace(e, source=_relative(e.source, folder))
        if isinstance(getattr(e, "source", None), str) and Path(e.source).is_absolute()
        else e
        for e in examples or ()
    ] or examples


def check_replaceable(out: Path, recipe, overwrite: bool) -> None:
    """`featurize` may write `out`: a new file, a features file of the same recipe (the
    rerun), or another file with `overwrite`; never a folder or a device."""
    from bertkit.training.feature_file_archive import read_header_only

    if out.is_dir():
        raise UserError("is a folder; name the features file to write (--out FILE)", source=out)
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_file():
        raise UserError("is not a regular file; name the features file to write", source=out)
    header = read_header_only(out)
    if not overwrite and not (header is not None and same_recipe(header, recipe)):
        what = "a features file of another recipe" if header else "not a features file"
        raise UserError(f"exists ({what}); pass --overwrite to replace it", source=out)
