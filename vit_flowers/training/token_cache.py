"""A hybrid's head start: its new parts trained on its frozen trunk's outputs, computed once per photo.

While the pretrained trunk of a hybrid ViT (:class:`~vit_flowers.models.patch_embed.HybridPatchEmbed`) does not
learn, its output is a function of the photo: one forward pass per photo caches it, and the projection, the
Transformer encoder and the head then train on the cache for a few epochs at a fraction of an end-to-end epoch's
cost (the trunk is most of the compute). End-to-end epochs follow for what is left of the time budget: a linear
probe then fine-tune in spirit (Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features"), with the
encoder instead of a linear head. The cached view is the photo as evaluation sees it; a training view flips the
token grid left to right, a close stand-in for the trunk's output on the mirrored photo (ImageNet training
taught it to be nearly mirror-symmetric) at no cost.

    >>> phase = TokenPhase(model, train_images, val_images, ...)   # one trunk pass over every photo
    >>> phase.train_epoch(generator)                              # seconds, not minutes
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from torch import nn
from tqdm import tqdm

from ..data.augment import IMAGENET_MEAN, IMAGENET_STD, eval_transform
from ..data.cache_folder import human_bytes
from ..data.cache_format import derived_key, set_name
from ..data.datasets import TensorImageDataset
from ..data.photo_cache import PhotoCache
from ..data.progress import counting, tracked
from ..inference import INFERENCE_BATCH
from ..inference.precision import autocast
from ..models.patch_embed import hybrid_embed
from ..models.vit import ViT
from .budget import STEP_OVER_FORWARD
from .optim import param_groups
from .recipe import Recipe

__all__ = ["TrunkOutputs", "timed_forward", "trunk_outputs", "TokenPhase"]

log = logging.getLogger("vit_flowers.train")


class TrunkOutputs(NamedTuple):
    """:func:`trunk_outputs`' answer."""

    data: torch.Tensor  # float16 (N, C, h, w): the trunk's output of each photo
    computed: int  # how many of them the trunk computed now (the others were read from the photo cache)


def _trunk_batch(model: ViT, images: torch.Tensor, device: torch.device,
                 amp_dtype: torch.dtype | None) -> torch.Tensor:
    """The trunk's output of uint8 photos (B, 3, S, S), float16 (B, C, h, w) on the CPU, as evaluation sees them."""
    x = eval_transform(images, model.image_size, IMAGENET_MEAN, IMAGENET_STD).to(device)
    with autocast(device, amp_dtype):
        return model.trunk_grid(x).to("cpu", torch.float16)


@torch.inference_mode()
def trunk_outputs(model: ViT, data: TensorImageDataset, batch_size: int, device: torch.device,
                  amp_dtype: torch.dtype | None, desc: str, progress: bool,
                  cache: PhotoCache | None = None) -> TrunkOutputs:
    """The hybrid's trunk output for every image of ``data`` as evaluation sees it: float16 (N, C, h, w) on the
    CPU (a 224-px photo through Lite0 at stride 32: 31 KB), kept in ``cache`` (memory-mapped; the next run on the
    same photos with the same trunk reads them there) when ``data`` came from it, else in memory."""
    embed = hybrid_embed(model.to_patch_embedding)
    was_training = embed.training
    embed.eval()  # BatchNorm on its running statistics, as frozen_stats trains it

    def features(idx: torch.Tensor) -> torch.Tensor:  # (B, C, h, w) float16
        return _trunk_batch(model, data.images[idx], device, amp_dtype)

    def produce(indices: list[int]) -> Iterator[tuple[int, np.ndarray | str]]:
        for chunk in torch.tensor(indices, dtype=torch.int64).split(batch_size):
            yield from zip(chunk.tolist(), features(chunk).numpy())

    try:
        spec = trunk_spec(embed.trunk, model.image_size, amp_dtype)
        if model.feature_head is not None and model.feature_head.extras:  # their grids follow the trunk's
            spec += " + " + trunk_spec(model.feature_head.extra_trunks, model.image_size, amp_dtype)
        kept = data.keys is not None and cache is not None  # photos from the cache: their outputs are kept too
        keys = [derived_key(k, spec) for k in data.keys] if data.keys is not None else [""] * len(data)
        store = cache if kept and cache is not None else PhotoCache(None)
        shape = tuple(features(torch.zeros(1, dtype=torch.int64)).shape[1:]) if len(data) else (0,)
        folder = os.path.commonpath(data.paths) if data.paths else ""
        group = set_name("trunk", desc, folder, model.image_size)
        count = counting(f"the pretrained part's pass over the photos ({desc})", len(data))
        with tqdm(total=len(data), desc=desc, leave=False, disable=None if progress else True) as bar:

            def advance(n: int) -> None:
                bar.update(n)
                count(n)

            rows = store.rows(group, keys, shape, torch.float16, produce,
                              f"{desc} of {len(data)} photos of {folder} at {model.image_size} px", progress=advance)
        store.tidy()
    finally:
        embed.train(was_training)
    if rows.where is not None:
        log.info("photo cache: %s, %d outputs: %s, %d read from the cache, %d computed", desc, len(data),
                 human_bytes(rows.data.nbytes), rows.reused, len(data) - rows.reused)
    return TrunkOutputs(rows.data, len(data) - rows.reused)


@torch.inference_mode()
def timed_forward(model: ViT, data: TensorImageDataset, batch_size: int, device: torch.device,
                  amp_dtype: torch.dtype | None) -> float:
    """Seconds a photo of ``data`` takes through the trunk, timed on one batch of ``batch_size`` after another to
    warm up (the first batch of a process allocates what the next ones reuse: timed alone it took 1.6x a pass's
    time a photo): what the plan needs when the photo cache gave the outputs without a pass."""
    embed = hybrid_embed(model.to_patch_embedding)
    was_training = embed.training
    embed.eval()
    try:
        n = min(batch_size, len(data))
        _trunk_batch(model, data.images[:n], device, amp_dtype)
        start = time.perf_counter()
        _trunk_batch(model, data.images[:n], device, amp_dtype)
        return (time.perf_counter() - start) / max(n, 1)
    finally:
        embed.train(was_training)


def trunk_spec(trunk: nn.Module, image_size: int, amp_dtype: torch.dtype | None) -> str:
    """What a trunk output depends on besides its photo: the trunk's weights and buffers (a digest), the input size,
    the precision and torch's version."""
    h = hashlib.blake2b(digest_size=16)
    for name, value in sorted(trunk.state_dict().items()):
        h.update(name.encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"trunk {h.hexdigest()} {image_size} px {amp_dtype} torch {torch.__version__}"


class TokenPhase:
    """The cached trunk outputs of the train and val images, and the optimizer and schedule of the epochs on
    them (AdamW over everything but the trunk, one epoch of warmup, cosine to zero over ``epochs``), the outputs kept
in ``cache`` (a second run's head start reads them there); each epoch
    makes ``passes`` passes over the training outputs (:mod:`vit_flowers.training.recipe`: a small folder's head
    start counted in optimizer steps)."""

    def __init__(self, model: ViT, train: TensorImageDataset, val: TensorImageDataset, *, recipe: Recipe, lr: float,
                 weight_decay: float, batch_size: int, label_smoothing: float, device: torch.device,
                 amp_dtype: torch.dtype | None, progress: bool,
                 cache: PhotoCache | None = None, trunk_batch: int = INFERENCE_BATCH) -> None:
        self.model, self.device, self.amp_dtype, self.passes = model, device, amp_dtype, recipe.passes
        self.batch_size, self.label_smoothing = batch_size, label_smoothing
        start = time.perf_counter()
        outputs = [trunk_outputs(model, data, trunk_batch, device, amp_dtype, f"trunk ({name})", progress, cache)
                   for data, name in ((train, "train"), (val, "val"))]
        (self.train_x, computed), (self.val_x, val_computed) = outputs
        self.train_y, self.val_y = train.labels, val.labels
        self.cache_seconds = time.perf_counter() - start  # what the outputs took: a pass, or reading the cache
        photos = len(train) + len(val)
        # seconds a photo takes through the trunk, what the plan of the end-to-end epochs and the end of the run reads:
        # the pass's own when it computed every photo; one batch timed when the photo cache gave some (or all)
        self.forward_per_photo = (self.cache_seconds / max(photos, 1) if computed + val_computed == photos
                                  else timed_forward(model, train if len(train) else val, trunk_batch, device,
                                                     amp_dtype))
        self.steps = recipe.steps_per_pass * recipe.passes  # optimizer steps an epoch
        epochs = recipe.head_epochs
        self.optimizer = create_optimizer_v2(param_groups(model, weight_decay, trunk_lr_scale=None), "adamw", lr=lr,
                                             weight_decay=weight_decay)
        self.warmup = min(self.steps, max(0, epochs * self.steps - 1))
        self.scheduler = CosineLRScheduler(self.optimizer, t_initial=max(1, epochs * self.steps - self.warmup),
                                           lr_min=0.0, warmup_t=self.warmup, warmup_lr_init=lr * 0.01,
                                           warmup_prefix=True, t_in_epochs=False)
        self.step_count = 0
        # a feature head's logits of the train and val photos (fix_feature_logits), once its classifier is fitted
        self.train_f: torch.Tensor | None = None
        self.val_f: torch.Tensor | None = None
        log.info("token cache: the trunk's output for %d train and %d val photos in %.0f s (%.0f photos/s, %.0f MB)",
                 len(self.train_y), len(self.val_y), self.cache_seconds,
                 (len(self.train_y) + len(self.val_y)) / max(self.cache_seconds, 1e-9),
                 (self.train_x.nbytes + self.val_x.nbytes) / 2**20)

    def plan(self, epochs: int) -> None:
        """End the cosine with epoch ``epochs`` (a time budget that fits fewer epochs than were asked for)."""
        self.scheduler.t_initial = max(1, epochs * self.steps - self.warmup)

    def end_to_end_epoch_estimate(self, train_images: int) -> float:
        """Seconds an end-to-end epoch over ``train_images`` photos should take, from the trunk's forward pass."""
        return self.forward_per_photo * (STEP_OVER_FORWARD * train_images + len(self.val_y))

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's and the schedule's state and the steps taken: what a resumed head start goes on from."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "step_count": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step_count = int(state["step_count"])

    @torch.inference_mode()
    def fix_feature_logits(self) -> None:
        """Compute the model's feature head's logits of every cached photo once: that head does not train in the
        head start, and it reads the pooled grid, which a flip leaves as it is (:meth:`_logits` adds them)."""
        head = self.model.feature_head
        if head is None:
            return
        self.train_f, self.val_f = (torch.cat([head(x.to(self.device).float()) for x in grids.split(256)])
                                    if len(grids) else torch.zeros(0, self.model.num_classes)
                                    for grids in (self.train_x, self.val_x))

    def _logits(self, features: torch.Tensor, fixed: torch.Tensor | None = None) -> torch.Tensor:
        """Cached grids (B, C, h, w) -> logits (B, K); ``fixed``: their feature head's, from
        :meth:`fix_feature_logits`."""
        grid = features.to(self.device).float()  # (B, C, h, w)
        tokens = self.model.forward_features(hybrid_embed(self.model.to_patch_embedding).tokens(grid), embedded=True)
        if fixed is None:
            return self.model.classify(tokens, grid).float()
        return (self.model.forward_head(tokens) + fixed.to(self.device)).float()

    def train_epoch(self, generator: torch.Generator, desc: str = "head start",
                    late: Callable[[float, float], bool] | None = None) -> dict[str, float]:
        """``passes`` passes over the cached training outputs, each in a random order, each grid flipped with
        probability 1/2 (``desc``: the epoch, as the progress file says it). ``late``: as an end-to-end epoch's
        (:func:`.steps.train_one_epoch`), told the seconds a photo and a step so far, whether the time budget needs
        the epoch to stop before its next step."""
        self.model.train()
        per_pass = self.steps // self.passes  # full batches (a folder smaller than one batch: all of it)
        batches = [order[step * self.batch_size: (step + 1) * self.batch_size]
                   for order in (torch.randperm(len(self.train_y), generator=generator) for _ in range(self.passes))
                   for step in range(per_pass)]
        flips = [torch.rand(len(idx), generator=generator) < 0.5 for idx in batches]  # drawn whether or not it stops
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
        start = time.perf_counter()
        for step, (idx, flip) in enumerate(tracked(list(zip(batches, flips)), desc, len(batches))):
            took = time.perf_counter() - start
            if step and late is not None and late(took / totals[2].item(), took / step):
                log.warning("time budget: the machine is slower than the plan read; %s stops after %d of its %d "
                            "steps so that the run ends in time", desc, step, len(batches))
                break
            x, y = self.train_x[idx], self.train_y[idx].to(self.device)
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)  # (B, C, h, w)
            with autocast(self.device, self.amp_dtype):
                logits = self._logits(x, None if self.train_f is None else self.train_f[idx])
                loss = F.cross_entropy(logits, y, label_smoothing=self.label_smoothing)
            if not math.isfinite(loss.item()):
                raise FloatingPointError(f"the loss on the cached trunk outputs became {loss.item()}")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.step_count += 1
            self.scheduler.step_update(self.step_count)
            totals += torch.tensor([loss.item() * len(idx), (logits.argmax(-1) == y).sum().item(), len(idx)],
                                   dtype=torch.float64)
        seconds = time.perf_counter() - start
        return {"train_loss": totals[0].item() / totals[2].item(), "train_acc": totals[1].item() / totals[2].item(),
                "seconds": seconds, "images_per_s": totals[2].item() / seconds}

    @torch.inference_mode()
    def validate(self) -> tuple[float, float]:
        """(loss, accuracy) on the cached val outputs: the same figures as validating on the images, since the
        trunk has not changed."""
        self.model.eval()
        loss, correct = 0.0, 0
        fixed = self.val_f.split(256) if self.val_f is not None else [None] * len(self.val_y.split(256))
        for x, y, f in zip(self.val_x.split(256), self.val_y.split(256), fixed):
            with autocast(self.device, self.amp_dtype):
                logits = self._logits(x, f)
            y = y.to(self.device)
            loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(-1) == y).sum().item()
        return loss / max(len(self.val_y), 1), correct / max(len(self.val_y), 1)
