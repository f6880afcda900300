"""Hardening (issue 51): recipes, `--set`, `check` and run directories; every bad input
one line and exit status 2, before the framework loads."""

import json
import subprocess
import sys

import pytest
import yaml

from bertkit.errors import UserError
from bertkit.recipes.recipe import load_recipe
from bertkit.testing import run_bertkit, write_sentiment_tsv, write_tiny_checkpoint


def one_line_error(result, message):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr, result.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny checkpoint (2 layers, 32 wide, 64-wide feed-forward, 128 positions) and data."""
    folder = tmp_path_factory.mktemp("recipes")
    write_tiny_checkpoint(folder / "ckpt")
    write_sentiment_tsv(folder / "train.tsv", 16, seed=0)
    return folder


def write_recipe(folder, name="r.yaml", text=None, **training):
    path = folder / name
    recipe = {
        "schema": 1,
        "task": "classification",
        "backbone": {"preset": "ckpt", "sequence_length": 16},
        "data": {"train": "train.tsv", "text": "sentence"},
        "training": {"epochs": 1, "batch_size": 8, **training},
        "output_dir": "run",
    }
    path.write_text(text if text is not None else yaml.safe_dump(recipe, sort_keys=False))
    return path


# ---- 1, 2: nesting and characters YAML refuses
def test_deep_nesting_in_a_recipe_is_one_line(folder):
    path = write_recipe(folder, text="schema: 1\ntask: classification\nbackbone: " + "[" * 1100)
    result = run_bertkit("check", path, cwd=folder)
    one_line_error(result, "r.yaml:3: invalid YAML: values nested more than 32 levels deep")


def test_deep_nesting_in_a_set_value_names_set(folder):
    path = write_recipe(folder)
    result = run_bertkit("check", path, "--set", "training.epochs=" + "[" * 2000, cwd=folder)
    one_line_error(result, "--set: training.epochs: invalid YAML: values nested more than 32")


@pytest.mark.parametrize(
    "character, named",
    [("\x00", "a NUL byte (U+0000)"), ("\x07", "a control character (U+0007)")],
)
def test_a_control_character_names_line_column_and_character(folder, character, named):
    text = f"schema: 1\ntask: classification\nbackbone: {{preset: ck{character}pt}}\n"
    result = run_bertkit("check", write_recipe(folder, text=text), cwd=folder)
    one_line_error(result, f"r.yaml:3: {named} at column 22")


def test_a_control_character_in_set_is_shown_escaped(folder):
    result = run_bertkit("check", write_recipe(folder), "--set", "output_dir=a\x1bb", cwd=folder)
    one_line_error(result, "--set: output_dir: a control character (U+001B) at column 2")
    assert "'a\\x1bb'" in result.stderr


# ---- 8: keyword arguments and --set keys the file lacks
def test_keyword_arguments_name_themselves(folder):
    with pytest.raises(UserError) as raised:
        load_recipe(write_recipe(folder), called_as="finetune", training={"epochs": "x"})
    assert (
        str(raised.value) == "finetune(training=...): training.epochs: expected an integer, got 'x'"
    )


def test_a_set_key_the_file_lacks_blames_set(folder):
    result = run_bertkit("check", write_recipe(folder), "--set", "foo.bar=1", cwd=folder)
    one_line_error(result, "bertkit: error: --set: foo: unknown key 'foo'")


def test_a_file_key_still_blames_the_file(folder):
    path = write_recipe(folder, text="schema: 1\ntask: classification\nfoo: 1\n")
    result = run_bertkit("check", path, "--set", "training.epochs=1", cwd=folder)
    one_line_error(result, "r.yaml:3: foo: unknown key 'foo'")


# ---- 9: the seed that diverged is named
DIVERGED = UserError(
    "training diverged: the loss is nan at epoch 2, step 3 (the checkpoint of epoch 1 is "
    "kept); lower the learning rate (now 1e+06)",
    key="training.learning_rate",
)


def test_the_seed_that_diverged_is_named_and_kept_in_run_json(folder, tmp_path):
    from bertkit.run_dir import RunDirectory, write_json
    from bertkit.training.seeds import seed_dir, train_seeds

    recipe = load_recipe(write_recipe(folder), ["training.seeds=3", "training.seed=7"])
    run = RunDirectory(tmp_path / "run")
    run.prepare(recipe.to_yaml(), overwrite=False)
    trained = []

    def finetune(seed_recipe, **options):
        seed = seed_recipe.training.seed
        trained.append(seed)
        if seed == 8:
            raise DIVERGED
        seed_run = RunDirectory(seed_dir(run, seed))
        seed_run.path.mkdir(parents=True)
        write_json(seed_run.metrics_file, {"final": {"validation": {"accuracy": 0.9}}})

    with pytest.raises(UserError) as raised:
        train_seeds(recipe, run, finetune)
    assert trained == [7, 8]
    message = f"seed 8: {DIVERGED}"
    assert str(raised.value) == message
    status = json.loads(run.run_file.read_text())
    assert status["status"] == "running"
    assert status["failed_seed"] == {"seed": 8, "error": message}


# ---- 3: where a run may go
@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--output", "/"], "bertkit: error: --output: '/' is the filesystem root"),
        (["--set", "output_dir=/.."], "--set: output_dir: '/..' is the filesystem root"),
        (
            ["--output", "~no-such-user-here/run"],
            "--output: '~no-such-user-here/run' starts with '~no-such-user-here', which names "
            "no home folder here; write $HOME/... or the full path",
        ),
        (["--set", "output_dir=~"], "--set: output_dir: expected a folder path, got null"),
    ],
)
def test_finetune_refuses_a_run_folder_it_cannot_make(folder, arguments, message):
    before = sorted(p.name for p in folder.iterdir())
    result = run_bertkit("finetune", write_recipe(folder), *arguments, cwd=folder)
    one_line_error(result, message)
    assert sorted(p.name for p in folder.iterdir()) == before


def test_the_root_in_a_recipe_names_its_line(folder):
    path = write_recipe(folder)
    path.write_text(path.read_text().replace("output_dir: run", "output_dir: /"))
    with pytest.raises(UserError, match="r.yaml:12: output_dir: '/' is the filesystem root"):
        load_recipe(path)


def test_a_leading_tilde_is_the_home_folder(folder, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    recipe = load_recipe(write_recipe(folder), ["output_dir=~/runs/a"])
    assert recipe.output_dir == str(tmp_path / "runs" / "a")
    assert recipe.with_output_dir("~/b").output_dir == str(tmp_path / "b")
    path = write_recipe(folder, text=write_recipe(folder).read_text() + "output_dir: ~/c\n")
    path.write_text(path.read_text().replace("output_dir: run\n", ""))
    assert load_recipe(path).output_dir == str(tmp_path / "c")


# ---- 4, 5: LoRA targets and rank, bucket lengths
@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "training.lora={targets: []}",
            "--set: training.lora.targets: lists no layer, and LoRA would train the task head "
            "alone; give one or more of: query, key, value, attention_output, intermediate, "
            "output",
        ),
        (
            "training.lora={targets: [query, value, query]}",
            "--set: training.lora.targets.2: 'query' is listed twice",
        ),
        (
            "training.bucket_lengths=[0, -3]",
            "--set: training.bucket_lengths.0: must be at least 1, got 0",
        ),
        (
            "training.bucket_lengths=[16, -3]",
            "--set: training.bucket_lengths.1: must be at least 1, got -3",
        ),
    ],
)
def test_recipe_lists_are_checked_item_by_item(folder, setting, message):
    result = run_bertkit("check", write_recipe(folder), "--set", setting, cwd=folder)
    one_line_error(result, f"bertkit: error: {message}")


def test_bucket_lengths_may_come_in_any_order(folder):
    recipe = load_recipe(write_recipe(folder), ["training.bucket_lengths=[12, 8, 8]"])
    from bertkit.padding import bucket_lengths

    assert bucket_lengths(16, recipe.training.bucket_lengths) == (8, 12, 16)


# ---- 6: check refuses what finetune refuses before training, with the same line
TOO_BIG = [
    (
        {"reinit_top_layers": 3},
        "r.yaml:12: training.reinit_top_layers: must be at most 2, the backbone's transformer "
        "layers, got 3",
    ),
    (
        {"lora": {"rank": 4096}},
        "r.yaml:13: training.lora.rank: must be at most 32, the narrower side of the query "
        "layers it adapts (32 x 32), got 4096",
    ),
    (
        {"lora": {"rank": 48, "targets": ["intermediate"]}},
        "r.yaml:13: training.lora.rank: must be at most 32, the narrower side of the "
        "intermediate layers it adapts (32 x 64), got 48",
    ),
]


@pytest.mark.parametrize("command", ["check", "finetune", "featurize"])
@pytest.mark.parametrize("training, message", TOO_BIG)
def test_check_and_finetune_refuse_what_does_not_fit_the_backbone(
    folder, command, training, message
):
    result = run_bertkit(command, write_recipe(folder, **training), cwd=folder)
    one_line_error(result, message)
    assert not (folder / "run").exists()


def test_a_sequence_longer_than_the_positions_is_refused_by_check(folder):
    path = write_recipe(folder)
    result = run_bertkit("check", path, "--set", "backbone.sequence_length=256", cwd=folder)
    one_line_error(
        result, "--set: backbone.sequence_length: 256 is more than the model's 128 positions"
    )


def test_a_fitting_lora_rank_passes_check(folder):
    result = run_bertkit("check", write_recipe(folder, lora={"rank": 32}), cwd=folder)
    assert result.returncode == 0, result.stderr
    assert "rank: 32" in result.stdout


def test_sizes_come_from_every_kind_of_checkpoint_config(tmp_path):
    from bertkit.model.sizes import BackboneSizes, read_sizes

    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "metadata.json").write_text("{}")
    (hub / "config.json").write_text(
        json.dumps(
            {
                "class_name": "BertBackbone",
                "config": {
                    "num_layers": 4,
                    "hidden_dim": 256,
                    "intermediate_dim": 1024,
                    "max_sequence_length": 512,
                },
            }
        )
    )
    google = tmp_path / "google"
    google.mkdir()
    (google / "bert_config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 12,
                "hidden_size": 768,
                "intermediate_size": 3072,
                "max_position_embeddings": 512,
            }
        )
    )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert read_sizes(hub) == BackboneSizes(4, 256, 1024, 512)
    assert read_sizes(google) == BackboneSizes(12, 768, 3072, 512)
    assert read_sizes(tmp_path / "broken") is None


def test_a_built_backbone_is_checked_the_same_way(folder):
    """A named keras-hub preset has no folder to read: `finetune` checks its built backbone."""
    import types

    from bertkit.model.sizes import BackboneSizes
    from bertkit.recipes.preflight import check_backbone_fits

    backbone = types.SimpleNamespace(
        num_layers=2, hidden_dim=32, intermediate_dim=64, max_sequence_length=128
    )
    recipe = load_recipe(write_recipe(folder, reinit_top_layers=3))
    with pytest.raises(
        UserError, match=r"r.yaml:12: training.reinit_top_layers: must be at most 2"
    ):
        check_backbone_fits(recipe, BackboneSizes.of(backbone))


def test_a_missing_data_file_is_refused_by_check_and_finetune_alike(folder):
    path = write_recipe(folder)
    for command in ("check", "finetune"):
        result = run_bertkit(command, path, "--set", "data.validation=dev.tsv", cwd=folder)
        one_line_error(result, f"--set: data.validation: file not found: {folder / 'dev.tsv'}")


# ---- 7: a bad recipe is answered before TensorFlow loads
BEFORE_TENSORFLOW = """
import sys
from bertkit.cli import main
code = main(sys.argv[1:])
print(code, "tensorflow" in sys.modules, "keras" in sys.modules)
"""


@pytest.mark.parametrize("command", ["finetune", "featurize", "tune"])
@pytest.mark.parametrize(
    "text", ["schema: 1\nx: " + "[" * 5000, "schema: 1\ntask: a\x00b\n", "schema: 1\ntask: 3\n"]
)
def test_a_bad_recipe_is_refused_before_tensorflow_loads(folder, command, text):
    path = write_recipe(folder, name=f"bad-{command}.yaml", text=text)
    result = subprocess.run(
        [sys.executable, "-c", BEFORE_TENSORFLOW, command, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
    )
    assert result.stdout.split() == ["2", "False", "False"], result.stderr
    assert result.stderr.startswith(f"bertkit: error: {path}:"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("command", ["check", "finetune"])
def test_a_preset_folder_without_a_checkpoint_is_refused_by_check_and_finetune(
    folder, tmp_path, command
):
    empty, no_weights = tmp_path / "empty", tmp_path / "no-weights"
    empty.mkdir()
    no_weights.mkdir()
    (no_weights / "config.json").write_text((folder / "ckpt" / "config.json").read_text())
    path = write_recipe(folder)
    result = run_bertkit(command, path, "--set", f"backbone.preset={empty}", cwd=folder)
    one_line_error(result, f"--set: backbone.preset: '{empty}' holds no BERT checkpoint")
    result = run_bertkit(command, path, "--set", f"backbone.preset={no_weights}", cwd=folder)
    one_line_error(
        result,
        f"bertkit: error: {no_weights}: found no model.safetensors, pytorch_model.bin or "
        "TensorFlow checkpoint (*.ckpt.index)",
    )


def test_a_seed_that_diverged_beside_others_is_named_once_and_kept(folder, tmp_path, monkeypatch):
    from bertkit.run_dir import RunDirectory
    from bertkit.training import seeds_side_by_side
    from bertkit.training.seeds import _SeedsDone, seed_recipe

    recipe = load_recipe(write_recipe(folder), ["training.seeds=2", "training.seed=7"])
    run = RunDirectory(tmp_path / "run")
    run.prepare(recipe.to_yaml(), overwrite=False)
    diverge = f"import sys; print('bertkit: error: {DIVERGED}'); sys.exit(2)"
    monkeypatch.setattr(seeds_side_by_side, "CHILD_COMMAND", [sys.executable, "-c", diverge])
    done = _SeedsDone(recipe, run, None)
    seed_runs = {7: (seed_recipe(recipe, 7, run), RunDirectory(tmp_path / "run/seeds/seed-7"))}
    with pytest.raises(UserError) as raised:
        seeds_side_by_side.train_side_by_side(seed_runs, 1, None, done.finished, done.failed)
    assert str(raised.value) == f"seed 7: {DIVERGED}"
    assert json.loads(run.run_file.read_text())["failed_seed"]["seed"] == 7


def test_finetune_names_the_seed_that_diverged(folder):
    path = write_recipe(folder, "diverge.yaml", epochs=3, learning_rate=1e6, max_grad_norm=None)
    result = run_bertkit("finetune", path, "--seeds", "2", "--output", "diverged", cwd=folder)
    assert result.returncode == 2, result.stderr
    error = result.stderr.splitlines()[-1]
    assert error.startswith(
        "bertkit: error: seed 42: training.learning_rate: training diverged: the loss is "
    ), result.stderr
    assert "Traceback" not in result.stderr
    run = folder / "diverged"
    if run.exists():  # diverged after an epoch: the run stays, to resume
        status = json.loads((run / "run.json").read_text())
        assert status["failed_seed"]["seed"] == 42


def test_the_python_api_names_its_output_dir_argument(folder):
    import bertkit

    with pytest.raises(UserError) as raised:
        bertkit.finetune(write_recipe(folder), output_dir="/")
    assert str(raised.value) == (
        "finetune(output_dir=...): '/' is the filesystem root; name a folder for the run"
    )


@pytest.mark.parametrize(
    "searched, message",
    [
        (
            "  training.reinit_top_layers: [0, 1, 3]\n",
            "search.yaml:16: search.training.reinit_top_layers.2: must be at most 2, the "
            "backbone's transformer layers, got 3",
        ),
        (
            "  training.lora.rank: {low: 4, high: 64}\n",
            "search.yaml:16: search.training.lora.rank.high: must be at most 32, the narrower "
            "side of the query layers it adapts (32 x 32), got 64",
        ),
    ],
)
def test_check_refuses_searched_values_a_trial_would_refuse(folder, searched, message):
    path = write_recipe(folder, "search.yaml")
    path.write_text(
        path.read_text().replace(
            "  text: sentence\n", "  text: sentence\n  validation: train.tsv\n"
        )
        + "search:\n  trials: 2\n"
        + searched
    )
    one_line_error(run_bertkit("check", path, cwd=folder), message)
