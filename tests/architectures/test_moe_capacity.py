"""The equivalences with MoE capacity on (model.moe_capacity_factor set) and tokens actually dropped.

Where both sides route the same tokens together, dropping is the same and so are the outputs: a re-run of
a training batch, per-layer weights against the stack (model.scan_layers), expert / data / tensor sharding
against one device, and cached decoding against the exact recurrence (each step routes the B tokens of
that step on both sides). Where they do not, outputs differ, as t2mlr_jax/model/moe.py's docstring says:
a parallel pass routes a call's B*T tokens together, the token-by-token paths (the exact recurrence,
decoding) B at a time, so capacity binds differently and the dropped counts differ; dropless, the same
pairs agree. Agreement is to the depth rule of tests/tolerance.py (passes x layers; tokens x layers through
the exact recurrence)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.lrt import forward as lrt_forward
from t2mlr_jax.model import backbone, layer_layout
from t2mlr_jax.model import generate as generation
from t2mlr_jax.model.spec import spec_axes
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.parallel.mesh import make_mesh
from t2mlr_jax.parallel.placement import batch_sharding
from t2mlr_jax.parallel.rules import tree_shardings
from tests.architectures.test_lrt import STATE
from tests.architectures.test_references import draw
from tests.tiny import NANO, rel_err
from tests.tolerance import assert_fp32_close

B, T = 4, 6
CAPPED = lrt_forward.LRTConfig(NANO.replace(moe_capacity_factor=1.0))  # C = ceil(N k / X) = N / 2 here
DROPLESS = lrt_forward.LRTConfig(NANO)
TOKS = jax.random.randint(jax.random.PRNGKey(7), (B, T), 1, NANO.vocab_size)
LAYOUT = make_layout(TOKS)
PARAMS = draw(lrt_forward.lrt_specs(CAPPED))
ROWS_DEPTH = 3 * NANO.num_layers  # _rows: pass 0 and 2 refinements


@jax.jit
def _rows(params, tokens):
    """Per-row logits of the LRT's training forward (pass 0 and 2 refinements), and its MoE stats."""
    out = lrt_forward.refine(CAPPED, params, tokens, make_layout(tokens), 2, STATE)
    return out.logits[-1], out.stats


def dropped(stats) -> float:
    return float(np.sum(stats["dropped"]))


def test_a_rerun_of_the_same_batch_drops_the_same_tokens():
    (logits, stats), (again, stats_again) = _rows(PARAMS, TOKS), _rows(PARAMS, TOKS)
    assert dropped(stats) > 0
    np.testing.assert_array_equal(logits, again)
    jax.tree.map(np.testing.assert_array_equal, stats, stats_again)
    # Capacity is counted over the whole call, earlier tokens first: another first row changes what the
    # last row keeps.
    other = _rows(PARAMS, TOKS.at[0].set(TOKS[0] % 7 + 1))[0]
    assert rel_err(other[-1], logits[-1]) > 1e-4


@pytest.mark.slow
@pytest.mark.numerics
def test_per_layer_weights_drop_as_the_stack():
    logits, stats = _rows(PARAMS, TOKS)
    apart = layer_layout.map_layers(PARAMS, layer_layout.split)  # model.scan_layers=False's form
    apart_logits, apart_stats = _rows(apart, TOKS)
    assert dropped(stats) > 0 and dropped(apart_stats) == dropped(stats)
    np.testing.assert_array_equal(apart_stats["load"], stats["load"])
    assert_fp32_close(apart_logits, logits, ROWS_DEPTH, "per layer")


@pytest.mark.slow
@pytest.mark.numerics
def test_sharded_drops_as_one_device():
    """Experts, batch and heads over a (data 2, expert 2, tensor 2) mesh: capacity counts the whole
    batch (the sharded program is the same function), so the same tokens drop."""
    logits, stats = _rows(PARAMS, TOKS)
    mesh = make_mesh(data=2, expert=2, tensor=2)
    with jax.set_mesh(mesh):
        params = jax.device_put(
            PARAMS, tree_shardings(spec_axes(lrt_forward.lrt_specs(CAPPED)), PARAMS, mesh)
        )
        sharded_logits, sharded_stats = _rows(params, jax.device_put(TOKS, batch_sharding(mesh)))
    assert dropped(stats) > 0 and dropped(sharded_stats) == dropped(stats)
    np.testing.assert_array_equal(sharded_stats["load"], stats["load"])
    assert_fp32_close(sharded_logits, logits, ROWS_DEPTH, "sharded")


_exact = jax.jit(
    lambda cfg, params, tokens: lrt_forward.exact_forward(
        cfg, params, tokens, make_layout(tokens), mlp_state=STATE
    ),
    static_argnums=0,
)


@pytest.mark.slow
@pytest.mark.numerics
def test_decoding_drops_as_the_exact_recurrence():
    """Both route the B tokens of one step together (a 2-token prompt, then a step per token), so they
    drop alike; that they drop at all shows in the dropless recurrence's other logits."""
    exact = _exact(CAPPED, PARAMS, TOKS).logits
    decoded = generation.teacher_forced(lrt_forward.LRTDecoder(CAPPED), (PARAMS, {"mlp": STATE}), TOKS, 2)
    assert_fp32_close(decoded, exact, T * NANO.num_layers, "decoded")  # the memory through T tokens
    assert rel_err(exact, _exact(DROPLESS, PARAMS, TOKS).logits) > 1e-3


def _plain(cfg, params, tokens):
    """The plain nanochat backbone's logits and dropped assignments in one parallel pass."""
    positions, segments = backbone.default_layout(tokens)
    kw = dict(positions=positions, segment_ids=segments, tokens=tokens, mlp_state=STATE)
    out = backbone.run_blocks(cfg, params, backbone.embed(cfg, params, tokens), 0, cfg.num_layers, **kw)
    return backbone.head(cfg, params, out.h), out.stats["dropped"].sum()


def _token_by_token(cfg, params, tokens):
    """The same, token by token through the KV cache (as the exact recurrences and decoding route)."""
    positions, segments = backbone.default_layout(tokens)
    cache = backbone.init_cache(cfg, *tokens.shape)

    def step(cache, t):
        one = lambda a: jax.lax.dynamic_slice_in_dim(a, t, 1, axis=1)
        out = backbone.run_blocks(
            cfg,
            params,
            backbone.embed(cfg, params, one(tokens)),
            0,
            cfg.num_layers,
            positions=one(positions),
            segment_ids=one(segments),
            cache=cache,
            tokens=one(tokens),
            mlp_state=STATE,
        )
        return backbone.advance(out.cache, 1), (
            backbone.head(cfg, params, out.h)[:, 0],
            out.stats["dropped"].sum(),
        )

    _, (logits, drops) = jax.lax.scan(step, cache, jnp.arange(tokens.shape[1]))
    return jnp.swapaxes(logits, 0, 1), drops.sum()


@pytest.mark.slow
@pytest.mark.numerics
def test_a_parallel_pass_and_token_by_token_routing_drop_differently():
    """Capacity per call: ceil(f N k / X) slots per expert for the N tokens routed together. A parallel
    pass (training) routes B*T tokens at once, the exact recurrence and decoding B per step: the dropped
    counts differ and so do the logits; one row token by token drops nothing. Dropless, the two agree."""
    plain, by_token = jax.jit(_plain, static_argnums=0), jax.jit(_token_by_token, static_argnums=0)
    counts, logits = {}, {}
    for name, cfg, tokens in (
        ("capped", CAPPED.model, TOKS),
        ("one row", CAPPED.model, TOKS[:1]),
        ("dropless", DROPLESS.model, TOKS),
    ):
        (parallel, parallel_drops), (serial, serial_drops) = (
            plain(cfg, PARAMS, tokens),
            by_token(cfg, PARAMS, tokens),
        )
        counts[name] = (float(parallel_drops), float(serial_drops), rel_err(serial, parallel))
        logits[name] = serial, parallel
    parallel_drops, serial_drops, gap = counts["capped"]
    assert parallel_drops > 0 and serial_drops > 0 and parallel_drops != serial_drops and gap > 1e-3
    assert counts["one row"][0] > 0 and counts["one row"][1] == 0.0
    assert counts["dropless"][:2] == (0.0, 0.0)
    assert_fp32_close(*logits["dropless"], NANO.num_layers, "dropless")  # the plain backbone: no chain
