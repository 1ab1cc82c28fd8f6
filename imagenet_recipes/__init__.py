"""Shared engine of the ImageNet training recipes (imported by the entry scripts in train/)."""
