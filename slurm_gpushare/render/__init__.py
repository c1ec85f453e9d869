"""Rendering: policy in, text out. Pure (no file or process I/O)."""

from .files import OUTPUTS, header_ok, render_all

__all__ = ["OUTPUTS", "header_ok", "render_all"]
