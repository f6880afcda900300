"""SIGTERM as a preemption: the run saves where it is and stops, to be resumed.

Schedulers end a job with SIGTERM and, after a grace period, SIGKILL: SLURM (at the time
limit, or preempting for a job of higher priority), Kubernetes (a pod evicted or deleted,
30 s by default), preemptible cloud VMs (about 30 s). While `finetune` runs, SIGTERM is
a request: training stops at the end of the step that is running, saves a checkpoint of
that step (`bertkit.training.checkpointing`) and raises `Preempted`; the same call again
resumes there. Before training starts and after it ends (reading data, final evaluation,
export) it raises `Preempted` at once, as Ctrl-C raises `KeyboardInterrupt`: those parts
are redone or picked up by the next call as after any interruption.

This module imports neither Keras nor TensorFlow: the CLI catches `Preempted` before
either is loaded.
"""

from __future__ import annotations

import contextlib
import signal
import threading

EXIT_PREEMPTED = 128 + signal.SIGTERM  # 143, as a shell reports a process SIGTERM ended


class Preempted(SystemExit):
    """`finetune` stopped by SIGTERM, its run saved to be resumed.

    A `SystemExit`, as PyTorch Lightning's `SIGTERMException` is: `except Exception`
    (a trial loop, a retry wrapper) does not swallow it, and uncaught it ends a script
    with exit status 143 and no traceback, so the scheduler sees the job stopped by its
    signal. (transformers' Trainer does not handle SIGTERM: its process dies and resumes
    from its last `save_steps` checkpoint.) Catch it to resubmit or log; call `finetune`
    again with the same recipe and output directory to continue the run.

    Attributes:
        epoch, step: where training stopped: `step` steps of epoch `epoch` (1-based)
            done, the checkpoint at that point; None before or after training.
        message: e.g. `stopped by SIGTERM at epoch 2 step 137`.

    Example:
        >>> error = Preempted(epoch=2, step=137)
        >>> error.code, str(error)
        (143, 'stopped by SIGTERM at epoch 2 step 137')
        >>> str(Preempted(epoch=2, step=0)), str(Preempted(where="after training"))
        ('stopped by SIGTERM after epoch 2', 'stopped by SIGTERM after training')
    """

    def __init__(
        self, epoch: int | None = None, step: int | None = None, *, where: str | None = None
    ):
        super().__init__(EXIT_PREEMPTED)
        self.epoch, self.step = epoch, step
        if where is None:
            where = f"at epoch {epoch} step {step}" if step else f"after epoch {epoch}"
        self.message = f"stopped by SIGTERM {where}"

    def __str__(self) -> str:
        return self.message


class SigtermWatch:
    """SIGTERM while `finetune` runs: `requested` during training (see `training`), checked at
    the end of each step; `Preempted` at once outside it.

    Installed by `watching_sigterm` for the length of one `finetune` call.
    """

    def __init__(self):
        self.requested = False
        self.where = "before training"  # then "after training"; None while training

    def __call__(self, signum, frame):
        if self.where is None:
            self.requested = True  # the step that runs ends, is saved, then `Preempted`
        else:
            raise Preempted(where=self.where)

    @contextlib.contextmanager
    def training(self):
        """While the block runs, SIGTERM is a request the training steps check."""
        self.where = None
        try:
            yield self
        finally:
            self.where = "after training"

    def stop_at(self, step: int) -> bool:
        """Whether training stops before step `step` (0-based, counted over the run's epochs):
        SIGTERM came."""
        return self.requested

    def stop_if_requested(self) -> None:
        """`Preempted` if SIGTERM came during the last epoch's end (its evaluation): called
        once the run is recorded trained, so the next call goes on from there."""
        if self.requested:
            raise Preempted(where="after training")


class JobSigtermWatch(SigtermWatch):
    """SIGTERM in a job of several processes (JAX): all of them stop after the same step.

    Stopping where the signal comes would leave each process at another step, waiting for
    the others in a collective. JAX's preemption service (its SIGTERM handler, installed by
    `jax.distributed.initialize`) tells every process of a SIGTERM any of them got, and
    `reached_preemption_sync_point`, asked at every step, is true in all of them at the
    same step: the first one after the last any of them had reached. Process 0 saves that
    step; every process raises `Preempted`. Outside training a SIGTERM is only noted, and
    the run goes on (to its end, or to the scheduler's SIGKILL).
    """

    def __init__(self):
        super().__init__()
        self.available = True  # False where JAX's preemption service is turned off

    def stop_at(self, step: int) -> bool:
        from jax.experimental import multihost_utils

        if self.requested or not self.available:
            return self.requested
        try:
            self.requested = multihost_utils.reached_preemption_sync_point(step)
        except RuntimeError:  # `jax_enable_preemption_service` off: SIGTERM ends the process
            self.available = False
        return self.requested


@contextlib.contextmanager
def watching_sigterm(processes: int = 1):
    """A `SigtermWatch` handling SIGTERM while the block runs; the handler before it comes
    back after. Python lets the main thread alone set handlers: elsewhere the watch is made
    but not installed, and SIGTERM does what it did. In a job of several `processes`, a
    `JobSigtermWatch` (JAX's handler stays)."""
    if processes > 1:
        yield JobSigtermWatch()
        return
    watch = SigtermWatch()
    if threading.current_thread() is not threading.main_thread():
        yield watch
        return
    previous = signal.signal(signal.SIGTERM, watch)
    try:
        yield watch
    finally:
        signal.signal(signal.SIGTERM, previous)
