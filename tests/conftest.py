import os
import tempfile

import pytest

# Converted checkpoints go to a throwaway cache, never to the user's ~/.cache.
os.environ.setdefault("BERTKIT_CACHE", tempfile.mkdtemp(prefix="bertkit-cache-"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# Two workers share two cores, and the tests' models are tiny: one thread a TensorFlow op keeps
# them from oversubscribing the cores (a test file's CPU time 10% lower). Inherited by the
# processes tests start.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

# The tests' JAX programs are tiny and run a few steps, so compiling them is most of a JAX
# test's time: with XLA's backend optimizations off a tiny model's training step compiles
# 2-3x faster on a 2-core CPU (94 -> 34 s for a one-epoch run's 24 programs). Inherited by
# the processes tests start; appended to any flags already set.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

# The slow tier: `python -m pytest -q` leaves it out (pyproject's `-m "not slow"`), so that the
# suite CI runs stays within its 15 minutes on 2 cores; `python -m pytest -q -m slow` runs it
# alone, `-m ""` everything. What it holds is the costliest tests whose paths the default tier
# also runs more cheaply: the simulated multi-process, multi-device and GPU-check runs, tuning
# with several workers, a kill -9 on JAX (the default tier kills TensorFlow runs), a second
# run's compilation cache, the merged-LoRA export of the tasks beyond classification.
SLOW_FILES = (
    "test_tune.py",
    "test_multi_process.py",
    "test_data_parallel.py",
    "test_seeds_side_by_side.py",
    "test_gpu_check.py",
    "test_features_jax.py",
)
SLOW_TESTS = (
    "test_lora.py::test_every_task_exports_the_merged_model[span_qa]",
    "test_lora.py::test_every_task_exports_the_merged_model[tagging]",
    "test_lora.py::test_every_task_exports_the_merged_model[mlm]",
    "test_export_hardening.py::test_a_rerun_after_kill_9_in_the_int8_gate_leaves_no_staging_folders",
    "test_embedding_task.py::test_kill_9_mid_epoch_then_resume_with_lora_gives_the_uninterrupted_run",
    "test_resume.py::test_kill_9_mid_epoch_then_resume_on_jax",
    "test_attention.py::test_the_jax_tests_pass_under_jax",
    "test_compilation.py::test_a_second_identical_run_compiles_nothing",
    "test_training_options.py::test_bfloat16_accumulation_and_early_stopping",
    "test_plugins.py::test_example_plugin_passes_the_contract_test",
    "test_feature_based.py::test_the_last_layers_concatenated_feed_the_tagging_head",
    "test_run_phases.py::test_final_metrics_are_the_best_epochs_without_evaluating_again",
    "test_packing.py::test_a_packed_run_trains_saves_and_serves_the_task_model[tagging]",
    "test_segment_embedding.py::test_on_jax_the_segment_table_gradient_is_no_scatter",
    "test_hardening.py::test_a_jax_run_prints_no_tensorflow_start_up_lines",
)

# The longest test files first. pytest-xdist (`--dist loadfile --no-loadscope-reorder`) hands
# each worker the next file in collection order, so with the long files started early the short
# ones fill in at the end and both workers finish close together (longest-processing-time-first
# scheduling). Times of the default tier on the 2-core machine; files not listed keep their
# order after these.
SLOWEST_FIRST = (
    "test_hardening.py",
    "test_tagging_spans.py",
    "test_serve.py",
    "test_tagging_crf.py",
    "test_mlm.py",
    "test_onnx_export.py",
    "test_serve_hardening.py",
    "test_jax_backend.py",
    "test_packing.py",
    "test_feature_based.py",
    "test_export_hardening.py",
    "test_span_qa.py",
    "test_tagging.py",
    "test_embedding_task.py",
    "test_untrusted_files.py",
    "test_resume.py",
    "test_serve_embeddings.py",
    "test_classification.py",
    "test_features_file.py",
    "test_embed.py",
    "test_int8_export.py",
    "test_vocabulary_checks.py",
    "test_progress.py",
    "test_weight_averaging.py",
    "test_lora.py",
    "test_seeds.py",
    "test_hardening_recipes.py",
    "test_small_data.py",
    "test_run_phases.py",
    *SLOW_FILES,  # for `-m slow` and `-m ""`
)


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    for item in items:
        if item.path.name in SLOW_FILES or f"{item.path.name}::{item.name}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
