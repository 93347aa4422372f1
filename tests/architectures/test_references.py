"""Every architecture against an independent reference (tests/reference.py: a naive float64 loop over
slots that shares no code with the model): its exact and its training (parallel) forward give the
reference's logits to fp32 round-off. Each reference fails on a deliberate mistake, so that an error shared
by our parallel and exact paths (which share one block function) cannot pass.

Bounds (tests/tolerance.py): the exact forward (or the only one: transformer, looped, pause) against the
float64 logits by the depth rule, the depth its longest path (layers x loop repeats, x tokens through a
recurrence); one fp32 path against float64 is held to the rule's bound for two fp32 paths (measured: at
most 0.84 of it, the pause model under SSE4.2). Every other path (parallel, cached decoding) by the float64
rule, measured against the exact forward's own error on this CPU. The deliberate mistakes move the logits
by > 1e-3 of the largest, far above both bounds (< 1e-5 of it).

Backbones: the Llama-style tiny_config (weighted norms, RoPE, GQA, SwiGLU, tied head) and test_lrt's
nanochat-style NANO (weightless norms, embedding norm, QK-norm after RoPE, a sliding window, logit softcap,
dropless MoE with routing biases, resid / x0 scalars, value embeddings, untied head)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.baselines import looped, pause
from t2mlr_jax.architectures.lrt import forward as lrt_forward
from t2mlr_jax.architectures.recirculation import forward as recirculation
from t2mlr_jax.architectures.recirculation.mix import Recirculation
from t2mlr_jax.architectures.t2mlr import RecurrenceConfig, T2MLRDecoder, recurrence, recurrent
from t2mlr_jax.model import backbone
from t2mlr_jax.model import generate as generation
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.spec import init_from_specs
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.studies.parity import recurrence_layers
from tests import reference
from tests.architectures.test_lrt import NANO, STATE
from tests.tiny import rel_err, tiny_config
from tests.tolerance import assert_fp32_close, assert_near_f64

pytestmark = pytest.mark.numerics
WRONG = 1e-3  # a deliberate mistake moves the logits by more than this (relative to the largest)
B, T = 2, 6
LLAMA = tiny_config(recurrence=None)
TOKS = jax.random.randint(jax.random.PRNGKey(3), (B, T), 1, 48)
# Row 1 holds two documents (every recurrence resets at the second one's start) and a prompt span
# (control flow 1: T²MLR fuses nothing there).
LAYOUT = make_layout(
    TOKS,
    positions=jnp.asarray([list(range(T)), [0, 1, 2, 0, 1, 2]]),
    segment_ids=jnp.asarray([[1] * T, [1, 1, 1, 2, 2, 2]]),
    control_flow=jnp.asarray([[2] * T, [1, 2, 2, 1, 2, 2]]),
)


def draw(specs, seed=0):
    """Random weights over a parameter table: N(0, 0.2) matrices (no zero-initialised path), norm scales,
    gammas and resid / x0 scalars in [0.5, 1.5]."""
    rng = np.random.default_rng(seed)

    def leaf(path, x):
        name = jax.tree_util.keystr(path)
        scalar = any(s in name for s in ("norm", "gamma", "lambdas"))
        value = rng.uniform(0.5, 1.5, x.shape) if scalar else rng.normal(0.0, 0.2, x.shape)
        return jnp.asarray(value, x.dtype)

    return jax.tree_util.tree_map_with_path(
        leaf, jax.eval_shape(lambda: init_from_specs(specs, jax.random.key(0), "float32"))
    )


def check(ours, reference_logits, depth, what="exact"):
    """The exact (or only) fp32 forward against the float64 reference: the depth rule."""
    assert_fp32_close(ours, reference_logits, depth, what)


def differs(ours, reference_logits):
    err = rel_err(ours, reference_logits)
    assert err > WRONG, f"the deliberately wrong reference still matches ours ({err:.2e})"


# --- transformer -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [LLAMA, NANO], ids=["llama", "nanochat"])
def test_transformer(cfg):
    params = draw(param_specs(cfg))
    state = STATE if cfg.mlp == "moe" else None
    ours = jax.jit(backbone.forward, static_argnums=0)(
        cfg, params, TOKS, positions=LAYOUT.positions, segment_ids=LAYOUT.segment_ids, mlp_state=state
    )
    check(ours, reference.transformer(cfg, params, TOKS, LAYOUT, mlp_state=state), cfg.num_layers)
    differs(
        ours, reference.transformer(cfg, params, TOKS, LAYOUT, mlp_state=state, bugs={"rope_interleaved"})
    )


# --- T²MLR (gated mixer over a window of layers) -----------------------------------------------------

T2MLR = [
    tiny_config(RecurrenceConfig(l_start=1, l_end=2)),
    recurrent(NANO, l_start=1, l_end=1),  # a one-block window; routing biases zero (no state)
]


@pytest.mark.slow
@pytest.mark.parametrize("cfg", T2MLR, ids=["llama", "nanochat"])
def test_t2mlr_exact_and_jacobi(cfg):
    params = draw(param_specs(cfg))
    want, depth = (
        reference.t2mlr(cfg, params, TOKS, LAYOUT),
        recurrence_layers(cfg, T),
    )  # R through the T tokens
    exact = jax.jit(recurrence.exact_forward, static_argnums=0)(cfg, params, TOKS, layout=LAYOUT).logits
    check(exact, want, depth)
    jacobi = jax.jit(recurrence.jacobi_forward, static_argnums=0, static_argnames=("d_forward", "d_backward"))
    ours = jacobi(cfg, params, TOKS, layout=LAYOUT, d_forward=T, d_backward=1).logits  # D >= T: exact
    assert_near_f64(ours, exact, want, depth, "jacobi")
    differs(ours, reference.t2mlr(cfg, params, TOKS, LAYOUT, bugs={"no_temporal_residual"}))


# --- looped, pause ------------------------------------------------------------------------------------


def test_looped():
    params = draw(param_specs(LLAMA))
    loop = dict(start=1, end=2, repeats=3)
    ours = jax.jit(looped.looped_forward, static_argnums=0, static_argnames=tuple(loop))(
        LLAMA, params, TOKS, LAYOUT, **loop
    ).logits
    depth = LLAMA.num_layers + (loop["end"] - loop["start"] + 1) * (loop["repeats"] - 1)  # blocks executed
    check(ours, reference.looped(LLAMA, params, TOKS, LAYOUT, **loop), depth)
    differs(ours, reference.looped(LLAMA, params, TOKS, LAYOUT, **loop, bugs={"looped_shared_keys"}))


def test_pause():
    params = draw(pause.pause_specs(LLAMA))
    ours = jax.jit(pause.pause_forward, static_argnums=0, static_argnames="num_pause")(
        LLAMA, params, TOKS, LAYOUT, num_pause=2
    )
    check(ours, reference.pause(LLAMA, params, TOKS, LAYOUT, num_pause=2), LLAMA.num_layers)  # no chain
    differs(ours, reference.pause(LLAMA, params, TOKS, LAYOUT, num_pause=2, bugs={"pause_next_position"}))


# --- the LRT family -----------------------------------------------------------------------------------

LRT = lrt_forward.LRTConfig(NANO)
TT1 = lrt_forward.LRTConfig(NANO, thought_slots=True)
SHARED_KV = lrt_forward.LRTConfig(NANO, feedback="kv", shared_projections=True)
PONDER = lrt_forward.LRTConfig(NANO, feedback="none", thought_slots=True, cross_token=False, embed_scale=2.0)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _lrt_exact(cfg, params, tokens, layout, thoughts):
    return lrt_forward.exact_forward(cfg, params, tokens, layout, mlp_state=STATE, thoughts=thoughts).logits


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _lrt_parallel(cfg, params, tokens, layout, passes, thoughts):
    return lrt_forward.refine(cfg, params, tokens, layout, passes, STATE, thoughts).logits[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg,thoughts,bug",
    [
        (LRT, 0, "feedback_after_rope"),
        (SHARED_KV, 0, "feedback_after_rope"),
        (TT1, 1, "thought_vocabulary_gates"),
        (PONDER, 1, "thought_input_unnormed"),
    ],
    ids=["lrt", "lrt_kv_shared", "lrt_tt1", "ponderlm2"],
)
def test_lrt_family(cfg, thoughts, bug):
    """Exact and parallel; thought models on the first 4 tokens (the second document still starts there):
    N(K + 1) refinement passes make the parallel forward the recurrence."""
    n = 4 if thoughts else T
    tokens, layout = TOKS[:, :n], jax.tree.map(lambda a: a[:, :n], LAYOUT)
    params = draw(lrt_forward.lrt_specs(cfg))
    run = lambda bugs=(): reference.lrt(
        cfg, params, tokens, layout, thoughts=thoughts, mlp_state=STATE, bugs=bugs
    )
    want, depth = run(), n * (thoughts + 1) * NANO.num_layers  # the memory through the n(K + 1) slots
    exact = _lrt_exact(cfg, params, tokens, layout, thoughts)
    check(exact, want, depth)
    ours = _lrt_parallel(cfg, params, tokens, layout, n * (thoughts + 1), thoughts)
    assert_near_f64(ours, exact, want, depth, "parallel")
    differs(ours, run({bug}))


# --- recirculation's decoders -------------------------------------------------------------------------

RC = Recirculation(source=2, destination=0, alpha=0.3)
RC1 = Recirculation(source=2, destination=1, alpha=0.3)


@pytest.mark.slow
def test_recirculation_two_stack():
    params = draw(param_specs(LLAMA))
    want = reference.two_stack(LLAMA, params, TOKS, LAYOUT, source=2, destination=0, alpha=0.3)
    # the first pass through blocks d+1..s reads the earlier tokens' second-pass keys: s - d blocks per
    # token (per Jacobi pass: T + 1 of them), then the token's own first pass and second pass
    depth = (T + 1) * (RC.source - RC.destination) + LLAMA.num_layers + RC.source - RC.destination
    serial = jax.jit(recirculation.two_stack_serial, static_argnums=(0, 2))
    exact = serial(LLAMA, params, RC, TOKS, layout=LAYOUT)[0]
    check(exact, want, depth, "serial")
    parallel = jax.jit(
        recirculation.two_stack_parallel, static_argnums=(0, 2), static_argnames=("tol", "max_passes")
    )
    ours = parallel(LLAMA, params, RC, TOKS, layout=LAYOUT, tol=0.0, max_passes=T + 1).logits
    assert_near_f64(ours, exact, want, depth, "parallel")
    wrong = reference.two_stack(
        LLAMA, params, TOKS, LAYOUT, source=2, destination=0, alpha=0.3, bugs={"first_pass_keys"}
    )
    differs(ours, wrong)
    # Its decoder: a 2-token prompt, then a cached step per token (one document per row, as generation).
    decoded = generation.teacher_forced(recirculation.TwoStackDecoder(LLAMA, RC), params, TOKS, 2)
    one_document = make_layout(TOKS)
    assert_near_f64(
        decoded,
        serial(LLAMA, params, RC, TOKS, layout=one_document)[0],
        reference.two_stack(LLAMA, params, TOKS, one_document, source=2, destination=0, alpha=0.3),
        depth,
        "decoded",
    )


@pytest.mark.slow
def test_recirculation_single_stack():
    params = draw(param_specs(LLAMA))
    cfg = recirculation.single_stack_model(LLAMA, RC1)
    layout = recirculation.single_stack_layout(LAYOUT)
    exact = jax.jit(recurrence.exact_forward, static_argnums=0)
    ours = exact(cfg, {**params, "mixer": {}}, TOKS, layout=layout).logits
    depth = recurrence_layers(cfg, T)  # block s's output into the next token's block d + 1
    want = reference.single_stack(LLAMA, params, TOKS, LAYOUT, source=2, destination=1, alpha=0.3)
    check(ours, want, depth)
    wrong = reference.single_stack(
        LLAMA, params, TOKS, LAYOUT, source=2, destination=1, alpha=0.3, bugs={"mix_one_block_early"}
    )
    differs(ours, wrong)
    decoded = generation.teacher_forced(T2MLRDecoder(cfg), {**params, "mixer": {}}, TOKS, 2)
    one_document = recirculation.single_stack_layout(make_layout(TOKS))
    assert_near_f64(
        decoded,
        exact(cfg, {**params, "mixer": {}}, TOKS, layout=one_document).logits,
        reference.single_stack(LLAMA, params, TOKS, make_layout(TOKS), source=2, destination=1, alpha=0.3),
        depth,
        "decoded",
    )
