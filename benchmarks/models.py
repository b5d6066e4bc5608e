"""The models of the training-step benchmark (train_step.py), in flax.linen, channels-last.

Each model takes its Conv class (`conv`), the only thing the backends change, and its compute dtype; parameters
stay float32. The image classifiers have torchvision's layer structure and parameter counts:
- ResNet-18 and ResNet-50 (v1.5, the stride on the 3x3), after Flax's ImageNet example: BatchNorm, ReLU.
- MobileNetV2 (width 1.0): inverted residuals of a 1x1 expansion, a 3x3 depthwise conv and a 1x1 projection,
  BatchNorm, ReLU6.
- ConvNeXt-T: a 4x4/4 patchify stem, blocks of a 7x7 depthwise conv, LayerNorm, two dense layers (the 1x1
  convolutions, as the reference implementation computes them), GELU and a layer scale, 2x2/2 downsampling.
And two models of few-channel and 3-D convolutions:
- a 3-D UNet (16, 32, 64 channels; two 3x3x3 conv + BatchNorm + ReLU per level, 2x2x2 max-pool down, nearest
  upsampling and skip concatenation up, a 1x1x1 classifier), per-voxel segmentation of one-channel volumes;
- the Mixed-Scale Dense network (Pelt and Sethian, PNAS 2018) of width 1 and depth 50: layer i convolves the
  concatenation of the image and every earlier layer's output (1 + i channels) with one 3x3 filter of dilation
  i mod 10 + 1, bias and ReLU; a 1x1 conv over all 51 channels regresses the output image.
Each entry of MODELS states its input, task and default sizes (ModelSpec). `num_convs` counts a model's
convolutions: the training step runs three per convolution (fwd, dgrad, wgrad), less the first one's data
gradient (the input is not differentiated).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax.numpy as jnp
from flax import linen as nn

import jaxconv

ModuleDef = Any

CONV_CLASSES = {"jaxconv": functools.partial(nn.Conv, conv_general_dilated=jaxconv.conv_general_dilated),
                "lax": nn.Conv}


# ---------------------------------------------------------------------------------------------------------
# ResNet (Flax's ImageNet example).
# ---------------------------------------------------------------------------------------------------------
def _shortcut(block: nn.Module, x, features: int):
  """The identity, or a strided 1x1 conv + BN where the block changes the shape."""
  if block.strides == 1 and x.shape[-1] == features:
    return x
  return block.norm(name="proj_bn")(block.conv(features, (1, 1), block.strides, name="proj_conv")(x))


class _ResNetBlock(nn.Module):
  """The fields of both ResNet blocks: filters, the Conv and BatchNorm partials, the stride of the block."""
  filters: int
  conv: ModuleDef
  norm: ModuleDef
  strides: int = 1


class BasicBlock(_ResNetBlock):
  """ResNet-18/34 block: two 3x3 convs, the first one strided."""

  @nn.compact
  def __call__(self, x):
    y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(x)))
    y = self.norm()(self.conv(self.filters, (3, 3))(y))
    return nn.relu(_shortcut(self, x, self.filters) + y)


class Bottleneck(_ResNetBlock):
  """ResNet-50 block, v1.5: 1x1 reduce, strided 3x3, 1x1 expand (x4)."""

  @nn.compact
  def __call__(self, x):
    y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x)))
    y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(y)))
    y = self.norm()(self.conv(4 * self.filters, (1, 1))(y))
    return nn.relu(_shortcut(self, x, 4 * self.filters) + y)


def _conv_and_norm(model: nn.Module, train: bool):
  """The bias-free Conv and the BatchNorm of the BatchNorm models, in the model's compute dtype."""
  conv = functools.partial(model.conv, use_bias=False, dtype=model.dtype)
  norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5,
                           dtype=model.dtype)
  return conv, norm


def _pooled_head(model: nn.Module, x):
  """Global average pool, then the dense classifier (float32 logits)."""
  return nn.Dense(model.num_classes, dtype=model.dtype, name="head")(jnp.mean(x, axis=(1, 2))).astype(jnp.float32)


class ResNet(nn.Module):
  """7x7/2 stem + 3x3/2 max-pool, four stages (64, 128, 256, 512 filters), global average pool, dense head."""
  stage_sizes: Sequence[int]
  block: ModuleDef
  conv: ModuleDef = nn.Conv
  num_classes: int = 1000
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv, norm = _conv_and_norm(self, train)
    x = conv(64, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="stem_conv")(x)
    x = nn.relu(norm(name="stem_bn")(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for i, n_blocks in enumerate(self.stage_sizes):
      for j in range(n_blocks):
        x = self.block(64 * 2 ** i, conv, norm, strides=2 if i > 0 and j == 0 else 1)(x)
    return _pooled_head(self, x)


def _resnet_convs(stages: Sequence[int], block) -> int:
  """Stem + convs per block + one projection per stage (the first stage's projection comes from the channel
  change of the Bottleneck, not from a stride)."""
  per_block = 2 if block is BasicBlock else 3
  projections = 3 if block is BasicBlock else 4
  return 1 + per_block * sum(stages) + projections


# ---------------------------------------------------------------------------------------------------------
# MobileNetV2.
# ---------------------------------------------------------------------------------------------------------
# (expansion t, output channels c, blocks n, stride of the first block s), as in the paper's table 2.
MOBILENETV2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                      (6, 320, 1, 1))


class InvertedResidual(nn.Module):
  """1x1 expansion (none at t = 1), 3x3 depthwise conv (strided), linear 1x1 projection; the identity shortcut
  where the shape is kept."""
  features: int
  expansion: int
  strides: int
  conv: ModuleDef
  norm: ModuleDef

  @nn.compact
  def __call__(self, x):
    hidden = x.shape[-1] * self.expansion
    y = x
    if self.expansion != 1:
      y = nn.relu6(self.norm()(self.conv(hidden, (1, 1))(y)))
    y = self.conv(hidden, (3, 3), self.strides, padding=((1, 1), (1, 1)), feature_group_count=hidden)(y)
    y = nn.relu6(self.norm()(y))
    y = self.norm()(self.conv(self.features, (1, 1))(y))
    return x + y if self.strides == 1 and x.shape[-1] == self.features else y


class MobileNetV2(nn.Module):
  conv: ModuleDef = nn.Conv
  num_classes: int = 1000
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv, norm = _conv_and_norm(self, train)
    x = nn.relu6(norm(name="stem_bn")(conv(32, (3, 3), (2, 2), padding=((1, 1), (1, 1)), name="stem_conv")(x)))
    for t, c, n, s in MOBILENETV2_STAGES:
      for j in range(n):
        x = InvertedResidual(c, t, s if j == 0 else 1, conv, norm)(x)
    x = nn.relu6(norm(name="last_bn")(conv(1280, (1, 1), name="last_conv")(x)))
    return _pooled_head(self, x)


def _mobilenetv2_convs() -> int:
  blocks = [(t, n) for t, _, n, _ in MOBILENETV2_STAGES]
  return 1 + sum(n * (2 if t == 1 else 3) for t, n in blocks) + 1


# ---------------------------------------------------------------------------------------------------------
# ConvNeXt-T.
# ---------------------------------------------------------------------------------------------------------
CONVNEXT_T = ((3, 3, 9, 3), (96, 192, 384, 768))
LAYER_SCALE_INIT = 1e-6


class ConvNeXtBlock(nn.Module):
  """7x7 depthwise conv, LayerNorm, dense 4x expansion, GELU, dense projection, layer scale, residual."""
  conv: ModuleDef
  dtype: Any

  @nn.compact
  def __call__(self, x):
    dim = x.shape[-1]
    y = self.conv(dim, (7, 7), padding=((3, 3), (3, 3)), feature_group_count=dim, dtype=self.dtype)(x)
    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype)(y)
    y = nn.gelu(nn.Dense(4 * dim, dtype=self.dtype)(y))
    y = nn.Dense(dim, dtype=self.dtype)(y)
    gamma = self.param("layer_scale", nn.initializers.constant(LAYER_SCALE_INIT), (dim,), jnp.float32)
    return x + (gamma * y).astype(x.dtype)


class ConvNeXt(nn.Module):
  depths: Sequence[int]
  dims: Sequence[int]
  conv: ModuleDef = nn.Conv
  num_classes: int = 1000
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, x, train: bool = True):
    del train  # LayerNorm only: no batch statistics
    ln = functools.partial(nn.LayerNorm, epsilon=1e-6, dtype=self.dtype)
    x = self.conv(self.dims[0], (4, 4), (4, 4), padding="VALID", dtype=self.dtype, name="stem_conv")(x)
    x = ln(name="stem_ln")(x)
    for i, (depth, dim) in enumerate(zip(self.depths, self.dims)):
      if i > 0:
        x = ln(name=f"down{i}_ln")(x)
        x = self.conv(dim, (2, 2), (2, 2), padding="VALID", dtype=self.dtype, name=f"down{i}_conv")(x)
      for _ in range(depth):
        x = ConvNeXtBlock(self.conv, self.dtype)(x)
    x = ln(name="head_ln")(jnp.mean(x, axis=(1, 2)))
    return nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------------
# 3-D UNet.
# ---------------------------------------------------------------------------------------------------------
class UNet3D(nn.Module):
  channels: Sequence[int] = (16, 32, 64)
  classes: int = 2
  conv: ModuleDef = nn.Conv
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv, norm = _conv_and_norm(self, train)

    def double(x, c):
      for _ in range(2):
        x = nn.relu(norm()(conv(c, (3, 3, 3))(x)))
      return x

    skips = []
    for c in self.channels[:-1]:
      x = double(x, c)
      skips.append(x)
      x = nn.max_pool(x, (2, 2, 2), strides=(2, 2, 2))
    x = double(x, self.channels[-1])
    for c, skip in zip(reversed(self.channels[:-1]), reversed(skips)):
      for axis in (1, 2, 3):  # nearest-neighbour upsampling by 2
        x = jnp.repeat(x, 2, axis=axis)
      x = double(jnp.concatenate([x, skip], axis=-1), c)
    return self.conv(self.classes, (1, 1, 1), dtype=self.dtype, name="classifier")(x).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------------
# Mixed-Scale Dense network.
# ---------------------------------------------------------------------------------------------------------
class MSDNet(nn.Module):
  depth: int = 50
  width: int = 1
  max_dilation: int = 10
  conv: ModuleDef = nn.Conv
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    del train  # no normalisation layers
    features = x
    for i in range(self.depth):
      d = i % self.max_dilation + 1
      y = self.conv(self.width, (3, 3), padding=((d, d), (d, d)), kernel_dilation=(d, d), dtype=self.dtype)(features)
      features = jnp.concatenate([features, nn.relu(y)], axis=-1)
    return self.conv(1, (1, 1), dtype=self.dtype, name="out_conv")(features).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------------
# The table the benchmark takes its --models from.
# ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A model of the benchmark: its constructor make(conv=, dtype=), its convolutions, and its input and task.

  task: "classify" (logits (N, classes) against integer labels), "segment" (logits (N, *spatial, classes) against
  a label per voxel) or "regress" (an output image against a target image, mean squared error). The input is
  (N, *[image] * nd, in_channels); batch and image are the full-scale defaults, quick_image the --quick one.
  """
  make: Callable[..., nn.Module]
  num_convs: int
  task: str = "classify"
  classes: int = 1000
  nd: int = 2
  in_channels: int = 3
  batch: int = 128
  image: int = 224
  quick_image: int = 64


MODELS: dict[str, ModelSpec] = {
    "resnet18": ModelSpec(functools.partial(ResNet, (2, 2, 2, 2), BasicBlock), _resnet_convs((2, 2, 2, 2), BasicBlock)),
    "resnet50": ModelSpec(functools.partial(ResNet, (3, 4, 6, 3), Bottleneck), _resnet_convs((3, 4, 6, 3), Bottleneck)),
    "mobilenetv2": ModelSpec(MobileNetV2, _mobilenetv2_convs(), batch=64),
    "convnext_t": ModelSpec(functools.partial(ConvNeXt, *CONVNEXT_T), 1 + sum(CONVNEXT_T[0]) + len(CONVNEXT_T[0]) - 1,
                            batch=32),
    # 2 * 3 convs down and at the bottom, 2 * 2 up, the classifier.
    "unet3d": ModelSpec(UNet3D, 11, task="segment", classes=2, nd=3, in_channels=1, batch=2, image=64, quick_image=16),
    "msd": ModelSpec(MSDNet, 51, task="regress", classes=1, in_channels=1, batch=4, image=512, quick_image=64),
}


def make_model(name: str, backend: str, dtype=jnp.bfloat16) -> nn.Module:
  return MODELS[name].make(conv=CONV_CLASSES[backend], dtype=dtype)


def num_convs(name: str) -> int:
  return MODELS[name].num_convs
