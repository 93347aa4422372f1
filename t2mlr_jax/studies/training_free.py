"""`STUDIES`: architecture name -> the study main.py's --mode=train runs instead of the trainer for an
architecture with nothing to train, a function (config, workdir) -> results: recirculation's sweep."""

from t2mlr_jax.registry import Registry

STUDIES = Registry("study")


def _recirculation_sweep(config, workdir):
    # imported when run: every main.py asks this registry, and the sweep's modules (scipy.stats, the
    # scoring and plots) take ~0.9 s to import
    from t2mlr_jax.studies.recirculation_sweep import run_sweep

    return run_sweep(config, workdir)


STUDIES.register("recirculation", _recirculation_sweep)
