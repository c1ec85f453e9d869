"""Site policy: model, validation and derived values. Pure.

The names below are loaded on first use, so that ``policy.share`` (which the
node hooks import) does not bring in pydantic and YAML with the package.
"""

__all__ = ["GpuSlot", "Group", "Site", "TierView", "build_site", "load_bytes", "load_file"]

_FROM = {"build_site": "load", "load_bytes": "load", "load_file": "load"}


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_FROM.get(name, 'site')}", __name__), name)
