"""Transformer layers shared by the ViT and the encoder-decoder Transformer.

Mask convention, used everywhere in this package: a mask is a **bool** tensor,
broadcastable to (B, heads, N_query, N_key), where **True means "may attend"**.
A query row whose mask is all False (nothing to attend to) yields zeros, never NaN.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

__all__ = ["Attention", "FeedForward", "DropPath", "Block", "Transformer", "sinusoidal_positions",
           "sincos_2d_positions"]


def sinusoidal_positions(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, d_model): PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...)."""
    position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (L, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angles = position * inv_freq  # (L, ceil(d/2))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe


def sincos_2d_positions(grid: int, dim: int) -> torch.Tensor:
    """(grid * grid, dim), row-major patches: the 1-D sinusoids of the row in the first half of each vector and
    those of the column in the second (MoCo v3's 2-D sin-cos; Beyer et al. 2022 start a plain ViT from it)."""
    if dim % 4:
        raise ValueError(f"2-D sin-cos positions need a width divisible by 4, got {dim}")
    axis = sinusoidal_positions(grid, dim // 2)  # (grid, dim / 2)
    rows = axis.repeat_interleave(grid, dim=0)  # (grid * grid, dim / 2): patch i lies in row i // grid
    cols = axis.repeat(grid, 1)  # (grid * grid, dim / 2): and in column i % grid
    return torch.cat((rows, cols), dim=1)


class Attention(nn.Module):
    """Multi-head attention with one fused qkv projection.

    Self-attention uses the fused ``to_qkv`` Linear in one matmul. Cross-attention
    (``context`` given, as in the decoder) projects queries from ``x`` and keys and
    values from ``context`` with the two slices of the same fused weight, so one
    module serves both (as ``torch.nn.MultiheadAttention`` does).

    The fast path is ``F.scaled_dot_product_attention``; the explicit softmax path
    runs only when the attention weights are asked for (attention maps).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 8,
        dim_head: int | None = None,
        dropout: float = 0.0,
        qkv_bias: bool = True,
    ) -> None:
        """
        Args:
            dim: model width (input and output features).
            heads: number of attention heads.
            dim_head: width of one head; defaults to ``dim // heads``.
            dropout: dropout on the attention weights and on the output projection.
            qkv_bias: whether the fused qkv projection has a bias.
        """
        super().__init__()
        if dim_head is None:
            if dim % heads != 0:
                raise ValueError(f"dim ({dim}) must be divisible by heads ({heads}), or give dim_head")
            dim_head = dim // heads
        self.heads = heads
        self.dim_head = dim_head
        self.inner_dim = heads * dim_head
        self.scale = dim_head**-0.5
        self.dropout = dropout
        self.to_qkv = nn.Linear(dim, self.inner_dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(dropout)
        self.to_out = nn.Linear(self.inner_dim, dim)
        self.out_drop = nn.Dropout(dropout)

    @torch.no_grad()
    def fold_scale(self) -> None:
        """Move the attention scale into the query rows of ``to_qkv`` ((s q) k^T = s (q k^T)): the same outputs
        with no multiplication by the scale, which an ONNX export otherwise writes as two (q and k by sqrt(s)).

        For a copy that is exported, not trained or saved: ``scale`` is not in the state dict, so a folded
        model saved and loaded again would scale twice.
        """
        self.to_qkv.weight[: self.inner_dim] *= self.scale
        if self.to_qkv.bias is not None:
            self.to_qkv.bias[: self.inner_dim] *= self.scale
        self.scale = 1.0

    def _split_heads(self, t: torch.Tensor, parts: int) -> list[torch.Tensor]:
        """(B, N, parts * H * D) -> ``parts`` views (B, H, N, D).

        The unbind is over the ``parts`` axis where it sits in memory, so in backward autograd stacks
        the (B, N, H, D)-laid-out gradients of scaled_dot_product_attention straight into a contiguous
        (B, N, parts, H, D) buffer: one copy, where unbinding a (parts, B, H, N, D) permutation (as timm
        does) costs a strided stack plus a second copy to make it contiguous again.
        """
        t = rearrange(t, "b n (parts h d) -> b n parts h d", parts=parts, h=self.heads)
        return [rearrange(u, "b n h d -> b h n d") for u in t.unbind(2)]  # each (B, H, N, D), views

    def _project(self, x: torch.Tensor, context: torch.Tensor | None) -> list[torch.Tensor]:
        if context is None:
            return self._split_heads(self.to_qkv(x), 3)  # q, k, v from (B, N, 3 * H * D)
        w_q, w_kv = self.to_qkv.weight.split([self.inner_dim, 2 * self.inner_dim])
        b_q = b_kv = None
        if self.to_qkv.bias is not None:
            b_q, b_kv = self.to_qkv.bias.split([self.inner_dim, 2 * self.inner_dim])
        q = rearrange(F.linear(x, w_q, b_q), "b n (h d) -> b h n d", h=self.heads)  # (B, H, Nq, D)
        k, v = self._split_heads(F.linear(context, w_kv, b_kv), 2)  # from (B, Nk, 2 * H * D)
        return [q, k, v]

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        return_attn: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """
        Args:
            x: queries (and keys/values for self-attention), (B, Nq, dim).
            context: keys/values for cross-attention, (B, Nk, dim), or None.
            mask: bool, True = attend, broadcastable to (B, H, Nq, Nk), or None.
            return_attn: also return the attention weights (B, H, Nq, Nk).
        """
        q, k, v = self._project(x, context)  # each (B, H, N, D)
        empty_rows = None
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"attention mask must be bool (True = attend), got {mask.dtype}")
            empty_rows = ~mask.any(dim=-1, keepdim=True)  # (B|1, H|1, Nq, 1)
            if empty_rows.any():
                mask = mask | empty_rows  # attend anywhere, zeroed below: no NaN
            else:
                empty_rows = None

        if return_attn:
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, Nq, Nk)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            attn = scores.softmax(dim=-1)
            if empty_rows is not None:
                attn = attn.masked_fill(empty_rows, 0.0)
            out = self.attn_drop(attn) @ v  # (B, H, Nq, D)
        else:
            out = self._fused_attention(q, k, v, mask)  # (B, H, Nq, D)
            if empty_rows is not None:
                out = out.masked_fill(empty_rows, 0.0)

        out = rearrange(out, "b h n d -> b n (h d)")
        out = self.out_drop(self.to_out(out))
        return (out, attn) if return_attn else out


    def _fused_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``F.scaled_dot_product_attention``; bf16 on a CPU attends in fp32.

        Under bf16 autocast on a CPU the Linear layers gain, but PyTorch's bf16 flash-attention kernel is
        slower than its fp32 one (its backward most; benchmarks/README.md), so q, k, v go to fp32 for this
        one op and the result comes back in bf16.
        """
        dropout_p = self.dropout if self.training else 0.0
        if q.device.type == "cpu" and q.dtype == torch.bfloat16:
            with torch.autocast("cpu", enabled=False):
                out = F.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), attn_mask=mask, dropout_p=dropout_p, scale=self.scale
                )
            return out.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale)


class FeedForward(nn.Module):
    """Position-wise MLP: Linear -> activation -> dropout -> Linear -> dropout."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0, activation: str = "gelu") -> None:
        """
        Args:
            dim: model width.
            hidden_dim: width of the hidden layer (``mlp_dim`` / ``d_ff``).
            dropout: dropout after the activation and after the output Linear.
            activation: "gelu" (ViT) or "relu" (the paper's encoder-decoder).
        """
        super().__init__()
        acts = {"gelu": nn.GELU, "relu": nn.ReLU}
        if activation not in acts:
            raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
        self.net = nn.Sequential(
            nn.Linear(dim, hidden_dim),
            acts[activation](),
            nn.Dropout(dropout),
            nn.Linear(hidden_dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.net(x)
        # No autograd (inference): the activation in place, one (B, N, hidden_dim) buffer less per block.
        # With autograd it must not be: GELU's backward needs its input.
        fc1, act, drop1, fc2, drop2 = self.net
        h = fc1(x)
        h = torch.relu_(h) if isinstance(act, nn.ReLU) else torch.ops.aten.gelu_(h, approximate=act.approximate)
        return drop2(fc2(drop1(h)))


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample while training."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop path probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # (B, 1, 1)
        return x * x.new_empty(shape).bernoulli_(keep).div_(keep)

    def residual(self, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """``x + self(branch)`` for a ``branch`` that is the layer's own fresh output.

        While dropping, one ``addcmul`` (one pass less over the activations). Without autograd (inference)
        the sum goes into ``branch``'s buffer instead of a new one when it has the sum's shape and dtype (under
        autocast a bf16 branch added to an fp32 stream is not); ``x`` is never written to.
        """
        if self.p == 0.0 or not self.training:
            if torch.is_grad_enabled() or branch.dtype != x.dtype or branch.shape != x.shape:
                return x + branch
            return branch.add_(x)
        keep = 1.0 - self.p
        shape = (branch.shape[0],) + (1,) * (branch.ndim - 1)  # (B, 1, 1)
        return torch.addcmul(x, branch, branch.new_empty(shape).bernoulli_(keep).div_(keep))

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Block(nn.Module):
    """Pre-norm encoder block: ``x = x + attn(norm(x)); x = x + ff(norm(x))``."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_dim: int,
        dim_head: int | None = None,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        activation: str = "gelu",
        norm_eps: float = 1e-6,
        qkv_bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout, qkv_bias=qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.ff = FeedForward(dim, mlp_dim, dropout=dropout, activation=activation)
        self.drop_path = DropPath(drop_path)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_attn: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """
        Args:
            x: tokens (B, N, dim).
            mask: bool, True = attend, broadcastable to (B, H, N, N), or None.
            return_attn: also return the attention weights (B, H, N, N).
        """
        attn: torch.Tensor | None = None
        h = self.norm1(x)
        if return_attn:
            h, attn = self.attn(h, mask=mask, return_attn=True)
        else:
            h = self.attn(h, mask=mask)
        x = self.drop_path.residual(x, h)
        x = self.drop_path.residual(x, self.ff(self.norm2(x)))
        return x if attn is None else (x, attn)


class Transformer(nn.Module):
    """The shared pre-norm Transformer encoder: a stack of :class:`Block`.

    Drop path grows linearly from 0 at the first block to ``drop_path`` at the last.
    The final LayerNorm belongs to the model that uses the encoder (as in timm).
    """

    def __init__(self, dim: int, depth: int, heads: int, mlp_dim: int, *, drop_path: float = 0.0,
                 **block_options: Any) -> None:
        """``depth`` :class:`Block` of width ``dim``; ``drop_path`` is the last block's rate and
        ``block_options`` the other keyword arguments of :class:`Block` (dim_head, dropout, activation,
        norm_eps, qkv_bias), the same for every block."""
        super().__init__()
        rates = torch.linspace(0, drop_path, depth).tolist() if depth > 1 else [drop_path] * depth
        self.layers = nn.ModuleList(Block(dim, heads, mlp_dim, drop_path=rate, **block_options) for rate in rates)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                return_attn: bool = False) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """x: (B, N, dim) -> (B, N, dim). With ``return_attn``, also a list of (B, H, N, N), one per layer."""
        maps = []
        for layer in self.layers:
            if return_attn:
                x, attn = layer(x, mask=mask, return_attn=True)
                maps.append(attn)
            else:
                x = layer(x, mask=mask)
        return (x, maps) if return_attn else x
