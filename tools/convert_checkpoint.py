"""Convert checkpoints between PyTorch formats and our orbax checkpoints.

Directions:
  hf | gguf | t2mlr-torch  ->  orbax     import (HF Llama folder, llama.cpp GGUF, the authors' T²MLR folder)
  orbax  ->  hf | t2mlr-torch            export (HF: plain models, or a T²MLR backbone with
                                         --drop-recurrence)

  python tools/convert_checkpoint.py --from gguf --to orbax \
      SmolLM2-135M-Instruct.Q4_1.gguf ckpt/smollm2 --verify
  python tools/convert_checkpoint.py --from orbax --to t2mlr-torch ckpt/run1 export/run1 --verify

--verify runs both sides (ours in JAX, exact recurrence for T²MLR; transformers or the torch reference)
on a few random token sequences, prints the largest logit difference and writes a JSON report
(--report, default TARGET.verify.json); the exit status is 1 when it exceeds --tolerance relative to
the largest |logit|.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

IMPORTS = ("hf", "gguf", "t2mlr-torch")
EXPORTS = ("hf", "t2mlr-torch")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--from", dest="source_format", required=True, choices=IMPORTS + ("orbax",))
    parser.add_argument("--to", dest="target_format", required=True, choices=EXPORTS + ("orbax",))
    parser.add_argument("source", type=Path, help="folder, .gguf file or orbax checkpoint to read")
    parser.add_argument("target", type=Path, help="folder to write (must not exist for orbax)")
    parser.add_argument(
        "--param-dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="dtype of the imported parameters (imports only; the gammas stay float32)",
    )
    parser.add_argument(
        "--drop-recurrence",
        action="store_true",
        help="orbax -> hf of a T²MLR model: export its backbone, without the mixer",
    )
    parser.add_argument("--verify", action="store_true", help="compare logits of both sides after converting")
    parser.add_argument("--report", type=Path, help="where --verify writes its JSON report")
    parser.add_argument("--num-sequences", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="on the difference relative to max |logit|"
    )
    args = parser.parse_args(argv)
    if (args.source_format == "orbax") == (args.target_format == "orbax"):
        parser.error(
            f"unsupported direction {args.source_format} -> {args.target_format}: one side must be "
            f"orbax ({'|'.join(IMPORTS)} -> orbax, or orbax -> {'|'.join(EXPORTS)})"
        )
    return args


def convert(args) -> tuple:
    """Read the source, write the target; returns the (cfg, params) our side holds."""
    from t2mlr_jax.interop import (
        load_gguf,
        load_hf,
        load_params,
        load_t2mlr_torch,
        save_hf,
        save_params,
        save_t2mlr_torch,
    )

    if args.target_format == "orbax":
        load = {"hf": load_hf, "gguf": load_gguf, "t2mlr-torch": load_t2mlr_torch}[args.source_format]
        cfg, params = load(args.source, param_dtype=args.param_dtype, progress=True)
        save_params(args.target, cfg, params)
        return load_params(args.target)  # verify what was written, not what is in memory
    cfg, params = load_params(args.source)
    if args.target_format == "hf":
        save_hf(cfg, params, args.target, drop_recurrence=args.drop_recurrence, progress=True)
        if cfg.recurrence is not None:  # the export holds the backbone only
            cfg, params = cfg.replace(recurrence=None), {k: v for k, v in params.items() if k != "mixer"}
    else:
        save_t2mlr_torch(cfg, params, args.target, progress=True)
    return cfg, params


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg, params = convert(args)
    except ValueError as e:  # bad or unsupported input: the message says what and why
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.target_format} checkpoint to {args.target}")
    if not args.verify:
        return 0
    from t2mlr_jax.interop.verify import verify

    torch_side = (
        (args.source_format, args.source)
        if args.target_format == "orbax"
        else (args.target_format, args.target)
    )
    report = verify(
        cfg,
        params,
        *torch_side,
        num_sequences=args.num_sequences,
        seq_len=args.seq_len,
        tolerance=args.tolerance,
    )
    report.update(
        source=str(args.source),
        source_format=args.source_format,
        target=str(args.target),
        target_format=args.target_format,
    )
    report_path = args.report or args.target.with_name(args.target.name + ".verify.json")
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"max |logit difference| = {report['max_abs_logit_diff']:.3g} "
        f"(relative {report['max_rel_logit_diff']:.3g}: {'ok' if report['passed'] else 'FAILED'}, "
        f"tolerance {args.tolerance:g}); report: {report_path}"
    )
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
