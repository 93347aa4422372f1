"""A small PyTorch reference of T²MLR's exact recurrence, built on transformers' Llama (no JAX).

It loads the authors' checkpoint layout (or ours exported to it) and runs token by token with R
carried: token t fuses R_{t-1} into the stream entering block l_start (Phi, any mixer of the
release's gate zoo) and R_t is read after block l_end, with the temporal residual and the clamped
stop-gradient RMS rescale at recurrent positions (shared/spec/t2mlr.md). Each step re-runs the
prefix with the already known caches instead of keeping a KV cache: O(T^2), but it needs nothing
from transformers beyond a plain forward and two hooks, so it is hard to get wrong. It assumes one
document per row and no padding; rows are independent.

    model = T2MLRReference.from_pretrained("ckpt/")          # a t2mlr-torch folder
    logits = model(input_ids)                               # [B, T, V], every token recurrent
"""

from __future__ import annotations

from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import nn

from t2mlr_jax.interop.configs import model_config_from_release
from t2mlr_jax.interop.files import numpy_to_torch, read_json, read_state_dict
from t2mlr_jax.model.config import PROJECTED_MIXERS, RecurrenceConfig

RECURRENT = 2  # control flow: 0 pad, 1 prompt, 2 recurrent


def clamped_rescale(y: torch.Tensor, clamp: float, eps: float) -> torch.Tensor:
    """y * stop_gradient(clip(1/rms(y), 1/c, c)), the scale computed in fp32."""
    y32 = y.detach().float()
    c = max(clamp, 1.0)
    scale = torch.rsqrt(y32.pow(2).mean(-1, keepdim=True) + eps).clamp(1.0 / c, c)
    return y * scale.to(y.dtype)


class Mixer(nn.Module):
    """Phi(x, R) for every mixer of the release's gate zoo: the formulas of t2mlr_jax.model.fusion, written
    again in torch. Attribute names are the release's state-dict names, so its checkpoints load as they are.
    """

    FP32 = ("rezero_gamma_recurrent_gate", "rezero_gamma_input_gate", "rezero_gamma", "erg_lambda_param")

    def __init__(self, hidden: int, rec: RecurrenceConfig):
        super().__init__()
        d, name = hidden, rec.mixer
        self.name = name
        self.post_norm_clamp = rec.post_norm_clamp if rec.post_norm else None
        gamma = lambda: nn.Parameter(torch.zeros((d,) if rec.gamma_per_channel else (1,)))
        self.recurrent_projection = (
            nn.Linear(d, d, bias=False) if rec.recurrent_projection and name in PROJECTED_MIXERS else None
        )
        self.norm_x = nn.RMSNorm(d) if rec.pre_norm else None
        self.norm_r = nn.RMSNorm(d) if rec.pre_norm else None
        if name == "gated":
            self.rezero_gamma_recurrent_gate, self.rezero_gamma_input_gate = gamma(), gamma()
            self.recurrent_gate_proj, self.input_gate_proj = nn.Linear(2 * d, d), nn.Linear(2 * d, d)
        elif name in ("var_norm_gated", "alpha_coupled"):
            self.rezero_gamma, self.alpha_gate_proj = gamma(), nn.Linear(2 * d, d)
        elif name == "constant_weight":
            self.recurrent_alpha = nn.Parameter(torch.full((1,), rec.constant_alpha))
        elif name == "concat":
            self.concat_projection = nn.Linear(2 * d, d, bias=False)
        elif name == "exponential_rotational_gated":
            self.erg_r_proj, self.erg_i_proj = nn.Linear(d, d), nn.Linear(d, d)
            self.erg_lambda_param = nn.Parameter(torch.zeros(d))
        elif name == "codi":  # the release's nn.Sequential, hence the keys recurrent_projection.{0,2,3}
            self.recurrent_projection = nn.Sequential(
                nn.Linear(d, d), nn.GELU(), nn.Linear(d, d), nn.LayerNorm(d)
            )

    def keep_fp32(self) -> Mixer:
        """The release keeps the gammas (and the ERG decay rates) in fp32 whatever the model dtype."""
        for name, param in self.named_parameters():
            if name in self.FP32:
                param.data = param.data.float()
        return self

    def _post(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.post_norm_clamp is None else clamped_rescale(y, self.post_norm_clamp, 1e-6)

    def forward(
        self, x: Float[torch.Tensor, "B T D"], big_r: Float[torch.Tensor, "B T D"]
    ) -> Float[torch.Tensor, "B T D"]:
        name, dtype = self.name, x.dtype
        r = (
            self.recurrent_projection(big_r)
            if name in PROJECTED_MIXERS and self.recurrent_projection
            else big_r
        )
        xn, rn = (x, r) if self.norm_x is None else (self.norm_x(x), self.norm_r(r))
        if name == "none":
            return x
        if name == "constant_weight":
            alpha = self.recurrent_alpha.clamp(0.0, 1.0).to(dtype)
            return (1 - alpha) * xn + alpha * rn
        if name == "concat":
            return self.concat_projection(torch.cat([xn, rn], dim=-1))
        if name == "coconut":
            return self._post(rn)
        if name == "codi":
            return self._post(self.recurrent_projection(rn))
        if name == "exponential_rotational_gated":
            gate_r, gate_i = torch.sigmoid(self.erg_r_proj(xn)), torch.sigmoid(self.erg_i_proj(xn))
            a = torch.exp(-8.0 * nn.functional.softplus(self.erg_lambda_param.float()) * gate_r.float())
            coeff = torch.sqrt(1.0 - a * a + 1e-8)
            return self._post(a.to(dtype) * xn + coeff.to(dtype) * gate_i * rn)
        both = torch.cat([xn, rn], dim=-1)  # [x ; r], x first (release order)
        if name == "gated":
            gamma_rec = torch.tanh(self.rezero_gamma_recurrent_gate.float()).to(dtype)
            gamma_in = torch.tanh(self.rezero_gamma_input_gate.float()).to(dtype)
            y = (
                gamma_rec * torch.sigmoid(self.recurrent_gate_proj(both)) * rn
                + gamma_in * torch.sigmoid(self.input_gate_proj(both)) * xn
            )
            return x + self._post(y)
        alpha = torch.sigmoid(self.alpha_gate_proj(both).float()).clamp(1e-4, 1 - 1e-4)
        g_rec, g_in = (alpha.sqrt(), (1 - alpha).sqrt()) if name == "var_norm_gated" else (alpha, 1 - alpha)
        y = self._post(g_rec.to(dtype) * rn + g_in.to(dtype) * xn)
        return x + torch.tanh(self.rezero_gamma.float()).to(dtype) * y


def _load_exact(
    module: nn.Module, state: dict[str, torch.Tensor], optional: tuple[str, ...] = ()
) -> list[str]:
    """Copy `state` into `module`; return every missing / unexpected / mis-shaped key instead of raising."""
    own = module.state_dict()
    problems = [f"missing key {k}" for k in own if k not in state and k not in optional]
    problems += [f"unexpected key {k}" for k in state if k not in own]
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
        mixer = Mixer(cfg.hidden_size, cfg.recurrence).to(dtype)
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
        problems += [f"mixer: {p}" for p in _load_exact(mixer, mixer_state)]
        if problems:
            raise ValueError(
                f"{path}: checkpoint does not match its config ({len(problems)} problems):\n  - "
                + "\n  - ".join(problems)
            )
        return cls(llama, cfg.recurrence, mixer.keep_fp32())

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
