"""BERT's optimizer: AdamW with linear warmup then linear decay, global-norm clipping.

Weight decay is not applied to biases and LayerNorm parameters (BERT's
`exclude_from_weight_decay`). Gradient accumulation and float16 loss scaling
are Keras's own (`gradient_accumulation_steps`, `LossScaleOptimizer` added by
`compile` under a `mixed_float16` policy).
"""

from __future__ import annotations

import keras
from keras import ops

NO_DECAY = ["bias", "gamma", "beta"]  # Keras names of biases and LayerNorm scale/offset


@keras.saving.register_keras_serializable(package="bertkit")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """0 -> peak over `warmup_steps`, then linearly down to 0 at `total_steps`.

    Example:
        >>> schedule = WarmupLinearDecay(1.0, warmup_steps=2, total_steps=10)
        >>> [round(float(schedule(step)), 3) for step in (0, 1, 2, 6, 10)]
        [0.0, 0.5, 1.0, 0.5, 0.0]
    """

    def __init__(self, peak_learning_rate: float, warmup_steps: int, total_steps: int):
        self.peak_learning_rate = peak_learning_rate
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = step / max(self.warmup_steps, 1)
        decay = (self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1)
        fraction = ops.where(step < self.warmup_steps, warmup, decay)
        return self.peak_learning_rate * ops.clip(fraction, 0.0, 1.0)

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


def make_optimizer(training, steps_per_epoch: int) -> keras.optimizers.Optimizer:
    """AdamW for a `TrainingConfig`.

    Keras feeds learning-rate schedules the count of batches, accumulated or
    not, so the schedule is laid out in batches.
    """
    accumulation = training.gradient_accumulation_steps
    total_steps = max(1, training.epochs * steps_per_epoch)
    schedule = WarmupLinearDecay(training.learning_rate,
                                 int(training.warmup_ratio * total_steps), total_steps)
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule, weight_decay=training.weight_decay, epsilon=1e-6,
        global_clipnorm=training.max_grad_norm,
        gradient_accumulation_steps=accumulation if accumulation > 1 else None)
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer
