"""Dense relative localization: a training-time task that helps a ViT learn from few images.

Liu et al. 2021, "Efficient Training of Visual Transformers with Small Datasets" (NeurIPS): besides the
class, the network predicts, for random pairs of output patch tokens of the same image, how far apart the two
patches are (|row difference| / k, |column difference| / k on the k x k token grid), with an L1 loss. The
task needs spatial information in every token, which a ViT trained on a few thousand labelled images
otherwise learns slowly. The small MLP that makes the guess exists only in training; the ViT it wraps is
unchanged and is what checkpoints, evaluation and predict use.

    >>> vit = create_vit("vit_micro", num_classes=5, image_size=32)
    >>> logits, aux = RelativeLocalization(vit)(torch.randn(4, 3, 32, 32))   # (4, 5), scalar
    >>> loss = F.cross_entropy(logits, labels) + 0.1 * aux
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .vit import ViT

__all__ = ["RelativeLocalization"]


class RelativeLocalization(nn.Module):
    """A ViT plus the relative-localization head: ``forward(images) -> (logits, auxiliary L1 loss)``."""

    def __init__(self, vit: ViT, pairs: int = 32, hidden: int = 256) -> None:
        """
        Args:
            vit: the classifier; its ``forward_features`` tokens feed both the head and the task.
            pairs: token pairs drawn per image each step (with replacement, from the global torch RNG).
            hidden: width of the MLP's two hidden layers.
        """
        super().__init__()
        if pairs <= 0:
            raise ValueError(f"RelativeLocalization: pairs must be positive, got {pairs}")
        if vit.grid_size < 2:
            raise ValueError(f"RelativeLocalization: the token grid is {vit.grid_size}x{vit.grid_size}; "
                             f"it needs at least 2x2 patches")
        self.vit = vit
        self.pairs = pairs
        dim = vit.config["dim"]
        self.mlp = nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, hidden),
                                 nn.ReLU(inplace=True), nn.Linear(hidden, 2))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images (B, C, H, W) -> (logits (B, num_classes), mean L1 error of the predicted offsets)."""
        tokens = self.vit.forward_features(images)  # (B, 1 + N, dim), every token through the last block
        logits = self.vit.forward_head(tokens)
        grid = tokens[:, 1:]  # (B, N, dim), row-major k x k
        b, n, dim = grid.shape
        k = self.vit.grid_size
        idx = torch.randint(n, (b, 2 * self.pairs), device=grid.device)  # (B, 2M): M pairs
        picked = grid.gather(1, idx.unsqueeze(-1).expand(-1, -1, dim))  # (B, 2M, dim)
        first, second = picked.chunk(2, dim=1)  # (B, M, dim) each
        pos = torch.stack((idx // k, idx % k), dim=-1)  # (B, 2M, 2): (row, column)
        target = (pos[:, :self.pairs] - pos[:, self.pairs:]).abs().float() / k  # (B, M, 2)
        guess = self.mlp(torch.cat((first, second), dim=-1)).float()  # (B, M, 2)
        return logits, F.l1_loss(guess, target)
