"""The jitted programs of one architecture on one mesh, built one way for the trainer and for compiling
ahead of time (tools/aot_compile.py): the train step (state donated, state and batch sharded by the one
logical-axis rule table), the eval forward, and, for an architecture that decodes with a KV cache, its
cached decode step and prefill.

Each `*_program` returns (the jitted function, the abstract arguments it is compiled from): shapes,
dtypes and shardings, so `fn.trace(*args).lower().compile()` builds the program without any array.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t2mlr_jax.architectures import Architecture
from t2mlr_jax.architectures.contract import CachedGenerate
from t2mlr_jax.architectures.t2mlr import T2MLRDecoder
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.data.batch import BATCH_DTYPES, OPTIONAL_DTYPES
from t2mlr_jax.model import layer_layout
from t2mlr_jax.model.backbone import KVCache, unstack_layers
from t2mlr_jax.model.spec import spec_axes
from t2mlr_jax.model.token_layout import Layout
from t2mlr_jax.parallel.placement import (
    batch_sharding,
    param_shardings,
    train_state_shardings,
    update_shardings,
)
from t2mlr_jax.parallel.rules import named_sharding
from t2mlr_jax.train.eval import make_eval_step
from t2mlr_jax.train.optimizer import make_optimizer, make_schedule
from t2mlr_jax.train.train_step import MODEL_INPUTS, TrainState, compile_step, init_state

# The logical axes of a KV cache's leaves (KVCache: k, v [L, B, S, K, E]; segment_ids, tokens [B, S]).
CACHE_AXES = KVCache(
    ("layers", "batch", "length", "kv_heads", "head_dim"),
    ("layers", "batch", "length", "kv_heads", "head_dim"),
    ("batch", "length"),
    (),
    ("batch", "length"),
)


def _with_sharding(shapes, shardings):
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


class Programs:
    """One architecture's programs on one mesh, for `config` (its optimizer, schedule, seed)."""

    def __init__(self, config: Experiment, arch: Architecture, mesh: Mesh):
        self.config, self.arch, self.mesh = config, arch, mesh
        self.schedule = make_schedule(config.optimizer, config.train.steps)
        self.optimizer = make_optimizer(config.optimizer, arch.specs, config.train.steps)
        self.state_shapes = jax.eval_shape(self.init_state)

    @functools.cached_property
    def state_shardings(self) -> TrainState:
        """Built when first asked for: optax's tree_map_params runs a tiny computation, which must not come
        before the trainer's checks of a resumed run. Weights and optimizer state are split as the ZeRO
        stage `mesh.zero` says (t2mlr_jax.parallel.rules.ZERO_STAGES)."""
        params = param_shardings(
            spec_axes(self.arch.specs), self.state_shapes.params, self.mesh, self.config.mesh.zero
        )
        return train_state_shardings(
            self.state_shapes, self.optimizer, params, self.update_shardings, self.mesh
        )

    @functools.cached_property
    def update_shardings(self):
        """Where each parameter's optimizer state lives and its update is computed (`update_shardings`)."""
        return update_shardings(
            spec_axes(self.arch.specs), self.state_shapes.params, self.mesh, self.config.mesh.zero
        )

    def init_state(self, loaded: dict | None = None) -> TrainState:
        """The state at step 0 from config.seed; `loaded`: config.init_from's weights."""
        return init_state(self.arch, self.optimizer, self.config.seed, loaded)

    def abstract_state(self) -> TrainState:
        """The state's shapes with this mesh's shardings (restoring onto them reshards a checkpoint saved
        on any other mesh)."""
        return _with_sharding(self.state_shapes, self.state_shardings)

    def abstract_batch(self, batch_size: int, seq_len: int, target_bytes: bool = False) -> dict:
        """A global batch's shapes and sharding (rows over the data-parallel axes)."""
        keys = MODEL_INPUTS + (("target_bytes",) if target_bytes else ())
        dtypes, sharding = {**BATCH_DTYPES, **OPTIONAL_DTYPES}, batch_sharding(self.mesh)
        return {k: jax.ShapeDtypeStruct((batch_size, seq_len), dtypes[k], sharding=sharding) for k in keys}

    def train_step(self, sample: Hashable | None = None):
        """The jitted train step for the architecture's per-step `sample`, state donated."""
        t = self.config.train
        return compile_step(
            self.arch,
            self.optimizer,
            self.schedule,
            t.grad_accum,
            mesh=self.mesh,
            state_sharding=self.state_shardings,
            batch_sharding=batch_sharding(self.mesh),
            update_sharding=self.update_shardings,
            sample=sample,
        )

    def train_program(self, batch_size: int, seq_len: int, sample: Hashable | None = None):
        return self.train_step(sample), (self.abstract_state(), self.abstract_batch(batch_size, seq_len))

    def eval_program(self, batch_size: int, seq_len: int):
        """The eval forward (`make_eval_step`) on the state's params and model state."""
        state = self.abstract_state()
        args = (state.params, state.model_state, self.abstract_batch(batch_size, seq_len))
        return make_eval_step(self.arch), args

    def decoder(self, jacobi_prefill: bool = False):
        """(the architecture's cached decoder, what it reads as `generate` hands it over: the abstract
        state's params, or params and model state, with their layers unstacked once); with
        `jacobi_prefill`, T²MLR's decoder prefilling by its Jacobi passes. None if it decodes by
        re-running its whole forward (no cache), or for a Jacobi prefill outside T²MLR."""
        if not isinstance(self.arch.generate, CachedGenerate):
            return None
        state = self.abstract_state()
        decoder, inputs = self.arch.generate.decoding(state.params, state.model_state)
        if jacobi_prefill:
            decoder = decoder.jacobi_prefill() if isinstance(decoder, T2MLRDecoder) else None
            if decoder is None:
                return None
        unstacked = jax.eval_shape(lambda tree: unstack_layers(decoder.model, tree), inputs)
        shardings = _unstacked_shardings(jax.tree.map(lambda x: x.sharding, inputs), decoder.model.num_layers)
        return decoder, _with_sharding(unstacked, shardings)

    def decode_program(self, batch_size: int, cache_len: int):
        """One cached decode step (a token per row) against a cache of `cache_len` slots; None without a
        cache."""
        found = self.decoder()
        if found is None:
            return None
        decoder, inputs = found
        tokens = self._rows(batch_size, 1)

        def step(inputs, tokens, recurrent_state, cache, layout):
            return decoder.step(inputs, tokens, recurrent_state, cache, layout)

        args = (
            inputs,
            tokens,
            self._recurrent_state(decoder, inputs, batch_size),
            self._cache(decoder, batch_size, cache_len),
            Layout(tokens, tokens, tokens),
        )
        return jax.jit(step, donate_argnums=3), args

    def jacobi_prefill_program(self, batch_size: int, seq_len: int):
        """T²MLR's prefill by Jacobi passes (t2mlr.prefill_passes) of a `seq_len` prompt, filling the cache;
        None for another architecture."""
        found = self.decoder(jacobi_prefill=True)
        if found is None:
            return None
        decoder, inputs = found
        tokens = self._rows(batch_size, seq_len)

        def prefill(inputs, tokens, cache, layout):
            return decoder.prefill(inputs, tokens, layout, cache)

        args = (inputs, tokens, self._cache(decoder, batch_size, seq_len), Layout(tokens, tokens, tokens))
        return jax.jit(prefill, donate_argnums=2), args

    def _rows(self, batch_size: int, length: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((batch_size, length), jnp.int32, sharding=batch_sharding(self.mesh))

    def _cache(self, decoder, batch_size: int, length: int) -> KVCache:
        shapes = jax.eval_shape(lambda: decoder.init_cache(batch_size, length))
        shardings = jax.tree.map(
            lambda axes, s: named_sharding(axes, s.shape, self.mesh),
            CACHE_AXES,
            shapes,
            is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(a, str) for a in x),
        )
        return _with_sharding(shapes, shardings)

    def _recurrent_state(self, decoder, inputs, batch_size: int) -> jax.ShapeDtypeStruct:
        """The one vector per row a decoder carries between tokens (T²MLR's R, the LRT's memory m), shaped
        as its prefill leaves it."""
        tokens = jax.ShapeDtypeStruct((batch_size, 1), jnp.int32)
        out = jax.eval_shape(
            lambda inputs, tokens: decoder.prefill(
                inputs, tokens, Layout(tokens, tokens, tokens), decoder.init_cache(batch_size, 1)
            ),
            inputs,
            tokens,
        )
        state = out.recurrent_state
        sharding = NamedSharding(self.mesh, PartitionSpec(batch_sharding(self.mesh).spec[0], None))
        return jax.ShapeDtypeStruct(state.shape, state.dtype, sharding=sharding)


def _unstacked_shardings(shardings, num_layers: int):
    """Shardings of `unstack_layers`' output: each layer takes its stacked parameter's spec without the
    leading layer axis (never sharded); everything outside `layers`, and layers held apart already
    (model.scan_layers=False), keeps its own."""
    drop_layer_axis = lambda sh: NamedSharding(sh.mesh, PartitionSpec(*sh.spec[1:]))

    def per_layer(layers):
        if isinstance(layers, tuple | list):
            return tuple(layers)
        return (jax.tree.map(drop_layer_axis, layers),) * num_layers

    return layer_layout.map_layers(shardings, per_layer)
