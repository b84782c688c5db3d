"""The Vision Transformer: patch embedding, CLS token, learnable positions, the
shared pre-norm encoder (:class:`vit_flowers.models.layers.Transformer`) and a head.

    >>> model = create_vit("vit_tiny_cpu", num_classes=5)
    >>> logits = model(torch.randn(2, 3, 64, 64))      # (2, 5)
    >>> model = from_timm(timm.create_model("vit_tiny_patch16_224"), num_classes=5)   # models/timm_port.py
"""

from __future__ import annotations

from typing import Any

import torch
from einops import repeat
from torch import nn

from .feature_head import FeatureHead
from .layers import Transformer, sincos_2d_positions
from .patch_embed import HYBRID_EMBEDS, HybridPatchEmbed, check_patch_embed, hybrid_embed, make_patch_embed

__all__ = ["ViT", "PRESETS", "POS_INITS", "HEAD_SOURCES", "create_vit", "resample_positions", "check_shape",
           "pool_patches", "head_features", "logits_and_features"]

# how the learnable position embedding starts: small random values (timm, DeiT) or 2-D sin-cos
POS_INITS: tuple[str, ...] = ("trunc_normal", "sincos")
# what the head may read, joined by "+" in ``head_input``: the CLS token, the mean of the patch tokens (both after
# the final norm); "cls" alone is the trained head's input as it is, any other choice each source L2-normalised
# and concatenated (a head fitted by ``teach`` on them, vit_flowers/teaching/teach.py)
HEAD_SOURCES: tuple[str, ...] = ("cls", "patches")


class ViT(nn.Module):
    """Vision Transformer with a CLS token (Dosovitskiy et al., 2020).

    ``forward_features`` returns every token after the final norm, (B, 1 + N, dim); ``forward_head`` classifies
    the CLS token (or what ``head_input`` names); ``forward`` is the two in turn, as in timm (through
    :meth:`classify`, where a hybrid taught classes after training, :class:`~vit_flowers.models.taught.TaughtViT`,
    mixes its trained head with a gate on the trunk); ``attention_maps`` also returns each layer's attention weights.
    ``self.config`` holds the constructor's arguments, so ``ViT(**model.config)`` rebuilds the same shape.
    """

    def __init__(  # over a screen: 16 typed, documented arguments, one a line
        self,
        *,
        image_size: int,
        patch_size: int,
        num_classes: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_dim: int,
        channels: int = 3,
        dim_head: int | None = None,
        dropout: float = 0.0,
        emb_dropout: float = 0.0,
        drop_path: float = 0.0,
        qkv_bias: bool = True,
        norm_eps: float = 1e-6,
        patch_embed: str = "linear",
        pos_init: str = "trunc_normal",
        head_input: str = "cls",
        feature_head: bool = False,
        feature_extras: str = "",
    ) -> None:
        """
        Args:
            image_size: input height and width in pixels (square images).
            patch_size: side of a square patch; must divide ``image_size``.
            num_classes: number of output classes (0 = no head, features only).
            dim: token width.
            depth: number of encoder blocks.
            heads: attention heads per block.
            mlp_dim: hidden width of each block's MLP.
            channels: input channels.
            dim_head: width of one head (default ``dim // heads``, which must divide).
            dropout: dropout inside attention and MLP.
            emb_dropout: dropout on the embedded tokens.
            drop_path: stochastic depth rate of the last block (linear from 0).
            qkv_bias: whether the fused qkv projection has a bias.
            norm_eps: LayerNorm epsilon (1e-6 as in timm's ViT).
            patch_embed: "linear" (the paper's), "conv" (early-convolution stem), "conv_deep" (a wider
                stem), "cct" (CCT's tokenizer) or "lite0" / "lite1" / "lite2" (the hybrid: EfficientNet-Lite0/1/2's
                stages up to stride ``patch_size``), see :mod:`vit_flowers.models.patch_embed`; all give the same
                token grid.
            pos_init: how the learnable positions start, one of ``POS_INITS``: "trunc_normal" (std 0.02) or
                "sincos" (2-D sin-cos of the patch's row and column, the CLS token's zero).
            head_input: what the head reads: "cls" (the CLS token, as trained), or sources of ``HEAD_SOURCES``
                joined by "+" (e.g. "cls+patches"), each L2-normalised, concatenated.
            feature_head: a hybrid cut at its last stage (patch_size 32) also classifies its trunk's grid as the
                frozen-feature recipe does (:class:`~vit_flowers.models.feature_head.FeatureHead`: the ImageNet head
                convolution, pooled, a linear classifier), its logits added to the encoder's head's.
            feature_extras: other EfficientNet-Lites joined by "+" (e.g. "lite2") whose whole networks, on the same
                photo, add their pooled features to the feature head's ("": none).
        """
        super().__init__()
        check_shape(image_size=image_size, patch_size=patch_size, dim=dim, depth=depth, heads=heads,
                    mlp_dim=mlp_dim, channels=channels, dim_head=dim_head, patch_embed=patch_embed, pos_init=pos_init,
                    head_input=head_input, feature_head=feature_head, feature_extras=feature_extras)
        if num_classes < 0:
            raise ValueError(f"ViT: num_classes must be >= 0, got {num_classes}")
        self.config: dict[str, Any] = dict(
            image_size=image_size, patch_size=patch_size, num_classes=num_classes, dim=dim, depth=depth,
            heads=heads, mlp_dim=mlp_dim, channels=channels, dim_head=dim_head, dropout=dropout,
            emb_dropout=emb_dropout, drop_path=drop_path, qkv_bias=qkv_bias, norm_eps=norm_eps,
            patch_embed=patch_embed, pos_init=pos_init, head_input=head_input, feature_head=feature_head,
            feature_extras=feature_extras,
        )
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_classes = num_classes
        self.grid_size = image_size // patch_size
        self.head_sources = tuple(head_input.split("+"))
        self.head_dim = dim * len(self.head_sources)  # the head's input width
        num_patches = self.grid_size**2

        # (B, C, H, W) -> (B, N, dim)
        self.to_patch_embedding = make_patch_embed(patch_embed, patch_size, channels, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = Transformer(dim, depth, heads, mlp_dim, drop_path=drop_path, dim_head=dim_head,
                                       dropout=dropout, norm_eps=norm_eps, qkv_bias=qkv_bias)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp_head: nn.Module = nn.Linear(self.head_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()
        self.feature_head: FeatureHead | None = None  # after init_weights: its classifier starts at zero
        if feature_head:
            trunk = hybrid_embed(self.to_patch_embedding).trunk  # a hybrid's (check_shape)
            self.feature_head = FeatureHead(patch_embed, trunk.out_channels, num_classes,
                                            tuple(feature_extras.split("+")) if feature_extras else ())

    def init_weights(self) -> None:
        """Truncated normal (std 0.02, cut at 2 std) for the CLS token, Linear weights and (by default) the
        positions; zero biases."""
        _trunc_normal(self.cls_token)
        if self.config["pos_init"] == "sincos":
            with torch.no_grad():
                self.pos_embedding.zero_()  # the CLS token's position stays zero
                self.pos_embedding[0, 1:] = sincos_2d_positions(self.grid_size, self.pos_embedding.shape[-1])
        else:
            _trunc_normal(self.pos_embedding)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                _trunc_normal(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameter names that AdamW should not decay (timm convention)."""
        return {"pos_embedding", "cls_token"}

    def _check_images(self, x: torch.Tensor) -> None:
        """Raise ValueError unless ``x`` is images of this model's size (B, C, S, S)."""
        if x.ndim != 4 or x.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(f"ViT expects images of shape (B, C, {self.image_size}, {self.image_size}), "
                             f"got {tuple(x.shape)}")

    def embed(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Images (B, C, H, W) -> (patch tokens (B, N, dim), a hybrid's trunk output (B, C_trunk, h, w), which the
        feature head and a taught class's gate read (:meth:`classify`); None for other patch embeddings): the first
        step of every path from images to logits (``forward``, ``attention_maps``, :func:`logits_and_features`)."""
        self._check_images(img)
        embed = self.to_patch_embedding
        if isinstance(embed, HybridPatchEmbed):
            grid = self.trunk_grid(img)  # (B, C_trunk (+ C_extras), h, w)
            return embed.tokens(grid), grid
        return embed(img), None

    def trunk_grid(self, img: torch.Tensor) -> torch.Tensor:
        """A hybrid's images (B, 3, H, W) -> its trunk's output (B, C_trunk, h, w), followed along the channels by
        those of its feature head's extra networks (B, C_trunk + C_extras, h, w): all that the model reads of the
        pretrained networks, what a head start caches."""
        embed = hybrid_embed(self.to_patch_embedding)
        x = embed.lite_input(img)
        grid = embed.trunk(x)
        if self.feature_head is not None and self.feature_head.extras:
            grid = torch.cat([grid, *self.feature_head.extra_grids(x)], dim=1)
        return grid

    def pooled_trunk(self, grid: torch.Tensor) -> torch.Tensor:
        """The grid of :meth:`trunk_grid` (B, C, h, w) -> the mean of the trunk's own channels (B, C_trunk): what a
        taught class's gate reads."""
        return grid[:, :hybrid_embed(self.to_patch_embedding).trunk.out_channels].mean((2, 3))

    def _tokens(self, x: torch.Tensor, embedded: bool) -> torch.Tensor:
        """Images, or (``embedded``) patch tokens -> the encoder's input (B, 1 + N, dim): CLS first, positions
        added. Raises ValueError for a shape this model does not take."""
        if not embedded:
            self._check_images(x)
            x = self.to_patch_embedding(x)  # (B, N, dim)
        elif x.ndim != 3 or tuple(x.shape[1:]) != (self.grid_size**2, self.cls_token.shape[-1]):
            raise ValueError(f"ViT expects patch tokens of shape (B, {self.grid_size**2}, {self.cls_token.shape[-1]}),"
                             f" got {tuple(x.shape)}")
        cls = repeat(self.cls_token, "1 1 d -> b 1 d", b=x.shape[0])
        return self.dropout(torch.cat((cls, x), dim=1) + self.pos_embedding)

    def forward_features(self, x: torch.Tensor, *, embedded: bool = False) -> torch.Tensor:
        """Images (B, C, H, W) -> normalised tokens (B, 1 + N, dim), CLS first. ``embedded``: ``x`` is patch
        tokens (B, N, dim) as the patch embedding makes them (how :mod:`vit_flowers.training.token_cache` runs the
        rest of a hybrid on its frozen trunk's cached outputs)."""
        return self.norm(self.transformer(self._tokens(x, embedded)))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """tokens (B, 1 + N, dim) -> logits (B, num_classes) from the CLS token (or what ``head_input`` names;
        ``pre_logits``: the head's input, (B, head_dim))."""
        x = x[:, 0] if self.head_sources == ("cls",) else head_features(x[:, 0], pool_patches(x), self.head_sources)
        return x if pre_logits else self.mlp_head(x)

    def classify(self, tokens: torch.Tensor, trunk: torch.Tensor | None) -> torch.Tensor:
        """tokens (B, 1 + N, dim) and, of a hybrid, the trunk output of :meth:`embed` (B, C_trunk, h, w) ->
        logits (B, num_classes): :meth:`forward_head`'s, plus the feature head's where there is one (a
        :class:`~vit_flowers.models.taught.TaughtViT` mixes in its gate, which reads the trunk). Every path from
        images to logits ends here."""
        logits = self.forward_head(tokens)
        return logits if self.feature_head is None else logits + self.feature_logits(trunk)

    def feature_logits(self, trunk: torch.Tensor | None) -> torch.Tensor:
        """The feature head's logits of the trunk output (B, C_trunk, h, w) -> (B, K trained classes). ValueError
        without a feature head or a trunk output."""
        if self.feature_head is None or trunk is None:
            raise ValueError("ViT: the feature head reads the trunk's output: "
                             + ("this model has none" if self.feature_head is None else "none was given"))
        return self.feature_head(trunk)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> logits (B, num_classes): :meth:`embed`, ``forward_features`` of its tokens and
        ``forward_head``. (One argument: ONNX's exporter passes every parameter of ``forward`` that has a default as
        an input.)"""
        tokens, trunk = self.embed(img)  # (B, N, dim), (B, C_trunk, h, w) or None
        return self.classify(self.forward_features(tokens, embedded=True), trunk)

    @torch.no_grad()
    def attention_maps(self, img: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and every layer's attention weights, each (B, heads, 1 + N, 1 + N).

        Uses the explicit softmax path; training and plain inference use the fused one.
        """
        tokens, trunk = self.embed(img)  # (B, N, dim), (B, C_trunk, h, w) or None
        x, maps = self.transformer(self._tokens(tokens, embedded=True), return_attn=True)
        return self.classify(self.norm(x), trunk), maps

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the head (e.g. for fine-tuning on new classes); a feature head's classifier starts again at zero."""
        self.num_classes = num_classes
        if self.feature_head is not None:
            self.feature_head.fc = nn.Linear(self.feature_head.num_features, num_classes)
            nn.init.zeros_(self.feature_head.fc.weight)
            nn.init.zeros_(self.feature_head.fc.bias)
            self.feature_head.freeze()
        self.config["num_classes"] = num_classes
        self.mlp_head = nn.Linear(self.head_dim, num_classes) if num_classes > 0 else nn.Identity()
        if isinstance(self.mlp_head, nn.Linear):
            _trunc_normal(self.mlp_head.weight)
            nn.init.zeros_(self.mlp_head.bias)

    def at_image_size(self, image_size: int) -> ViT:
        """A copy of this model for inputs of another size: the same weights, positions resampled to the new
        patch grid (how a model is evaluated above its training resolution, Touvron et al. 2019, FixRes)."""
        if image_size == self.image_size:
            return self
        model = type(self).from_state_dict({**self.config, "image_size": image_size}, self.state_dict())
        return model.to(self.pos_embedding.device).train(self.training)

    @classmethod
    def from_state_dict(cls, config: dict[str, Any], state: dict[str, torch.Tensor]) -> ViT:
        """A model of this class built from ``config`` (constructor arguments) holding ``state``, the weights of a
        model of the same shape at any image size: positions resampled to this grid, floating-point weights as
        float32."""
        model = cls(**config)
        state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
        state["pos_embedding"] = resample_positions(state["pos_embedding"], model.grid_size)
        model.load_state_dict(state)
        return model


def check_shape(*, image_size: int, patch_size: int, dim: int, depth: int, heads: int, mlp_dim: int,
                channels: int = 3, dim_head: int | None = None, patch_embed: str = "linear",
                pos_init: str = "trunc_normal", head_input: str = "cls", feature_head: bool = False,
                feature_extras: str = "") -> None:
    """Raise ValueError (naming the argument) unless these make a ViT: the one home of these rules, which the
    training config checks too before any work starts."""
    sources = head_input.split("+") if isinstance(head_input, str) else []
    if not sources or any(s not in HEAD_SOURCES for s in sources) or len(set(sources)) != len(sources):
        raise ValueError(f"ViT: head_input must be sources of {', '.join(HEAD_SOURCES)} joined by '+', "
                         f"got {head_input!r}")
    for name, value in dict(image_size=image_size, patch_size=patch_size, dim=dim, depth=depth, heads=heads,
                            mlp_dim=mlp_dim, channels=channels).items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"ViT: {name} must be a positive integer, got {value!r}")
    if image_size % patch_size != 0:
        raise ValueError(f"ViT: image_size ({image_size}) must be divisible by patch_size ({patch_size})")
    if dim_head is None and dim % heads != 0:
        raise ValueError(f"ViT: dim ({dim}) must be divisible by heads ({heads})")
    check_patch_embed(patch_embed, patch_size)
    if feature_head and (patch_embed not in HYBRID_EMBEDS or patch_size != 32):
        raise ValueError(f"ViT: feature_head reads a hybrid's trunk cut at its last stage (patch_embed "
                         f"{' | '.join(HYBRID_EMBEDS)}, patch_size 32), got {patch_embed!r} at {patch_size}")
    extras = feature_extras.split("+") if feature_extras else []
    if extras and (not feature_head or any(v not in HYBRID_EMBEDS for v in extras)):
        raise ValueError(f"ViT: feature_extras are EfficientNet-Lites ({' | '.join(HYBRID_EMBEDS)}) joined by '+' "
                         f"beside a feature_head, got {feature_extras!r}")
    if pos_init not in POS_INITS:
        raise ValueError(f"ViT: pos_init must be one of {', '.join(POS_INITS)}, got {pos_init!r}")
    if pos_init == "sincos" and dim % 4:
        raise ValueError(f"ViT: pos_init 'sincos' needs dim divisible by 4, got {dim}")


def resample_positions(pos: torch.Tensor, grid: int) -> torch.Tensor:
    """A position embedding (1, 1 + g*g, dim), CLS first, resampled (bicubic, timm's) to a ``grid`` x ``grid``
    patch grid: how a model trained at one image size starts at another."""
    if pos.shape[1] - 1 == grid * grid:
        return pos
    from timm.layers import resample_abs_pos_embed

    return resample_abs_pos_embed(pos, new_size=(grid, grid), num_prefix_tokens=1)


def pool_patches(tokens: torch.Tensor) -> torch.Tensor:
    """Tokens (B, 1 + N, dim) of :meth:`ViT.forward_features` -> the mean of the patch tokens (B, dim)."""
    return tokens[:, 1:].mean(dim=1)


def head_features(cls_token: torch.Tensor, patches: torch.Tensor, sources: tuple[str, ...]) -> torch.Tensor:
    """A head's input for ``sources`` (other than the CLS token alone) from the CLS token (B, dim) and the patch
    mean (B, dim): each L2-normalised, concatenated, (B, dim * len(sources))."""
    found = {"cls": cls_token, "patches": patches}
    return torch.cat([nn.functional.normalize(found[s], dim=-1) for s in sources], dim=-1)


def logits_and_features(model: ViT, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (B, C, H, W) -> (logits (B, num_classes), the mean of the patch tokens after the final norm (B, dim)):
    the features the "none of these" rule compares (:mod:`vit_flowers.inference.unknown`; they told non-flowers
    apart better than the CLS token the head reads, benchmarks/HISTORY.md)."""
    patches, trunk = model.embed(x)  # (B, N, dim), (B, C_trunk, h, w) or None
    tokens = model.forward_features(patches, embedded=True)  # (B, 1 + N, dim)
    return model.classify(tokens, trunk), pool_patches(tokens)


def _trunc_normal(tensor: torch.Tensor, std: float = 0.02) -> None:
    """Normal(0, std) truncated at two standard deviations."""
    nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)


PRESETS: dict[str, dict[str, int]] = {
    # a tiny model that trains in minutes on a laptop CPU
    "vit_tiny_cpu": dict(image_size=64, patch_size=8, dim=192, depth=6, heads=3, mlp_dim=384),
    # smaller still, for tests and smoke runs
    "vit_micro": dict(image_size=32, patch_size=8, dim=64, depth=2, heads=2, mlp_dim=128),
    # the paper / DeiT shapes at 224 px
    "vit_ti16": dict(image_size=224, patch_size=16, dim=192, depth=12, heads=3, mlp_dim=768),
    "vit_s16": dict(image_size=224, patch_size=16, dim=384, depth=12, heads=6, mlp_dim=1536),
    "vit_b16": dict(image_size=224, patch_size=16, dim=768, depth=12, heads=12, mlp_dim=3072),
}


def create_vit(name: str, num_classes: int, **overrides: Any) -> ViT:
    """Build a named preset; keyword overrides replace any of its fields.

    >>> create_vit("vit_ti16", num_classes=102, drop_path=0.1)
    """
    if name not in PRESETS:
        raise ValueError(f"unknown ViT preset {name!r}; choose one of {sorted(PRESETS)}")
    return ViT(**{**PRESETS[name], **overrides, "num_classes": num_classes})
