"""The `bertkit` command, sending its own process a signal before a chosen training step.

Tests that interrupt a run (kill -9, SIGTERM) at a wall-clock moment must give it hundreds
of steps to be sure to catch it mid-epoch. Here the run signals itself before step `STEP`
(0-based) of epoch `EPOCH` (0-based), whatever the machine's speed, so a few steps do:

    BERTKIT_TEST_SIGNAL=SIGKILL,1,13 python tests/signal_at_step.py finetune recipe.yaml

Without the variable the command runs as `bertkit` does. `install_from_environment()` does
the same for a script that starts the command itself.
"""

import os
import signal
import sys
import time

VARIABLE, RENDEZVOUS = "BERTKIT_TEST_SIGNAL", "BERTKIT_TEST_RENDEZVOUS"


def install_from_environment() -> None:
    """Patches `RunCheckpoint` to send the signal `$BERTKIT_TEST_SIGNAL` names
    (`NAME,EPOCH,STEP`) before that step.

    In a job of several processes, JAX's preemption notifier takes SIGTERM; it looks for
    it once a second, and JAX dispatches a tiny model's steps ahead of their results up
    to the epoch's end, so the notice would reach the processes an epoch later, where a
    real model's steps would have taken their time. There every process is held before
    the step instead: the signalled one 2 s after its signal, then it creates the file
    `$BERTKIT_TEST_RENDEZVOUS`; the others (`NAME` `PAUSE`) until that file exists.
    """
    if not os.environ.get(VARIABLE):
        return
    from bertkit.training.checkpointing import RunCheckpoint

    name, epoch, step = os.environ[VARIABLE].split(",")
    at, rendezvous = (int(epoch), int(step)), os.environ.get(RENDEZVOUS)
    before_step = RunCheckpoint.on_train_batch_begin

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == at and name == "PAUSE":
            deadline = time.monotonic() + 120
            while not os.path.exists(rendezvous) and time.monotonic() < deadline:
                time.sleep(0.05)
        elif (self.epoch, batch) == at:
            os.kill(os.getpid(), signal.Signals[name])
            if rendezvous:
                time.sleep(2)
                open(rendezvous, "w").close()
        before_step(self, batch, logs)

    RunCheckpoint.on_train_batch_begin = on_train_batch_begin


if __name__ == "__main__":
    install_from_environment()
    sys.argv[0] = "bertkit"
    from bertkit.cli import run

    run()
