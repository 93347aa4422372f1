#!/usr/bin/env python
"""Compile an experiment's programs ahead of time for a TPU pod, from this host (no TPU needed: libtpu's
compiler, `pip install 'libtpu==0.0.42.*'`), and report per device what each would cost there.

  python tools/aot_compile.py --config=configs/smollm135m_t2mlr.py:w13_18 --topology=v5e:16x16 \
      --mesh=data:16,fsdp:16 --batch=256 --seq_len=2048 --out=runs/aot/t2mlr_v5e256
  python tools/aot_compile.py --config=configs/lrt_nanochat.py --arch=lrt,ponderlm2 --topology=v5p:4x4x4 \
      --mesh=fsdp:16,expert:4 --config.train.grad_accum=1
  python tools/aot_compile.py --config=configs/smollm135m_t2mlr.py --topology=v5e:16x16 \
      --mesh=data:16,fsdp:16 --config.mesh.zero=1 --batch=1024 --seq_len=2048   # ZeRO-1

Each architecture of --arch (default: the config's arch) gets its programs compiled exactly as the
trainer and the generator build them (t2mlr_jax/train/programs.py): the train step (T²MLR with its
configured Jacobi D / B; an architecture that samples its per-step choice gets step 1's), the eval forward,
the cached decode step against a --seq_len cache, and T²MLR's Jacobi prefill of a --seq_len prompt.
Attention on TPU is the Pallas splash kernel under shard_map (its custom calls are counted).
Per program and device: argument / output / temporary / total bytes against the HBM libtpu makes
available, FLOPs (matmuls and splash kernels, every loop trip), HBM bytes (buffers that live in HBM) beside
XLA's raw cost, each collective with the torus links it uses and its time, and a roofline estimate of the
step and, for the train step, MFU (t2mlr_jax/parallel/compiled_report.py; chip facts with their sources
in t2mlr_jax/parallel/chips.py; calibration against measured runs in docs/tpu_compile.md). Written to
--out: aot.json, aot.md and the compiled HLO.

Bad input (config, topology, mesh, batch) is one `error:` line and exit status 2 before anything
compiles; a program that fails to compile is one line naming it and XLA's reason, the others still
compile, and the exit status is 1.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the programs are compiled for the topology, never run here

from absl import app, flags  # noqa: E402

from t2mlr_jax import cpu_runtime  # noqa: E402
from t2mlr_jax.config.cli import config_file_flag, fail, parse_flags  # noqa: E402
from t2mlr_jax.storage.workdir import write_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # config files import configs.recipes, from the repo root
DEFAULT_CONFIG = str(ROOT / "configs" / "smollm135m_t2mlr.py")
_CONFIG = config_file_flag(DEFAULT_CONFIG, "Experiment config file[:preset].")
_TOPOLOGY = flags.DEFINE_string("topology", "v5e:2x2", "TPU topology, e.g. v5e:2x2, v5e:16x16, v5p:4x4x4.")
_MESH = flags.DEFINE_string(
    "mesh",
    "fsdp:-1",
    "Mesh sizes, e.g. data:16,fsdp:16 (axes data, fsdp, expert, tensor; -1: the rest). The ZeRO stage is "
    "the config's: --config.mesh.zero=1 keeps weights whole, optimizer state over data and fsdp.",
)
_ARCH = flags.DEFINE_string("arch", None, "Architectures (comma list). Default: the config's arch.")
_BATCH = flags.DEFINE_integer("batch", None, "Global batch (rows). Default: config.train.batch_size.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", None, "Row length. Default: config.data.seq_len.")
_PROGRAMS = flags.DEFINE_string("programs", "train,eval,decode,jacobi_prefill", "Programs to compile.")
_OUT = flags.DEFINE_string("out", "runs/aot", "Output folder: aot.json, aot.md.")


def _plan(config, names: list[str], mesh, batch: int, seq_len: int, wanted: list[str]):
    """(architecture name, its Programs, the programs to compile) per architecture, every input checked."""
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.studies.training_free import STUDIES
    from t2mlr_jax.train import aot
    from t2mlr_jax.train.programs import Programs

    plan = []
    for name in names:
        arch = build_architecture(config, name)  # random weights: init_from is the run's, not the program's
        aot.check_shapes(config, arch, mesh, batch, seq_len)
        programs = [p for p in wanted if not (p == "train" and name in STUDIES)]  # training-free: no step
        plan.append((name, Programs(config, arch, mesh), programs))
    return plan


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import tqdm

    from t2mlr_jax.architectures import arch_names
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.parallel.chips import chip_of
    from t2mlr_jax.parallel.compiled_report import compiled_report
    from t2mlr_jax.train import aot

    try:
        config = resolve(_CONFIG.value)
        if _ARCH.value:
            config = config.replace(arch=_ARCH.value)
        names = arch_names(config)
        wanted = [p.strip() for p in _PROGRAMS.value.split(",") if p.strip()]
        unknown = [p for p in wanted if p not in aot.PROGRAMS]
        if unknown or not wanted:
            raise ValueError(f"--programs: {unknown or wanted} not among {aot.PROGRAMS}")
        batch = _BATCH.value or config.train.batch_size
        seq_len = _SEQ_LEN.value or config.data.seq_len
        mesh = aot.topology_mesh(_TOPOLOGY.value, _MESH.value)
        chip = chip_of(mesh.devices.flat[0].device_kind)
        plan = _plan(config, names, mesh, batch, seq_len, wanted)
    except (ValueError, KeyError) as e:
        fail(e)
    out = Path(_OUT.value)
    (out / "hlo").mkdir(parents=True, exist_ok=True)
    setting = {
        "command": " ".join(["python tools/aot_compile.py", *sys.argv[1:]]),
        "topology": _TOPOLOGY.value,
        "chip": chip.name,
        "chips": mesh.size,
        "mesh": dict(mesh.shape),
        "zero": config.mesh.zero,
        "batch": batch,
        "seq_len": seq_len,
    }
    records, failed = [], []
    jobs = [(name, programs, p) for name, programs, wanted_here in plan for p in wanted_here]
    progress = tqdm.tqdm(jobs, desc="compiling", unit="program", dynamic_ncols=True)
    for name, programs, program in progress:
        progress.set_postfix_str(f"{name} {program}")
        sample = programs.arch.sample(config.seed, 1) if programs.arch.sample and program == "train" else None
        result = aot.compile_program(programs, program, batch, seq_len, sample)
        if result is None:  # none such: a Jacobi prefill outside T²MLR; no KV cache to decode with
            if program == "decode":
                records.append({"arch": name, "program": program, "skipped": aot.NO_CACHE})
            continue
        record = {"arch": name, "program": program, "compile_seconds": round(result.seconds, 1)}
        if result.sample:
            record["sample"] = result.sample
        if result.needs_temp_bytes is not None:  # the compiler's answer: it does not fit
            record["memory"] = {"temp_bytes": result.needs_temp_bytes, "fits": False}
            tqdm.tqdm.write(f"{name} {program}: does not fit ({result.error})", file=sys.stderr)
        elif result.error:
            failed.append(f"{name} {program}: {result.error}")
            tqdm.tqdm.write(f"error: {failed[-1]}", file=sys.stderr)
            record["error"] = result.error
        else:
            with gzip.open(out / "hlo" / f"{name}_{program}.hlo.gz", "wt") as f:
                f.write(result.compiled.as_text())
            flops = _model_flops(programs.arch, program, batch, seq_len)
            try:
                record.update(compiled_report(result.compiled, model_flops=flops))
            except Exception as e:  # noqa: BLE001 -- an HLO form the reader does not know: say so, go on
                failed.append(f"{name} {program}: reading its HLO: {type(e).__name__}: {e}")
                tqdm.tqdm.write(f"error: {failed[-1]}", file=sys.stderr)
                record["error"] = failed[-1]
        records.append(record)
    write_atomic(out / "aot.json", json.dumps({"setting": setting, "programs": records}, indent=2))
    write_atomic(out / "aot.md", _markdown(setting, records))
    print((out / "aot.md").read_text())
    print(f"-> {out / 'aot.json'}, {out / 'aot.md'}")
    if failed:
        sys.exit(1)


def _markdown(setting: dict, records: list[dict]) -> str:
    from t2mlr_jax.parallel.compiled_report import MARKDOWN_HEADER, markdown_row

    lines = [
        f"# {setting['topology']}: {setting['chips']} x {setting['chip']}, mesh {setting['mesh']} "
        f"ZeRO-{setting['zero']}, batch {setting['batch']} x {setting['seq_len']} tokens",
        "",
        f"`{setting['command']}`",
        "",
        *(prefix + line for prefix, line in zip(("| arch ", "|---"), MARKDOWN_HEADER.split("\n"))),
    ]
    for r in records:
        if "error" in r or "skipped" in r or "roofline" not in r:
            lines.append(f"| {r['arch']} | {r['program']} | {not_compiled(r)} |")
        else:
            lines.append(f"| {r['arch']} " + markdown_row(r["program"], r))
    return "\n".join(lines) + "\n"


def not_compiled(record: dict) -> str:
    """Why a program has no report: it failed, it does not exist for this architecture, or the compiler
    found it does not fit the chip."""
    if "error" in record:
        return f"**failed**: {record['error']}"
    if "skipped" in record:
        return record["skipped"]
    return f"**does not fit**: {record['memory']['temp_bytes'] / 2**30:.1f} GiB of temporaries"


def _model_flops(arch, program: str, batch: int, seq_len: int) -> float | None:
    """The train step's model FLOPs (the architecture's count: MFU's numerator); None for other programs."""
    if program != "train" or arch.train_flops is None:
        return None
    return batch * arch.train_flops(seq_len)


if __name__ == "__main__":
    cpu_runtime.tune()  # the host runs little here, but it runs on the CPU
    app.run(main, flags_parser=lambda argv: parse_flags(argv, _CONFIG, DEFAULT_CONFIG))
