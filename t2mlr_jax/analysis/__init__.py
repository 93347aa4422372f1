"""Analyses of trained runs: the run report (tools/report.py), the multi-architecture comparison (main.py),
the run logs and plots they read and draw. Above the training layer: it may import t2mlr_jax.train and
below; the studies (t2mlr_jax.studies) build on it."""
