"""PonderLM-2's release format (LUMIA-Group/PonderLM-2, a LLaMA-Factory fork) <-> our arch "ponderlm2" on a
Llama backbone.

The release saves its model with transformers' save_pretrained: an HF Llama folder (safetensors, keys as
transformers' LlamaForCausalLM) whose config.json also holds the fields its loader.load_model sets from the
training flags (hparams/model_args.py):
  recurrent_model           its pondering forward (modeling_llama.py); False is the plain Llama baseline
  num_latent_thoughts       K, thought slots per token
  scale_embeds              token embeddings x sqrt(2.5 H) (interpolation=False; with interpolation, sqrt(H))
  interpolation             thoughts fed a softmax-weighted mix of embeddings instead of the hidden state
  interpolation_use_topk    (with interpolation) that mix over the top-k logits only
  num_jacobi_iterations     R, the Jacobi refinements of its evaluation (and of training unless random)
  random_jacobi_iterations  training draws R uniformly from {2, 3} per step
Its weights are our Llama backbone's exactly (t2mlr_jax.formats.hf reads them); its fields are our `ponderlm2`
section (`ponderlm2_settings`): thoughts=(K,), embed_scale, init="growing" (its K growing passes),
passes = R + 1 (its refinements and its final pass; (3, 4) at equal odds when random) and eval_passes =
num_jacobi_iterations + 1 (its evaluation forward). Not importable: interpolation=True (the PonderLM-2
paper's main recipe uses the hidden state, as its scripts do) and recurrent_model=False (a plain Llama:
load it as an HF folder). The release's nn.Embedding(padding_idx=pad_token_id) zeroes that row's
gradient; ours does not (no text the model trains on holds the padding id).

Registered as the checkpoint format "ponderlm2" when this package is imported: its import gives the
backbone (the settings are printed), its export the scripts' recipe at K thoughts (convert_checkpoint's
--thoughts), its --verify runs our evaluation (evaluation.py) against torch_reference.py.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np

from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.formats.configs import model_config_from_hf, refuse
from t2mlr_jax.formats.files import read_json, write_json
from t2mlr_jax.formats.hf import load_hf, save_hf
from t2mlr_jax.formats.registry import CheckpointFormat, folder_config, register_format
from t2mlr_jax.model.config import ModelConfig

RANDOM_JACOBI = (2, 3)  # the refinement counts its random_jacobi_iterations draws (torch.randint(2, 4))
MARK = "num_latent_thoughts"  # a config.json field of the release's, not of transformers'
FIELDS = (  # the fields its loader adds to config.json (module docstring)
    "recurrent_model",
    MARK,
    "scale_embeds",
    "interpolation",
    "interpolation_use_topk",
    "num_jacobi_iterations",
    "random_jacobi_iterations",
)


SCRIPTS = {  # what scripts/train_ponderlm2_*.sh pass (K: --num_latent_thoughts, 1 there)
    "recurrent_model": True,
    "scale_embeds": True,
    "interpolation": False,
    "num_jacobi_iterations": 3,
    "random_jacobi_iterations": True,
}


def is_ponderlm2_release(path: Path | str) -> bool:
    """Whether `path` is a folder the release saved (its config.json carries the pondering fields)."""
    config = Path(path) / "config.json"
    return config.is_file() and MARK in read_json(config)


def ponderlm2_settings(fields: dict) -> dict:
    """Our `ponderlm2` section that computes the release's model of this config.json, number for number;
    one error listing every field it cannot."""
    problems = []
    if not fields.get("recurrent_model"):
        problems.append("recurrent_model=false (a plain Llama: load the folder as an HF checkpoint)")
    if fields.get("interpolation", True):  # the release's default
        problems.append("interpolation=true (softmax-weighted embeddings fed back; only the hidden state)")
    k = fields.get(MARK, 0)
    if not isinstance(k, int) or k < 1:
        problems.append(f"num_latent_thoughts={k!r} (only K >= 1 thought slots)")
    r = fields.get("num_jacobi_iterations", 3)
    if not isinstance(r, int) or r < 0:
        problems.append(f"num_jacobi_iterations={r!r} (only R >= 0)")
    refuse(problems, "this PonderLM-2 release config")
    passes = tuple(n + 1 for n in RANDOM_JACOBI) if fields.get("random_jacobi_iterations") else (r + 1,)
    return {
        "thoughts": (k,),
        "embed_scale": bool(fields.get("scale_embeds")),
        "init": "growing",
        "passes": passes,
        "pass_probs": tuple(1 / len(passes) for _ in passes),
        "eval_passes": r + 1,
    }


def scripts_settings(thoughts: int) -> dict:
    """The `ponderlm2` section of the release's training scripts (scripts/train_ponderlm2_*.sh) at K."""
    return ponderlm2_settings({**SCRIPTS, MARK: thoughts})


def release_fields(settings: dict) -> dict:
    """The release's config.json fields of our `ponderlm2` section; one error for what it cannot hold."""
    passes = tuple(settings["passes"])
    problems = []
    if len(settings["thoughts"]) != 1:
        problems.append(f"thoughts={tuple(settings['thoughts'])} (the release trains one K)")
    if settings.get("init") != "growing":
        problems.append(f"init={settings.get('init')!r} (the release initialises by growing passes)")
    random = passes == tuple(n + 1 for n in RANDOM_JACOBI) and len(set(settings["pass_probs"])) == 1
    if not random and len(passes) != 1:
        problems.append(f"passes={passes} (the release trains at one R + 1, or at (3, 4) evenly)")
    if settings.get("eval_passes", 0) < 1:
        problems.append("eval_passes=0 (the release evaluates by its parallel forward: eval_passes >= 1)")
    refuse(problems, "a PonderLM-2 release export")
    return {
        "recurrent_model": True,
        MARK: settings["thoughts"][0],
        "scale_embeds": bool(settings["embed_scale"]),
        "interpolation": False,
        "interpolation_use_topk": False,
        "num_jacobi_iterations": settings["eval_passes"] - 1,
        "random_jacobi_iterations": random,
    }


def looped_settings(fields: dict) -> dict:
    """Our `looped` section of the release's loop baseline (--patch_method loop, modeling_llama_loop.py):
    the whole stack run K + 1 times on embeddings x sqrt(2.5 H), whatever scale_embeds says."""
    k = fields.get(MARK, 0)
    problems = [] if fields.get("recurrent_model") else ["recurrent_model=false (a plain Llama)"]
    if not isinstance(k, int) or k < 0:
        problems.append(f"num_latent_thoughts={k!r} (only K >= 0 extra passes)")
    refuse(problems, "this loop baseline config")
    return {"start": 0, "end": -1, "repeats": k + 1, "embed_scale": True}


def loop_fields(settings: dict) -> dict:
    """The loop baseline's config.json fields of our `looped` section (its scripts' flags besides K)."""
    problems = (
        [] if settings["embed_scale"] else ["embed_scale=False (the loop baseline scales its embeddings)"]
    )
    if (settings["start"], settings["end"]) != (0, -1):
        problems.append(f"loop range [{settings['start']}, {settings['end']}] (it loops the whole stack)")
    refuse(problems, "a loop baseline export")
    return {**SCRIPTS, "interpolation_use_topk": False, MARK: settings["repeats"] - 1}


PAUSE_ID = 50288  # the pause baseline's token id unless its config.json sets pause_token_id


def pause_settings(fields: dict) -> dict:
    """Our `pause` section of the release's pause baseline (--patch_method pause, modeling_llama_pause.py):
    K pause slots after each token, each the embedding row `pause_token_id`, at the token's position id,
    every slot's embedding x sqrt(H) (whatever scale_embeds says), logits read at the last pause."""
    k = fields.get(MARK, 0)
    problems = [] if isinstance(k, int) and k >= 1 else [f"num_latent_thoughts={k!r} (only K >= 1 pauses)"]
    if not 0 <= fields.get("pause_token_id", PAUSE_ID) < fields["vocab_size"]:
        problems.append(f"pause_token_id {fields.get('pause_token_id', PAUSE_ID)} outside the vocabulary")
    refuse(problems, "this pause baseline config")
    return {"tokens": k, "embed_scale": True}


def pause_fields(settings: dict) -> dict:
    """The pause baseline's config.json fields of our `pause` section (its scripts' flags besides K)."""
    refuse(
        [] if settings["embed_scale"] else ["embed_scale=False (it scales its embeddings)"], "a pause export"
    )
    return {**SCRIPTS, "interpolation_use_topk": False, MARK: settings["tokens"]}


# What each --patch_method's model is here: (its section's settings of config.json, config.json's fields
# of its section). The folder does not record the method (its config.json is the same): name it.
METHODS = {
    "ponderlm2": (ponderlm2_settings, release_fields),
    "loop": (looped_settings, loop_fields),
    "pause": (pause_settings, pause_fields),
}


def ponderlm2_model_config(fields: dict, *, param_dtype: str = "float32") -> ModelConfig:
    """The backbone's ModelConfig of the release's config.json, its pondering fields checked too."""
    ponderlm2_settings(fields)
    return model_config_from_hf(fields, param_dtype=param_dtype)


def load_ponderlm2_release(
    path: Path | str, *, method: str = "ponderlm2", param_dtype: str = "float32", progress: bool = False
) -> tuple[ModelConfig, dict, dict]:
    """(our Llama backbone's ModelConfig, params, the section of its arch) of a folder the release saved
    with --patch_method `method`: PonderLM-2 (arch ponderlm2) or the loop baseline (arch looped)."""
    config = read_json(Path(path) / "config.json")
    settings = METHODS[method][0](config)
    cfg, params = load_hf(path, param_dtype=param_dtype, progress=progress)
    if method == "pause":  # its pause slots embed the row pause_token_id: our pause embedding
        from t2mlr_jax.architectures.baselines import PAUSE_PARAM  # (architectures import this module)

        params = {**params, PAUSE_PARAM: params["embed_tokens"][config.get("pause_token_id", PAUSE_ID)]}
    return cfg, params, settings


def load_ponderlm2_backbone(path: Path | str, **kwargs) -> tuple[ModelConfig, dict]:
    """The release folder as (its Llama backbone, params); its settings: load_ponderlm2_release."""
    cfg, params, _ = load_ponderlm2_release(path, **kwargs)
    return cfg, params


def save_ponderlm2_release(
    cfg: ModelConfig,
    params: dict,
    settings: dict,
    path: Path | str,
    *,
    method: str = "ponderlm2",
    pause_token_id: int = PAUSE_ID,
    tokenizer=None,
    progress: bool = False,
    overwrite: bool = False,
) -> None:
    """The folder the release's save_pretrained writes (its from_pretrained loads it): our HF export (with
    `tokenizer` as save_hf's) plus the pondering fields of `settings` (the `ponderlm2` section, or the
    `looped` one of the loop baseline, the `pause` one of the pause baseline, its pause embedding written
    to row `pause_token_id`: `method`) in config.json. Checked before writing."""
    fields = METHODS[method][1](settings)
    if method == "pause":  # our pause embedding is its row pause_token_id (the release ties the two)
        from t2mlr_jax.architectures.baselines import PAUSE_PARAM

        fields["pause_token_id"] = pause_token_id
        embedding = np.array(params["embed_tokens"])
        embedding[pause_token_id] = np.asarray(params[PAUSE_PARAM])
        params = {**{k: v for k, v in params.items() if k != PAUSE_PARAM}, "embed_tokens": embedding}
    save_hf(cfg, params, path, tokenizer=tokenizer, progress=progress, overwrite=overwrite)
    config = Path(path) / "config.json"
    write_json(config, {**read_json(config), **fields})


def check_release_start(config: Experiment, path: str) -> None:
    """A ponderlm2 run started from PonderLM-2's release folder (config.init_from) keeps its embedding
    scale: its weights compute something else without it (the rest of its recipe may change)."""
    if config.arch != "ponderlm2" or not is_ponderlm2_release(path):
        return
    release = ponderlm2_settings(read_json(Path(path) / "config.json"))
    if release["embed_scale"] != config.ponderlm2.embed_scale:
        raise ValueError(
            f"init_from {path} is PonderLM-2's release model with scale_embeds={release['embed_scale']}: set "
            f"ponderlm2.embed_scale={release['embed_scale']} (its whole recipe: ponderlm2={release})"
        )


def _settings_of(path: Path) -> dict:
    return ponderlm2_settings(read_json(Path(path) / "config.json"))


def _export(cfg: ModelConfig, params: dict, path: Path | str, *, thoughts: int = 1, **kwargs) -> None:
    save_ponderlm2_release(cfg, params, scripts_settings(thoughts), path, **kwargs)


def _reference(path: Path):
    from t2mlr_jax.architectures.ponderlm2.torch_reference import PonderLM2Reference

    return PonderLM2Reference.from_pretrained(path)


def _evaluation(path: Path):
    """Our side of --verify: arch ponderlm2's evaluation with the settings the folder records."""
    from t2mlr_jax.architectures.ponderlm2.evaluation import evaluation_logits

    settings = _settings_of(path)
    return lambda cfg, params, tokens: evaluation_logits(cfg, params, settings, tokens)


register_format(
    CheckpointFormat(
        "ponderlm2",
        recognises=is_ponderlm2_release,
        read_config=partial(folder_config, ponderlm2_model_config),
        load=load_ponderlm2_backbone,
        save=_export,
        options=("thoughts",),
        refuses_model=lambda cfg: (
            None if cfg.recurrence is None else "a T²MLR model: a PonderLM-2 release model has no recurrence"
        ),
        torch_model=_reference,
        evaluation=_evaluation,
        import_note=lambda path: (
            "the release's model is arch=ponderlm2 with the section "
            f"ponderlm2={json.dumps(_settings_of(path))}"
        ),
    )
)
