"""The model options: which network, its starting weights, its layout and compilation."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..registry import ENGINE_LOOP
from .fields import MODEL, Section, opt


@dataclass(frozen=True)
class ModelOptions(Section):
    """The network and how it is built."""
    arch: str = field(default="resnet50", metadata=opt(
        MODEL, "-a", "--arch",
        help="torchvision model name, e.g. resnet18, resnet50; timm's as timm/NAME, e.g. "
             "timm/resnet50d", evaluation=True))
    pretrained: Optional[str] = field(default=None, metadata=opt(
        MODEL, "--pretrained", nargs="?", const="",  # bare: pytorch/examples' (peer_flags)
        help="path of a local weights file (state_dict) to start from"))
    zero_init_residual: bool = field(default=False, metadata=opt(
        MODEL, "--zero-init-residual", help="start the last BatchNorm of each residual block "
                                            "at zero (ResNet family; Goyal et al.)"))
    channels_last: Optional[bool] = field(default=None, metadata=opt(
        MODEL, "--channels-last",
        help="the channels_last memory format for the model and the batches; unset: on where "
             "it is the faster layout (a CPU at crops of 112 px and more; a GPU with a half "
             "type), off for small crops on a CPU and for fp32 on a GPU", evaluation=True))
    compile: bool = field(default=False, metadata=opt(
        MODEL, "--compile", help="torch.compile the model", needs=ENGINE_LOOP))
