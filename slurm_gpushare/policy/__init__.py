"""Site policy: model, validation and derived values. Pure."""

from .load import build_site, load_bytes, load_file
from .site import GpuSlot, Group, Site, TierView

__all__ = ["GpuSlot", "Group", "Site", "TierView", "build_site", "load_bytes", "load_file"]
