"""Hyperparameter search with Optuna: the trials (`tuner.tune`), where the study lives
(`study`), and its report (`tune_report`)."""
