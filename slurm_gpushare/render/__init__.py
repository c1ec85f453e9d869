"""Rendering: policy in, text out. Pure (no file or process I/O)."""

from .files import OUTPUTS, render_all
from .header import COMMENT, header_ok

__all__ = ["COMMENT", "OUTPUTS", "header_ok", "render_all"]
