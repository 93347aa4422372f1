import json
import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.config.convert import to_dict
from t2mlr_jax.experiment import resolve
from t2mlr_jax.storage import checkpoint as ckpt
from t2mlr_jax.storage import run_config
from t2mlr_jax.train.train_step import TrainState
from t2mlr_jax.train.trainer import Run
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_source


def _state(value: float) -> dict:
    return {"w": jnp.full((64, 64), value, jnp.float32), "step": jnp.asarray(int(value), jnp.int32)}


def _abstract(state):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)


def _two_checkpoints(directory):
    saver = ckpt.Checkpointer(directory, save_every=1, keep=3)
    for step in (1, 2):
        saver.save(step, _state(step), {"index": step})
    saver.wait()
    saver.close()


def _restore(directory):
    loader = ckpt.Checkpointer(directory, save_every=1, keep=3)
    try:
        return loader.restore_latest(_abstract(_state(0)))
    finally:
        loader.close()


def test_roundtrip_keeps_state_iterator_state_and_bytes(tmp_path):
    _two_checkpoints(tmp_path)
    state, data_state, step, _ = _restore(tmp_path)
    assert step == 2 and data_state == {"index": 2}
    np.testing.assert_array_equal(state["w"], np.full((64, 64), 2.0, np.float32))


@pytest.mark.parametrize("damage", ["truncate", "fingerprint"])
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage):
    _two_checkpoints(tmp_path)
    if damage == "truncate":  # a save cut short: every array file of step 2 loses its tail
        for f in (tmp_path / "2" / "state").rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:  # bytes that load but are not what was saved
        meta = tmp_path / "2" / "meta" / "metadata"
        record = json.loads(meta.read_text())
        record["fingerprints"][0] ^= 1
        meta.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING):
        state, data_state, step, _ = _restore(tmp_path)
    assert step == 1 and data_state == {"index": 1} and float(state["w"][0, 0]) == 1.0
    assert any("step 2" in r.getMessage() and "unreadable" in r.getMessage() for r in caplog.records)


def test_a_workdir_of_another_config_is_refused_untouched(tmp_path):
    run_config.write_run_config(
        tmp_path, {**run_config.run_identity(to_dict(resolve(tiny_experiment()))), "arch": "t2mlr"}
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    other = tiny_experiment()
    other.model.hidden_size = 48
    with pytest.raises(run_config.WorkdirMismatchError, match="model.hidden_size: 32 .workdir. vs 48"):
        Run(resolve(other), tmp_path, tiny_source(), "t2mlr")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_fingerprints_see_one_changed_or_moved_value_and_not_the_mesh():
    state = {
        "w": jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8) / 7,
        "h": jnp.ones((16, 4), jnp.bfloat16),
        "step": jnp.int32(3),
        "rng": jnp.array([1, 2], jnp.uint32),
    }
    prints = lambda tree: dict(zip(sorted(tree), ckpt.fingerprints(tree)))  # dict leaves come in key order
    base = prints(state)
    one_ulp = np.nextafter(np.float32(state["w"][5, 3]), np.float32(9))
    assert prints({**state, "w": state["w"].at[5, 3].set(one_ulp)})["w"] != base["w"]
    assert prints({**state, "step": jnp.int32(4)})["step"] != base["step"]
    # A flipped sign bit at an odd position: version 1's even weight there lost it mod 2^32.
    sign = {**state, "w": state["w"].at[0, 1].set(-state["w"][0, 1])}
    assert ckpt.fingerprints(sign["w"], version=1) == ckpt.fingerprints(state["w"], version=1)
    assert prints(sign)["w"] != base["w"]
    assert prints({**state, "h": state["h"].at[0, 0].set(2.0)})["h"] not in (  # the same value elsewhere
        base["h"],
        prints({**state, "h": state["h"].at[0, 1].set(2.0)})["h"],
    )
    mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    sharded = jax.device_put(
        state,
        {
            "w": jax.NamedSharding(mesh, jax.P("a", "b")),
            "h": jax.NamedSharding(mesh, jax.P("b", "a")),
            "step": jax.NamedSharding(mesh, jax.P()),
            "rng": jax.NamedSharding(mesh, jax.P()),
        },
    )
    assert prints(sharded) == base


class _TrainStateBeforeModelState(NamedTuple):
    step: Any
    params: Any
    opt_state: Any
    rng: Any


def test_model_state_roundtrips_and_checkpoints_from_before_it_still_restore(tmp_path):
    core = (jnp.asarray(3, jnp.int32), {"w": jnp.arange(4.0)}, {"mu": jnp.ones(4)}, jax.random.PRNGKey(1))
    saver = ckpt.Checkpointer(tmp_path / "old", save_every=1, keep=2)
    saver.save(3, _TrainStateBeforeModelState(*core), {"index": 3})
    saver.wait()
    saver.close()
    new = TrainState(*core, model_state={"bias": jnp.asarray([0.5, -0.5])})
    saver = ckpt.Checkpointer(tmp_path / "new", save_every=1, keep=2)
    saver.save(3, new, {"index": 3})
    saver.wait()
    saver.close()
    for name, expected in (("old", {}), ("new", new.model_state)):
        loader = ckpt.Checkpointer(tmp_path / name, save_every=1, keep=2)
        state, data, step, _ = loader.restore_latest(_abstract(TrainState(*core, model_state=expected)))
        loader.close()
        assert step == 3 and data == {"index": 3} and isinstance(state, TrainState)
        assert jax.tree.all(
            jax.tree.map(
                np.array_equal, jax.device_get(state), jax.device_get(new._replace(model_state=expected))
            )
        )


def test_a_checkpoint_with_version_1_fingerprints_still_restores(tmp_path):
    _two_checkpoints(tmp_path)
    meta = tmp_path / "2" / "meta" / "metadata"
    record = json.loads(meta.read_text())
    assert record.pop("fingerprint") == ckpt.FINGERPRINT == 2
    saved = ckpt.fingerprints(_state(2))  # the stored leaf order: step, params, ... as _state lays them
    assert record["fingerprints"] == saved
    record["fingerprints"] = ckpt.fingerprints(_state(2), version=1)  # as written before versions
    meta.write_text(json.dumps(record))
    assert _restore(tmp_path)[2] == 2
