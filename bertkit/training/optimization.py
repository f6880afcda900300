"""BERT's optimizer: AdamW with linear warmup then linear decay, global-norm clipping.

Weight decay is not applied to biases and LayerNorm parameters (BERT's
`exclude_from_weight_decay`). Epsilon is added to the bias-corrected second
moment, as PyTorch's and transformers' AdamW do (`BertAdamW`). Gradient
accumulation (also of micro-batches) and float16 loss scaling are Keras's own
(`gradient_accumulation_steps`, `LossScaleOptimizer` added by `compile` under a
`mixed_float16` policy). On TensorFlow outside a distribution strategy each update
runs as TensorFlow's fused Adam kernel, a quarter of Keras's time for the same rule.
With `training.head_learning_rate` the task head's variables take their own peak rate on
the same schedule, and with `training.layer_lr_decay` each backbone layer its own
(`layer_rate_factors`), both through `BertAdamW.scale_learning_rate`.
"""

from __future__ import annotations

import keras
from keras import ops

NO_DECAY = ["bias", "gamma", "beta"]  # Keras names of biases and LayerNorm scale/offset


@keras.saving.register_keras_serializable(package="bertkit")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """0 -> peak over `warmup_steps`, then linearly down to 0 at `total_steps`.

    Steps count updates. Keras calls the schedule with the count of batches it
    was fed; under gradient accumulation `steps_per_update` of them make one
    update, and each batch of an update gets that update's rate.

    Example:
        >>> schedule = WarmupLinearDecay(1.0, warmup_steps=2, total_steps=10)
        >>> [round(float(schedule(step)), 3) for step in (0, 1, 2, 6, 10)]
        [0.0, 0.5, 1.0, 0.5, 0.0]
        >>> accumulated = WarmupLinearDecay(1.0, 2, 10, steps_per_update=4)
        >>> [round(float(accumulated(batch)), 3) for batch in (0, 3, 4, 8)]
        [0.0, 0.0, 0.5, 1.0]
    """

    def __init__(
        self,
        peak_learning_rate: float,
        warmup_steps: int,
        total_steps: int,
        steps_per_update: int = 1,
    ):
        self.peak_learning_rate = peak_learning_rate
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.steps_per_update = steps_per_update

    def __call__(self, step):
        step = ops.cast(ops.floor_divide(step, self.steps_per_update), "float32")
        warmup = step / max(self.warmup_steps, 1)
        decay = (self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1)
        fraction = ops.where(step < self.warmup_steps, warmup, decay)
        return self.peak_learning_rate * ops.clip(fraction, 0.0, 1.0)

    def value_at(self, batch: int) -> float:
        """The rate at `batch` as a Python float: `__call__` without a tensor op, for logs.

        Example:
            >>> WarmupLinearDecay(1.0, 2, 10, steps_per_update=4).value_at(8)
            1.0
        """
        step = batch // self.steps_per_update
        if step < self.warmup_steps:
            fraction = step / max(self.warmup_steps, 1)
        else:
            fraction = (self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1)
        return self.peak_learning_rate * min(max(fraction, 0.0), 1.0)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "steps_per_update": self.steps_per_update,
        }


@keras.saving.register_keras_serializable(package="bertkit")
class BertAdamW(keras.optimizers.AdamW):
    """Keras AdamW with PyTorch's epsilon: `m_hat / (sqrt(v_hat) + epsilon)`.

    Keras's Adam adds epsilon to `sqrt(v)` before the bias correction, so the
    epsilon it applies is `epsilon / sqrt(1 - beta_2**t)`: 31x the set value at
    step 1, still 2x at step 250. At fine-tuning's epsilon (1e-6) that shrinks
    the first hundreds of updates of weights with small gradients to 0.5-0.8x of
    PyTorch's, which recipes and learning rates tuned with transformers assume.
    Weight decay, clipping and accumulation stay Keras's own.

    Example:
        >>> import numpy as np
        >>> weight = keras.Variable(np.ones(2, "float32"))
        >>> optimizer = BertAdamW(learning_rate=0.1, weight_decay=0.0, epsilon=1e-6)
        >>> optimizer.apply([keras.ops.convert_to_tensor([1e-6, 1.0])], [weight])
        >>> [round(float(w), 3) for w in weight.numpy()]  # step 1: 1 - lr * g / (|g| + eps)
        [0.95, 0.9]
    """

    def scale_learning_rate(self, var_list, factor: float) -> None:
        """Trains the variables of `var_list` at `factor` times the scheduled rate.

        Why here: Keras 3 has no parameter groups (PyTorch's per-group `lr`), and `compile`
        takes one optimizer; two would need a custom `train_step`. Scaling the rate per
        variable inside `update_step` keeps one optimizer, one set of moments and one
        checkpoint layout, so saving, restoring and resuming are unchanged: the factors
        are configuration, set again whenever a run builds its optimizer (as Keras's
        `exclude_from_weight_decay`). A scaled variable decays by its own rate, as a
        PyTorch parameter group with its own `lr` does.

        Example:
            >>> import numpy as np
            >>> head, body = (keras.Variable(np.ones(1, "float32")) for _ in range(2))
            >>> optimizer = BertAdamW(learning_rate=0.1, weight_decay=0.0)
            >>> optimizer.scale_learning_rate([head], 10.0)
            >>> optimizer.apply([keras.ops.ones(1), keras.ops.ones(1)], [head, body])
            >>> round(float(head.numpy()[0]), 3), round(float(body.numpy()[0]), 3)
            (0.0, 0.9)
        """
        factors = dict(getattr(self, "_learning_rate_factors", {}))
        factors.update({self._var_key(variable): float(factor) for variable in var_list})
        self._learning_rate_factors = factors

    def _learning_rate_of(self, variable, learning_rate):
        """`learning_rate` scaled for `variable` (`scale_learning_rate`)."""
        factor = getattr(self, "_learning_rate_factors", {}).get(self._var_key(variable), 1.0)
        return learning_rate if factor == 1.0 else ops.multiply(learning_rate, factor)

    def _apply_weight_decay(self, variables):
        if self._fused_on_tensorflow() or self.weight_decay is None:
            return  # fused: `update_step` decays each variable in the same pass as its update
        for variable in variables:  # Keras's rule, by each variable's own rate
            if self._use_weight_decay(variable):
                rate = ops.cast(
                    self._learning_rate_of(variable, self.learning_rate), variable.dtype
                )
                decay = ops.cast(self.weight_decay, variable.dtype)
                variable.assign(variable - variable * decay * rate)

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = self._learning_rate_of(variable, learning_rate)
        if self._fused_on_tensorflow():
            self._fused_tensorflow_step(gradient, variable, learning_rate)
            return
        dtype = variable.dtype
        learning_rate = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        step = ops.cast(self.iterations + 1, dtype)
        first_correction = 1 - ops.power(ops.cast(self.beta_1, dtype), step)
        second_correction = 1 - ops.power(ops.cast(self.beta_2, dtype), step)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        if self.amsgrad:
            v_hat = self._velocity_hats[index]
            self.assign(v_hat, ops.maximum(v_hat, v))
            v = v_hat
        denominator = ops.add(ops.sqrt(ops.divide(v, second_correction)), self.epsilon)
        self.assign_sub(
            variable,
            ops.divide(ops.multiply(m, ops.divide(learning_rate, first_correction)), denominator),
        )

    def _fused_on_tensorflow(self) -> bool:
        """Whether updates run as TensorFlow's fused Adam kernel (see `_fused_tensorflow_step`)."""
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return False
        import tensorflow as tf

        return not tf.distribute.has_strategy()  # a strategy's replicas: Keras's own path

    def _clip_gradients(self, grads):
        """Global-norm clipping by the norm PyTorch clips by, that of the dense gradient.

        On TensorFlow the word embeddings' gradient is sparse (`tf.IndexedSlices`),
        one slice per token of the batch; Keras squares the slices one by one, so a
        row seen several times (a batch's [CLS], common words) adds the sum of its
        slices' squared norms instead of the squared norm of their sum, too little
        (6 for 12 with two equal slices).
        Here repeated rows are summed first, and the gradient stays sparse until the
        update (not made dense twice and scaled over all 30k rows).
        """
        if keras.backend.backend() != "tensorflow" or not self.global_clipnorm:
            return super()._clip_gradients(grads)
        import tensorflow as tf

        grads = [_summed_rows(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        parts = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(part)) for part in parts]))
        scale = self.global_clipnorm * tf.minimum(1.0 / norm, 1.0 / self.global_clipnorm)
        scale += norm - norm  # as Keras: NaN for a non-finite norm
        return [
            tf.IndexedSlices(g.values * scale, g.indices, g.dense_shape)
            if isinstance(g, tf.IndexedSlices)
            else g * scale
            for g in grads
        ]

    def _fused_tensorflow_step(self, gradient, variable, learning_rate):
        """The update above as one `ResourceApplyAdam` kernel per weight, decay first.

        Keras runs Adam on TensorFlow as about ten element-wise kernels per weight,
        each a pass over memory: 106 ms per update for MiniLM's 22.7M weights here,
        a third of a training step. TensorFlow's fused kernel makes one pass (26 ms).
        It places epsilon as Keras does, `m * alpha / (sqrt(v) + eps')` with `alpha =
        lr * sqrt(c2) / c1`, so `eps' = epsilon * sqrt(c2)` gives PyTorch's
        `lr / c1 * m / (sqrt(v / c2) + epsilon)` exactly (c1, c2: the bias corrections).
        The decay is PyTorch's `weight *= 1 - lr * weight_decay`.
        """
        import tensorflow as tf

        if isinstance(variable, keras.Variable):
            variable = variable.value
        dtype = variable.dtype
        learning_rate = tf.cast(learning_rate, dtype)
        if self.weight_decay and self._use_weight_decay(variable):
            variable.assign(variable * (1 - learning_rate * tf.cast(self.weight_decay, dtype)))
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        beta_1_power, beta_2_power = tf.pow(beta_1, step), tf.pow(beta_2, step)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].value.handle,
            v=self._velocities[index].value.handle,
            beta1_power=beta_1_power,
            beta2_power=beta_2_power,
            lr=learning_rate,
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype) * tf.sqrt(1 - beta_2_power),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),
        )


def _summed_rows(gradient):
    """A sparse gradient with each row once (`tf.IndexedSlices` may repeat a row)."""
    import tensorflow as tf

    rows, position = tf.unique(gradient.indices)
    values = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, gradient.dense_shape)


def head_variables(model, backbone) -> list:
    """The trainable variables of `model` outside `backbone`: its task head's."""
    in_backbone = {id(variable) for variable in backbone.variables}
    return [v for v in model.trainable_variables if id(v) not in in_backbone]


def layer_rate_factors(backbone, decay: float) -> dict[str, float]:
    """{variable path: its factor of the learning rate} under `training.layer_lr_decay`.

    The rule of ELECTRA (Clark et al. 2020) and Sun et al. 2019, "How to fine-tune BERT for
    text classification?": the top transformer layer (and the pooler above it) trains at
    the learning rate, each layer below at `decay` times the one above, the embeddings at
    `decay ** num_layers`. Keyed by keras-hub `BertBackbone` paths (`transformer_layer_{i}/...`,
    `token_embedding/...`); a variable of no transformer layer and not the pooler's is an
    embedding's. The task head is not the backbone's: it keeps its own rate.

    Example:
        >>> import keras_hub
        >>> backbone = keras_hub.models.BertBackbone(vocabulary_size=10, num_layers=2,
        ...     num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
        >>> factors = layer_rate_factors(backbone, 0.5)
        >>> [factors[path] for path in ("pooled_dense/kernel",
        ...     "transformer_layer_1/self_attention_layer/query/kernel",
        ...     "transformer_layer_0/feedforward_output_dense/bias", "token_embedding/embeddings")]
        [1.0, 1.0, 0.5, 0.25]
    """
    layers = list(backbone.transformer_layers)
    factors = {variable.path: decay ** len(layers) for variable in backbone.weights}
    for depth, layer in enumerate(layers):
        factors.update({v.path: decay ** (len(layers) - 1 - depth) for v in layer.weights})
    factors.update({variable.path: 1.0 for variable in backbone.pooled_dense.weights})
    return factors


def make_optimizer(
    training, steps_per_epoch: int, head=(), learning_rates=(), backbone=None
) -> keras.optimizers.Optimizer:
    """AdamW for a `TrainingConfig`; `steps_per_epoch` counts the batches `fit` is fed.

    Keras accumulates `gradient_accumulation_steps * micro_batches` of them
    into one update; warmup and decay are laid out in updates, as in
    transformers, so splitting batches into micro-batches leaves the learning
    rate of every update as it was. The variables of `head` (`head_variables`)
    peak at `training.head_learning_rate` when it is set, and those of each
    `(variables, peak)` pair of `learning_rates` (`Task.learning_rates`) at `peak`;
    those of `backbone` at their layer's rate under `training.layer_lr_decay`
    (`layer_rate_factors`).
    """
    accumulation = training.gradient_accumulation_steps * training.micro_batches
    total_updates = max(1, training.epochs * steps_per_epoch // accumulation)
    schedule = WarmupLinearDecay(
        training.learning_rate,
        int(training.warmup_ratio * total_updates),
        total_updates,
        steps_per_update=accumulation,
    )
    optimizer = BertAdamW(
        learning_rate=schedule,
        weight_decay=training.weight_decay,
        epsilon=training.adam_epsilon,
        global_clipnorm=training.max_grad_norm,
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
    )
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    if training.layer_lr_decay not in (None, 1.0) and backbone is not None:
        factors = layer_rate_factors(backbone, training.layer_lr_decay)
        for variable in backbone.trainable_variables:
            optimizer.scale_learning_rate([variable], factors.get(variable.path, 1.0))
    if training.head_learning_rate is not None:
        optimizer.scale_learning_rate(head, training.head_learning_rate / training.learning_rate)
    for variables, peak in learning_rates:  # after the head's: these are head weights too
        optimizer.scale_learning_rate(variables, peak / training.learning_rate)
    return optimizer
