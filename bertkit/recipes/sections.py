"""The core's recipe sections, `backbone:`, `training:` and `export:`: their keys, defaults,
bounds and help (the schema `bertkit.recipes.schema` checks and `bertkit schema` shows).
`Recipe` and its loading are `bertkit.recipes.recipe`'s, which re-exports these classes."""

from __future__ import annotations

import dataclasses
from typing import Literal

from bertkit.model.feature_layers import FeatureLayersConfig
from bertkit.model.lora import LoraConfig

_field = dataclasses.field


@dataclasses.dataclass(frozen=True)
class BackboneConfig:
    preset: str = _field(
        metadata={
            "help": "keras-hub preset name, hf://org/name, "
            "package:module/folder, or a local folder (keras-hub "
            "preset, Hugging Face BERT, or Google BERT checkpoint)"
        }
    )
    sequence_length: int = _field(
        default=128, metadata={"min": 8, "max": 4096, "help": "longest model input in word pieces"}
    )
    lowercase: bool | None = _field(
        default=None,
        metadata={
            "help": "lowercase and strip accents; null takes the checkpoint's setting (but "
            "lowercases a checkpoint that says cased and has no capital letters)"
        },
    )
    normalize_punctuation: bool = _field(
        default=True,
        metadata={
            "help": "map characters the vocabulary lacks to the equivalents it has before "
            "lookup (curly quotes to ' and \", dashes to -, … to ..., full-width forms to "
            "ASCII), offsets kept; saved with the model. false: look them up as they are"
        },
    )
    attention_dropout: float | None = _field(
        default=None,
        metadata={
            "min": 0.0,
            "max_exclusive": 1.0,
            "help": "dropout of the attention probabilities in training (Hugging Face's "
            "attention_probs_dropout_prob); null: 0 on JAX with a GPU (training takes "
            "fused attention), else the backbone's one rate (0.1 for BERT)",
        },
    )
    trainable: bool = _field(
        default=True,
        metadata={
            "help": "false: the encoder is frozen (BERT's feature-based approach): only the "
            "task head trains, with no gradients, optimizer state or dropout in the encoder"
        },
    )
    features: FeatureLayersConfig | None = _field(
        default=None,
        metadata={
            "help": "the hidden layers the heads that read the sequence output (tagging, "
            "span_qa) take, e.g. {layers: [-4, -3, -2, -1], combine: concat}; null: the last"
        },
    )


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    epochs: int = _field(
        default=3, metadata={"min": 1, "max": 10_000, "help": "passes over the training data"}
    )
    batch_size: int = _field(
        default=32,
        metadata={"min": 1, "help": "examples per update, over all devices (the global batch)"},
    )
    eval_batch_size: int | None = _field(
        default=None, metadata={"min": 1, "help": "defaults to 2 x batch_size"}
    )
    preset: Literal["small_data"] | None = _field(
        default=None,
        metadata={
            "help": "small_data: fill the keys this recipe leaves out with the small-data "
            "options (10 epochs, early_stopping_patience 3, head_learning_rate 1e-3, "
            "reinit_top_layers 1, task.class_weights balanced where the task has it)",
        },
    )
    learning_rate: float = _field(
        default=3e-5,
        metadata={
            "min_exclusive": 0.0,
            "help": "AdamW's peak learning rate: linear warmup to it, then linear decay to 0",
        },
    )
    head_learning_rate: float | None = _field(
        default=None,
        metadata={
            "min_exclusive": 0.0,
            "help": "peak learning rate of the task head (the layers outside the backbone), "
            "on the same schedule; null: learning_rate",
        },
    )
    layer_lr_decay: float | None = _field(
        default=None,
        metadata={
            "min_exclusive": 0.0,
            "max": 1.0,
            "help": "layer-wise learning-rate decay: the top transformer layer trains at "
            "learning_rate, each layer below at this times the one above, the embeddings at "
            "its num_layers-th power (ELECTRA); null or 1.0: one rate",
        },
    )
    reinit_top_layers: int = _field(
        default=0,
        metadata={
            "min": 0,
            "help": "re-initialise the backbone's top N transformer layers and its pooler "
            "before training (Zhang et al. 2021), from the seed",
        },
    )
    warmup_ratio: float = _field(
        default=0.1,
        metadata={"min": 0.0, "max": 1.0, "help": "share of the updates spent warming up"},
    )
    weight_decay: float = _field(
        default=0.01,
        metadata={"min": 0.0, "help": "AdamW decay; never applied to biases and LayerNorm"},
    )
    adam_epsilon: float = _field(
        default=1e-6,
        metadata={"min_exclusive": 0.0, "help": "AdamW's epsilon, added after the bias correction"},
    )
    max_grad_norm: float | None = _field(
        default=1.0,
        metadata={"min_exclusive": 0.0, "help": "global-norm gradient clipping; null disables it"},
    )
    gradient_accumulation_steps: int = _field(
        default=1,
        metadata={"min": 1, "help": "batches whose gradients are summed into one update"},
    )
    mixed_precision: Literal["bfloat16", "float16"] | None = _field(
        default=None,
        metadata={
            "help": "compute in this dtype, variables in float32 (Keras mixed precision); "
            "null: float32"
        },
    )
    jit_compile: bool | Literal["auto"] = _field(
        default="auto",
        metadata={"help": "XLA; 'auto' uses it on GPUs only (it does not speed up CPU training)"},
    )
    compilation_cache: str = _field(
        default="auto",
        metadata={
            "help": "folder of JAX's persistent compilation cache, so that a second run compiles "
            "nothing; auto: $BERTKIT_COMPILATION_CACHE, else ~/.cache/bertkit/xla; off: "
            "no cache"
        },
    )
    seed: int = _field(
        default=42,
        metadata={
            "min": 0,
            "max": 2**32 - 1,
            "help": "seeds NumPy, Python and the backend (NumPy takes 0 to 2^32 - 1)",
        },
    )
    seeds: int = _field(
        default=1,
        metadata={
            "min": 1,
            "max": 100,
            "help": "train seed, seed + 1, ... (one after another, or side by side: "
            "parallel_seeds) in seeds/seed-<k>/; report mean and sd (README: Seeds)",
        },
    )
    parallel_seeds: int | Literal["auto"] = _field(
        default="auto",
        metadata={
            "min": 1,
            "help": "seeds > 1: how many train at once, each in a child process on its own "
            "GPUs; auto: one per visible GPU where several are (README: Seeds)",
        },
    )
    keep_seed: Literal["median", "best"] = _field(
        default="median",
        metadata={
            "help": "seeds > 1: the seed whose model is the run's, by the validation monitor"
        },
    )
    checkpoint_every_steps: int | None = _field(
        default=None,
        metadata={
            "min": 1,
            "help": "also checkpoint every N training steps (default: at epoch ends)",
        },
    )
    checkpoint_every_minutes: float | None = _field(
        default=None,
        metadata={"min_exclusive": 0.0, "help": "also checkpoint every M minutes of training"},
    )
    early_stopping_patience: int | None = _field(
        default=None,
        metadata={
            "min": 1,
            "help": "stop after this many epochs without a better validation metric, "
            "counted once it beats the task's learned-nothing baseline (e.g. entity F1 0)",
        },
    )
    average_last_epochs: int = _field(
        default=0,
        metadata={
            "min": 0,
            "help": "keep the mean of the weights at the end of N epochs, the best epoch and "
            "the N - 1 before it (SWA-style; README: Small data); 0: the best epoch's",
        },
    )
    distribution: Literal["auto", "one_device", "data_parallel", "mirrored"] = _field(
        default="auto",
        metadata={
            "help": "data parallel over this machine's devices (JAX: keras.distribution."
            "DataParallel, TensorFlow: MirroredStrategy); 'auto' when there are "
            "several, 'data_parallel' (or 'mirrored') always; batch_size is global"
        },
    )
    bucket_lengths: tuple[int, ...] | None = _field(
        default=None,
        metadata={
            "min": 1,
            "help": "padded batch lengths to choose from (in any order: they are sorted, "
            "repeats dropped, and those of sequence_length or more replaced by it); null: "
            "16, 32, 64, 128, ... up to sequence_length (on a GPU or TPU: 64, 128, 256, "
            "...: fewer programs to compile)",
        },
    )
    batch_order: Literal["auto", "length_buckets", "random"] = _field(
        default="auto",
        metadata={
            "help": "length_buckets: each batch from one bucket (least padding); random: "
            "rows drawn at random, as transformers' Trainer does; auto: random for every task "
            "(length buckets scored less at small budgets: docs/training/overview.md)"
        },
    )
    micro_batches: int = _field(
        default=1,
        metadata={
            "min": 1,
            "help": "random order: split each batch by length into this many parts, "
            "each padded to its own bucket; the update is the whole batch's",
        },
    )
    packing: bool | Literal["auto"] = _field(
        default="auto",
        metadata={
            "help": "lay each batch's rows end to end in a few long rows (block-diagonal "
            "attention, positions restart per row): the same update, far less padding; "
            "auto: wherever it can (tagging and classification, one device or JAX in one "
            "process; otherwise the run says why not); true: an error where it cannot"
        },
    )
    lora: LoraConfig | None = _field(
        default=None,
        metadata={
            "help": "train low-rank updates of the backbone's layers and the task head only "
            "(README: LoRA); null: every weight"
        },
    )


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    saved_model: bool = _field(
        default=True,
        metadata={
            "help": "false: finetune writes no saved_model/ (bertkit export RUN --out DIR "
            "writes one later): for sweeps and for machines that only train"
        },
    )
    quantize: Literal["int8"] | None = _field(
        default=None,
        metadata={
            "help": "int8: the run also writes saved_model_int8/, if its validation metric "
            "drops at most max_metric_drop points (README: int8 export); null: float only"
        },
    )
    max_metric_drop: float | None = _field(
        default=None,
        metadata={
            "min": 0.0,
            "help": "points of the validation metric the int8 model may lose; null: the "
            "task's (0.5 for classification and tagging, 1.0 F1 for span QA)",
        },
    )
