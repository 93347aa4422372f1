"""The typed experiment config: sections.py (the dataclasses, their defaults and checks), convert.py (the one
conversion to and from ml_collections and plain dicts), edit.py (presets and dotted paths for config files
and the command line), cli.py (the flags of a program that reads a config file). t2mlr_jax.experiment
assembles a config file's experiment from them."""

from t2mlr_jax.config.convert import from_config_dict, to_config_dict, to_dict
from t2mlr_jax.config.sections import SECTIONS, Experiment, register_section

__all__ = ["SECTIONS", "Experiment", "from_config_dict", "register_section", "to_config_dict", "to_dict"]
