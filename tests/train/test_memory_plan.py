"""memory_plan: the training state as each ZeRO stage splits it, and the plan: the most rows per chip that
fit, under ZeRO-1 where the whole weights fit beside them, else ZeRO-3."""

from t2mlr_jax.parallel.chips import CHIPS, GIB
from t2mlr_jax.train.memory_plan import Plan, Workload, plan, state_bytes

V5E = CHIPS["TPU v5 lite"]  # 16 GiB, 14.4 of them planned for
MESH = "data:16,fsdp:16"


def test_the_state_is_split_as_the_zero_stage_says():
    """fp32 weights and gradients (8 bytes a parameter), Adam's moments (8) and a bf16 copy (2): ZeRO-1
    splits only the moments, over all 256 chips; ZeRO-3 all but the copy, over fsdp's 16."""
    work = Workload(params=2**30, compute_bytes=2, row_bytes=0.0)
    sizes = {"data": 16, "fsdp": 16, "expert": 1, "tensor": 1}
    assert state_bytes(work, sizes, 1) == 2**30 * (8 + 8 / 256 + 2)
    assert state_bytes(work, sizes, 3) == 2**30 * (8 / 16 + 8 / 16 + 2)


def test_the_plan_takes_the_most_rows_then_whole_weights():
    small = Workload(int(0.1 * GIB), 2, 2 * GIB)  # ZeRO-1: 1 GiB of state
    large = Workload(int(GIB), 2, 2 * GIB)  # ZeRO-1: 10 GiB of state, ZeRO-3: 3
    assert plan([small], V5E, MESH) == Plan(MESH, 1, 4)
    assert plan([large], V5E, MESH) == Plan(MESH, 3, 4)  # 4 rows under ZeRO-3 before fewer under ZeRO-1
    assert plan([small, large], V5E, MESH) == Plan(MESH, 3, 4)  # a row's architectures share one plan
    assert plan([small._replace(row_bytes=5 * GIB)], V5E, MESH) == Plan(MESH, 1, 2)
    assert plan([large._replace(row_bytes=20 * GIB)], V5E, MESH) == Plan(MESH, 3, 1)  # none fits: the least
