"""PonderLM-2's evaluation forward in PyTorch, written from its description (release.py, architecture.py),
not from the release's code: the other side of
`tools/convert_checkpoint.py --verify` for the release's folders, on transformers' own Llama blocks.

With K thoughts, R = num_jacobi_iterations and E the token embeddings (x sqrt(2.5 H) with scale_embeds),
a pass over stages (s_0 = E, s_1, ..., s_n) runs the Llama stack on them interleaved token by token
(N(n + 1) slots, each slot at its token's position id, causal over slots), its output at slot j of each
token being h_j. Growing: stages (E), then for i = 0..K-1 a pass whose h_0..h_i become s_1..s_{i+1}; then
R passes whose h_0..h_{K-1} become s_1..s_K; logits = lm_head(h_K) of a final pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from t2mlr_jax.architectures.ponderlm2.release import ponderlm2_settings
from t2mlr_jax.formats.files import read_json


class PonderLM2Reference(torch.nn.Module):
    def __init__(self, llama, fields: dict):
        super().__init__()
        settings = ponderlm2_settings(fields)  # refuses what this forward does not compute
        self.llama, self.thoughts = llama, settings["thoughts"][0]
        self.refinements = settings["eval_passes"] - 1
        self.scale = math.sqrt(2.5 * llama.config.hidden_size) if settings["embed_scale"] else 1.0

    @classmethod
    def from_pretrained(cls, path: Path | str) -> PonderLM2Reference:
        from transformers import LlamaForCausalLM

        llama = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        return cls(llama.eval(), read_json(Path(path) / "config.json"))

    def _pass(self, stages: list[torch.Tensor]) -> list[torch.Tensor]:
        """h_0..h_n of one pass over the interleaved stages."""
        b, t, d = stages[0].shape
        n = len(stages)
        embeds = torch.stack(stages, dim=2).reshape(b, t * n, d)
        positions = torch.arange(t).repeat_interleave(n)[None].expand(b, -1)
        h = self.llama.model(inputs_embeds=embeds, position_ids=positions).last_hidden_state
        return list(h.reshape(b, t, n, d).unbind(dim=2))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        stages = [self.llama.model.embed_tokens(tokens) * self.scale]
        for i in range(self.thoughts):
            stages = [stages[0], *self._pass(stages)[: i + 1]]
        for _ in range(self.refinements):
            stages = [stages[0], *self._pass(stages)[: self.thoughts]]
        return self.llama.lm_head(self._pass(stages)[self.thoughts])
