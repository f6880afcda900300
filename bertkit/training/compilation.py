"""Compiled programs, paid for once: JAX's persistent compilation cache, and a count of
what a run compiled.

On JAX every new input shape compiles an XLA program: 20-35 s each for BERT-base on a
GPU, about half of a short run. Keras leaves JAX's persistent compilation cache off, so
every run compiles every program again. bertkit turns it on (`training.
compilation_cache`, default `auto`: `$BERTKIT_COMPILATION_CACHE`, else `xla/` in
bertkit's cache folder, `~/.cache/bertkit`): a second identical run, every `bertkit
tune` trial after the first and a resumed run read their programs from disk.
`CompileCounter` counts the programs a run obtained, how many came from the cache and
the seconds spent, for `run.json`'s `compilation` entry.

Example:
    >>> cache_folder("off") is None
    True
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bertkit.run_dir import user_cache_dir

# JAX's monitoring events (jax._src.dispatch, jax._src.compiler): a program obtained
# (compiled or read from the cache, with its seconds), and one read from the cache
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"


def cache_folder(setting: str = "auto") -> Path | None:
    """The folder `setting` (`training.compilation_cache`) names; None: no cache."""
    if setting == "auto":
        setting = os.environ.get("BERTKIT_COMPILATION_CACHE", "auto")
    if setting == "off":
        return None
    return user_cache_dir() / "xla" if setting == "auto" else Path(setting).expanduser()


def use_compilation_cache(setting: str = "auto") -> Path | None:
    """Turns JAX's persistent compilation cache on in `setting`'s folder (on JAX only).

    Every program is cached, however fast it compiled: on a CPU the tiny models of
    the tests compile in well under JAX's default threshold of one second. Call
    before the first compilation; the first folder a process uses stays its folder.
    """
    import keras

    folder = cache_folder(setting)
    if keras.backend.backend() != "jax" or folder is None:
        return None
    import jax

    if jax.config.jax_compilation_cache_dir:  # set by the user, or by an earlier run
        return Path(jax.config.jax_compilation_cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return folder


class CompileCounter:
    """Counts the XLA programs JAX obtains while it is entered: compiled, or read from the
    persistent cache. A no-op on other backends.

    Example:
        >>> with CompileCounter() as counted:
        ...     pass
        >>> counted.record()
        {'programs': 0, 'from_cache': 0, 'seconds': 0.0}
    """

    def __init__(self):
        self.programs, self.from_cache, self.seconds = 0, 0, 0.0
        # (started, seconds, function, read from the cache) of each program obtained
        self.obtained: list[tuple[float, float, str, bool]] = []
        self._hit = threading.local()  # JAX reports a cache hit, then its duration
        self._monitoring = None

    def __enter__(self) -> CompileCounter:
        import keras

        if keras.backend.backend() == "jax":
            from jax import monitoring

            monitoring.register_event_duration_secs_listener(self._on_duration)
            monitoring.register_event_listener(self._on_event)
            self._monitoring = monitoring
        return self

    def __exit__(self, *exc) -> None:
        if self._monitoring is not None:
            self._monitoring.unregister_event_duration_listener(self._on_duration)
            self._monitoring.unregister_event_listener(self._on_event)
            self._monitoring = None

    def _on_duration(self, event: str, seconds: float, fun_name: str = "?", **_) -> None:
        if event == _BACKEND_COMPILE:
            self.programs += 1
            self.seconds += seconds
            hit, self._hit.value = getattr(self._hit, "value", False), False
            self.obtained.append((time.perf_counter() - seconds, seconds, fun_name, hit))

    def _on_event(self, event: str, **_) -> None:
        if event == _CACHE_HIT:
            self.from_cache += 1
            self._hit.value = True

    def record(self, first_step_ended: float | None = None) -> dict:
        """`{"programs", "from_cache", "seconds"}`, as `run.json` keeps it; with the
        `time.perf_counter()` at which the run's first step ended, also
        `after_first_step`: the programs compiled after it (each one stalls the steps),
        their seconds and the longest one's function, and those read from the cache."""
        record = {
            "programs": self.programs,
            "from_cache": self.from_cache,
            "seconds": round(self.seconds, 3),
        }
        if first_step_ended is not None:
            late = [item for item in self.obtained if item[0] >= first_step_ended]
            compiled = [item for item in late if not item[3]]
            longest = max(compiled, key=lambda item: item[1], default=(0, 0.0, None))
            record["after_first_step"] = {
                "compiled": len(compiled),
                "seconds": round(sum(item[1] for item in compiled), 3),
                "longest": {"function": longest[2], "seconds": round(longest[1], 3)},
                "from_cache": len(late) - len(compiled),
            }
        return record
