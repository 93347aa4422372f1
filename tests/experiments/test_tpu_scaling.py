"""experiments/tpu_scaling.py without compiling: its rows, its tables from hand-made reports, bad input."""

import math
from pathlib import Path

import pytest

from t2mlr_jax.studies.tpu import rows as tpu_rows
from t2mlr_jax.studies.tpu import scaling, tables

CHIPS = {"v5e:2x2": 4, "v5e:16x16": 256, "v5p:4x4x4": 64, "v6e:8x8": 64, "v6e:16x16": 256}


@pytest.mark.parametrize("study", sorted(tpu_rows.STUDIES))
def test_every_row_is_named_once_and_its_mesh_covers_its_topology(study):
    rows = tpu_rows.STUDIES[study]()
    assert len({row.name for row in rows}) == len(rows)
    for row in rows:
        sizes = [int(axis.split(":")[1]) for axis in row.mesh.split(",")]
        assert math.prod(sizes) == CHIPS[row.topology], row
        assert row.batch % CHIPS[row.topology] == 0, row  # a row per data-parallel chip at least


def _program(arch, step_s, model_flops, fits=True, refused=False):
    memory = {
        "total_bytes": 3 * 2**30,
        "available_hbm_bytes": 15.75 * 2**30,
        "temp_bytes": 40 * 2**30,
        "fits": fits,
    }
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


def _result(name, *programs, per_chip=1, **setting):
    row = {"name": name, "arch": "t2mlr,transformer", "topology": "v5e:16x16", "mesh": "data:16,fsdp:16"}
    mesh = {"data": 16, "fsdp": 16, "tensor": 1}
    setting = {"mesh": mesh, "chips": 256, "chip": "TPU v5e", "batch": 256 * per_chip, **setting}
    return {"row": row, "setting": setting, "programs": list(programs)}


def test_the_tables_give_each_train_step_its_memory_estimate_and_ratio():
    results = [
        _result("135M_v5e-256", _program("t2mlr", 0.2, 6e15), _program("transformer", 0.1, 2e15), zero=1),
        _result("3B_v5e-256_fsdp", _program("t2mlr", None, None, fits=False, refused=True)),
    ]
    train = tables.train_table(results)
    assert (
        "| 135M_v5e-256 | t2mlr | data:16,fsdp:16 ZeRO-1 | 3.0 / 15.75 | yes | 200 ms (memory) | 25% (18%) | "
        "12 all-gather |" in train
    )
    assert "| 3B_v5e-256_fsdp | t2mlr | data:16,fsdp:16 | > 40 (temporaries) | **no** ||||" in train
    ratios = tables.train_ratios(results)
    assert "| 135M_v5e-256 | 2.00× | 3.00× | memory | memory |" in ratios
    assert "3B" not in ratios  # no transformer beside it


def test_an_unknown_row_is_one_line_before_anything_compiles(capsys, tmp_path):
    assert scaling.main(["--study=pods", "--rows=135M_v5e-256,70B_v5e-256", f"--out={tmp_path}"]) == 2
    assert "70B_v5e-256" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_maxtext_flops_match_its_published_step_logs():
    """tpu-recipes' logged steps on v6e-256: TFLOP/s/device x seconds is the FLOPs MaxText counts per device
    and step (Llama 3.1 8B: 4 rows of 8192; Mixtral 8x7B: 12 rows of 4096)."""
    llama = tpu_rows.maxtext_flops(tpu_rows.LLAMA31_8B, 8192) * 4 * 8192
    mixtral = tpu_rows.maxtext_flops(tpu_rows.MIXTRAL_8X7B, 4096) * 12 * 4096
    assert llama == pytest.approx(417.397e12 * 4.546, rel=1e-3)
    assert mixtral == pytest.approx(302.311e12 * 13.484, rel=1e-3)


def _anchor_result(anchor, mfu):
    """A compiled anchor whose roofline is compute-bound at `mfu` on MaxText's count, serial sum twice."""
    flops = tpu_rows.maxtext_flops(anchor.model, anchor.seq_len) * anchor.batch * anchor.seq_len / 256
    step = flops / (mfu * 197e12)
    line = {"step_s": step, "compute_s": step, "memory_s": step / 2, "communication_s": step / 2}
    program = {
        "program": "train",
        "roofline": {**line, "bound": "compute"},
        "device_kind": "TPU v5 lite",
        "devices": 256,
        "memory": {"fits": True},
    }
    return {"row": {"name": anchor.name}, "programs": [program]}


def test_the_calibration_table_puts_the_estimate_beside_the_measurement():
    """Two anchors measured at 61.1% and 66.9%, both estimated at 80%: each is calibrated by the other's
    measured / estimated ratio (leave-one-out), landing on the other's measurement."""
    a16, a32 = tpu_rows.ANCHORS[:2]
    table = tables.calibration_table([_anchor_result(a16, 0.8), _anchor_result(a32, 0.8)])
    assert f"| {a16.name} | 61.1% | 80.0% | +18.9 | 40.0% | 1.31 | 66.9% | +5.8 | yes |" in table
    assert f"| {a32.name} | 66.9% | 80.0% | +13.1 | 40.0% | 1.20 | 61.1% | -5.8 | yes |" in table
    assert "32 x 5120, 32 x 256 heads (MHA), relu2 32768, vocab 32768 tied; 1536 x 2048 tokens" in table
    assert "Median measured / estimated step over the 2 anchors: 1.25" in table


def test_rows_per_chip_line_up_in_one_table():
    results = [
        _result("135M_v5e-256_x1", _program("t2mlr", 0.2, 6e15)),
        _result("135M_v5e-256", _program("t2mlr", 0.8, 24e15), per_chip=4),
        _result("135M_v5e-256_x8", _program("t2mlr", None, None, fits=False, refused=True), per_chip=8),
    ]
    table = tables.per_chip_table(results)
    assert "| row | arch | 1 row per chip | 4 rows per chip | 8 rows per chip |" in table
    assert (
        "| 135M_v5e-256 | t2mlr | 3.0 GiB, 200 ms memory, 25% (18%) | "
        "3.0 GiB, 800 ms memory, 25% (18%) | **does not fit**: 40 GiB |" in table
    )


def test_each_recipe_takes_zero1_where_its_whole_weights_fit_and_the_most_rows_that_fit():
    """The pods' recipes as memory_plan plans them: the 135M models whole on every chip at 4 rows per chip
    everywhere (study rows beside them at 1 and 8); 1B on v5e-256 (16 GiB) under ZeRO-3 at one row, on
    v5p-64 (95 GiB) whole at 4; the LRT-d16 on v5p-64 data parallel (each chip holds every expert) at
    4, on v5e-256 at one row on the pod's own mesh too (its expert mesh fits no more); the stage reaches
    the tool."""
    rows = {row.name: row for row in tpu_rows.pod_rows()}
    for pod in tpu_rows.PODS:
        recipe = rows[f"135M_{pod}"]
        assert (recipe.zero, recipe.batch, recipe.programs) == (1, 4 * CHIPS[recipe.topology], "train,decode")
        assert rows[f"135M_{pod}_x8"].zero == 1 and f"135M_{pod}_x4" not in rows
    assert (rows["1B_v5e-256"].zero, rows["1B_v5e-256"].batch) == (3, 256)
    assert (rows["1B_v5p-64"].zero, rows["1B_v5p-64"].batch) == (1, 4 * 64)
    lrt = rows["LRT-d16_v5p-64"]
    assert (lrt.mesh, lrt.zero, lrt.batch) == ("fsdp:64", 1, 4 * 64)
    lrt = rows["LRT-d16_v5e-256"]
    assert (lrt.mesh, lrt.batch) == ("data:16,fsdp:16", 256)
    assert "--config.mesh.zero=1" in scaling.command(rows["135M_v5e-256"], Path("out"))
    assert "--config.mesh.zero=3" in scaling.command(rows["1B_v5e-256"], Path("out"))


def test_the_row_estimate_is_near_the_compiled_pods():
    """memory_plan's activations per row against the compiled pods' GiB per row added (docs/tpu_compile.md:
    135M T²MLR 2.2 and its transformer 1.2 on v5e-256; 1B T²MLR 5.5): within 30%."""
    compiled = {("135M", "t2mlr"): 2.2, ("135M", "transformer"): 1.2, ("1B", "t2mlr"): 5.5}
    for (size, arch), gib in compiled.items():
        (work,) = tpu_rows.recipe_workloads(tpu_rows.T2MLR_SIZES[size], arch, "data:16,fsdp:16")
        assert work.row_bytes / 2**30 == pytest.approx(gib, rel=0.3), (size, arch)
