"""A workdir written before a config field existed still resumes: the run used the field's default. A field
that really differs, or a new field set away from its default, is still refused."""

import json

import pytest

from t2mlr_jax.config.convert import to_dict
from t2mlr_jax.experiment import resolve
from t2mlr_jax.storage.run_config import WorkdirMismatchError, check_workdir, run_identity
from t2mlr_jax.storage.workdir import RUN_CONFIG
from tests.tiny import tiny_experiment


def _identity(**model):
    config = tiny_experiment()
    for key, value in model.items():
        config.model[key] = value
    return run_identity(to_dict(resolve(config)))


def _workdir_without(tmp_path, *fields):
    stored = _identity()
    for field in fields:
        del stored["model"][field]
    (tmp_path / RUN_CONFIG).write_text(json.dumps(stored))
    return tmp_path


def test_a_field_added_since_the_workdir_was_written_reads_as_its_default(tmp_path):
    workdir = _workdir_without(tmp_path, "rope_table_dtype", "ve_every_layer")
    check_workdir(workdir, _identity())  # nothing raised
    with pytest.raises(
        WorkdirMismatchError, match=r"model.rope_table_dtype: 'float32' \(workdir\) vs 'bfloat16'"
    ):
        check_workdir(workdir, _identity(rope_table_dtype="bfloat16"))
    with pytest.raises(WorkdirMismatchError, match=r"model.hidden_size"):
        check_workdir(workdir, _identity(hidden_size=48))
