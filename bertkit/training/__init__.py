"""Fine-tuning as named steps (`run_steps`: prepare, build, fit, finish) and the short script
over them (`trainer.finetune`), with the callbacks, optimizer and validation a run uses."""

from bertkit.training.preemption import Preempted  # imports no Keras: the CLI catches it

__all__ = ["Preempted"]
