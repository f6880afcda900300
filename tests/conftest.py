import os
import tempfile

# Converted checkpoints go to a throwaway cache, never to the user's ~/.cache.
os.environ.setdefault("BERTKIT_CACHE", tempfile.mkdtemp(prefix="bertkit-cache-"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
