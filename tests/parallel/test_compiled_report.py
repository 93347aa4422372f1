"""The compiled-program report on programs compiled here for a TPU v5e 2x2 (libtpu, no TPU needed): per
device memory, XLA's cost, the collectives of the HLO and the roofline arithmetic."""

import functools
import re

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from t2mlr_jax.parallel.chips import CHIPS, Chip, chip_of
from t2mlr_jax.parallel.compiled_report import (
    COLUMNS,
    MARKDOWN_HEADER,
    compiled_report,
    devices_per_chip,
    markdown_row,
    roofline,
)
from t2mlr_jax.parallel.hlo import executed, kernels, parse, type_bytes
from t2mlr_jax.parallel.hlo_bytes import fused_computations, hbm_bytes, instruction_bytes
from t2mlr_jax.parallel.hlo_collectives import collectives, each, summary
from t2mlr_jax.parallel.hlo_flops import matmul_flops
from t2mlr_jax.parallel.interconnect import Interconnect
from t2mlr_jax.parallel.tpu_topology import available_hbm_bytes, topology_devices

tpu_devices = functools.cache(topology_devices)  # one topology build per test session


def compile_on(devices, f, args, out_spec=None, donate=()):
    """`f` compiled for a 1-D `fsdp` mesh over `devices`; args: (shape, dtype, PartitionSpec)."""
    mesh = jax.make_mesh((len(devices),), ("fsdp",), axis_types=(AxisType.Auto,), devices=devices)
    structs = [jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, p)) for s, d, p in args]
    out = None if out_spec is None else NamedSharding(mesh, out_spec)
    return jax.jit(f, out_shardings=out, donate_argnums=donate).lower(*structs).compile()


def sgd_step(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.sum((x @ w).astype(jnp.float32) ** 2))(w)


W, X = ((512, 1024), jnp.bfloat16, P("fsdp", None)), ((256, 512), jnp.bfloat16, P("fsdp", None))


def test_topology_devices_and_the_chip_table():
    for topology in ("v4:2x2x1", "v5e:2x2", "v5p:2x2x1", "v6e:2x2"):
        devices = tpu_devices(topology)
        assert devices[0].device_kind in CHIPS and devices_per_chip(devices) == 1
    # libtpu's default v4: a device per TensorCore, each with half the chip
    per_core = topologies.get_topology_desc(topology_name="v4:2x2x1", platform="tpu").devices
    assert len(per_core) == 8 and devices_per_chip(per_core) == 2
    with pytest.raises(ValueError, match="TPU topology 'v9:2x2'"):
        topology_devices("v9:2x2")
    assert chip_of("TPU v5 lite").peak_flops == 197e12
    assert chip_of("TPU v4").split(2).hbm_bytes == 16 * 2**30
    with pytest.raises(ValueError, match=r"'TPU v9'.*known: \[.*'TPU v5 lite'"):
        chip_of("TPU v9")


def test_sharded_sgd_step_gathers_the_weight_and_scatters_its_gradient():
    """FSDP over 4 devices: the forward gathers w (bf16 [512,1024]) once, the gradient is reduce-scattered
    back to w's [128,1024] shard once; every figure is one device's."""
    report = compiled_report(compile_on(tpu_devices("v5e:2x2"), sgd_step, [W, X], out_spec=W[2]))
    table = report["collectives"]
    # a v5e 2x2 is an open 2-D torus (no wraparound below 16 chips an axis): fsdp:4 spans both axes, one
    # link each way along each, 50 GB/s a link
    shard = 128 * 1024 * 2
    seconds = 3 * shard / (2 * 50e9)
    assert table["all-gather"] == {
        "ops": 1,
        "count": 1,
        "bytes": 4 * shard,
        "traffic_bytes": 3 * shard,
        "seconds": pytest.approx(seconds),
    }
    assert table["reduce-scatter"] == {
        "ops": 1,
        "count": 1,
        "bytes": shard,
        "traffic_bytes": 3 * shard,
        "seconds": pytest.approx(seconds),
    }
    assert table["all-reduce"]["count"] == table["all-to-all"]["count"] == 0
    assert report["roofline"]["communication_s"] == pytest.approx(2 * seconds)
    assert [(op["axes"], op["links"], op["loop"]) for op in report["collective_ops"]] == [
        ([0, 1], 2, None)
    ] * 2
    assert report["memory"]["argument_bytes"] == (128 * 1024 + 64 * 512) * 2
    assert report["memory"]["fits"] and report["chip"] == "TPU v5e" and report["devices"] == 4
    # libtpu lets a program use 15.75 of the v5e's 16 GiB
    assert (
        report["memory"]["available_hbm_bytes"]
        == available_hbm_bytes(tpu_devices("v5e:2x2")[0])
        == 15.75 * 2**30
    )


def test_cost_analysis_is_per_device_and_counts_a_loop_body_once():
    one = compile_on(tpu_devices("v5e:2x2")[:1], sgd_step, [W, X]).cost_analysis()["flops"]
    four = compile_on(tpu_devices("v5e:2x2"), sgd_step, [W, X]).cost_analysis()["flops"]
    assert 3.9 < one / four < 4.1

    def layers(unroll):
        def forward(ws, x):
            return jnp.sum(jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws, unroll=unroll)[0])

        args = [((6, 512, 512), jnp.bfloat16, P(None, "fsdp", None)), X]
        return compiled_report(compile_on(tpu_devices("v5e:2x2"), forward, args))

    rolled, unrolled = layers(1), layers(True)
    assert rolled["while_trip_counts"] == [6] and unrolled["while_trip_counts"] == []
    assert 5 < unrolled["cost"]["xla_flops"] / rolled["cost"]["xla_flops"] < 7  # XLA: one trip of the body
    for report in (rolled, unrolled):  # ... while the report counts every trip
        assert report["cost"]["matmul_flops"] == 6 * 2 * 64 * 512 * 512  # 6 layers, a [64,512] shard
        assert report["collectives"]["all-gather"]["count"] == 6


def test_a_donated_state_is_counted_once():
    devices = tpu_devices("v5e:2x2")
    kept = compiled_report(compile_on(devices, sgd_step, [W, X], out_spec=W[2]))["memory"]
    donated = compiled_report(compile_on(devices, sgd_step, [W, X], out_spec=W[2], donate=(0,)))["memory"]
    shard = 128 * 1024 * 2
    assert kept["alias_bytes"] == 0 and donated["alias_bytes"] == donated["output_bytes"] == shard
    assert donated["argument_bytes"] == kept["argument_bytes"]
    live = ("argument_bytes", "output_bytes", "temp_bytes", "generated_code_bytes")
    assert donated["total_bytes"] == sum(donated[k] for k in live) - shard


HLO = """HloModule handwritten, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%gather_fusion (p: bf16[16,8]) -> bf16[64,8] {
  %p = bf16[16,8]{1,0:T(8,128)(2,1)} parameter(0)
  ROOT %ag.copy = bf16[64,8]{1,0:T(8,128)(2,1)} all-gather(%p), channel_id=9, replica_groups=[2,4]<=[8]
}

%body (param: (s32[], f32[32,8])) -> (s32[], f32[32,8]) {
  %param = (s32[], f32[32,8]) parameter(0)
  %i = s32[] get-tuple-element(%param), index=0
  %h = f32[32,8] get-tuple-element(%param), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %a2a = f32[32,8]{1,0} all-to-all(%h), channel_id=5, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}
  %sq = f32[8,8] slice(%h), slice={[0:8], [0:8]}
  %mm = f32[32,8]{1,0} dot(%a2a, %sq), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %out = (s32[], f32[32,8]) tuple(%next, %mm)
}

%offloaded (q: s32[8]) -> s32[8] {
  ROOT %q = s32[8]{0} parameter(0)
}, execution_thread="sparsecore"

%cond (param.1: (s32[], f32[32,8])) -> pred[] {
  %param.1 = (s32[], f32[32,8]) parameter(0)
  %limit = s32[] constant(5)
  %counter = s32[] get-tuple-element(%param.1), index=0
  ROOT %lt = pred[] compare(%counter, %limit), direction=LT
}

%c2 (param.2: (s32[], f32[32,8])) -> pred[] {
  %param.2 = (s32[], f32[32,8]) parameter(0)
  ROOT %flag = pred[] constant(true)
}

ENTRY %main (a: bf16[16,8], b: f32[32,8], c: f32[8], d: f32[1,18,8], e: f32[3,4,4], g: f32[1,1,8], k: f32[32,8,4], idx: s32[8]) -> f32[32,8] {
  %a = bf16[16,8]{1,0} parameter(0)
  %b = f32[32,8]{1,0} parameter(1)
  %c = f32[8]{0} parameter(2)
  %d = f32[1,18,8]{2,1,0} parameter(3)
  %e = f32[3,4,4]{2,1,0} parameter(4)
  %g = f32[1,1,8]{2,1,0} parameter(5)
  %k = f32[32,8,4]{2,1,0} parameter(6)
  %idx = s32[8]{0} parameter(7)
  %conv = f32[1,16,4]{2,1,0} convolution(%d, %e), window={size=3}, dim_labels=b0f_0io->b0f, feature_group_count=2
  %full = f32[1,32,4]{2,1,0} convolution(%g, %k), window={size=32 pad=31_31 rhs_reversal=1}, dim_labels=b0f_0io->b0f
  %gemm = (f32[32,16]{1,0}, s8[1024]{0}) custom-call(%b, %a), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %ags = ((bf16[16,8]{1,0}), bf16[64,8]{1,0}) all-gather-start(%a), channel_id=1, replica_groups={}
  %agd = bf16[64,8]{1,0} all-gather-done(%ags)
  %splash_mha_fwd.3 = f32[8]{0} custom-call(%c), custom_call_target="tpu_custom_call", backend_config={"body": "a Pallas kernel's
}}, metadata={op_name="its config spans lines, one starting with a brace"}
  %ar = (f32[32,8], f32[8]{0}) all-reduce(%b, %c), replica_groups=mesh['x'=2,'y'=4] {'y'}, to_apply=%add
  %rs = f32[4,8]{1,0} reduce-scatter(%b), channel_id=3, replica_groups=[1,8]<=[8], to_apply=%add
  %cp = f32[32,8]{1,0} collective-permute(%b), channel_id=4, source_target_pairs={{0,1},{1,0}}
  %offload = s32[8]{0} call(%idx), to_apply=%offloaded
  %f1 = bf16[64,8]{1,0} fusion(%a), kind=kCustom, calls=%gather_fusion
  %f2 = bf16[64,8]{1,0} fusion(%a), kind=kCustom, calls=%gather_fusion
  %zero = s32[] constant(0)
  %start = s32[] copy(%zero)
  %t = (s32[], f32[32,8]) tuple(%start, %b)
  %loop = (s32[], f32[32,8]) while(%t), condition=%cond, body=%body
  %opaque = (s32[], f32[32,8]) while(%t), condition=%c2, body=%body
  %known = (s32[], f32[32,8]) while(%t), condition=%c2, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %res = f32[32,8]{1,0} get-tuple-element(%loop), index=1
}
"""  # noqa: E501


def test_collectives_and_matmuls_read_off_handwritten_hlo():
    runs, loops = executed(parse(HLO))
    assert loops == [5, None, 3]
    # the loops' dot (2 x 32x8 results x 8) 5 + 1 + 3 times; a convolution (2 x 16x4 x 8/2 features x 3
    # taps); one padded by its whole window: one of its 32 taps lands on the length-1 input; a cuBLAS GEMM
    # (its result [32,16], not its workspace) contracting 8
    convolutions = 2 * 16 * 4 * 4 * 3 + 2 * 32 * 4 * 8 * 1
    assert matmul_flops(runs) == 2 * 32 * 8 * 8 * 9 + convolutions + 2 * 32 * 16 * 8
    table = summary(each(collectives(runs, num_devices=8), Interconnect(link_bytes_per_s=1.0)))  # a switch
    # the async pair once, at its done; two fusions holding channel 9 once
    assert table["all-gather"]["ops"] == 2 and table["all-gather"]["count"] == 2
    assert table["all-gather"]["bytes"] == 2 * 64 * 8 * 2
    assert table["all-gather"]["traffic_bytes"] == 64 * 8 * 2 * (7 / 8 + 3 / 4)  # groups of 8, then of 4
    assert table["all-reduce"] == {
        "ops": 1,
        "count": 1,
        "bytes": (32 * 8 + 8) * 4,
        "traffic_bytes": 1056 * 2 * 3 / 4,
        "seconds": 1056 * 2 * 3 / 4,  # one link each way at 1 B/s
    }
    assert table["reduce-scatter"] == {
        "ops": 1,
        "count": 1,
        "bytes": 4 * 8 * 4,
        "traffic_bytes": 128 * 7,
        "seconds": 128 * 7,
    }
    assert table["collective-permute"]["traffic_bytes"] == 32 * 8 * 4
    # one all-to-all in three loops' shared body: 5 trips, 1 (unreadable) and 3 (annotated)
    assert table["all-to-all"]["ops"] == 3 and table["all-to-all"]["count"] == 5 + 1 + 3
    assert table["all-to-all"]["traffic_bytes"] == 9 * 32 * 8 * 4 / 2
    assert type_bytes("(f32[2,3]{1,0:T(8,128)}, /*index=1*/pred[4], f8e4m3fn[8], s4[2])") == 24 + 4 + 8 + 1
    assert kernels(HLO) == {"splash_mha_fwd": 1}  # and the instructions after it still read (the all-reduce)


def test_roofline_arithmetic_and_markdown_row():
    device = Chip(
        "toy", peak_flops=100.0, hbm_bytes=1e3, hbm_bytes_per_s=10.0, interconnect_bytes_per_s=1.0, source="-"
    )
    line = roofline(1000.0, 50.0, 3.0, device, devices=4, model_flops=2000.0)
    assert (line["compute_s"], line["memory_s"], line["communication_s"]) == (10.0, 5.0, 3.0)
    assert (
        line["step_s"] == 10.0 and line["bound"] == "compute" and line["mfu"] == 2000.0 / (10.0 * 100.0 * 4)
    )
    comm = roofline(10.0, 5.0, 30.0, device, devices=1, model_flops=None)
    assert comm["bound"] == "communication" and comm["step_s"] == 30.0 and comm["mfu"] is None

    report = compiled_report(
        compile_on(tpu_devices("v5e:2x2"), sgd_step, [W, X], out_spec=W[2]), model_flops=1e9
    )
    row = markdown_row("sgd step", report)
    assert row.count("|") == MARKDOWN_HEADER.splitlines()[0].count("|") == len(COLUMNS) + 1
    assert row.startswith("| sgd step | 4 x TPU v5e |") and "| 1 x 1.05 MB | 1 x 0.262 MB | - |" in row


LOOP_HLO = """HloModule loop_bytes

%slice_layer (stack: f32[4,8,8], i: s32[]) -> f32[8,8] {
  %stack = f32[4,8,8]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %zero = s32[] constant(0)
  %layer = f32[1,8,8]{2,1,0} dynamic-slice(%stack, %i, %zero, %zero), dynamic_slice_sizes={1,8,8}
  ROOT %one = f32[8,8]{1,0} bitcast(%layer)
}

%write (buffer: f32[4,8], row: f32[1,8], i: s32[]) -> f32[4,8] {
  %buffer = f32[4,8]{1,0} parameter(0)
  %row = f32[1,8]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %zero = s32[] constant(0)
  ROOT %dus = f32[4,8]{1,0} dynamic-update-slice(%buffer, %row, %i, %zero)
}

%body (p: (s32[], f32[4,8,8], f32[4,8])) -> (s32[], f32[4,8,8], f32[4,8]) {
  %p = (s32[], f32[4,8,8], f32[4,8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %stack = f32[4,8,8]{2,1,0} get-tuple-element(%p), index=1
  %buffer = f32[4,8]{1,0} get-tuple-element(%p), index=2
  %w = f32[8,8]{1,0} fusion(%stack, %i), kind=kLoop, calls=%slice_layer
  %row = f32[1,8]{1,0} slice(%w), slice={[0:1], [0:8]}
  %out = f32[4,8]{1,0} fusion(%buffer, %row, %i), kind=kLoop, calls=%write
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4,8,8], f32[4,8]) tuple(%next, %stack, %out)
}

%cond (p.1: (s32[], f32[4,8,8], f32[4,8])) -> pred[] {
  %p.1 = (s32[], f32[4,8,8], f32[4,8]) parameter(0)
  %c = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%c, %n), direction=LT
}

ENTRY %main (stack: f32[4,8,8], buffer: f32[4,8]) -> f32[4,8] {
  %stack = f32[4,8,8]{2,1,0} parameter(0)
  %buffer = f32[4,8]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,8,8], f32[4,8]) tuple(%zero, %stack, %buffer)
  %loop = (s32[], f32[4,8,8], f32[4,8]) while(%init), condition=%cond, body=%body
  ROOT %res = f32[4,8]{1,0} get-tuple-element(%loop), index=2
}
"""


def test_every_loop_trip_moves_its_hbm_bytes():
    """Per trip: the fusion reads its layer (8x8, not the 4-layer stack) and the scalar index, writes
    8x8; the slice reads and writes the 1x8 it takes; the in-place write reads its 1x8 row and index and
    writes the row, not the 4x8 buffer; the add and the condition's compare read and write scalars. XLA
    counts one trip; the count here all four."""
    module = parse(LOOP_HLO)
    runs, loops = executed(module)
    assert loops == [4]
    per_trip = (64 + 1 + 64) * 4 + (8 + 8) * 4 + (2 * 8 + 1) * 4 + 3 * 4 + (4 + 4 + 1)
    assert hbm_bytes(module, runs) == 4 * per_trip
    # a counter raised by 2 (XLA's windowed einsums) runs half the trips
    module = parse(LOOP_HLO.replace("%one = s32[] constant(1)", "%one = s32[] constant(2)"))
    runs, loops = executed(module)
    assert loops == [2] and hbm_bytes(module, runs) == 2 * per_trip


SPACES_HLO = """HloModule spaces

%fused_sum (p0: f32[64,128], p1: f32[64,128]) -> f32[64,128] {
  %p0 = f32[64,128]{1,0:T(8,128)S(1)} parameter(0)
  %p1 = f32[64,128]{1,0:T(8,128)} parameter(1)
  ROOT %s = f32[64,128]{1,0:T(8,128)S(1)} add(%p0, %p1)
}

%two_outputs (buf: f32[512,128], row: f32[8,128]) -> (f32[512,128], f32[8,128]) {
  %buf = f32[512,128]{1,0:T(8,128)} parameter(0)
  %row = f32[8,128]{1,0:T(8,128)} parameter(1)
  %zero = s32[] constant(0)
  %put = f32[512,128]{1,0:T(8,128)} dynamic-update-slice(%buf, %row, %zero, %zero)
  %twice = f32[8,128]{1,0:T(8,128)} add(%row, %row)
  ROOT %both = (f32[512,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) tuple(%put, %twice)
}

%take_rows (p: f32[64,128]) -> f32[8,128] {
  %p = f32[64,128]{1,0:T(8,128)} parameter(0)
  ROOT %r = f32[8,128]{1,0:T(8,128)} slice(%p), slice={[0:8], [0:128]}
}

ENTRY %main (a: f32[64,128], b: f32[64,128], big: f32[512,128]) -> f32[8,128] {
  %a = f32[64,128]{1,0:T(8,128)} parameter(0)
  %b = f32[64,128]{1,0:T(8,128)} parameter(1)
  %big = f32[512,128]{1,0:T(8,128)} parameter(2)
  %cs = (f32[64,128]{1,0:T(8,128)S(1)}, f32[64,128]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%a)
  %cd = f32[64,128]{1,0:T(8,128)S(1)} copy-done(%cs)
  %sum = f32[64,128]{1,0:T(8,128)S(1)} fusion(%cd, %b), kind=kLoop, calls=%fused_sum
  %ss = ((f32[512,128]{1,0:T(8,128)}), f32[64,128]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) slice-start(%big), slice={[0:64], [0:128]}
  %sd = f32[64,128]{1,0:T(8,128)S(1)} slice-done(%ss)
  %cps = (f32[64,128]{1,0:T(8,128)S(1)}, f32[64,128]{1,0:T(8,128)}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%sum), channel_id=1, source_target_pairs={{0,1},{1,0}}
  %cpd = f32[64,128]{1,0:T(8,128)} collective-permute-done(%cps)
  %prod = f32[64,128]{1,0:T(8,128)} multiply(%sd, %cpd)
  %rows.1 = f32[8,128]{1,0:T(8,128)} slice(%prod), slice={[0:8], [0:128]}
  %upd = (f32[512,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)}) fusion(%big, %rows.1), kind=kLoop, calls=%two_outputs
  ROOT %rows = f32[8,128]{1,0:T(8,128)} fusion(%prod), kind=kLoop, calls=%take_rows
}
"""  # noqa: E501


def test_hbm_bytes_count_only_buffers_in_hbm():
    """A [64,128] f32 buffer is 32 KiB. The prefetch reads `a` from HBM into VMEM (S(1)); the fusion adds
    the VMEM copy to `b`, reading only `b` from HBM and writing VMEM; the async slice reads 64 of `big`'s
    512 rows; the permute reads VMEM and lands in HBM; the multiply reads one HBM operand and writes HBM;
    a two-output fusion writes 8 rows into `big` in place (not reading it) and 8 rows beside; the last
    fusion reads the 8 rows it slices and writes them. XLA would charge every operand and result whole,
    VMEM and all of `big` included."""
    module = parse(SPACES_HLO)
    runs, _ = executed(module)
    by_name = {run.instruction.name: instruction_bytes(module, run) for run in runs}
    block = 64 * 128 * 4
    assert by_name["cs"] == block and by_name["cd"] == 0  # HBM -> VMEM: the read once
    assert by_name["sum"] == block  # `b` only
    assert by_name["ss"] == block and by_name["sd"] == 0  # the slice, not the 512 rows
    assert by_name["cps"] == block and by_name["cpd"] == 0  # the HBM destination
    assert by_name["prod"] == 2 * block
    rows = 8 * 128 * 4
    assert by_name["rows"] == 2 * rows and by_name["rows.1"] == 2 * rows
    assert by_name["upd"] == 3 * rows  # reads its 8 rows, writes them into `big` and beside
    assert fused_computations(module) == {"fused_sum", "two_outputs", "take_rows"}
    assert hbm_bytes(module, runs) == 6 * block + 7 * rows


ASYNC_COLLECTIVE_HLO = """HloModule a

%step (p0: f32[2,128], p1: f32[8,128], p2: bf16[64,128]) -> (bf16[64,128], f32[8,128], f32[8,128]) {
  %p0 = f32[2,128]{1,0} parameter(0)
  %p1 = f32[8,128]{1,0} parameter(1)
  %p2 = bf16[64,128]{1,0} parameter(2)
  %work = bf16[64,128]{1,0} multiply(%p2, %p2)
  %gathered = f32[8,128]{1,0} all-gather(%p0), channel_id=7, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %out = (bf16[64,128]{1,0}, f32[8,128]{1,0}, f32[8,128]{1,0}) tuple(%work, %p1, %gathered)
}

ENTRY %main (shard: f32[2,128], previous: f32[8,128], x: bf16[64,128]) -> (bf16[64,128], f32[8,128], f32[8,128]) {
  %shard = f32[2,128]{1,0} parameter(0)
  %previous = f32[8,128]{1,0} parameter(1)
  %x = bf16[64,128]{1,0} parameter(2)
  ROOT %fused = (bf16[64,128]{1,0}, f32[8,128]{1,0}, f32[8,128]{1,0}) fusion(%shard, %previous, %x), kind=kOutput, calls=%step
}
"""  # noqa: E501


def test_an_async_collective_fusion_charges_only_its_own_work():
    """libtpu spreads one collective over many fusions, each passing the buffers on: the fusion above does
    its own work (reads and writes a [64,128] bf16 block) and reads the shard it sends; the buffer it
    passes through and the collective's result are not HBM traffic (the links time the collective)."""
    module = parse(ASYNC_COLLECTIVE_HLO)
    runs, _ = executed(module)
    fused = next(run for run in runs if run.instruction.name == "fused")
    assert instruction_bytes(module, fused) == 2 * 64 * 128 * 2 + 2 * 128 * 4


def test_collectives_take_the_links_of_the_torus_axes_they_span():
    """Rings along whole wrapped axes send both ways (2 links per axis), open lines one way; strided
    members share links; an all-to-all's bytes travel the mean distance; a permute its longest hop."""
    v5e, v5p = chip_of("TPU v5 lite"), chip_of("TPU v5")
    assert v5e.link_bytes_per_s == 50e9 and v5p.link_bytes_per_s == 100e9
    pod = Interconnect.of(v5e, [(x, y, 0) for y in range(16) for x in range(16)])  # id = x + 16 y
    assert pod.wrap == (True, True, False)
    row, column, strided = list(range(16)), list(range(0, 256, 16)), list(range(0, 16, 2))
    assert pod.route("all-gather", row) == (route := pod.route("all-gather", row)) and route.axes == (0,)
    assert (route.links, route.hops) == (2, 1.0)
    assert pod.route("all-reduce", column).axes == (1,)
    assert (pod.route("all-reduce", range(256)).links, pod.route("all-gather", strided).links) == (4, 1)
    assert pod.route("all-gather", strided).hops == 2.0  # every second chip: each link carries two rings
    assert pod.seconds(1e9, pod.route("all-gather", row)) == pytest.approx(1e9 / (2 * 50e9))
    shift = [i for x in range(16) for i in (x, (x + 3) % 16)]  # source-target pairs
    assert (pod.route("collective-permute", shift).links, pod.route("collective-permute", shift).hops) == (
        1,
        3,
    )
    small = Interconnect.of(v5e, [(x, y, 0) for y in range(4) for x in range(4)])
    assert small.wrap == (False, False, False) and small.route("all-gather", range(4)).links == 1
    cube = Interconnect.of(v5p, [(x, y, z) for z in range(4) for y in range(4) for x in range(4)])
    assert cube.wrap == (True,) * 3 and cube.route("all-gather", range(4)).links == 2
    assert cube.route("all-to-all", range(4)).hops == pytest.approx(4 / 3)  # distances 1, 2, 1 on a ring
    assert Interconnect.of(v5p, [(x, y, 0) for y in range(2) for x in range(2)]).wrap == (False, False, False)
    switch = Interconnect.of(chip_of("NVIDIA H100 80GB HBM3"), None)
    assert switch.link_bytes_per_s == 450e9 and switch.route("all-gather", range(8)).links == 1


def test_replica_groups_in_every_printed_form():
    from t2mlr_jax.parallel.hlo import Instruction
    from t2mlr_jax.parallel.hlo_collectives import replica_groups

    def groups(attributes):
        return replica_groups(Instruction("x", "f32[8]", "all-gather", f"%a), {attributes}"), 8).tolist()

    mesh = "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, dimensions={0}"
    assert groups(mesh) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups("replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert groups("replica_groups=[4,2]<=[8]") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups("replica_groups={{0,2},{1,3}}, dimensions={0}") == [[0, 2], [1, 3]]
    assert groups("replica_groups={}") == groups("channel_id=3") == [list(range(8))]
    assert groups("source_target_pairs={{0,1},{1,0}}") == [[0, 1], [1, 0]]


def test_splash_kernels_count_the_blocks_a_causal_mask_keeps():
    from t2mlr_jax.parallel.hlo_flops import causal_fraction, kernel_flops

    assert causal_fraction(16, 16, 2048, 2048) == 136 / 256  # the diagonal blocks whole
    assert causal_fraction(4, 2, 512, 512) == 3 / 4
    hlo = """HloModule k

%body (p: (s32[], bf16[4,256,64])) -> (s32[], bf16[4,256,64]) {
  %p = (s32[], bf16[4,256,64]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %q = bf16[4,256,64]{2,1,0} get-tuple-element(%p), index=1
  %mask = s8[1,2,2]{2,1,0} constant({...})
  %k = bf16[2,256,64]{2,1,0} slice(%q), slice={[0:2], [0:256], [0:64]}
  %splash_mha_fwd_residuals.3 = (bf16[4,256,64]{2,1,0}, f32[4,256]{1,0}) custom-call(%mask, %q, %k, %k), custom_call_target="tpu_custom_call"
  %splash_mha_dkv_no_residuals = (bf16[2,256,64]{2,1,0}) custom-call(%mask, %q, %k, %k), custom_call_target="tpu_custom_call"
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[4,256,64]) tuple(%next, %q)
}

%cond (p.1: (s32[], bf16[4,256,64])) -> pred[] {
  %p.1 = (s32[], bf16[4,256,64]) parameter(0)
  %c = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%c, %n), direction=LT
}

ENTRY %main (q: bf16[4,256,64]) -> bf16[4,256,64] {
  %q = bf16[4,256,64]{2,1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4,256,64]) tuple(%zero, %q)
  %loop = (s32[], bf16[4,256,64]) while(%init), condition=%cond, body=%body
  ROOT %out = bf16[4,256,64]{2,1,0} get-tuple-element(%loop), index=1
}
"""  # noqa: E501
    runs, loops = executed(parse(hlo))
    assert loops == [3]
    # 3 trips x (forward 2 + dkv 4 matmuls) x 2 x 4 heads x 256 x 256 x 64 x the 3 of 4 blocks kept
    assert kernel_flops(runs) == 3 * (2 + 4) * 2 * 4 * 256 * 256 * 64 * 3 / 4
    # rows vmapped into the kernel's grid (static masks, segment ids): q [rows, heads, q, d]
    batched = re.sub(r"bf16\[(4|2),256,64\]", r"bf16[5,\1,256,64]", hlo)
    assert kernel_flops(executed(parse(batched))[0]) == 5 * kernel_flops(runs)


def test_grouped_matmul_kernels_count_2mkn_from_their_operands():
    """The dropless MoE's kernels (moe.py): megablox's gmm (lhs [m, k] x [groups, k, n]), its input gradient
    (k and n swapped) and tgmm ([m, k]^T x [m, n] -> [groups, k, n]), by the names libtpu gives them, plain
    or with the transformations', and libtpu's ragged_dot kernel: 2 m k n each, after the integer metadata
    operands; ragged_dot's metadata call multiplies nothing."""
    from t2mlr_jax.parallel.hlo_flops import kernel_flops

    hlo = """HloModule g

ENTRY %main (x: bf16[256,128], w: bf16[4,128,384], tiles: s32[], offsets: s32[6], ids: s32[8], sizes: s32[5]) -> bf16[4,128,384] {
  %x = bf16[256,128]{1,0} parameter(0)
  %w = bf16[4,128,384]{2,1,0} parameter(1)
  %tiles = s32[] parameter(2)
  %offsets = s32[6]{0} parameter(3)
  %ids = s32[8]{0} parameter(4)
  %sizes = s32[5]{0} parameter(5)
  %gmm.2 = bf16[256,384]{1,0:T(8,128)(2,1)S(1)} custom-call(%tiles, %offsets, %ids, %ids, %ids, %x, %w), custom_call_target="tpu_custom_call"
  %transpose_jvp_jit_gmm___.1 = bf16[256,128]{1,0} custom-call(%tiles, %offsets, %ids, %ids, %ids, %gmm.2, %w), custom_call_target="tpu_custom_call"
  %tgmm = bf16[4,128,384]{2,1,0} custom-call(%tiles, %offsets, %ids, %ids, %ids, %x, %gmm.2), custom_call_target="tpu_custom_call"
  %ragged-dot-metadata = (s32[5]{0}, s32[5]{0}, s32[5]{0}, s32[1]{0}) custom-call(%sizes), custom_call_target="tpu_custom_call"
  %ragged-dot-none.1 = bf16[256,384]{1,0} custom-call(%tiles, %offsets, %ids, %ids, %ids, %x, %w), custom_call_target="tpu_custom_call"
  %gmm_like = bf16[256,384]{1,0} add(%gmm.2, %gmm.2)
  ROOT %transpose_jvp_jit_tgmm___.2 = bf16[4,128,384]{2,1,0} custom-call(%tiles, %offsets, %ids, %ids, %ids, %x, %gmm_like), custom_call_target="tpu_custom_call"
}
"""  # noqa: E501
    runs, _ = executed(parse(hlo))
    # 4 megablox calls and ragged_dot's kernel; %gmm_like, an add, is not a kernel
    assert kernel_flops(runs) == 5 * 2 * 256 * 128 * 384


def test_a_vmem_buffer_of_a_real_compile_is_not_hbm_traffic():
    """A two-layer MLP's gradient compiled for v5e:2x2: memory-space assignment puts its small
    activations in VMEM (S(1)); an op reading and writing only VMEM moves no HBM bytes, and the count is
    below XLA's bytes accessed, which charges them."""

    def loss(w1, w2, x):
        h = jnp.tanh(x @ w1)
        return jnp.sum((jnp.tanh(h @ w2) * 2 + h).astype(jnp.float32))

    square, rows = ((512, 512), jnp.bfloat16, P()), ((256, 512), jnp.bfloat16, P("fsdp", None))
    compiled = compile_on(tpu_devices("v5e:2x2"), jax.grad(loss, argnums=(0, 1)), [square, square, rows])
    module = parse(compiled.as_text())
    runs, _ = executed(module)
    inside = fused_computations(module)
    vmem_only = [
        run
        for run in runs
        if run.computation.name not in inside
        and run.instruction.opcode == "fusion"
        and type_bytes(run.instruction.type) > 0
        and type_bytes(run.instruction.type, 0) == 0
        and all(type_bytes(run.computation.instructions[o].type, 0) == 0 for o in run.instruction.operands)
    ]
    assert vmem_only and all(instruction_bytes(module, run) == 0 for run in vmem_only)
    report = compiled_report(compiled)
    weights_in = 2 * 512 * 512 * 2  # read from HBM at least once
    assert weights_in < report["cost"]["hbm_bytes"] < report["cost"]["xla_bytes_accessed"]
