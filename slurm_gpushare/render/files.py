"""One function per output file (the header they carry: header.py)."""

from __future__ import annotations

from ..policy import Site
from . import context as ctx
from .env import environment
from .header import COMMENT, with_header
from .jobsubmit import render_body as job_submit_lua_body

OUTPUTS = ("slurm.conf", "slurm-gpushare.conf", "gres.conf", "cgroup.conf", "job_submit.lua")
JOB_CONTAINER = "job_container.conf"  # only where per-job MIG isolates its jobs (context.job_container)


def _base(site: Site) -> dict:
    return {"site": site, "cluster": site.cluster, "policy": site.policy, "version": site.version, "ctx": ctx}


def slurm_fragment(site: Site) -> str:
    return environment().get_template("slurm-gpushare.conf.j2").render(**_base(site))


def slurm_conf(site: Site) -> str:
    return environment().get_template("slurm.conf.j2").render(fragment=slurm_fragment(site), **_base(site))


def gres_conf(site: Site) -> str:
    return environment().get_template("gres.conf.j2").render(**_base(site))


def cgroup_conf(site: Site) -> str:
    return environment().get_template("cgroup.conf.j2").render(**_base(site))


def job_container_conf(site: Site) -> str:
    return environment().get_template("job_container.conf.j2").render(**_base(site))


_RENDERERS = {
    "slurm.conf": slurm_conf,
    "slurm-gpushare.conf": slurm_fragment,
    "gres.conf": gres_conf,
    "cgroup.conf": cgroup_conf,
    "job_submit.lua": job_submit_lua_body,
    JOB_CONTAINER: job_container_conf,
}


def render_all(site: Site) -> dict[str, str]:
    """Every output file, each with its header; same site in, byte-identical text out."""
    names = OUTPUTS + ((JOB_CONTAINER,) if ctx.job_container(site) is not None else ())
    return {name: with_header(site, name, _RENDERERS[name](site), COMMENT.get(name, "#")) for name in names}
