"""The PyTorch CPU baseline: a minimal GPT-2 equal to models.architectures.gpt.GPT, op for op.

Same parameters (copied from the glassgrad model, so both start from identical weights), same
layout (row vectors x @ W + b, W (in, out)), Pre-LN blocks, fused c_attn split into q/k/v,
`scaled_dot_product_attention(is_causal=True)`, tanh GELU, LayerNorm eps 1e-5, tied head, mean
cross-entropy, and torch.optim.AdamW with the same settings. Eager mode (no torch.compile), the
same float dtype and thread count as glassgrad. Imported only when torch is installed.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as TF


class TorchGPT(torch.nn.Module):
    """GPT-2 built from a glassgrad GPT's state_dict (HF names, (in, out) weights)."""

    def __init__(self, state: dict[str, np.ndarray], n_layer: int, n_head: int) -> None:
        super().__init__()
        self.n_layer = n_layer
        self.n_head = n_head
        # "transformer.h.0.ln_1.weight" is not a valid attribute name: keep a flat dict.
        self.p = torch.nn.ParameterDict(
            {
                name.replace(".", "__"): torch.nn.Parameter(torch.from_numpy(array.copy()))
                for name, array in state.items()
            }
        )

    def w(self, name: str) -> torch.Tensor:
        return self.p["transformer__" + name.replace(".", "__")]

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x @ self.w(name + ".weight") + self.w(name + ".bias")

    def _layer_norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        weight = self.w(name + ".weight")
        return TF.layer_norm(x, weight.shape, weight, self.w(name + ".bias"), 1e-5)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        caches: list[list[torch.Tensor]] | None = None,
        past: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, loss); with caches ([k, v] buffers per layer) idx holds new positions only."""
        B, T = idx.shape
        wte = self.w("wte.weight")
        C = wte.shape[1]
        H, D = self.n_head, C // self.n_head
        x = wte[idx] + self.w("wpe.weight")[past : past + T]
        for i in range(self.n_layer):
            h = self._layer_norm(x, f"h.{i}.ln_1")
            w, b = self.w(f"h.{i}.attn.c_attn.weight"), self.w(f"h.{i}.attn.c_attn.bias")
            q, k, v = (
                (h @ w[:, j * C : (j + 1) * C] + b[j * C : (j + 1) * C])
                .view(B, T, H, D)
                .transpose(1, 2)
                for j in range(3)
            )
            if caches is not None:
                k_buf, v_buf = caches[i]
                k_buf[:, :, past : past + T] = k
                v_buf[:, :, past : past + T] = v
                k, v = k_buf[:, :, : past + T], v_buf[:, :, : past + T]
            # torch's is_causal is top-left aligned; a one-token decode step may see every key.
            y = TF.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
            y = y.transpose(1, 2).reshape(B, T, C)
            x = x + self._linear(y, f"h.{i}.attn.c_proj")
            h = self._layer_norm(x, f"h.{i}.ln_2")
            h = TF.gelu(self._linear(h, f"h.{i}.mlp.c_fc"), approximate="tanh")
            x = x + self._linear(h, f"h.{i}.mlp.c_proj")
        if targets is None:
            x = x[:, -1:, :]
        logits = self._layer_norm(x, "ln_f") @ wte.T
        if targets is None:
            return logits, None
        return logits, TF.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def from_glassgrad(model) -> TorchGPT:
    """A TorchGPT with the parameters of a glassgrad models.architectures.gpt.GPT (copied)."""
    return TorchGPT(model.state_dict(), model.config.n_layer, model.config.n_head)


def new_caches(model: TorchGPT, batch: int, max_len: int) -> list[list[torch.Tensor]]:
    wte = model.w("wte.weight")
    C = wte.shape[1]
    shape = (batch, model.n_head, max_len, C // model.n_head)
    return [
        [torch.empty(shape, dtype=wte.dtype), torch.empty(shape, dtype=wte.dtype)]
        for _ in range(model.n_layer)
    ]
