"""Capsule nets' images made showable: stereo pairs side by side, enlarged digits, several objects'
reconstructions overlaid in colours, and the pose perturbation of Sabour et al. (2017, Fig. 4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Fig. 4's tweaks of a capsule dimension: "by intervals of 0.05 in the range [-0.25, 0.25]", 11 values.
PERTURBATION_STEPS, PERTURBATION_DELTA = 11, 0.25


def displayable(images: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> images make_grid can show: stereo pairs (C = 2) side by side as one channel."""
    if images.shape[1] == 2:
        images = torch.cat([images[:, :1], images[:, 1:]], dim=-1)
    return images.float().clamp(0, 1).cpu()


def upscaled(images: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, C, H, W) enlarged ``scale`` times by repeating pixels (nearest neighbour: no blur to misread
    as the model's), so that 28-pixel digits are read at a glance in TensorBoard's image panel."""
    return F.interpolate(images, scale_factor=scale, mode="nearest") if scale > 1 else images


def overlaid(reconstructions: torch.Tensor) -> torch.Tensor:
    """(B, T, 1, H, W), one reconstruction per object -> (B, 3, H, W): object t in colour channel t
    (red, green, blue), as the MultiMNIST figure of Sabour et al. (2017, Fig. 5) shows them."""
    objects = reconstructions.shape[1]
    if objects > 3 or reconstructions.shape[2] != 1:
        raise ValueError(f"can overlay up to 3 one-channel reconstructions, got {tuple(reconstructions.shape[1:3])}")
    return F.pad(reconstructions[:, :, 0], (0, 0, 0, 0, 0, 3 - objects))


def perturbed_reconstructions(net: torch.nn.Module, images: torch.Tensor, steps: int, max_delta: float) -> torch.Tensor:
    """Sabour et al. 2017, Fig. 4: (examples, pose_dim, steps, C, H, W), the predicted class capsule of
    each image decoded with each of its dimensions tweaked by ``steps`` values evenly spaced over
    [-max_delta, max_delta] (the others kept)."""
    output = net(images)
    poses, predicted = output.poses, output.scores.argmax(dim=-1)  # (N, K, D), (N,)
    examples, _, pose_dim = poses.shape
    deltas = torch.linspace(-max_delta, max_delta, steps, device=poses.device)
    tweaked = poses[:, None, None].repeat(1, pose_dim, steps, 1, 1)  # (N, D, S, K, D)
    example = torch.arange(examples, device=poses.device)[:, None, None]
    dim = torch.arange(pose_dim, device=poses.device)[None, :, None]
    step = torch.arange(steps, device=poses.device)[None, None, :]
    tweaked[example, dim, step, predicted[:, None, None], dim] += deltas[step]
    classes = predicted.repeat_interleave(pose_dim * steps)
    decoded = net.decode(tweaked.flatten(0, 2), classes)
    return decoded.view(examples, pose_dim, steps, *decoded.shape[1:])
