"""Models: torchvision architectures by name (`-a resnet50`), or timm's (`-a timm/resnet50d`),
optionally initialised from a local weights file."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torchvision

from .errors import UsageError

# `-a timm/NAME`: NAME is one of timm's architectures (timm is installed for its optimizers).
# Random initialisation, like torchvision's here; weights come from --pretrained FILE only.
TIMM_PREFIX = "timm/"


def available_archs() -> list:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def arch_slug(arch: str) -> str:
    """The architecture's name as a run directory's name holds it (no path separator)."""
    return arch.replace("/", "-")


def load_command(arch: str, num_classes: int) -> str:
    """How to build the architecture to load exported weights into."""
    if arch.startswith(TIMM_PREFIX):
        return (f"timm.create_model({arch[len(TIMM_PREFIX):]!r}, num_classes={num_classes})"
                ".load_state_dict(torch.load(...))")
    return (f"torchvision.models.get_model({arch!r}, num_classes={num_classes})"
            ".load_state_dict(torch.load(...))")


def build_model(arch: str, num_classes: int, pretrained: Optional[str] = None,
                zero_init_residual: bool = False) -> nn.Module:
    """`zero_init_residual`: the last BatchNorm of each residual block starts at 0, so every
    block starts as the identity (Goyal et al.; timm's ResNets do it by default)."""
    if arch.startswith(TIMM_PREFIX):
        model = _timm_model(arch[len(TIMM_PREFIX):], num_classes, zero_init_residual)
    else:
        model = _torchvision_model(arch, num_classes, zero_init_residual)
    if pretrained:
        load_pretrained(model, Path(pretrained))
    return model


# Every torchvision and timm classifier takes ImageNet's 224-pixel crops; some refuse smaller.
TAKEN_BY_ALL = 224


def input_size_refusal(arch: str, size: int) -> Optional[str]:
    """Why `-a arch` cannot take `size`-pixel crops (its layers shrink them to nothing, or it
    checks the size itself), from one forward pass of a blank image through a copy of the
    model, made only below TAKEN_BY_ALL; None where it takes them."""
    if size >= TAKEN_BY_ALL:
        return None
    model = build_model(arch, num_classes=2).eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, size, size))
    except (RuntimeError, ValueError, AssertionError) as err:
        said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (f"-a {arch} cannot take {size}x{size} crops ({said}): raise --image-size "
                f"(and --val-crop-size) to {TAKEN_BY_ALL}, ImageNet's, or pick a model that "
                "takes small images (resnet*, timm/test_resnet)")
    return None


def _torchvision_model(arch: str, num_classes: int, zero_init_residual: bool) -> nn.Module:
    if arch not in available_archs():
        close = [a for a in available_archs() if a.startswith(arch[:4])][:8]
        raise UsageError(f"unknown architecture {arch!r}; torchvision classification models "
                         f"include {close or available_archs()[:8]} (see torchvision.models), "
                         f"and timm's are named {TIMM_PREFIX}NAME")
    extra = {"zero_init_residual": True} if zero_init_residual else {}
    try:
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes,
                                            **extra)
    except TypeError:
        if not extra:
            raise
        raise UsageError(f"--zero-init-residual: {arch} has no residual blocks of the kind it "
                         "applies to (torchvision's ResNet family: resnet*, resnext*, "
                         "wide_resnet*)") from None


def _timm_model(name: str, num_classes: int, zero_init_residual: bool) -> nn.Module:
    import timm

    if not timm.is_model(name):
        family = re.match(r"[^\d]*", name).group()  # resnet5000 -> resnet*
        close = timm.list_models(f"{family}*")[:8] if family else []
        raise UsageError(f"unknown architecture {TIMM_PREFIX + name!r}; timm's include "
                         f"{close or timm.list_models()[:8]} (see timm.list_models())")
    # timm's ResNets take zero_init_last (their default is on); other families do not
    extra = {"zero_init_last": True} if zero_init_residual else {}
    try:
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **extra)
    except TypeError:
        if not extra:
            raise
        raise UsageError(f"--zero-init-residual: {TIMM_PREFIX}{name} takes no zero_init_last "
                         "(timm's ResNet family does, and zero-inits by default)") from None


def load_pretrained(model: nn.Module, path: Path) -> None:
    """Load a state_dict file (e.g. torchvision's resnet50-*.pth, downloaded beforehand).

    A classifier of another shape (another class count) is skipped with a notice, so the same
    file serves fine-tuning on a smaller label set; any other mismatch is an error.
    """
    if not path.is_file():
        raise UsageError(f"--pretrained {path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UsageError(f"--pretrained {path} is not a loadable weights file: {err}") from None
    state = state.get("model", state) if isinstance(state, dict) else state
    if not isinstance(state, dict):
        raise UsageError(f"--pretrained {path} does not hold a state_dict")
    own = model.state_dict()
    unexpected = [k for k in state if k not in own]
    missing = [k for k in own if k not in state]
    if unexpected or missing:
        raise UsageError(f"--pretrained {path} does not fit this architecture (missing keys such "
                         f"as {missing[:3]}, unexpected keys such as {unexpected[:3]})")
    # Only the classifier may differ in shape (another class count); anything else means the
    # file belongs to another model variant.
    classifier = next(k for k in reversed(own) if k.endswith("weight")).rsplit(".", 1)[0]
    mismatched = [k for k, v in state.items() if v.shape != own[k].shape]
    wrong = [k for k in mismatched if not k.startswith(classifier + ".")]
    if wrong:
        raise UsageError(f"--pretrained {path} does not fit this architecture "
                         f"(shapes differ for {wrong[:3]})")
    if mismatched:
        print(f"note: --pretrained: not loading {mismatched} (another class count; "
              "the classifier starts from scratch)")
    own.update({k: v for k, v in state.items() if k not in mismatched})
    model.load_state_dict(own)
