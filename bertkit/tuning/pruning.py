"""The Keras callback through which a trial's epochs reach Optuna, and its pruner stops it.

Apart from `bertkit.tuning.tuner`, which imports it only when a trial runs: loading it
imports Keras, which `bertkit check` and `bertkit tune --report` never need.
"""

from __future__ import annotations

import math

import keras


class ReportToTrial(keras.callbacks.Callback):
    """Reports each epoch's validation metric to an Optuna trial; stops a trial it prunes.

    optuna-integration's `KerasPruningCallback` is a separate package, reads a metric
    name Keras computes (bertkit's `val_<metric>` comes from `Evaluate`, so this
    callback must run after it), and raises `TrialPruned` inside `fit`, which would
    leave a half-made run directory. Here a pruned trial stops at the end of the
    epoch, and `finetune` finishes it as any run (best epoch so far, metrics,
    SavedModel). The last epoch is reported but never pruned: the trial has done all
    its training by then, and its result is a complete one. Only `trial.report` and
    `trial.should_prune` are used.
    """

    def __init__(self, trial, monitor: str):
        super().__init__()
        self.trial, self.monitor = trial, monitor
        self.pruned_after = None  # the epoch (1-based) after which the trial was pruned

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or not math.isfinite(value):
            return
        self.trial.report(float(value), step=epoch + 1)
        if epoch + 1 < self.params.get("epochs", 0) and self.trial.should_prune():
            self.pruned_after = epoch + 1
            self.model.stop_training = True
