"""Independent references: every architecture as a naive loop over slots, one token (or thought / pause
slot) at a time, in float64 numpy, written from the specs (shared/spec/*.md) and the architectures'
docstrings. It imports nothing of the model's code: its own embedding, RMSNorm, RoPE, attention over its
own per-block key / value lists, MLPs and MoE, and each architecture's recurrence on top of one naive
block. It reads only the config and the params pytree (stacked layers, the library's names).

`bugs` (a set of names) switches on deliberate mistakes, so that tests can show a reference that would
catch them: "rope_interleaved", "feedback_after_rope", "no_temporal_residual", "looped_shared_keys",
"pause_next_position", "thought_vocabulary_gates", "thought_input_unnormed", "first_pass_keys",
"mix_one_block_early".

Supported backbone options are the tiny configs' (tests/tiny.py, NANO's included); any other is refused
(`check_supported`), so a reference never silently ignores a feature.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

LATENT = -1  # a thought slot's token: no embedding, no value embedding


def check_supported(cfg) -> None:
    unsupported = {
        "sandwich_norms": cfg.sandwich_norms,
        "norm_offset": cfg.norm_offset,
        "rope_local_theta": cfg.rope_local_theta is not None,
        "rope_table_dtype": cfg.rope_table_dtype != "float32",
        "dtype": cfg.dtype != "float32",
        "moe token dropping": cfg.mlp == "moe" and cfg.moe_capacity_factor is not None,
    }
    bad = [name for name, on in unsupported.items() if on]
    if bad:
        raise NotImplementedError(f"the reference does not implement {bad}")


def f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rms(x, weight, eps):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def rope(x, position, theta, interleaved=False):
    """x [N, E] rotated by `position`: pairs (i, i + E/2) (HF's rotate-half), or (2i, 2i+1) as a bug."""
    if theta is None:
        return x
    half = x.shape[-1] // 2
    angle = position / theta ** (np.arange(half) / half)
    cos, sin = np.cos(angle), np.sin(angle)
    if interleaved:
        a, b = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2], out[:, 1::2] = a * cos - b * sin, b * cos + a * sin
        return out
    a, b = x[:, :half], x[:, half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def relu2(x, up, down):
    return np.square(np.maximum(x @ up, 0.0)) @ down


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def mlp(cfg, p, x, bias):
    """One token's MLP; `bias` is this layer's MoE routing bias."""
    if cfg.mlp == "swiglu":
        g = x @ p["gate_proj"]
        return (g * sigmoid(g) * (x @ p["up_proj"])) @ p["down_proj"]
    if cfg.mlp == "geglu":
        return (gelu_tanh(x @ p["gate_proj"]) * (x @ p["up_proj"])) @ p["down_proj"]
    if cfg.mlp == "relu2":
        return relu2(x, p["up_proj"], p["down_proj"])
    if cfg.mlp == "moe":  # dropless: top-k by score + bias, weights the picked scores normalised
        scores = sigmoid(x @ p["router"])
        picked = np.argsort(-(scores + bias))[: cfg.moe_top_k]
        weights = scores[picked] / scores[picked].sum()
        y = sum(w * relu2(x, p["up_proj"][e], p["down_proj"][e]) for e, w in zip(picked, weights))
        if "shared" in p:
            y = y + relu2(x, p["shared"]["up_proj"], p["shared"]["down_proj"])
        return y
    raise NotImplementedError(f"the reference has no MLP {cfg.mlp!r}")


@dataclasses.dataclass
class Slot:
    """What one slot brings to every block: its token (LATENT for a thought), position, document, index in
    the row's slot sequence, x0 (the resid / x0 scalars' stream) and the LRT memory (None: no feedback)."""

    token: int
    position: int
    segment: int
    index: int
    x0: np.ndarray
    memory: np.ndarray | None = None
    thought: bool = False


class Backbone:
    """The naive backbone of one row: `block` runs weight layer `layer` on one slot, attending over the
    key / value list `keys` (one list per executed block, owned by the caller)."""

    def __init__(self, cfg, params, *, mlp_state=None, lrt=None, bugs=frozenset()):
        check_supported(cfg)
        self.cfg, self.p, self.bugs = cfg, f64(params), set(bugs)
        self.lrt = lrt  # an LRTConfig: its feedback at every block
        self.bias = None if mlp_state is None else f64(mlp_state)["router_bias"]

    def layer(self, i):
        return jax.tree.map(lambda a: a[i], self.p["layers"])

    def embed(self, token):
        cfg = self.cfg
        h = self.p["embed_tokens"][token]
        if cfg.embed_scale:
            h = h * math.sqrt(cfg.hidden_size)
        return rms(h, self.p.get("embed_norm"), cfg.norm_eps) if cfg.embed_norm else h

    def final_norm(self, h):
        return rms(h, self.p.get("norm"), self.cfg.norm_eps)

    def unembed(self, x):
        cfg = self.cfg
        logits = x @ (self.p["embed_tokens"].T if cfg.tie_embeddings else self.p["lm_head"])
        cap = cfg.logit_softcap
        return logits if cap is None else cap * np.tanh(logits / cap)

    def head(self, h):
        return self.unembed(self.final_norm(h))

    def _own(self, slot) -> bool:
        """Whether this slot is an LRT thought slot with parameters of its own (PonderLM-2's share them)."""
        own = slot.thought and self.lrt is not None and self.lrt.thought_slots
        return bool(own) and "thought_vocabulary_gates" not in self.bugs

    def _feedback(self, name, slot):
        """This slot's LRT parameter `name` at every layer: the thought slots' own where they have one."""
        return self.p["lrt"][name + "_thought" if self._own(slot) else name]

    def _scalars(self, slot):
        """The resid / x0 scalars at every layer: an LRT thought slot's own where it has them."""
        names = ("resid_lambdas", "x0_lambdas")
        if self._own(slot) and self.lrt.feedback != "none":
            return [self.p["lrt"][name + "_thought"] for name in names]
        return [self.p[name] for name in names]

    def block(self, i, h, slot: Slot, keys: list, keep: bool = True):
        """Weight layer i on one slot; its key / value joins `keys` (kept for later slots when `keep`,
        else seen by this slot only)."""
        cfg, p, fb = self.cfg, self.layer(i), self.lrt
        a = p["self_attn"]
        if cfg.resid_scalars:
            alpha, beta = self._scalars(slot)
            h = alpha[i] * h + beta[i] * slot.x0
        memory = slot.memory if fb is not None and fb.feedback != "none" else None
        if memory is not None and fb.feedback in ("both", "residual"):
            h = h + self._feedback("gamma", slot)[i] * memory
        x = rms(h, p.get("input_layernorm"), cfg.norm_eps)
        q = np.einsum("d,dhe->he", x, a["q_proj"])
        k = np.einsum("d,dke->ke", x, a["k_proj"])
        v = np.einsum("d,dke->ke", x, a["v_proj"])
        c = cfg.gate_channels
        kv_feedback = memory is not None and fb.feedback in ("both", "kv")
        if kv_feedback:
            gates = 2 * sigmoid(x[:c] @ self._feedback("gate", slot)[i])
            g_loc, g_fb = np.split(gates[:, None], 2)
            lrt = self.p["lrt"]
            w_k, w_v = (lrt[n] if fb.shared_projections else lrt[n][i] for n in ("k_fb", "v_fb"))
            k_fb, v_fb = np.einsum("d,dke->ke", memory, w_k), np.einsum("d,dke->ke", memory, w_v)
            v = g_loc * v + g_fb * v_fb
            if "feedback_after_rope" not in self.bugs:
                k = g_loc * k + g_fb * k_fb
        if cfg.value_embeds and i in cfg.value_embed_layers and slot.token != LATENT:
            gate = 2 * sigmoid(x[:c] @ a["ve_gate"])
            v = v + gate[:, None] * self.p["value_embeds"][cfg.value_embed_layers.index(i)][slot.token]
        q, k = self._qk(q, a.get("q_norm"), slot), self._qk(k, a.get("k_norm"), slot)
        if kv_feedback and "feedback_after_rope" in self.bugs:
            k = g_loc * k + g_fb * k_fb
        entry = (k, v, slot.segment, slot.index)
        seen = keys + [entry]
        if keep:
            keys.append(entry)
        h = h + self._attend(i, q, seen, slot) @ a["o_proj"].reshape(-1, cfg.hidden_size)
        bias = 0.0 if self.bias is None else self.bias[i]
        return h + mlp(cfg, p["mlp"], rms(h, p.get("post_attention_layernorm"), cfg.norm_eps), bias)

    def _qk(self, x, weight, slot):
        cfg, eps = self.cfg, self.cfg.norm_eps
        if cfg.qk_norm == "before_rope":
            x = rms(x, weight, eps)
        x = rope(x, slot.position, cfg.rope_theta, "rope_interleaved" in self.bugs)
        return rms(x, weight, eps) if cfg.qk_norm == "after_rope" else x

    def _attend(self, i, q, seen, slot):
        """Softmax attention of one query slot over the keys of its document within the layer's window
        (counted in slots); returns the heads' outputs flattened [H * E]."""
        cfg = self.cfg
        window = cfg.layer_windows[i]
        visible = [
            (k, v)
            for k, v, segment, index in seen
            if segment == slot.segment and (window is None or slot.index - index <= window)
        ]
        keys, values = np.stack([k for k, _ in visible]), np.stack([v for _, v in visible])  # [S, K, E]
        group = cfg.num_heads // cfg.num_kv_heads
        scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        out = []
        for head in range(cfg.num_heads):
            logits = keys[:, head // group] @ q[head] * scale
            if cfg.attn_softcap is not None:
                logits = cfg.attn_softcap * np.tanh(logits / cfg.attn_softcap)
            weights = np.exp(logits - logits.max())
            out.append((weights / weights.sum()) @ values[:, head // group])
        return np.concatenate(out)


def rows(tokens, layout):
    """Each row's (tokens, positions, segments, control flow) as Python lists."""
    arrays = [np.asarray(a) for a in (tokens, layout.positions, layout.segment_ids, layout.control_flow)]
    return [[a[b].tolist() for a in arrays] for b in range(arrays[0].shape[0])]


def per_token(run_row, tokens, layout):
    """[B, T, V] logits of `run_row(tokens, positions, segments, control)` -> [T, V] over each row."""
    return np.stack([np.stack(list(run_row(*row))) for row in rows(tokens, layout)])


def _blocks(net, h, layers, slot, keys, keep=True):
    for i, key in layers:
        h = net.block(i, h, slot, keys.setdefault(key, []), keep)
    return h


def transformer(cfg, params, tokens, layout, *, mlp_state=None, bugs=()):
    """The plain transformer, one token at a time."""
    net = Backbone(cfg, params, mlp_state=mlp_state, bugs=bugs)
    every = [(i, i) for i in range(cfg.num_layers)]

    def run(tokens, positions, segments, control):
        keys = {}
        for t, (token, pos, seg) in enumerate(zip(tokens, positions, segments)):
            h = net.embed(token)
            yield net.head(_blocks(net, h, every, Slot(token, pos, seg, t, h), keys))

    return per_token(run, tokens, layout)


def gated_mix(p, x, r):
    """T²MLR's `gated` mixer (spec t2mlr.md): x + tanh(γ_rec) g_rec r + tanh(γ_in) g_in x, the gates
    sigmoid(Linear([x ; r]))."""
    both = np.concatenate([x, r])
    gate = lambda name: sigmoid(both @ p[name]["kernel"] + p[name]["bias"])
    return (
        x
        + np.tanh(p["rezero_gamma_recurrent_gate"]) * gate("recurrent_gate_proj") * r
        + np.tanh(p["rezero_gamma_input_gate"]) * gate("input_gate_proj") * x
    )


def t2mlr(cfg, params, tokens, layout, *, bugs=()):
    """T²MLR's exact recurrence (spec t2mlr.md, gated mixer): R_{t-1} (zeros at a document start) fused
    into the stream entering block l_start at recurrent positions (control flow 2), R_t read after block
    l_end, with the temporal residual's clamped rescale N(h + w R_{t-1}) at recurrent positions."""
    rec = cfg.recurrence
    if rec.mixer != "gated" or rec.pre_norm or rec.post_norm or rec.cache_norm not in ("rescale", "none"):
        raise NotImplementedError("the reference fuses with the plain gated mixer only")
    net = Backbone(cfg, params, bugs=bugs)
    l_start, l_end = rec.layer_range(cfg.num_layers)
    lower, middle, upper = (
        [(i, i) for i in range(a, b)]
        for a, b in ((0, l_start), (l_start, l_end + 1), (l_end + 1, cfg.num_layers))
    )
    mixer = net.p["mixer"]

    def run(tokens, positions, segments, control):
        keys, big_r = {}, np.zeros(cfg.hidden_size)
        for t, (token, pos, seg, flow) in enumerate(zip(tokens, positions, segments, control)):
            big_r = np.zeros(cfg.hidden_size) if pos == 0 else big_r
            h = net.embed(token)
            slot = Slot(token, pos, seg, t, h)
            x = _blocks(net, h, lower, slot, keys)
            recurrent = flow >= 2
            if recurrent:
                r = big_r @ mixer["recurrent_projection"] if "recurrent_projection" in mixer else big_r
                x = gated_mix(mixer, x, r)
            out = _blocks(net, x, middle, slot, keys)
            new_r = out
            if recurrent and rec.temporal_residual and "no_temporal_residual" not in bugs:
                y = out + rec.temporal_residual_weight * big_r
                if rec.cache_norm == "rescale":
                    c = max(rec.cache_norm_clamp, 1.0)
                    y = y * np.clip(1 / np.sqrt(np.mean(y * y) + rec.cache_norm_eps), 1 / c, c)
                new_r = y
            big_r = new_r
            yield net.head(_blocks(net, out, upper, slot, keys))

    return per_token(run, tokens, layout)


def looped(cfg, params, tokens, layout, *, start, end, repeats, bugs=()):
    """Blocks [start, end] (inclusive, 0-based) run `repeats` times per token on shared weights; every
    executed block keeps its own keys (a repeat attends to the same repeat of earlier tokens)."""
    net = Backbone(cfg, params, bugs=bugs)
    order = [*range(start), *list(range(start, end + 1)) * repeats, *range(end + 1, cfg.num_layers)]
    shared = "looped_shared_keys" in bugs  # the bug: one key list per weight layer, not per executed block
    executed = [(i, i if shared else j) for j, i in enumerate(order)]

    def run(tokens, positions, segments, control):
        keys = {}
        for t, (token, pos, seg) in enumerate(zip(tokens, positions, segments)):
            h = net.embed(token)
            yield net.head(_blocks(net, h, executed, Slot(token, pos, seg, t, h), keys))

    return per_token(run, tokens, layout)


def pause(cfg, params, tokens, layout, *, num_pause, bugs=()):
    """After every token, `num_pause` slots fed the learned pause embedding at the token's position; the
    token's prediction is read at its last pause."""
    net = Backbone(cfg, params, bugs=bugs)
    every = [(i, i) for i in range(cfg.num_layers)]
    step = 1 if "pause_next_position" in bugs else 0

    def run(tokens, positions, segments, control):
        keys, index = {}, 0
        for token, pos, seg in zip(tokens, positions, segments):
            inputs = [net.embed(token)] + [net.p["pause_embedding"]] * num_pause
            for j, h in enumerate(inputs):
                slot = Slot(token if j == 0 else LATENT, pos + step * j, seg, index, h)
                h = _blocks(net, h, every, slot, keys)
                index += 1
            yield net.head(h)

    return per_token(run, tokens, layout)


def lrt(lrt_cfg, params, tokens, layout, *, thoughts=0, mlp_state=None, bugs=()):
    """The LRT family (spec lrt_thought_tokens.md): vocabulary slot h^(0) = F(E[x_t] * embed_scale,
    m = the previous interval's last final-normed state; zeros at a document start or without cross-token
    feedback), then thought slots h^(j) = F(h^(j-1), m = h^(j-1)); the last state predicts the next token.
    A slot's x0 is its input. feedback="none" with thought slots is PonderLM-2."""
    cfg = lrt_cfg.model
    net = Backbone(cfg, params, mlp_state=mlp_state, lrt=lrt_cfg, bugs=bugs)
    every = [(i, i) for i in range(cfg.num_layers)]
    unnormed = "thought_input_unnormed" in bugs

    def run(tokens, positions, segments, control):
        keys, index, memory = {}, 0, np.zeros(cfg.hidden_size)
        for token, pos, seg in zip(tokens, positions, segments):
            m = memory if pos != 0 and lrt_cfg.cross_token else np.zeros(cfg.hidden_size)
            h = net.embed(token) * lrt_cfg.embed_scale
            out = _blocks(net, h, every, Slot(token, pos, seg, index, h, m), keys)
            state = net.final_norm(out)
            for _ in range(thoughts):
                index += 1
                h = out if unnormed else state
                out = _blocks(net, h, every, Slot(LATENT, pos, seg, index, h, state, thought=True), keys)
                state = net.final_norm(out)
            index += 1
            memory = state
            yield net.unembed(state)

    return per_token(run, tokens, layout)


def ratio_mix(z_dest, z_src, alpha):
    """Recirculation's default mix (spec recirculation.md, Eq. 1-2): (1 - α) z_dest + α f(z_src), f(z_src)
    = z_src rescaled to |z_dest|."""
    return (1 - alpha) * z_dest + alpha * z_src * np.linalg.norm(z_dest) / np.linalg.norm(z_src)


def two_stack(cfg, params, tokens, layout, *, source, destination, alpha, bugs=()):
    """Recirculation's two-stack (the paper): token t's first pass through blocks 0..s, the output of s
    mixed into the output of d seeds its second pass through blocks d+1..L-1, which predicts. Later
    tokens keep the first pass's keys in blocks 0..d and the second pass's above; a first pass in blocks
    d+1..s sees its own key and the earlier tokens' second-pass keys."""
    net = Backbone(cfg, params, bugs=bugs)
    lower = [(i, i) for i in range(destination + 1)]
    recirculated = [(i, i) for i in range(destination + 1, source + 1)]
    first_keys = "first_pass_keys" in bugs  # the bug: the first pass's keys kept in a list of their own
    upper = [(i, i) for i in range(destination + 1, cfg.num_layers)]

    def run(tokens, positions, segments, control):
        keys = {}
        for t, (token, pos, seg) in enumerate(zip(tokens, positions, segments)):
            h = net.embed(token)
            slot = Slot(token, pos, seg, t, h)
            z_dest = _blocks(net, h, lower, slot, keys)
            first = [(i, ("first", i)) for i, _ in recirculated] if first_keys else recirculated
            z_src = _blocks(net, z_dest, first, slot, keys, keep=first_keys)
            yield net.head(_blocks(net, ratio_mix(z_dest, z_src, alpha), upper, slot, keys))

    return per_token(run, tokens, layout)


def single_stack(cfg, params, tokens, layout, *, source, destination, alpha, bugs=()):
    """Recirculation's single-stack: token t-1's output of block s mixed into token t's output of block d
    (nothing at a document's first token)."""
    net = Backbone(cfg, params, bugs=bugs)
    d = destination if "mix_one_block_early" not in bugs else destination - 1
    lower = [(i, i) for i in range(d + 1)]
    middle = [(i, i) for i in range(d + 1, source + 1)]
    upper = [(i, i) for i in range(source + 1, cfg.num_layers)]

    def run(tokens, positions, segments, control):
        keys, z_src = {}, None
        for t, (token, pos, seg) in enumerate(zip(tokens, positions, segments)):
            h = net.embed(token)
            slot = Slot(token, pos, seg, t, h)
            z_dest = _blocks(net, h, lower, slot, keys)
            if pos != 0:
                z_dest = ratio_mix(z_dest, z_src, alpha)
            z_src = _blocks(net, z_dest, middle, slot, keys)
            yield net.head(_blocks(net, z_src, upper, slot, keys))

    return per_token(run, tokens, layout)
