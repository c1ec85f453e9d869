"""Read a policy file into a validated ``Site``, reporting every problem at once."""

from __future__ import annotations

import hashlib
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from ..errors import PolicyError, Problem
from ..slurmversion import OLDEST_SUPPORTED, TESTED, SlurmVersion
from . import perjob
from .groups import declared_models, resolve_groups
from .model import Policy
from .rules import (
    build_tiers,
    check_billing,
    check_features,
    check_routes,
    check_submission,
    check_tenants,
    check_tier_submission,
    check_types,
)
from .site import Site

if typing.TYPE_CHECKING:
    _SafeLoader = yaml.SafeLoader  # the checker sees the pure-Python loader, whose interface CSafeLoader shares
else:
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it: ~10x faster


class _StrictLoader(_SafeLoader):
    """SafeLoader that refuses duplicate keys instead of keeping the last one silently."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
            )
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError(source, [Problem("", f"not valid YAML: {exc}")]) from None


def load_file(path: str | Path, slurm_version: str | None = None) -> Site:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(str(path), [Problem("", f"cannot read policy: {exc.strerror}")]) from None
    return load_bytes(data, path.name, slurm_version)


def load_bytes(data: bytes, source: str, slurm_version: str | None = None) -> Site:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(source, [Problem("", f"not UTF-8 text ({exc.reason} at byte {exc.start})")]) from None
    raw = parse_yaml(text, source)
    return build_site(raw, source, hashlib.sha256(data).hexdigest(), slurm_version)


def build_site(raw: object, source: str, digest: str = "", slurm_version: str | None = None) -> Site:
    if not isinstance(raw, dict):
        raise PolicyError(source, [Problem("", "the policy must be a YAML mapping with 'version: 1' at the top")])
    try:
        policy = Policy.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(source, [_problem(e) for e in exc.errors()]) from None
    problems: list[Problem] = []
    version = _version(slurm_version or policy.cluster.slurm_version, problems)
    declared, found = declared_models(policy.gpu_models)
    problems += found
    groups, found = resolve_groups(policy.node_groups, version or OLDEST_SUPPORTED, declared)
    problems += found
    problems += check_types(policy, groups)
    problems += check_features(policy, groups)
    problems += check_tenants(policy)
    tiers, found = build_tiers(policy, groups)
    problems += found
    problems += check_billing(policy, declared)
    problems += check_submission(policy, groups)
    problems += check_routes(policy, groups, tiers)
    problems += perjob.check_site(policy, groups)
    problems += check_tier_submission(tiers, version)
    if problems or version is None:  # no version without a problem saying why
        raise PolicyError(source, problems)
    return Site(policy, version, tuple(groups), tuple(tiers), source, digest)


def _version(value, problems: list[Problem]) -> SlurmVersion | None:
    try:
        version = SlurmVersion.parse(value)
    except ValueError as exc:
        problems.append(Problem("cluster.slurm_version", str(exc)))
        return None
    if version < OLDEST_SUPPORTED:
        problems.append(
            Problem(
                "cluster.slurm_version",
                f"Slurm {version} is not supported: {OLDEST_SUPPORTED} or newer (tested: {', '.join(TESTED)})",
            )
        )
    return version


def _problem(error: ErrorDetails) -> Problem:
    loc = error["loc"]
    path = _format_loc(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        return Problem(path, f"unknown key; allowed here: {', '.join(allowed)}" if allowed else "unknown key")
    if kind == "missing":
        return Problem(path, "required key is missing")
    if kind == "literal_error" and loc == ("version",):
        return Problem(path, "must be 1 (the only policy format this release reads)")
    return Problem(path, error["msg"])


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "int", "float", "list[str]", "bool") or "[" in str(part):
            continue  # pydantic's union branch labels
        else:
            out += f".{part}" if out else str(part)
    return out


def _allowed_keys(loc: tuple) -> list[str]:
    """Walk the model along ``loc`` to name the keys allowed where an unknown one was found."""
    model: type[BaseModel] | None = Policy
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        model = _model_in(field.annotation)
    return sorted(model.model_fields) if model else []


def _model_in(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found:
            return found
    return None
