#!/usr/bin/env python
"""What one of the release's training scripts really runs, read by the release's own code and written as a
JSON fixture (tests/test_release_recipes.py compares our config with it field by field).

The script (princeton-pli/T2MLR, scripts/<task>/train_<task>.sh, from --release_src; never copied) runs
under bash as its sweep submitter starts it for one run of its sweep_params.yaml (the run's keys as
environment variables, RUN_NAME_SUFFIX its tag), on the GPU count its `#SBATCH --gres=gpu:N` requests
(what nvidia-smi reports inside the job), with `python` replaced by a recorder of its command line. That
command line is parsed by the release's HfArgumentParser over its all_arguments.py dataclasses, in the
order src/train_minimal.py gives them. The fixture holds:
  launch          the release's commit, the sweep run, the GPU count, the launcher before train_minimal.py
  argv            the arguments to src/train_minimal.py
  args            every field of the five dataclasses, as parsed
  t2mlr_settings  the flat settings the release's T2MLRConfig.from_base_config keeps for these arguments
                  (what its config.json stores and t2mlr_jax.interop reads)
  generation      the generate() settings its evaluation uses: components/generation_eval.py's
                  _prepare_generation_kwargs over the wrapper's generation config, and the samples per
                  prompt (num_generations_per_sample, else max(pass_at_k))
  mixer_probe     the release's mixing module for these settings in a 4-wide T2MLRWrapper, on random
                  inputs and weights: both, and its output (called as its BlockWrapper calls it)
Host paths read <release_src> and <output_base>; dataset_num_proc (the host's nproc) and logging_dir (a
timestamp) are left out (<host> in argv).

Two things as committed stop a plain run, and are met here: train_hotpotqa.sh reads MAX_NEW_TOKENS under
`set -u` without a default (it runs with MAX_NEW_TOKENS empty, what the unset variable means without -u:
no --max_new_tokens), and transformers' TrainingArguments refuses bf16 without a GPU (its check is
answered yes; no parsed value depends on it). Importing the release needs the shims of
experiments/benchmarks/vs_release_torch.py, and components/generation_eval.py imports `datasets` and
`math_verify`, which its generation settings do not use (stub modules).

  python -m experiments.release_args --release_src=../T2MLR --release_python=../release_venv/bin/python

The release needs torch and transformers 4.57 (how to get both: python -m experiments.vs_release --help); this
script re-runs itself under --release_python and imports nothing of ours there but the shims.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

from experiments.benchmarks.vs_release_torch import (  # stdlib only: runs under the release's Python
    check_release,
)
from experiments.benchmarks.vs_release_torch import (
    import_release as import_shimmed,
)
from experiments.release_python import run_under

ROOT = Path(__file__).resolve().parents[1]
ENTRY = "src/train_minimal.py"  # the release's training entry point, which the script launches
DEFAULTS = {
    "script": "scripts/hotpotqa/train_hotpotqa.sh",
    "sweep_run": "hotpotqa_t2mlr_on_l1",
    "out": ROOT / "tests/fixtures/release_args_hotpotqa.json",
}
HOST_FIELDS = ("dataset_num_proc", "logging_dir")
PROBE = {"hidden": 4, "tokens": 3, "seed": 0}


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        prog=f"python -m {__spec__.name}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--release_src", required=True, help="a checkout of princeton-pli/T2MLR")
    parser.add_argument(
        "--release_python", default=sys.executable, help="a Python with torch and transformers 4.57"
    )
    parser.add_argument("--script", default=DEFAULTS["script"], help="the training script, under release_src")
    parser.add_argument(
        "--sweep_run",
        default=DEFAULTS["sweep_run"],
        help="RUN_TAG of the run in the script's sweep_params.yaml ('' = the script's own defaults)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULTS["out"], help="the JSON fixture to write")
    args = parser.parse_args(argv)
    try:
        check_release(args.release_src, args.release_python)
    except ValueError as e:
        parser.error(str(e))
    if not (Path(args.release_src) / args.script).is_file():
        parser.error(f"--script {args.script}: no such file under {args.release_src}")
    return args


def sweep_env(script: Path, run_tag: str) -> dict[str, str]:
    """The environment the sweep submitter gives the script for one run: each key but RUN_TAG as str() of
    its YAML value (empty ones skipped), and RUN_NAME_SUFFIX the run's tag."""
    if not run_tag:
        return {}
    import yaml

    runs = yaml.safe_load((script.parent / "sweep_params.yaml").read_text())["runs"]
    run = next((r for r in runs if r.get("RUN_TAG") == run_tag), None)
    if run is None:
        raise SystemExit(f"error: no run {run_tag!r} in {script.parent / 'sweep_params.yaml'}")
    env = {k: str(v) for k, v in run.items() if k != "RUN_TAG" and str(v)}
    return {**env, "RUN_NAME_SUFFIX": run_tag}


def release_commit(src: Path) -> str | None:
    if not (src / ".git").exists():
        return None
    return subprocess.run(
        ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def requested_gpus(script: Path) -> int:
    found = re.search(r"^#SBATCH --gres=gpu:(\d+)", script.read_text(), re.MULTILINE)
    return int(found.group(1)) if found else 1


def command_line(src: Path, script: Path, env: dict[str, str], out_base: Path) -> list[str]:
    """The command the script launches, recorded by a stand-in for its Python."""
    record, python = out_base / "argv", out_base / "python"
    python.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > "{record}"\n')
    python.chmod(0o755)
    host = {"PATH": os.environ["PATH"], "HOME": str(out_base), "master_port": "29500"}
    fixed = {"PYTHON_BIN": str(python), "OUTPUT_BASE": str(out_base / "outputs"), "MAX_NEW_TOKENS": ""}
    done = subprocess.run(["bash", str(script)], cwd=src, env={**host, **fixed, **env}, capture_output=True)
    if done.returncode:
        raise SystemExit(f"error: {script} failed:\n{done.stderr.decode()}")
    return [arg.decode() for arg in record.read_bytes().split(b"\0")[:-1]]


def import_release(src: Path):
    import_shimmed(str(src))  # the IPython stub and components.t2mlr_utils
    import transformers.training_args

    transformers.training_args.is_torch_bf16_gpu_available = lambda: True
    for name, attrs in {"datasets": ("Dataset",), "math_verify": ("parse", "verify")}.items():
        stub = types.ModuleType(name)
        stub.__dict__.update(dict.fromkeys(attrs))
        sys.modules.setdefault(name, stub)


def parsed_arguments(argv: list[str]) -> tuple:
    from components import all_arguments as a
    from transformers import HfArgumentParser

    classes = (
        a.ModelArguments,
        a.TrainingArguments,
        a.DataArguments,
        a.T2MLRArguments,
        a.GenerationEvalArguments,
    )
    return HfArgumentParser(classes).parse_args_into_dataclasses(args=argv)


def fields_of(parsed) -> dict:
    values = parsed.to_dict() if hasattr(parsed, "to_dict") else dataclasses.asdict(parsed)
    return {k: v for k, v in values.items() if k not in HOST_FIELDS}


def tiny_wrapper(t2mlr_args):
    """The release's T2MLRWrapper over a 4-wide Llama with room for the window, built as train_minimal.py
    wraps its model."""
    import torch
    from t2mlr_wrapper import T2MLRWrapper
    from transformers import LlamaConfig, LlamaForCausalLM

    d = PROBE["hidden"]
    layers = 2 * t2mlr_args.l_start + 2
    config = LlamaConfig(
        vocab_size=8, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers, num_attention_heads=1,
        num_key_value_heads=1, head_dim=d, dtype=torch.float32, attn_implementation="sdpa",
    )  # fmt: skip
    return T2MLRWrapper.from_base_model(LlamaForCausalLM(config), t2mlr_args)


def settings(wrapper) -> dict:
    from t2mlr_wrapper.t2mlr_config import T2MLRSettings

    return {name: getattr(wrapper.config, name) for name in T2MLRSettings.__dataclass_fields__}


def generation(wrapper, eval_args) -> dict:
    from components.generation_eval import _prepare_generation_kwargs

    config, _ = wrapper._prepare_generation_config(None, **_prepare_generation_kwargs(eval_args))
    names = ("do_sample", "temperature", "top_k", "top_p", "num_beams")
    # components/generation_eval.py, run_generation_evaluation: samples per prompt
    samples = eval_args.num_generations_per_sample or max(eval_args.pass_at_k)
    return {**{name: getattr(config, name) for name in names}, "num_generations_per_sample": samples}


def mixer_probe(wrapper, l_start: int) -> dict:
    import torch

    mixer = wrapper.layers[l_start].t2mlr_mixing_module
    generator = torch.Generator().manual_seed(PROBE["seed"])
    draw = lambda shape: torch.randn(shape, generator=generator)  # noqa: E731
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(draw(p.shape))
        x, big_r = draw((1, PROBE["tokens"], PROBE["hidden"])), draw((1, PROBE["tokens"], PROBE["hidden"]))
        out, _ = mixer(x, big_r)  # as its BlockWrapper calls it: no recurrent_weight / orig_weight
    return {
        "module": type(mixer).__name__,
        "weights": {k: v.tolist() for k, v in mixer.state_dict().items()},
        "x": x.tolist(),
        "R": big_r.tolist(),
        "out": out.tolist(),
    }


def without_host_values(argv: list[str]) -> list[str]:
    return ["<host>" if i and argv[i - 1][2:] in HOST_FIELDS else arg for i, arg in enumerate(argv)]


def placeholders(value, paths: dict[str, str]):
    if isinstance(value, str):
        for path, name in paths.items():
            value = value.replace(path, name)
        return value
    if isinstance(value, list):
        return [placeholders(v, paths) for v in value]
    if isinstance(value, dict):
        return {k: placeholders(v, paths) for k, v in value.items()}
    return value


def make(args: argparse.Namespace) -> dict:
    import torch

    src = Path(args.release_src).resolve()
    script = src / args.script
    env, gpus = sweep_env(script, args.sweep_run), requested_gpus(script)
    with tempfile.TemporaryDirectory() as tmp:
        argv = command_line(src, script, {**env, "num_gpus": str(gpus)}, Path(tmp))
        paths = {str(Path(tmp) / "outputs"): "<output_base>", str(src): "<release_src>"}
    entry = argv.index(str(src / ENTRY))
    import_release(src)
    parsed = parsed_arguments(argv[entry + 1 :])
    model_args, training_args, data_args, t2mlr_args, eval_args = parsed
    torch.manual_seed(PROBE["seed"])
    wrapper = tiny_wrapper(t2mlr_args)
    fixture = {
        "launch": {
            "release_commit": release_commit(src),
            "script": args.script,
            "sweep_run": env,
            "num_gpus": gpus,
            "launcher": argv[:entry],
        },
        "argv": without_host_values(argv[entry + 1 :]),
        "args": {type(p).__name__: fields_of(p) for p in parsed},
        "t2mlr_settings": settings(wrapper),
        "generation": generation(wrapper, eval_args),
        "mixer_probe": mixer_probe(wrapper, t2mlr_args.l_start),
    }
    return placeholders(json.loads(json.dumps(fixture, default=str)), paths)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run_under(args.release_python, __spec__.name, argv)
    fixture = make(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
