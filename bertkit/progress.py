"""Progress of long steps, as a person watching a terminal or reading a log file wants it.

Every long step says what it is doing (`say`), and counted work (training steps,
inputs predicted) prints a line at every tenth of the work or every 30 seconds,
whichever comes first, like transformers' Trainer logging: a log file, CI or
`nohup` never stays silent through a long epoch.
"""

from __future__ import annotations

import math
import sys
import time


def say(message: str, stream=None) -> None:
    """One status line of `finetune`, flushed at once.

    On stdout, with Keras' progress and the final metrics: stderr carries only
    errors and warnings, so a user error stays the one line there. (`evaluate`
    and `predict` keep stdout for results; their progress goes to stderr.)
    """
    stream = stream or sys.stdout
    print(message, file=stream, flush=True)


def format_duration(seconds: float) -> str:
    """`h:mm:ss` or `m:ss`.

    Example:
        >>> format_duration(75), format_duration(3725.2)
        ('1:15', '1:02:05')
    """
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class Cadence:
    """When a progress line is due: every `fraction` of `total`, or every `interval` seconds.

    Example:
        >>> now = [0.0]
        >>> cadence = Cadence(100, clock=lambda: now[0])
        >>> [cadence.due(done) for done in (5, 10, 11)]
        [False, True, False]
        >>> now[0] = 31.0
        >>> cadence.due(12), cadence.due(100)
        (True, True)
    """

    def __init__(
        self, total: int, *, fraction: float = 0.1, interval: float = 30.0, clock=time.monotonic
    ):
        self.total, self.interval, self.clock = total, interval, clock
        self.every = max(1, math.ceil(total * fraction))
        self.restart()

    def restart(self) -> None:
        self.started = self.last_time = self.clock()
        self.last_done = 0

    def due(self, done: int) -> bool:
        now = self.clock()
        if (
            done >= self.total
            or done - self.last_done >= self.every
            or (now - self.last_time >= self.interval and done > self.last_done)
        ):
            self.last_done, self.last_time = done, now
            return True
        return False

    def elapsed(self) -> float:
        return self.clock() - self.started

    def eta(self, done: int) -> str:
        if not done:
            return "?"
        return format_duration(self.elapsed() / done * max(self.total - done, 0))


class CountProgress:
    """Progress of `total` items (inputs, examples) on stderr: `predict 64/200 (32%) ...`.

    On a terminal the line is rewritten in place; elsewhere a line is printed at
    each tenth or every 30 seconds. Nothing is printed for work under `quiet_below`
    items, so short calls stay quiet.
    """

    def __init__(
        self, what: str, total: int, *, stream=None, clock=time.monotonic, quiet_below: int = 1
    ):
        self.what, self.total = what, total
        self.stream = stream or sys.stderr
        self.cadence = Cadence(total, clock=clock)
        self.enabled = total >= quiet_below
        self.terminal = _is_terminal(self.stream)

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self.terminal:
            end = "\n" if done >= self.total else ""
            print(f"\r{self._line(done)}", end=end, file=self.stream, flush=True)
        elif self.cadence.due(done):
            print(self._line(done), file=self.stream, flush=True)

    def _line(self, done: int) -> str:
        rate = done / max(self.cadence.elapsed(), 1e-9)
        return (
            f"{self.what} {done}/{self.total} ({100 * done // max(self.total, 1)}%)  "
            f"{rate:.1f}/s  eta {self.cadence.eta(done)}"
        )


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
