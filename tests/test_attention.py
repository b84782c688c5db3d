"""Tests for vit_flowers.reporting.attention_maps (rollout, overlays) and the explain command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_flowers.data.synthetic import make_synthetic_flowers
from vit_flowers.explain import main
from vit_flowers.reporting.attention_maps import attention_rollout, explain, output_name, overlay
from vit_flowers.runs.checkpoint import load_model


@pytest.fixture(scope="module")
def run(micro_run) -> Path:
    return micro_run  # this module's copy of the session's trained micro run


def _photo(width: int, height: int, seed: int = 2) -> Image.Image:
    img = make_synthetic_flowers(1, 64, seed=seed)[0][1].permute(1, 2, 0).numpy()  # (64, 64, 3)
    return Image.fromarray(img).resize((width, height))


def _random_attention(b: int, heads: int, t: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, heads, t, t, generator=g).softmax(-1)  # rows sum to 1


def test_rollout_matches_the_paper_step_by_step():
    layers = [_random_attention(2, 3, 5, s) for s in range(3)]
    expected = np.tile(np.eye(5), (2, 1, 1))
    for attn in layers:  # Abnar & Zuidema: mean over heads, + I, renormalise, multiply through the layers
        a = attn.mean(1).numpy() + np.eye(5)
        a /= a.sum(-1, keepdims=True)
        expected = a @ expected
    got = attention_rollout(layers)
    assert got.shape == (2, 4)
    np.testing.assert_allclose(got.numpy(), expected[:, 0, 1:], rtol=1e-5)


def test_rollout_of_pure_self_attention_ignores_the_patches():
    eye = torch.eye(5).expand(1, 2, 5, 5)
    assert torch.count_nonzero(attention_rollout([eye, eye])) == 0
    with pytest.raises(ValueError):
        attention_rollout([])


def test_explain_shapes_and_ranges(run):
    model, ckpt = load_model(run / "best.pt")
    images = make_synthetic_flowers(1, 32, seed=1)[0][:3]  # (3, 3, 32, 32)
    exp = explain(model, images, ckpt["mean"], ckpt["std"], "cpu")
    g, heads = model.grid_size, model.config["heads"]
    assert exp.probs.shape == (3, 5) and exp.rollout.shape == (3, g, g) and exp.last_heads.shape == (3, heads, g, g)
    torch.testing.assert_close(exp.probs.sum(1), torch.ones(3))
    for maps in (exp.rollout, exp.last_heads):
        assert maps.min() >= 0 and maps.max() <= 1
        assert (maps.flatten(-2).amax(-1) == 1).all()  # each map min-max scaled: not constant
    with torch.no_grad():  # the explicit attention path predicts like the fused one
        x = (images / 255.0 - torch.tensor(ckpt["mean"]).view(1, 3, 1, 1)) / torch.tensor(ckpt["std"]).view(1, 3, 1, 1)
        torch.testing.assert_close(exp.probs, model(x).softmax(-1), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("size", [(90, 60), (40, 100), (64, 64)])
def test_overlay_has_the_image_size_and_shows_the_map(size):
    image = _photo(*size)
    heat = torch.zeros(4, 4)
    heat[1, 2] = 1.0
    out = overlay(image, heat)
    assert out.size == image.size and out.mode == "RGB"
    a = np.asarray(out, dtype=np.float32)
    assert a.std() > 1 and not np.array_equal(a, np.asarray(image))
    # the attended patch is drawn where it is in the model's centre crop
    w, h = size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    hot = a[top + int(1.5 * side / 4), left + int(2.5 * side / 4)]
    cold = a[top + int(3.5 * side / 4), left + int(0.5 * side / 4)]
    assert hot.sum() > cold.sum() + 60


def test_cli_writes_one_png_per_image(run, tmp_path):
    _photo(120, 80).save(tmp_path / "wide.jpg")
    _photo(50, 50, seed=3).save(tmp_path / "square.png")
    (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "maps"
    argv = [str(tmp_path / "wide.jpg"), str(tmp_path / "square.png"), str(tmp_path / "broken.jpg"),
            "--checkpoint", str(run), "--output", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["square_attention.png", "wide_attention.png"]
    with Image.open(out / "wide_attention.png") as png:
        assert png.width > 500 and np.asarray(png.convert("L")).std() > 10
    assert main([str(tmp_path / "broken.jpg"), "--checkpoint", str(run), "--output", str(out)]) == 1


def test_output_names_are_unique(tmp_path):
    used: set[str] = set()
    names = [output_name(Path(p), tmp_path, used).name for p in ("a/x.jpg", "b/x.png", "x.webp", "y.jpg")]
    assert names == ["x_attention.png", "x_attention_2.png", "x_attention_3.png", "y_attention.png"]
