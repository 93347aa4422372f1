"""Convert checkpoints between PyTorch formats and our orbax checkpoints: --from / --to name the checkpoint
formats registered in t2mlr_jax.formats.registry.FORMATS (the generic ones in t2mlr_jax/formats/, each
research system's release layout in its package under t2mlr_jax/architectures/), one side orbax.

Directions:
  hf | gguf | t2mlr-torch | nanochat  ->  orbax     import (HF Llama folder, llama.cpp GGUF, the authors'
                                                    T²MLR folder, a nanochat checkpoint folder: karpathy/
                                                    nanochat or the LRT release's model_<step>.pt + meta)
  orbax  ->  hf | t2mlr-torch | nanochat            export (HF: plain models, or a T²MLR backbone with
                                                    --drop-recurrence; nanochat: its GPT's backbone only)
  ponderlm2  <->  orbax                             PonderLM-2's release (LUMIA-Group/PonderLM-2): its
                                                    save_pretrained folder, an HF Llama with its pondering
                                                    fields; the orbax side holds the backbone, the import
                                                    prints the arch=ponderlm2 settings that compute the
                                                    release's model; an export writes its scripts' recipe
                                                    at --thoughts K; --verify runs arch ponderlm2's
                                                    evaluation against a PyTorch reference of the release's

  python tools/convert_checkpoint.py --from gguf --to orbax \
      SmolLM2-135M-Instruct.Q4_1.gguf ckpt/smollm2 --verify
  python tools/convert_checkpoint.py --from orbax --to t2mlr-torch ckpt/run1 export/run1 --verify
  python tools/convert_checkpoint.py --from orbax --to hf ckpt/smollm2 export/smollm2 \
      --tokenizer SmolLM2-135M-Instruct.Q4_1.gguf --verify-text some.txt

An export is a folder to load as it is: the weights; config.json with the tokenizer's bos/eos/pad ids;
the tokenizer files and generation_config.json (so that AutoTokenizer loads it and generate stops at EOS)
from --tokenizer, by default the tokenizer the source records; and a README.md model card (architecture,
recurrence, source, how to load it, the --verify figures). An import records the tokenizer with the
orbax checkpoint. TARGET is new or empty: a non-empty one is refused before anything is converted,
unless --overwrite, which replaces the model in it (an earlier export's or download's weights, every
shard and index, config, tokenizer files and card: none of them is left to be read with the new model;
other files stay) and, for orbax, replaces an exported folder whole.

--verify runs both sides (ours in JAX, exact recurrence for T²MLR; transformers or the torch reference)
on a few random token sequences, prints the largest logit difference and writes a JSON report
(--report, default TARGET.verify.json); --verify-text FILE (implies --verify) also compares them on
FILE's text tokenized by that tokenizer (the report's "text" section). The exit status is 1 when a
difference exceeds --tolerance relative to the largest |logit|, and 2 on bad input (one error line,
nothing written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from t2mlr_jax import cpu_runtime
from t2mlr_jax.config.cli import OneLineParser


def directions() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The registered formats a checkpoint converts from, and those (with a save) it converts to."""
    from t2mlr_jax.interop.pretrained import formats

    registered = formats()
    names = registered.names()
    return names, tuple(name for name in names if registered.get(name).save)


def parse_args(argv):
    imports, exports = directions()
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--from", dest="source_format", required=True, choices=imports)
    parser.add_argument("--to", dest="target_format", required=True, choices=exports)
    parser.add_argument("source", type=Path, help="folder, .gguf file or orbax checkpoint to read")
    parser.add_argument("target", type=Path, help="folder to write: new or empty, unless --overwrite")
    parser.add_argument(
        "--param-dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="dtype of the imported parameters (imports only; the gammas stay float32)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the model in a non-empty TARGET: for hf / t2mlr-torch, remove the weights (every "
        "shard, index and .bin), config, tokenizer files and model card an earlier export or download left "
        "there, keeping other files; for orbax, TARGET must be an exported orbax folder, replaced whole",
    )
    parser.add_argument(
        "--drop-recurrence",
        action="store_true",
        help="orbax -> hf of a T²MLR model: export its backbone, without the mixer",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="a .gguf, tokenizer.json or folder holding one: what an export carries and --verify-text "
        "tokenizes with (default: the tokenizer the source records)",
    )
    parser.add_argument(
        "--thoughts",
        type=int,
        default=1,
        help="orbax -> ponderlm2: the thought count K its config.json records (default 1: the release's "
        "scripts; the ponderlm2 format's save option)",
    )
    parser.add_argument("--verify", action="store_true", help="compare logits of both sides after converting")
    parser.add_argument(
        "--verify-text", type=Path, metavar="FILE", help="also compare logits on this text (implies --verify)"
    )
    parser.add_argument("--report", type=Path, help="where --verify writes its JSON report")
    parser.add_argument("--num-sequences", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="on the difference relative to max |logit|"
    )
    args = parser.parse_args(argv)
    if (args.source_format == "orbax") == (args.target_format == "orbax"):
        others = lambda names: "|".join(name for name in names if name != "orbax")  # noqa: E731
        parser.error(
            f"unsupported direction {args.source_format} -> {args.target_format}: one side must be "
            f"orbax ({others(imports)} -> orbax, or orbax -> {others(exports)})"
        )
    args.verify = args.verify or args.verify_text is not None
    if args.thoughts < 1:
        parser.error(f"--thoughts {args.thoughts}: a PonderLM-2 model has K >= 1 thought slots")
    return args


def check_paths(args) -> None:
    """Refuse a missing, mislabelled or unreadable source (its config and weight headers: a cut-short file
    is found here), a non-empty target without --overwrite and a missing text, before anything is
    converted."""
    from t2mlr_jax.formats.files import check_export_target
    from t2mlr_jax.interop.orbax_folder import check_orbax_target
    from t2mlr_jax.interop.pretrained import format_of

    if not args.source.exists():
        raise ValueError(f"{args.source} does not exist")
    found = format_of(args.source)
    if found.name != args.source_format:
        raise ValueError(
            f"{args.source} is not a --from {args.source_format} checkpoint: it looks like "
            f"--from {found.name}"
        )
    cfg = found.read_config(args.source)
    if reason := found.refuses_checkpoint(args.source):
        raise ValueError(f"{args.source} is {reason}")
    if args.verify and args.seq_len > cfg.max_seq_len:
        raise ValueError(f"--seq-len {args.seq_len} is longer than the model's context ({cfg.max_seq_len})")
    check_target = check_orbax_target if args.target_format == "orbax" else check_export_target
    check_target(args.target, overwrite=args.overwrite)
    if args.verify_text and not args.verify_text.is_file():
        raise ValueError(f"--verify-text {args.verify_text}: no such file")


def resolve_tokenizer(args):
    """The tokenizer (as `read_tokenizer` reads it) of --tokenizer, else the one the source records, else
    None. Read here, so that a bad --tokenizer is refused before anything is written; a recorded one that
    does not read is left out with a warning (the conversion itself does not need it)."""
    from t2mlr_jax.formats.tokenizer_files import read_tokenizer
    from t2mlr_jax.interop.pretrained import recorded_tokenizer

    if args.tokenizer:
        return read_tokenizer(args.tokenizer)
    path = recorded_tokenizer(args.source)
    if path is None:
        return None
    try:
        return read_tokenizer(path)
    except ValueError as e:
        print(f"warning: ignoring the tokenizer {args.source} records: {e}", file=sys.stderr)
        return None


def verify_text_tokens(args, tokenizer):
    """The --verify-text file as --num-sequences windows of --seq-len tokens."""
    from t2mlr_jax.interop.verify import text_windows

    if tokenizer is None:
        raise ValueError(
            f"--verify-text needs a tokenizer and {args.source} records none: pass --tokenizer PATH"
        )
    ids = tokenizer.ours.encode(args.verify_text.read_text(encoding="utf-8"))
    try:
        return text_windows(ids, args.num_sequences, args.seq_len)
    except ValueError as e:
        raise ValueError(
            f"--verify-text {args.verify_text}: {e}; use a longer text or lower --num-sequences / --seq-len"
        ) from None


def convert(args, tokenizer) -> tuple:
    """Read the source, write the target; returns the (cfg, params) our side holds (for an export, the
    model read, its recurrence included)."""
    from t2mlr_jax.interop.pretrained import formats

    source, target = (formats().get(name) for name in (args.source_format, args.target_format))
    cfg, params = source.load(args.source, param_dtype=args.param_dtype, progress=True)
    if source.import_note:
        print(source.import_note(args.source))
    target_cfg, target_params = exported(args, cfg, params)
    if reason := target.refuses_model(target_cfg):
        raise ValueError(f"{args.source} is {reason}")
    target.save(
        target_cfg,
        target_params,
        args.target,
        tokenizer=tokenizer,
        progress=True,
        overwrite=args.overwrite,
        **{option: getattr(args, option) for option in target.options},
    )
    if args.target_format == "orbax":
        return target.load(args.target)  # verify what was written, not what is in memory
    return cfg, params


def exported(args, cfg, params) -> tuple:
    """The model the target holds: a T²MLR model's backbone for --drop-recurrence to a backbone format."""
    from t2mlr_jax.interop.pretrained import formats

    if (
        args.drop_recurrence
        and formats().get(args.target_format).backbone_only
        and cfg.recurrence is not None
    ):
        return cfg.replace(recurrence=None), {k: v for k, v in params.items() if k != "mixer"}
    return cfg, params


def verify_conversion(args, cfg, params, text_tokens, written: Path) -> dict:
    """--verify's report, against the torch side (the source, or the export `written` for args.target)."""
    from t2mlr_jax.interop.verify import verify

    torch_side = (
        (args.source_format, args.source) if args.target_format == "orbax" else (args.target_format, written)
    )
    report = verify(
        cfg,
        params,
        *torch_side,
        num_sequences=args.num_sequences,
        seq_len=args.seq_len,
        tolerance=args.tolerance,
        text_tokens=text_tokens,
    )
    if text_tokens is not None:
        report["text"]["file"] = str(args.verify_text)
    report.update(
        source=str(args.source),
        source_format=args.source_format,
        target=str(args.target),
        target_format=args.target_format,
    )
    return report


def write_report(args, report: dict) -> None:
    """Write (whole or not at all) and print --verify's report."""
    from t2mlr_jax.interop.verify import report_sections
    from t2mlr_jax.storage.workdir import write_atomic

    report_path = args.report or args.target.with_name(args.target.name + ".verify.json")
    write_atomic(report_path, json.dumps(report, indent=2) + "\n")
    for label, section in report_sections(report):
        print(
            f"{label}: max |logit difference| = {section['max_abs_logit_diff']:.3g} "
            f"(relative {section['max_rel_logit_diff']:.3g}: {'ok' if section['passed'] else 'FAILED'}, "
            f"tolerance {args.tolerance:g})"
        )
    print(f"report: {report_path}")


def run(args) -> int:
    from t2mlr_jax.formats.files import staged_folder
    from t2mlr_jax.interop.model_card import write_model_card
    from t2mlr_jax.interop.verify import report_sections

    check_paths(args)
    tokenizer = resolve_tokenizer(args)
    text_tokens = verify_text_tokens(args, tokenizer) if args.verify_text else None
    exporting = args.target_format != "orbax"
    with staged_folder(args.target) as stage:  # a kill leaves no half-written target
        cfg, params = convert(argparse.Namespace(**{**vars(args), "target": stage}), tokenizer)
        target_cfg, target_params = exported(args, cfg, params)
        report = (
            verify_conversion(args, target_cfg, target_params, text_tokens, stage) if args.verify else None
        )
        if exporting:  # after verifying, so that the card shows its figures
            write_model_card(
                stage,
                cfg,
                target_params,
                layout=args.target_format,
                source=str(args.source),
                source_format=args.source_format,
                tokenizer=None if tokenizer is None else tokenizer.source,
                report=report,
            )
    print(f"wrote {args.target_format} checkpoint to {args.target}")
    if exporting and tokenizer is None and args.target_format != "nanochat":  # nanochat's: not in checkpoints
        print(
            f"warning: {args.target} has no tokenizer files ({args.source} records no tokenizer); "
            "convert again with --tokenizer PATH (a .gguf, tokenizer.json or its folder) to add them",
            file=sys.stderr,
        )
    if report is None:
        return 0
    write_report(args, report)
    return 0 if all(section["passed"] for _, section in report_sections(report)) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError) as e:  # bad or unsupported input: the message says what and why
        from t2mlr_jax.formats.files import one_line

        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    cpu_runtime.tune()
    sys.exit(main())
