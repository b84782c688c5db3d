import pytest
import torch

from vit_flowers.models.patch_embed import ConvPatchEmbed, LinearPatchEmbed, make_patch_embed
from vit_flowers.models.timm_port import from_timm
from vit_flowers.models.vit import ViT, create_vit
from vit_flowers.runs.checkpoint import model_from_checkpoint
from vit_flowers.training.config import ConfigError, load_config


@pytest.mark.parametrize("kind", ["linear", "conv", "conv_deep", "cct"])
@pytest.mark.parametrize("size, patch", [(32, 8), (64, 16), (32, 4)])
def test_same_token_grid_for_both_kinds(kind, size, patch):
    embed = make_patch_embed(kind, patch, 3, 48)
    assert embed(torch.randn(2, 3, size, size)).shape == (2, (size // patch) ** 2, 48)


def test_conv_stem_widths_double_and_end_at_half_dim():
    stem = ConvPatchEmbed(8, 3, 192)
    widths = [m.out_channels for m in stem.stem if isinstance(m, torch.nn.Conv2d)]
    assert widths == [24, 48, 96]
    assert stem.proj.out_channels == 192


def test_deep_conv_stem_layout():
    stem = make_patch_embed("conv_deep", 16, 3, 192)
    convs = [(m.out_channels, m.stride[0]) for m in stem.stem if isinstance(m, torch.nn.Conv2d)]
    assert convs == [(32, 2), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2)]  # extra convs in the middle stages
    assert stem.proj.out_channels == 192
    assert [m.stride[0] for m in make_patch_embed("conv_deep", 2, 3, 64).stem if isinstance(m, torch.nn.Conv2d)] == [2]


def test_cct_tokenizer_convolves_at_full_resolution_and_max_pools():
    stem = make_patch_embed("cct", 16, 3, 192)
    convs = [(m.out_channels, m.stride[0]) for m in stem.stem if isinstance(m, torch.nn.Conv2d)]
    assert convs == [(32, 1), (64, 1), (128, 1), (256, 1)]
    assert sum(isinstance(m, torch.nn.MaxPool2d) for m in stem.stem) == 4  # each halves the resolution


def test_conv_tokens_are_row_major_and_local():
    """Changing the top-left corner changes the first token and leaves the far bottom-right one alone."""
    torch.manual_seed(0)
    for embed in (ConvPatchEmbed(8, 3, 32).eval(), ConvPatchEmbed(8, 3, 32, deep=True).eval(),
                  ConvPatchEmbed(8, 3, 32, pool=True).eval(), LinearPatchEmbed(8, 3, 32)):
        img = torch.randn(1, 3, 64, 64)
        edited = img.clone()
        edited[..., :8, :8] += 3.0
        a, b = embed(img), embed(edited)  # (1, 64, 32)
        assert not torch.allclose(a[0, 0], b[0, 0])
        torch.testing.assert_close(a[0, -1], b[0, -1])


@pytest.mark.parametrize("kind, patch, message", [("conv", 6, "power of two"), ("conv", 1, "power of two"),
                                                   ("cnn", 8, "unknown patch_embed")])
def test_bad_patch_embed_is_a_clear_error(kind, patch, message):
    with pytest.raises(ValueError, match=message):
        make_patch_embed(kind, patch, 3, 32)


def test_vit_with_conv_stem_trains_and_rebuilds_from_its_config():
    torch.manual_seed(0)
    model = create_vit("vit_micro", num_classes=5, patch_embed="conv")
    assert model.config["patch_embed"] == "conv"
    x = torch.randn(4, 3, 32, 32)
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    first_conv = model.to_patch_embedding.stem[0].weight
    assert first_conv.grad is not None and first_conv.grad.abs().sum() > 0
    model.eval()
    state = {"model_config": model.config, "model": model.state_dict(), "classes": list("abcde")}
    rebuilt = model_from_checkpoint(state).eval()  # what load_model does with a checkpoint
    assert isinstance(rebuilt.to_patch_embedding, ConvPatchEmbed)
    torch.testing.assert_close(rebuilt(x), model(x))


def test_old_configs_without_the_key_build_linear():
    config = dict(create_vit("vit_micro", num_classes=5).config)
    config.pop("patch_embed")
    assert isinstance(ViT(**config).to_patch_embedding, LinearPatchEmbed)


def test_from_timm_refuses_the_conv_stem():
    with pytest.raises(ValueError, match="linear"):
        from_timm({}, heads=3, patch_embed="conv")


def test_config_key():
    assert load_config(None, {"patch_embed": "conv"}).model_kwargs()["patch_embed"] == "conv"
    assert load_config(None).model_kwargs()["patch_embed"] == "linear"
    with pytest.raises(ConfigError, match="patch_embed"):
        load_config(None, {"patch_embed": "cnn"})
    with pytest.raises(ConfigError, match="power of two"):
        load_config(None, {"patch_embed": "conv", "image_size": 60, "cache_size": 60, "patch_size": 6})
    with pytest.raises(ConfigError, match="pretrained"):
        load_config(None, {"patch_embed": "conv", "pretrained": "vit_tiny_patch16_224"})
