"""The typed experiment config: sections.py (the dataclasses, their defaults and checks), convert.py (the one
conversion to and from ml_collections and plain dicts), edit.py (presets and dotted paths for config files
and the command line), cli.py (the flags of a program that reads a config file, `OneLineParser` for every
other program, and `fail`, every program's one-line error). t2mlr_jax.experiment assembles a config file's
experiment from them. Nothing is imported here: a program that needs only `fail` loads none of the rest."""
