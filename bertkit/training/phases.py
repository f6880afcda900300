"""Wall seconds of a fine-tuning run's phases: recorded in `run.json` under `phases`.

Example:
    >>> phases = Phases()
    >>> with phases("read"):
    ...     pass
    >>> phases.add("read", 1.0)
    >>> sorted(phases.record())
    ['read', 'total']
"""

from __future__ import annotations

import contextlib
import time


class Phases:
    """Named wall-clock totals, in the order the phases first ran."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.first_step_ended: float | None = None  # perf_counter(), set by `TimeSteps`
        self.started = time.perf_counter()
        self.called_at = time.time()  # Unix time: start-up is measured up to here

    @contextlib.contextmanager
    def __call__(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def total(self, names) -> float:
        return sum(self.seconds.get(name, 0.0) for name in names)

    def record(self) -> dict[str, float]:
        """Seconds per phase, rounded, and `total`: the whole `finetune` call so far."""
        return {
            **{name: round(value, 3) for name, value in self.seconds.items()},
            "total": round(time.perf_counter() - self.started, 3),
        }

    def line(self) -> str:
        return "phases (s): " + ", ".join(
            f"{name} {value:.1f}" for name, value in self.record().items()
        )
