"""The tokenizer files of an exported folder, so that `AutoTokenizer.from_pretrained(folder)` gives the ids
our tokenizer gives and `model.generate` stops at its EOS.

Special tokens come from the source: a GGUF's tokenizer.ggml.{bos,eos,padding}_token_id and its chat
template; a tokenizer.json's EOS as `load_tokenizer` finds it, and BOS, pad and chat template from the
tokenizer_config.json beside it. Where that file names no BOS or pad, both are the EOS, GPT-2's convention
for byte-level BPE: our pipelines put the EOS between documents, so it is what a document follows, and
padding with it is what `generate` falls back to anyway.

The files are written here rather than by transformers' save_pretrained: transformers 5 names the class
"TokenizersBackend" there, which transformers 4 (the authors' release) cannot load; "PreTrainedTokenizerFast"
loads in both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from t2mlr_jax.data.gguf_metadata import read_gguf_metadata
from t2mlr_jax.data.tokenizer import TextTokenizer, load_tokenizer, token_name
from t2mlr_jax.formats.files import read_json, write_json

SPECIAL_TOKENS = ("bos", "eos", "pad")


@dataclasses.dataclass(frozen=True)
class ExportTokenizer:
    source: str  # the .gguf, tokenizer.json or folder it was read from
    ours: TextTokenizer
    special: dict[str, str | None]  # "bos" / "eos" / "pad" -> the token, None when there is none
    chat_template: str | None

    @property
    def token_ids(self) -> dict[str, int | None]:
        """bos_token_id / eos_token_id / pad_token_id, as config.json and generation_config.json hold them."""
        return {
            f"{name}_token_id": None if token is None else self.ours.backend.token_to_id(token)
            for name, token in self.special.items()
        }


def read_tokenizer(path: Path | str) -> ExportTokenizer:
    """From a .gguf file, a tokenizer.json or a folder holding one."""
    path = str(path)
    ours = load_tokenizer(path)
    eos = ours.backend.id_to_token(ours.eos_id)
    if path.endswith(".gguf"):
        meta = read_gguf_metadata(path)
        bos, pad = (meta.get(f"tokenizer.ggml.{key}_token_id") for key in ("bos", "padding"))
        special = {
            "bos": None if bos is None else ours.backend.id_to_token(bos),
            "eos": eos,
            "pad": None if pad is None else ours.backend.id_to_token(pad),
        }
        return ExportTokenizer(path, ours, special, meta.get("tokenizer.chat_template"))
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    config_file, template_file = folder / "tokenizer_config.json", folder / "chat_template.jinja"
    config = read_json(config_file) if config_file.exists() else {}
    special = {name: token_name(config.get(f"{name}_token", eos)) for name in ("bos", "pad")}
    unknown = [
        token for token in special.values() if token is not None and ours.backend.token_to_id(token) is None
    ]
    if unknown:
        raise ValueError(f"{config_file}: special tokens {unknown} are not in the vocabulary")
    # transformers 5 keeps the chat template in a file of its own
    chat_template = config.get("chat_template") or (
        template_file.read_text() if template_file.exists() else None
    )
    return ExportTokenizer(path, ours, {**special, "eos": eos}, chat_template)


def export_tokenizer(
    tokenizer: ExportTokenizer | Path | str | None, vocab_size: int
) -> ExportTokenizer | None:
    """The tokenizer (read when given as a path), refused when it has ids the model cannot embed."""
    if tokenizer is None:
        return None
    if not isinstance(tokenizer, ExportTokenizer):
        tokenizer = read_tokenizer(tokenizer)
    if tokenizer.ours.vocab_size > vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer.source} has {tokenizer.ours.vocab_size} tokens but the model's vocabulary "
            f"only {vocab_size}: it is not this model's tokenizer"
        )
    return tokenizer


def token_ids(tokenizer: ExportTokenizer | None) -> dict[str, int | None]:
    """What config.json records; null ids without a tokenizer, so that transformers does not assume
    Llama's defaults (bos 1, eos 2)."""
    return tokenizer.token_ids if tokenizer else {f"{name}_token_id": None for name in SPECIAL_TOKENS}


def write_tokenizer_files(folder: Path | str, tokenizer: ExportTokenizer, max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json and generation_config.json."""
    folder = Path(folder)
    tokenizer.ours.backend.save(str(folder / "tokenizer.json"))
    named = {f"{name}_token": token for name, token in tokenizer.special.items() if token is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **named,
        "model_max_length": max_length,
        # Byte-level BPE decodes exactly; transformers 4's default clean-up would drop spaces before ".,!?".
        "clean_up_tokenization_spaces": False,
    }
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    write_json(folder / "tokenizer_config.json", config)
    write_json(folder / "special_tokens_map.json", named)
    write_json(folder / "generation_config.json", tokenizer.token_ids)
