"""A small PyTorch reference of T²MLR's exact recurrence, built on transformers' Llama (no JAX).

It loads the authors' checkpoint layout (or ours exported to it) and runs token by token with R
carried: token t fuses R_{t-1} into the stream entering block l_start (Phi, any mixer of the
release's gate zoo) and R_t is read after block l_end, with the temporal residual and the clamped
stop-gradient RMS rescale at recurrent positions. Each step re-runs the prefix with the already known
caches instead of keeping a KV cache: O(T^2), but it needs nothing from transformers beyond a plain
forward and two hooks, so it is hard to get wrong. It assumes one document per row and no padding;
rows are independent. Of this package it reads only pure-Python metadata (configs, the mixer
registry's key names), so it runs without JAX installed.

    model = T2MLRReference.from_pretrained("ckpt/")          # a t2mlr-torch folder
    logits = model(input_ids)                               # [B, T, V], every token recurrent
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import nn
from torch.nn import functional as F

from t2mlr_jax.architectures.t2mlr import MIXERS, SHARED_KEYS, RecurrenceConfig
from t2mlr_jax.architectures.t2mlr.release_configs import model_config_from_release
from t2mlr_jax.formats.files import numpy_to_torch, read_json, read_state_dict
from t2mlr_jax.model.control_flow import RECURRENT

W_REC, NORM_X, NORM_R = (SHARED_KEYS[(name,)] for name in ("recurrent_projection", "norm_x", "norm_r"))


def clamped_rescale(y: torch.Tensor, clamp: float, eps: float) -> torch.Tensor:
    """y * stop_gradient(clip(1/rms(y), 1/c, c)), the scale computed in fp32."""
    y32 = y.detach().float()
    c = max(clamp, 1.0)
    scale = torch.rsqrt(y32.pow(2).mean(-1, keepdim=True) + eps).clamp(1.0 / c, c)
    return y * scale.to(y.dtype)


# ---------------------------------------------------------------------------------------------
# The release's mixing modules, one formula each: (weights by release key, x, pre-normed x and r, P) -> Phi.
# Weights keep the checkpoint's dtype and are cast where used: to the stream's dtype, the gammas and the
# ERG decay rates to fp32 (the release keeps those in fp32 whatever the model dtype).

Weights = Mapping[str, torch.Tensor]
Post = Callable[[torch.Tensor], torch.Tensor]


def _linear(w: Weights, name: str, x: torch.Tensor) -> torch.Tensor:
    bias = w.get(f"{name}.bias")
    return F.linear(x, w[f"{name}.weight"].to(x.dtype), None if bias is None else bias.to(x.dtype))


def _tanh_gamma(w: Weights, name: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.tanh(w[name].float()).to(dtype)


def _gated(w: Weights, x, xn, rn, post: Post) -> torch.Tensor:
    both = torch.cat([xn, rn], dim=-1)  # [x ; r], x first (release order)
    g_rec = torch.sigmoid(_linear(w, "recurrent_gate_proj", both))
    g_in = torch.sigmoid(_linear(w, "input_gate_proj", both))
    gamma_rec = _tanh_gamma(w, "rezero_gamma_recurrent_gate", x.dtype)
    gamma_in = _tanh_gamma(w, "rezero_gamma_input_gate", x.dtype)
    return x + post(gamma_rec * g_rec * rn + gamma_in * g_in * xn)


def _gated_fixed(w: Weights, x, xn, rn, post: Post) -> torch.Tensor:
    """The release's gated module without gate projections: its forward's default gates, 1 and 0."""
    gamma_rec = _tanh_gamma(w, "rezero_gamma_recurrent_gate", x.dtype)
    gamma_in = _tanh_gamma(w, "rezero_gamma_input_gate", x.dtype)
    return x + post(gamma_rec * 1.0 * rn + gamma_in * 0.0 * xn)


def _alpha_gated(gates: Callable) -> Callable:
    def formula(w: Weights, x, xn, rn, post: Post) -> torch.Tensor:
        both = torch.cat([xn, rn], dim=-1)
        alpha = torch.sigmoid(_linear(w, "alpha_gate_proj", both).float()).clamp(1e-4, 1 - 1e-4)
        g_rec, g_in = gates(alpha)
        y = post(g_rec.to(x.dtype) * rn + g_in.to(x.dtype) * xn)
        return x + _tanh_gamma(w, "rezero_gamma", x.dtype) * y

    return formula


def _constant_weight(w: Weights, x, xn, rn, post: Post) -> torch.Tensor:
    alpha = w["recurrent_alpha"].clamp(0.0, 1.0).to(x.dtype)
    return (1 - alpha) * xn + alpha * rn


def _concat(w: Weights, x, xn, rn, post: Post) -> torch.Tensor:
    return _linear(w, "concat_projection", torch.cat([xn, rn], dim=-1))


def _exponential_rotational_gated(w: Weights, x, xn, rn, post: Post) -> torch.Tensor:
    gate_r, gate_i = torch.sigmoid(_linear(w, "erg_r_proj", xn)), torch.sigmoid(_linear(w, "erg_i_proj", xn))
    a = torch.exp(-8.0 * F.softplus(w["erg_lambda_param"].float()) * gate_r.float())
    coeff = torch.sqrt(1.0 - a * a + 1e-8)
    return post(a.to(x.dtype) * xn + coeff.to(x.dtype) * gate_i * rn)


def _codi(w: Weights, x, xn, rn, post: Post) -> torch.Tensor:
    """The release's nn.Sequential(Linear, GELU, Linear, LayerNorm) under recurrent_projection.{0,2,3}."""
    z = _linear(w, "recurrent_projection.2", F.gelu(_linear(w, "recurrent_projection.0", rn)))
    scale, shift = (w[f"recurrent_projection.3.{k}"].to(x.dtype) for k in ("weight", "bias"))
    return post(F.layer_norm(z, z.shape[-1:], scale, shift))


FORMULAS: dict[str, Callable] = {
    "gated": _gated,
    "gated_fixed": _gated_fixed,
    "var_norm_gated": _alpha_gated(lambda alpha: (alpha.sqrt(), (1 - alpha).sqrt())),
    "alpha_coupled": _alpha_gated(lambda alpha: (alpha, 1 - alpha)),
    "constant_weight": _constant_weight,
    "concat": _concat,
    "exponential_rotational_gated": _exponential_rotational_gated,
    "coconut": lambda w, x, xn, rn, post: post(rn),
    "codi": _codi,
    "none": lambda w, x, xn, rn, post: x,
}


def mixer_keys(rec: RecurrenceConfig) -> set[str]:
    """The release's state-dict keys of the mixer `rec` configures (under `...t2mlr_mixing_module.`)."""
    mixer = MIXERS.get(rec.mixer)
    keys = set(mixer.keys.values())
    if rec.recurrent_projection and mixer.recurrent_projection:
        keys.add(W_REC)
    if rec.pre_norm:
        keys |= {NORM_X, NORM_R}
    return keys


def _key_problems(expected: Iterable[str], state: Mapping, optional: tuple[str, ...] = ()) -> list[str]:
    expected = dict.fromkeys(expected)  # ordered, for the messages
    problems = [f"missing key {k}" for k in expected if k not in state and k not in optional]
    return problems + [f"unexpected key {k}" for k in state if k not in expected]


class Mixer(nn.Module):
    """Phi(x, R) of the release's gate zoo, its formula written again in torch (`FORMULAS`). Its parameters
    are the mixer's entries of a release state dict, nested by their dotted keys, so `state_dict()` gives
    the release's keys back."""

    def __init__(self, rec: RecurrenceConfig, weights: Mapping[str, torch.Tensor]):
        super().__init__()
        problems = _key_problems(sorted(mixer_keys(rec)), weights)
        if rec.mixer not in FORMULAS:
            problems.append(f"the torch reference has no formula for mixer {rec.mixer!r}")
        if problems:
            raise ValueError("mixer weights do not match the config:\n  - " + "\n  - ".join(problems))
        self.rec = rec
        for key, value in weights.items():
            *parents, leaf = key.split(".")
            module = self
            for name in parents:
                if name not in module._modules:
                    module.add_module(name, nn.Module())
                module = module._modules[name]
            module.register_parameter(leaf, nn.Parameter(value))

    def _post(self, y: torch.Tensor) -> torch.Tensor:
        rec = self.rec
        return clamped_rescale(y, rec.post_norm_clamp, 1e-6) if rec.post_norm else y

    def forward(
        self, x: Float[torch.Tensor, "B T D"], big_r: Float[torch.Tensor, "B T D"]
    ) -> Float[torch.Tensor, "B T D"]:
        w = dict(self.named_parameters())
        r = _linear(w, "recurrent_projection", big_r) if W_REC in w else big_r
        if NORM_X in w:  # torch.nn.RMSNorm(eps=None): the dtype's epsilon
            xn = F.rms_norm(x, x.shape[-1:], w[NORM_X].to(x.dtype))
            rn = F.rms_norm(r, r.shape[-1:], w[NORM_R].to(r.dtype))
        else:
            xn, rn = x, r
        return FORMULAS[self.rec.mixer](w, x, xn, rn, self._post)


def _load_exact(
    module: nn.Module, state: dict[str, torch.Tensor], optional: tuple[str, ...] = ()
) -> list[str]:
    """Copy `state` into `module`; return every missing / unexpected / mis-shaped key instead of raising."""
    own = module.state_dict()
    problems = _key_problems(own, state, optional)
    problems += [
        f"{k}: shape {tuple(v.shape)}, expected {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and v.shape != own[k].shape
    ]
    if not problems:
        module.load_state_dict(state, strict=False)
    return problems


class T2MLRReference(nn.Module):
    def __init__(self, llama: nn.Module, rec: RecurrenceConfig, mixer: Mixer):
        super().__init__()
        if rec.cache_norm == "rmsnorm":
            raise ValueError(
                "the torch reference implements the release's cache (cache_norm rescale or none), "
                "not the paper's learnable RMSNorm (cache_norm='rmsnorm')"
            )
        self.llama, self.rec, self.mixer = llama, rec, mixer
        self.l_start, self.l_end = rec.layer_range(llama.config.num_hidden_layers)

    @classmethod
    def from_pretrained(cls, path: Path | str, dtype: torch.dtype = torch.float32) -> T2MLRReference:
        """Load a t2mlr-torch folder strictly: one ValueError lists every key problem."""
        from transformers import LlamaConfig, LlamaForCausalLM

        config = read_json(Path(path) / "config.json")
        cfg = model_config_from_release(config)
        llama = LlamaForCausalLM(LlamaConfig.from_dict(config["base_config"])).to(dtype).eval()
        l_start = cfg.layer_range[0]
        wrapped, fused = f"model.layers.{l_start}.model.", f"model.layers.{l_start}.t2mlr_mixing_module."
        backbone, mixer_state, problems = {}, {}, []
        for key, value in read_state_dict(path).items():
            if not key.startswith("t2mlr_model."):
                problems.append(f"unexpected key {key}")
                continue
            key, tensor = key[len("t2mlr_model.") :], numpy_to_torch(value)
            if key.startswith(fused):
                mixer_state[key[len(fused) :]] = tensor
            else:
                backbone[key.replace(wrapped, f"model.layers.{l_start}.", 1)] = tensor
        tied = ("lm_head.weight",) if cfg.tie_embeddings else ()
        problems += _load_exact(llama, backbone, optional=tied)
        problems += [f"mixer: {p}" for p in _key_problems(sorted(mixer_keys(cfg.recurrence)), mixer_state)]
        if problems:
            raise ValueError(
                f"{path}: checkpoint does not match its config ({len(problems)} problems):\n  - "
                + "\n  - ".join(problems)
            )
        return cls(llama, cfg.recurrence, Mixer(cfg.recurrence, mixer_state))

    def _next_cache(self, h_end: torch.Tensor, prev: torch.Tensor, recurrent: torch.Tensor) -> torch.Tensor:
        """R_t: raw h^(l_end), or N(h^(l_end) + w R_{t-1}) in fp32 at recurrent positions."""
        rec = self.rec
        if not rec.temporal_residual:
            return h_end
        y = h_end.float() + rec.temporal_residual_weight * prev.float()
        if rec.cache_norm == "rescale":
            y = clamped_rescale(y, rec.cache_norm_clamp, rec.cache_norm_eps)
        return torch.where(recurrent[:, None], y.to(h_end.dtype), h_end)

    def _run_prefix(self, input_ids, big_r, recurrent):
        """Run the prefix with Phi(x, R) at block l_start; the last token's h^(l_end) and logits."""
        captured = {}

        def fuse(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            mixed = torch.where(recurrent[..., None], self.mixer(x, big_r.to(x.dtype)), x)
            return ((mixed, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": mixed})

        def capture(module, args, output):
            captured["h"] = output[0] if isinstance(output, tuple) else output

        layers = self.llama.model.layers
        hooks = [
            layers[self.l_end].register_forward_hook(capture),
            layers[self.l_start].register_forward_pre_hook(fuse, with_kwargs=True),
        ]
        try:
            out = self.llama(input_ids=input_ids, use_cache=False)
        finally:
            for hook in hooks:
                hook.remove()
        return captured["h"][:, -1], out.logits[:, -1].float()

    @torch.no_grad()
    def forward(
        self, input_ids: Int[torch.Tensor, "B T"], control_flows: Int[torch.Tensor, "B T"] | None = None
    ) -> Float[torch.Tensor, "B T V"]:
        """Exact-recurrence logits; control flow 2 (default everywhere) marks recurrent positions."""
        b, t = input_ids.shape
        recurrent = (
            torch.full_like(input_ids, RECURRENT) if control_flows is None else control_flows
        ) >= RECURRENT
        dtype = self.llama.model.embed_tokens.weight.dtype
        big_r = torch.zeros(
            b, t, self.llama.config.hidden_size, dtype=dtype
        )  # big_r[:, s]: the cache token s sees
        logits = []
        for step in range(t):
            h_end, step_logits = self._run_prefix(
                input_ids[:, : step + 1], big_r[:, : step + 1], recurrent[:, : step + 1]
            )
            logits.append(step_logits)
            if step + 1 < t:
                big_r[:, step + 1] = self._next_cache(h_end, big_r[:, step], recurrent[:, step])
        return torch.stack(logits, dim=1)
