import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from vit_flowers.models.taught import TaughtViT, build_vit
from vit_flowers.models.timm_port import from_timm
from vit_flowers.models.vit import PRESETS, ViT, create_vit, logits_and_features


def small_vit(**kw):
    cfg = dict(image_size=32, patch_size=8, num_classes=5, dim=32, depth=2, heads=4, mlp_dim=64)
    return ViT(**{**cfg, **kw})


def test_shapes_features_and_head():
    model = small_vit().eval()
    x = torch.randn(3, 3, 32, 32)
    feats = model.forward_features(x)
    assert feats.shape == (3, 1 + 16, 32)
    logits = model.forward_head(feats)
    assert logits.shape == (3, 5)
    torch.testing.assert_close(model(x), logits)
    assert model.forward_head(feats, pre_logits=True).shape == (3, 32)


def test_gradients_reach_every_parameter_and_no_nan():
    model = small_vit(dropout=0.1, emb_dropout=0.1, drop_path=0.1).train()
    loss = model(torch.randn(4, 3, 32, 32)).logsumexp(-1).mean()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_explicit_init():
    model = small_vit()
    assert 0.005 < model.pos_embedding.std().item() < 0.03
    assert model.pos_embedding.abs().max().item() <= 0.04 + 1e-6  # truncated at 2 std
    assert torch.count_nonzero(model.transformer.layers[0].attn.to_qkv.bias) == 0


def test_sincos_positions_start_as_the_rows_and_columns_sinusoids_and_stay_learnable():
    model = small_vit(pos_init="sincos")  # a 4 x 4 grid of patches, dim 32
    pos = model.pos_embedding[0].detach()  # (1 + 16, 32)
    assert torch.count_nonzero(pos[0]) == 0  # the CLS token has no position
    rows, cols = pos[1:, :16], pos[1:, 16:]
    # patch i lies in row i // 4 and column i % 4: patches sharing a row share the first half, and so on
    torch.testing.assert_close(rows[5], rows[6])
    torch.testing.assert_close(cols[1], cols[13])
    assert not torch.allclose(rows[1], rows[5]) and not torch.allclose(cols[1], cols[2])
    torch.testing.assert_close(rows[0, 0::2], torch.zeros(8))  # sin(0) in row 0 ...
    torch.testing.assert_close(rows[0, 1::2], torch.ones(8))  # ... cos(0)
    torch.testing.assert_close(rows[4, 0], torch.sin(torch.tensor(1.0)))  # row 1, the fastest frequency
    assert model.pos_embedding.requires_grad
    assert ViT(**model.config).config["pos_init"] == "sincos"  # a checkpoint's model_config keeps it


def test_config_rebuilds_same_shape():
    model = small_vit()
    clone = ViT(**model.config)
    clone.load_state_dict(model.state_dict())


def test_from_state_dict_keeps_the_weights_and_resamples_the_positions():
    model = small_vit(patch_embed="conv").eval()
    half = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    same = ViT.from_state_dict(model.config, half).eval()
    assert same.pos_embedding.dtype == torch.float32
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(same(x), model(x), atol=2e-2, rtol=2e-2)  # fp16 weights, fp32 model
    larger = ViT.from_state_dict({**model.config, "image_size": 48}, model.state_dict())
    assert larger.pos_embedding.shape == (1, 1 + 6 * 6, 32)
    torch.testing.assert_close(larger.pos_embedding[:, 0], model.pos_embedding[:, 0])  # the CLS token's own
    qkv = [m.transformer.layers[1].attn.to_qkv.weight for m in (larger, model)]
    torch.testing.assert_close(*qkv)  # every other weight as it was


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(image_size=30), "divisible by patch_size"),
        (dict(dim=30, heads=4), "divisible by heads"),
        (dict(depth=0), "depth must be a positive integer"),
        (dict(patch_size=-8), "patch_size must be a positive integer"),
        (dict(pos_init="learned"), "pos_init must be one of trunc_normal, sincos"),
        (dict(dim=30, heads=3, pos_init="sincos"), "needs dim divisible by 4"),
    ],
)
def test_bad_shapes_raise_clear_value_error(kw, message):
    with pytest.raises(ValueError, match=message):
        small_vit(**kw)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(taught=1), "taught classes read the trunk: they need a hybrid patch_embed"),
        (dict(taught=0, patch_size=32, patch_embed="lite0"), "taught must be an integer >= 1"),
        (dict(patch_size=32, patch_embed="lite0", taught=5), r"taught \(5\) must leave a trained class of the 5"),
    ],
)
def test_bad_taught_classes_raise_clear_value_error(kw, message):
    with pytest.raises(ValueError, match=message):
        _taught(**kw)


def test_wrong_input_size_is_a_clear_error():
    with pytest.raises(ValueError, match=r"\(B, C, 32, 32\)"):
        small_vit()(torch.randn(1, 3, 64, 64))
    with pytest.raises(ValueError, match=r"patch tokens of shape \(B, 16, 32\)"):
        small_vit().forward_features(torch.randn(1, 9, 32), embedded=True)


def test_forward_is_the_head_of_the_features_from_images_or_patch_tokens():
    """One path: ``forward`` is ``forward_head(forward_features(x))``, and patch tokens (``embedded``) as the patch
    embedding makes them give what the images give."""
    model = small_vit(drop_path=0.1).eval()
    x = torch.randn(3, 3, 32, 32)
    tokens = model.to_patch_embedding(x)  # (3, 16, 32)
    torch.testing.assert_close(model.forward_features(tokens, embedded=True), model.forward_features(x))
    torch.testing.assert_close(model(x), model.forward_head(model.forward_features(x)))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build(name):
    model = create_vit(name, num_classes=7)
    size = PRESETS[name]["image_size"]
    assert model.mlp_head.out_features == 7
    if size <= 64:
        assert model(torch.randn(1, 3, size, size)).shape == (1, 7)


def test_unknown_preset():
    with pytest.raises(ValueError, match="vit_tiny_cpu"):
        create_vit("vit_huge_banana", num_classes=2)


def test_attention_maps_match_forward():
    model = small_vit().eval()
    x = torch.randn(2, 3, 32, 32)
    logits, maps = model.attention_maps(x)
    torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-5)
    assert len(maps) == 2 and maps[-1].shape == (2, 4, 17, 17)


TIMM_SHAPES = [
    dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=4.0),
    dict(img_size=48, patch_size=16, embed_dim=96, depth=3, num_heads=3, mlp_ratio=2.0),
    dict(img_size=64, patch_size=4, embed_dim=48, depth=1, num_heads=6, mlp_ratio=3.0, qkv_bias=False),
]


@pytest.mark.parametrize("shape", TIMM_SHAPES)
def test_from_timm_logits_match(shape):
    theirs = VisionTransformer(num_classes=10, **shape).eval()
    with torch.no_grad():  # randomise biases and norms too, so every tensor is checked
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = from_timm(theirs).eval()
    x = torch.randn(4, 3, shape["img_size"], shape["img_size"])
    with torch.no_grad():
        diff = (ours(x) - theirs(x)).abs().max().item()
    assert diff < 1e-4


def test_from_timm_state_dict_and_new_head():
    theirs = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10).eval()
    ours = from_timm(theirs.state_dict(), heads=4).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
        # a new head for 5 flower classes keeps the features
        tuned = from_timm(theirs, num_classes=5, drop_path=0.1).eval()
        assert tuned(x).shape == (2, 5)
        torch.testing.assert_close(tuned.forward_features(x), theirs.forward_features(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="heads"):
        from_timm(theirs.state_dict())


def test_from_timm_resamples_positions_for_another_image_size():
    theirs = VisionTransformer(img_size=64, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    ours = from_timm(theirs, image_size=32)
    assert ours.pos_embedding.shape == (1, 17, 32)
    assert ours(torch.randn(1, 3, 32, 32)).shape == (1, 3)


@pytest.mark.parametrize("kw, problem", [(dict(global_pool="avg"), "global_pool"), (dict(reg_tokens=2), "register"),
                                         (dict(init_values=1e-5), "layer scale")])
def test_from_timm_refuses_unsupported_models(kw, problem):
    theirs = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, **kw)
    with pytest.raises(ValueError, match=problem):
        from_timm(theirs)


def test_from_timm_named_model_shape():
    theirs = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5).eval()
    ours = from_timm(theirs).eval()
    assert ours.config["dim"] == 192 and ours.config["depth"] == 12 and ours.config["heads"] == 3
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max().item() < 1e-4


def test_a_head_on_the_cls_token_and_the_patch_mean():
    """head_input "cls+patches" (a head ``teach`` fits): each source L2-normalised, concatenated; every path to the
    logits agrees, and ViT(**config) rebuilds it."""
    model = small_vit(head_input="cls+patches").eval()
    x = torch.randn(3, 3, 32, 32)
    tokens = model.forward_features(x)
    f = model.forward_head(tokens, pre_logits=True)
    assert f.shape == (3, 64) and model.mlp_head.in_features == 64
    expected = torch.cat([torch.nn.functional.normalize(tokens[:, 0], dim=-1),
                          torch.nn.functional.normalize(tokens[:, 1:].mean(1), dim=-1)], dim=-1)
    torch.testing.assert_close(f, expected)
    torch.testing.assert_close(model(x), model.mlp_head(expected))
    logits, features = logits_and_features(model, x)
    torch.testing.assert_close(logits, model(x))
    torch.testing.assert_close(features, tokens[:, 1:].mean(1))
    torch.testing.assert_close(model.attention_maps(x)[0], model(x), rtol=1e-4, atol=1e-5)
    again = ViT(**model.config)
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again.eval()(x), model(x))
    model.reset_classifier(7)
    assert model.mlp_head.in_features == 64 and model(x).shape == (3, 7)


@pytest.mark.parametrize("bad", ["", "trunk", "cls+cls", "patches+", 3])
def test_head_input_is_checked(bad):
    with pytest.raises(ValueError, match="head_input"):
        small_vit(head_input=bad)


def _hybrid(**kw) -> ViT:
    torch.manual_seed(0)
    return small_vit(patch_size=32, patch_embed="lite0", **kw).eval()  # one token: the trunk at stride 32


def _taught(num_classes=5, taught=2, **kw) -> TaughtViT:
    """A hybrid with ``taught`` of its ``num_classes`` taught, its gate random (teach fits it)."""
    torch.manual_seed(0)
    cfg = dict(image_size=32, patch_size=8, dim=32, depth=2, heads=4, mlp_dim=64)
    model = TaughtViT(**{**cfg, **kw}, num_classes=num_classes, taught=taught)
    torch.nn.init.normal_(model.mlp_head.gate.weight)
    return model.eval()


def test_a_hybrid_without_taught_classes_gives_the_logits_of_its_head():
    model, x = _hybrid(), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), model.forward_head(model.forward_features(x)))
    assert isinstance(model.mlp_head, torch.nn.Linear) and "taught" not in model.config


def test_taught_classes_share_the_gates_probability_with_the_trained_head():
    """The logits of a model with taught classes are the log of the mixture its TaughtHead makes: a taught class
    gets the gate's probability times exp(taught_bias), the trained classes the gate's probability of them all
    shared out as the product of the gate's and the trained head's probabilities. Every path to the logits agrees;
    build_vit(config) rebuilds it; its forward_head is the trained head's, logits of the trained classes from the
    tokens alone, as any ViT's."""
    model, x = _taught(patch_size=32, patch_embed="lite0"), torch.randn(3, 3, 32, 32)
    model.mlp_head.taught_bias.fill_(1.0)
    head = model.mlp_head
    assert head.trained.out_features == 3 and head.gate.out_features == 5 and model.num_classes == 5
    with torch.no_grad():
        logits = model(x)
        tokens, grid = model.embed(x)  # (3, N, dim), (3, C_trunk, h, w)
        trunk = grid.mean((2, 3))  # what the gate reads: the grid pooled
        features = model.forward_features(tokens, embedded=True)
        trained = head.trained(features[:, 0])
        torch.testing.assert_close(model.forward_head(features), trained)  # (3, 3): the trained classes' logits
        gate = head.gate(torch.nn.functional.normalize(trunk, dim=-1)).softmax(-1)  # (3, 5)
        agreed = gate[:, :3] * trained.softmax(-1)
        mix = torch.cat([gate[:, :3].sum(-1, keepdim=True) * agreed / agreed.sum(-1, keepdim=True),
                         gate[:, 3:] * torch.e], dim=-1)
        torch.testing.assert_close(logits.exp(), mix / mix.sum(-1, keepdim=True))
        torch.testing.assert_close(logits_and_features(model, x)[0], logits)
        torch.testing.assert_close(model.attention_maps(x)[0], logits, rtol=1e-4, atol=1e-5)
        again = build_vit(model.config)
        again.load_state_dict(model.state_dict())
        torch.testing.assert_close(again.eval()(x), logits)
        torch.testing.assert_close(model.at_image_size(64)(torch.randn(2, 3, 64, 64)).exp().sum(-1), torch.ones(2))
        with pytest.raises(ValueError, match="2 taught class"):
            model.classify(features, None)
    assert model.state_dict()["mlp_head.taught_bias"] == 1.0
    with pytest.raises(TypeError, match="untaught"):
        model.reset_classifier(4)
