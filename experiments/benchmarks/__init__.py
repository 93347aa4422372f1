"""The two sides of experiments/vs_release.py, each run in a process of its own (`python -m
experiments.benchmarks.NAME '<spec json>'`); what they run is t2mlr_jax/studies/benchmarks/NAME.py."""
