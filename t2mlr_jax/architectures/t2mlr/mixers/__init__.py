"""The gate zoo: every mixer Phi(x, R) by name (release names; `gated` is the default).

Each built-in mixer's JAX code is one module here (its parameter specs and `mix`); its registration below
is pure Python (release key names and flags), so reading the registry needs no JAX. Adding a mixer is one
module with `specs` and `mix` plus one `MIXERS.register(name, Mixer(...))`.

  gated                          x + P(tanh(γ_rec) g_rec ⊙ r + tanh(γ_in) g_in ⊙ x)
  gated_fixed                    x + P(tanh(γ_rec) r): gated with the release's fixed gates (g_rec 1, g_in 0)
  var_norm_gated, alpha_coupled  x + tanh(γ) P(g_rec r + g_in x), one gate α for both streams
  constant_weight                (1 - α) x + α r
  concat                         W_c [x ; r]
  exponential_rotational_gated   P(a x + sqrt(1 - a² + 1e-8) i ⊙ r)
  coconut                        P(r)
  codi                           P(LayerNorm(Linear(GELU(Linear(r))))), hidden width bottleneck_size
  none                           x
where r is W_rec R (when used), both streams are optionally RMS-normalised first (pre_norm) and P is the
optional clamped RMS rescale (post_norm). A system may register its own mixer from its package
(recirculation's parameter-free mix: t2mlr_jax.architectures.recirculation.mixer).
"""

from t2mlr_jax.architectures.t2mlr.mixers.registry import MIXERS, SHARED_KEYS, Mixer, deferred, linear_keys

__all__ = ["MIXERS", "SHARED_KEYS", "Mixer", "linear_keys"]


def _builtin(module: str, mix: str = "mix", specs: str = "specs", **metadata) -> Mixer:
    path = f"{__name__}.{module}"
    return Mixer(specs=deferred(path, specs), mix=deferred(path, mix), **metadata)


_ALPHA_GATED = dict(
    keys={("rezero_gamma",): "rezero_gamma", **linear_keys("alpha_gate_proj")},
    recurrent_projection=True,
    rezero=True,
)

_GAMMA_KEYS = {
    ("rezero_gamma_recurrent_gate",): "rezero_gamma_recurrent_gate",
    ("rezero_gamma_input_gate",): "rezero_gamma_input_gate",
}
MIXERS.register(
    "gated",
    _builtin(
        "gated",
        keys={**_GAMMA_KEYS, **linear_keys("recurrent_gate_proj"), **linear_keys("input_gate_proj")},
        recurrent_projection=True,
        rezero=True,
    ),
)
# The release's `gated` with use_learnable_gate=False: no gate projections (mixers/gated.py).
MIXERS.register(
    "gated_fixed",
    _builtin("gated", "mix_fixed", "specs_fixed", keys=_GAMMA_KEYS, recurrent_projection=True, rezero=True),
)
MIXERS.register(
    "var_norm_gated",
    _builtin("alpha_gated", "mix_var_norm_gated", "specs_var_norm_gated", **_ALPHA_GATED),
)
MIXERS.register("alpha_coupled", _builtin("alpha_gated", "mix_alpha_coupled", **_ALPHA_GATED))
MIXERS.register(
    "constant_weight", _builtin("constant_weight", keys={("recurrent_alpha",): "recurrent_alpha"})
)
MIXERS.register(
    "concat",
    _builtin("concat", keys={("concat_projection",): "concat_projection.weight"}, recurrent_projection=True),
)
MIXERS.register(
    "exponential_rotational_gated",
    _builtin(
        "exponential_rotational_gated",
        keys={
            **linear_keys("erg_r_proj"),
            **linear_keys("erg_i_proj"),
            ("erg_lambda_param",): "erg_lambda_param",
        },
    ),
)
MIXERS.register("coconut", _builtin("coconut", keys={}))
# The release's nn.Sequential(Linear, GELU, Linear, LayerNorm) is stored as recurrent_projection.{0,2,3}.
MIXERS.register(
    "codi",
    _builtin(
        "codi",
        keys={
            ("codi_projection", "fc1", "kernel"): "recurrent_projection.0.weight",
            ("codi_projection", "fc1", "bias"): "recurrent_projection.0.bias",
            ("codi_projection", "fc2", "kernel"): "recurrent_projection.2.weight",
            ("codi_projection", "fc2", "bias"): "recurrent_projection.2.bias",
            ("codi_projection", "norm", "scale"): "recurrent_projection.3.weight",
            ("codi_projection", "norm", "bias"): "recurrent_projection.3.bias",
        },
    ),
)
MIXERS.register("none", _builtin("none", keys={}))
