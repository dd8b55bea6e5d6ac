"""Per-layer early-exit heads for PPD (``train heads --early-exit``): for each layer j in 1..d-1,
``logits_j(h) = head(norm_j(W_j h + h))``, a residual H x H map (initialised at zero, so an
untrained head is the shared LM head) and a copy of the final norm, with the base's LM head
shared. Saved as ``exit_heads.json`` (base fingerprint as the adapter's) + ``exit_heads.safetensors``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models.adapter import base_fingerprint, fingerprint_mismatch
from latticedraft.gpu.models.layer_split import LayerSplit

CONFIG = "exit_heads.json"
WEIGHTS = "exit_heads.safetensors"


class ExitHeads(nn.Module):
    def __init__(self, split: LayerSplit):
        super().__init__()
        H, d = split.hidden_size, split.num_layers
        self.num_layers = d
        self.maps = nn.ModuleList(nn.Linear(H, H, bias=False) for _ in range(d - 1))
        for lin in self.maps:
            nn.init.zeros_(lin.weight)
        self.norms = nn.ModuleList(copy.deepcopy(split.norm) for _ in range(d - 1))
        for p in self.norms.parameters():
            p.requires_grad_(True)
        self._head = [split.head]  # shared, not a submodule (never saved or trained here)

    def forward(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        """Logits [.., V] at the output of layer ``layer`` (1..d-1) from its hidden states h [.., H]."""
        j = layer - 1
        return self._head[0](self.norms[j](h + self.maps[j](h)))


def save_exit_heads(heads: ExitHeads, split: LayerSplit, out: Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}, str(out / WEIGHTS))
    (out / CONFIG).write_text(json.dumps({"kind": "early-exit-heads", "base": base_fingerprint(split),
                                          **(extra or {})}, indent=1) + "\n")


def load_exit_heads(path, split: LayerSplit) -> ExitHeads:
    from latticedraft.gpu.models.hf import load_safetensors

    p = Path(path)
    if not (p / CONFIG).is_file() or not (p / WEIGHTS).is_file():
        raise InputError(f"early-exit head directory {p} has no {CONFIG} and {WEIGHTS}; train one with "
                         "`latticedraft train heads --early-exit --base BASE --out DIR`")
    made_for = json.loads((p / CONFIG).read_text()).get("base", {})
    what = fingerprint_mismatch(made_for, split)
    if what:
        raise ModelError(f"early-exit heads {p} were trained for another base ({what}); retrain them on this base")
    heads = ExitHeads(split)
    heads.load_state_dict(load_safetensors(p / WEIGHTS))
    return heads.to(split.device, split.dtype).eval()
