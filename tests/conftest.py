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
