"""nanochat's GPT forward in PyTorch, written from its description (t2mlr_jax.interop.nanochat), not from
its code: the other side of `tools/convert_checkpoint.py --verify` for nanochat checkpoints, in nanochat's
own key names and conventions (its RoPE orientation, bfloat16 rotary tables, padded vocabulary tables).

Per block i, with every norm a weightless RMSNorm at torch's default eps:
  x <- λ_resid[i] x + λ_x0[i] x0                       (x0: the normed embedding)
  q, k, v = c_q, c_k, c_v of norm(x); v += 2 σ(ve_gate(norm(x)[:C])) VE_i[token] on value-embedding layers
  q, k <- norm(rotate(q)), norm(rotate(k)), rotate: (x1, x2) -> (x1 cos + x2 sin, x2 cos - x1 sin)
  x <- x + c_proj(attention), causal, within `window` keys back on "S" layers (the last layer is "L")
  x <- x + c_proj(relu(c_fc(norm(x)))²)
logits = 15 tanh(lm_head(norm(x))[:V] / 15).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from t2mlr_jax.interop.files import read_json, torch_state


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


class NanochatReference(torch.nn.Module):
    def __init__(self, gpt: dict, state: dict[str, torch.Tensor]):
        super().__init__()
        self.gpt = {"window_pattern": "L", **gpt}
        self.w = {key.removeprefix("_orig_mod."): value.float() for key, value in state.items()}

    @classmethod
    def from_checkpoint(cls, path: Path | str) -> NanochatReference:
        from t2mlr_jax.interop.nanochat import checkpoint_files

        model_file, meta = checkpoint_files(path)
        return cls(read_json(meta)["model_config"], torch_state(model_file))

    def windows(self) -> list[int]:
        """Keys back each layer sees: "L" the whole context, "S" half of it; the last layer is "L"."""
        g = self.gpt
        pattern, long = g["window_pattern"].upper(), g["sequence_len"]
        kinds = [pattern[i % len(pattern)] for i in range(g["n_layer"] - 1)] + ["L"]
        return [long if kind == "L" else long // 2 for kind in kinds]

    def rotation(self, length: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = 1.0 / (10_000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
        table = lambda t: t.bfloat16().float()[None, :, None, :]  # nanochat keeps them in bfloat16
        return table(angles.cos()), table(angles.sin())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        g, w = self.gpt, self.w
        b, t = tokens.shape
        heads, kv_heads, width = g["n_head"], g["n_kv_head"], g["n_embd"]
        e = width // heads
        cos, sin = self.rotation(t, e)
        gate_channels = g.get("ve_gate_channels", 32) or width
        x = x0 = _norm(w["transformer.wte.weight"][tokens])
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
                gate = 2 * torch.sigmoid(h[..., :gate_channels] @ w[p + "attn.ve_gate.weight"].T)
                v = v + gate[..., None] * w[f"value_embeds.{i}.weight"][tokens].view(b, t, kv_heads, e)

            def rotate(a):
                a1, a2 = a[..., : e // 2], a[..., e // 2 :]
                return torch.cat([a1 * cos + a2 * sin, a2 * cos - a1 * sin], dim=-1)

            q, k = _norm(rotate(q)), _norm(rotate(k))
            mask = (back >= 0) & (back <= window)
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=True
            )
            x = x + y.transpose(1, 2).reshape(b, t, width) @ w[p + "attn.c_proj.weight"].T
            hidden = F.relu(_norm(x) @ w[p + "mlp.c_fc.weight"].T).square()
            x = x + hidden @ w[p + "mlp.c_proj.weight"].T
        logits = (_norm(x) @ w["lm_head.weight"].T)[..., : g["vocab_size"]]
        return 15 * torch.tanh(logits / 15)
