import os
import tempfile

# Converted checkpoints go to a throwaway cache, never to the user's ~/.cache.
os.environ.setdefault("BERTKIT_CACHE", tempfile.mkdtemp(prefix="bertkit-cache-"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# The tests' JAX programs are tiny and run a few steps, so compiling them is most of a JAX
# test's time: with XLA's backend optimizations off a tiny model's training step compiles
# 2-3x faster on a 2-core CPU (94 -> 34 s for a one-epoch run's 24 programs). Inherited by
# the processes tests start; appended to any flags already set.
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if _FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

# The longest test files first. pytest-xdist (`--dist loadfile --no-loadscope-reorder`) hands
# each worker the next file in collection order, so with the long files started early the short
# ones fill in at the end and both workers finish close together (longest-processing-time-first
# scheduling). Times on the 2-core CI machine; files not listed keep their order after these.
SLOWEST_FIRST = (
    "test_tune.py",
    "test_multi_process.py",
    "test_hardening.py",
    "test_jax_backend.py",
    "test_data_parallel.py",
    "test_resume.py",
    "test_mlm.py",
    "test_packing.py",
    "test_gpu_check.py",
    "test_serve.py",
    "test_tagging.py",
    "test_span_qa.py",
    "test_classification.py",
    "test_int8_export.py",
    "test_embed.py",
    "test_embedding_task.py",
    "test_feature_based.py",
    "test_preemption.py",
    "test_lora.py",
    "test_seeds_side_by_side.py",
    "test_plugins.py",
    "test_compilation.py",
    "test_untrusted_files.py",
    "test_features_jax.py",
    "test_run_phases.py",
    "test_progress.py",
    "test_small_data.py",
    "test_seeds.py",
    "test_cli.py",
    "test_training_options.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
