"""The tuner: Optuna searches over the harness's settings with short real training runs."""
