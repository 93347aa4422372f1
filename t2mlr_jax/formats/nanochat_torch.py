"""nanochat's GPT forward in PyTorch, written from its description (t2mlr_jax.formats.nanochat), not from
its code: the other side of `tools/convert_checkpoint.py --verify` for nanochat checkpoints, in nanochat's
own key names and conventions (its RoPE orientation, bfloat16 rotary tables, padded vocabulary tables).

Per block i, with every norm a weightless RMSNorm at torch's default eps:
  x <- λ_resid[i] x + λ_x0[i] x0                       (x0: the normed embedding)
  q, k, v = c_q, c_k, c_v of norm(x); v += 2 σ(ve_gate(norm(x)[:C])) VE_i[token] on value-embedding layers
  q, k <- norm(rotate(q)), norm(rotate(k)), rotate: (x1, x2) -> (x1 cos + x2 sin, x2 cos - x1 sin)
  x <- x + c_proj(attention), causal, within `window` keys back on "S" layers (the last layer is "L")
  x <- x + c_proj(relu(c_fc(norm(x)))²)
logits = 15 tanh(lm_head(norm(x))[:V] / 15).
karpathy/nanochat's own GPT (92d63d4; its meta has none of the LRT fork's fields) differs: the normed
embedding is smeared, x_t += λ_smear σ(smear_gate x_t[:24]) x_(t-1) for t >= 1, before x0 is taken; the
value-embedding gate is 3 σ(ve_gate norm(x)[:12]); q and k are times 1.2 after their norm; the rotary
base is 100,000 with float32 tables; an "S" window is a quarter of the context rounded up to 128; and
λ_backout times the stream after block L // 2 is subtracted before the final norm.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from t2mlr_jax.formats.files import read_json, torch_state


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


class NanochatReference(torch.nn.Module):
    def __init__(self, gpt: dict, state: dict[str, torch.Tensor]):
        super().__init__()
        from t2mlr_jax.formats.nanochat import is_karpathy

        self.gpt = {"window_pattern": "L", **gpt}
        self.w = {key.removeprefix("_orig_mod."): value.float() for key, value in state.items()}
        self.karpathy = is_karpathy(gpt)

    @classmethod
    def from_checkpoint(cls, path: Path | str) -> NanochatReference:
        from t2mlr_jax.formats.nanochat import checkpoint_files

        model_file, meta = checkpoint_files(path)
        return cls(read_json(meta)["model_config"], torch_state(model_file))

    def windows(self) -> list[int]:
        """Keys back each layer sees: "L" the whole context, "S" half of it (karpathy's: a quarter rounded
        up to 128); the last layer is "L"."""
        g = self.gpt
        pattern, long = g["window_pattern"].upper(), g["sequence_len"]
        short = -(-long // 4 // 128) * 128 if self.karpathy else long // 2
        kinds = [pattern[i % len(pattern)] for i in range(g["n_layer"] - 1)] + ["L"]
        return [long if kind == "L" else short for kind in kinds]

    def rotation(self, length: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        base = 100_000 if self.karpathy else 10_000
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
        rounded = torch.float32 if self.karpathy else torch.bfloat16  # the LRT fork keeps them in bfloat16
        table = lambda t: t.to(rounded).float()[None, :, None, :]
        return table(angles.cos()), table(angles.sin())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        g, w = self.gpt, self.w
        b, t = tokens.shape
        heads, kv_heads, width = g["n_head"], g["n_kv_head"], g["n_embd"]
        e = width // heads
        cos, sin = self.rotation(t, e)
        gate_channels = 12 if self.karpathy else g.get("ve_gate_channels", 32) or width
        gate_scale, qk_scale = (3.0, 1.2) if self.karpathy else (2.0, 1.0)
        x = _norm(w["transformer.wte.weight"][tokens])
        if "smear_gate.weight" in w:
            gate = w["smear_lambda"] * torch.sigmoid(x[:, 1:, :24] @ w["smear_gate.weight"].T)
            x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
        x0, middle = x, None
        position = torch.arange(t)
        back = position[:, None] - position[None, :]
        for i, window in enumerate(self.windows()):
            p = f"transformer.h.{i}."
            if g.get("use_resid_lambdas", True):
                x = w["resid_lambdas"][i] * x
            if g.get("use_x0_residual", True):
                x = x + w["x0_lambdas"][i] * x0
            h = _norm(x)
            q = (h @ w[p + "attn.c_q.weight"].T).view(b, t, heads, e)
            k = (h @ w[p + "attn.c_k.weight"].T).view(b, t, kv_heads, e)
            v = (h @ w[p + "attn.c_v.weight"].T).view(b, t, kv_heads, e)
            if f"value_embeds.{i}.weight" in w:
                gate = gate_scale * torch.sigmoid(h[..., :gate_channels] @ w[p + "attn.ve_gate.weight"].T)
                v = v + gate[..., None] * w[f"value_embeds.{i}.weight"][tokens].view(b, t, kv_heads, e)

            def rotate(a):
                a1, a2 = a[..., : e // 2], a[..., e // 2 :]
                return torch.cat([a1 * cos + a2 * sin, a2 * cos - a1 * sin], dim=-1)

            q, k = _norm(rotate(q)) * qk_scale, _norm(rotate(k)) * qk_scale
            mask = (back >= 0) & (back <= window)
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=True
            )
            x = x + y.transpose(1, 2).reshape(b, t, width) @ w[p + "attn.c_proj.weight"].T
            hidden = F.relu(_norm(x) @ w[p + "mlp.c_fc.weight"].T).square()
            x = x + hidden @ w[p + "mlp.c_proj.weight"].T
            middle = x if i == g["n_layer"] // 2 else middle
        if "backout_lambda" in w:
            x = x - w["backout_lambda"] * middle
        logits = (_norm(x) @ w["lm_head.weight"].T)[..., : g["vocab_size"]]
        return 15 * torch.tanh(logits / 15)
