"""Shared engine of the ImageNet training recipes (imported by the entry scripts in train/)."""
from .nvjpeg_wheel import load_before_torchvision

# Before any module of the package imports torchvision: nvImageCodec must find the
# nvidia-nvjpeg wheel's nvJPEG, not the older copy torchvision carries (nvjpeg_wheel.py)
load_before_torchvision()
