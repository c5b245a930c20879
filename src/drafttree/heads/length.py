"""AdaEAGLE's Lightweight Draft Length Predictor (LDLP) and its checkpoint.

Before each drafting round the LDLP looks at the last token the target validated: its input embedding e
and the target's last hidden feature f (after the final norm), and predicts how many draft tokens the
target will accept, so the drafter drafts that many instead of a fixed length. A small MLP with
residual connections: x = W_in [e; f]; three blocks x += MLP(norm(x)); k = w_out . x.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from drafttree.errors import DraftTreeError


class LengthPredictor(nn.Module):
    def __init__(self, hidden_size: int, width: int = 256, blocks: int = 3, k_max: int = 8):
        super().__init__()
        self.hidden_size, self.width, self.n_blocks, self.k_max = hidden_size, width, blocks, k_max
        self.inp = nn.Linear(2 * hidden_size, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.SiLU(), nn.Linear(2 * width, width))
            for _ in range(blocks)
        )
        self.out = nn.Linear(width, 1)
        # standardise the inputs (embeddings and features live on different scales)
        self.register_buffer("mean", torch.zeros(2 * hidden_size))
        self.register_buffer("std", torch.ones(2 * hidden_size))

    def forward(self, emb: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        x = (torch.cat([emb, feat], dim=-1).float() - self.mean) / self.std
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.out(x).squeeze(-1)

    @torch.no_grad()
    def predict(self, emb: torch.Tensor, feat: torch.Tensor) -> int:
        """Rounded draft length in [0, k_max] for one position."""
        k = float(self(emb[None], feat[None])[0])
        return int(min(self.k_max, max(0, round(k))))

    def save(self, path: str | Path, meta: dict) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / f"ldlp.safetensors.tmp{os.getpid()}"
        save_file({k: v.detach().float().contiguous().cpu() for k, v in self.state_dict().items()}, str(tmp))
        os.replace(tmp, path / "ldlp.safetensors")
        cfg = {"hidden_size": self.hidden_size, "width": self.width, "blocks": self.n_blocks, "k_max": self.k_max,
               **meta}
        (path / "ldlp.json").write_text(json.dumps(cfg, indent=1))


def load_length_predictor(path: str | Path, hidden_size: int) -> LengthPredictor:
    path = Path(path)
    if not (path / "ldlp.safetensors").exists() or not (path / "ldlp.json").exists():
        raise DraftTreeError(f"no length predictor in {path} (needs ldlp.json and ldlp.safetensors)")
    cfg = json.loads((path / "ldlp.json").read_text())
    if cfg["hidden_size"] != hidden_size:
        raise DraftTreeError(f"length predictor in {path} expects hidden size {cfg['hidden_size']}, "
                             f"the target has {hidden_size}")
    m = LengthPredictor(cfg["hidden_size"], cfg["width"], cfg["blocks"], cfg["k_max"])
    m.load_state_dict(load_file(str(path / "ldlp.safetensors")))
    m.meta = cfg
    return m.eval().requires_grad_(False)
