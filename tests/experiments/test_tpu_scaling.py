"""experiments/tpu_scaling.py without compiling: its rows, its tables from hand-made reports, bad input."""

import math

import pytest

from experiments import tpu_scaling

CHIPS = {"v5e:2x2": 4, "v5e:16x16": 256, "v5p:4x4x4": 64, "v6e:8x8": 64, "v6e:16x16": 256}


@pytest.mark.parametrize("study", sorted(tpu_scaling.STUDIES))
def test_every_row_is_named_once_and_its_mesh_covers_its_topology(study):
    rows = tpu_scaling.STUDIES[study]()
    assert len({row.name for row in rows}) == len(rows)
    for row in rows:
        sizes = [int(axis.split(":")[1]) for axis in row.mesh.split(",")]
        assert math.prod(sizes) == CHIPS[row.topology], row
        assert row.batch % CHIPS[row.topology] == 0, row  # a row per data-parallel chip at least


def _program(arch, step_s, model_flops, fits=True, refused=False):
    memory = {"total_bytes": 3 * 2**30, "hbm_bytes": 16 * 2**30, "temp_bytes": 40 * 2**30, "fits": fits}
    if refused:
        return {"arch": arch, "program": "train", "memory": memory}
    return {
        "arch": arch,
        "program": "train",
        "memory": memory,
        "roofline": {"step_s": step_s, "model_flops": model_flops, "bound": "memory", "mfu": 0.25},
        "collectives": {"all-gather": {"count": 12}, "all-reduce": {"count": 0}},
        "kernels": {"splash_mha_fwd": 2},
    }


def _result(name, *programs):
    row = {"name": name, "arch": "t2mlr,transformer", "topology": "v5e:16x16", "mesh": "data:16,fsdp:16"}
    setting = {"mesh": {"data": 16, "fsdp": 16, "tensor": 1}, "chips": 256, "chip": "TPU v5e"}
    return {"row": row, "setting": setting, "programs": list(programs)}


def test_the_tables_give_each_train_step_its_memory_estimate_and_ratio():
    results = [
        _result("135M_v5e-256", _program("t2mlr", 0.2, 6e15), _program("transformer", 0.1, 2e15)),
        _result("3B_v5e-256_fsdp", _program("t2mlr", None, None, fits=False, refused=True)),
    ]
    train = tpu_scaling.train_table(results)
    assert (
        "| 135M_v5e-256 | t2mlr | data:16,fsdp:16 | 3.0 / 16 | yes | 200 ms (memory) | 25% | 12 all-gather |"
        in train
    )
    assert "| 3B_v5e-256_fsdp | t2mlr | data:16,fsdp:16 | > 40 (temporaries) | **no** ||||" in train
    ratios = tpu_scaling.train_ratios(results)
    assert "| 135M_v5e-256 | 2.00× | 3.00× | memory | memory |" in ratios
    assert "3B" not in ratios  # no transformer beside it


def test_an_unknown_row_is_one_line_before_anything_compiles(capsys, tmp_path):
    assert tpu_scaling.main(["--study=pods", "--rows=135M_v5e-256,70B_v5e-256", f"--out={tmp_path}"]) == 2
    assert "70B_v5e-256" in capsys.readouterr().err and not any(tmp_path.iterdir())
