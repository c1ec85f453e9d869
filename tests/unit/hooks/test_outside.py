"""The hooks on a node outside the policy (node.yaml ``outside_policy: yes``, as `gpushare node install
--outside-policy` writes it): the site's merged slurm.conf runs them there, and they do nothing of ours. The
prolog, epilog and ns-caps hook exit 0 without a policy, a GPU, a journal or a Slurm call; the task prolog
exports nothing for a GPU job; the health check runs only the site's program and its exit code is the site's;
`gpushare node boot` changes nothing."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpushare.cli.node import node as node_cli
from slurm_gpushare.hooks import epilog as epilog_hook
from slurm_gpushare.hooks import health as health_hook
from slurm_gpushare.hooks import nscaps as nscaps_hook
from slurm_gpushare.hooks import prolog as prolog_hook
from slurm_gpushare.node import taskprolog
from slurm_gpushare.node.nodeconfig import NodeConfigError, read_config
from slurm_gpushare.proc import run

NODE = "legacy-gpu01"


def nothing_runs(argv, **kwargs):
    raise AssertionError(f"a hook outside the policy ran {list(argv)}")


def outside_config(tmp_path: Path, site_program: Path | None = None) -> Path:
    config = tmp_path / "node.yaml"
    text = "outside_policy: yes\n" + (f"site_health_program: {site_program}\n" if site_program else "")
    config.write_text(text)
    os.chmod(config, 0o644)
    return config


def job_env(config: Path, job_id: int = 41) -> dict[str, str]:
    """A GPU job's environment on the node (its GPUs are the site's, as the site's gres.conf declares them)."""
    return {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURM_JOB_USER": "dave",
        "SLURMD_NODENAME": NODE,
        "SLURM_JOB_GPUS": "0,1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SLURM_NS": "/var/spool/slurm/gpushare-ns/41/.ns",
        "GPUSHARE_NODE_CONFIG": str(config),
    }


def test_the_prolog_and_epilog_do_nothing_and_succeed(tmp_path):
    """No policy file exists, no fake NVML is named (real NVML would fail here): either would fail the hook."""
    config = outside_config(tmp_path)
    env = job_env(config)
    assert prolog_hook.main(env, runner=nothing_runs) == 0
    assert epilog_hook.main(env, runner=nothing_runs) == 0
    assert nscaps_hook.main(env, runner=nothing_runs) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.yaml"]  # no journal, spec cache or state dir


def test_the_task_prolog_passes_the_environment_through(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    assert taskprolog.main(job_env(outside_config(tmp_path)), out, err) == 0
    assert out.getvalue() == "" and err.getvalue() == ""  # no export line: the task keeps CUDA_VISIBLE_DEVICES=0,1


def site_program(tmp_path: Path, script: str) -> Path:
    program = tmp_path / "nhc"
    program.write_text(script)
    os.chmod(program, 0o755)
    return program


def only(program: Path):
    def runner(argv, **kwargs):
        assert list(argv) == [str(program)], f"a health check outside the policy ran {list(argv)}"
        return run(argv, **kwargs)

    return runner


def test_the_health_check_runs_the_site_program_only_and_its_failure_is_the_sites(tmp_path):
    program = site_program(tmp_path, "#!/bin/sh\necho 'ERROR: nhc: /scratch is full'\nexit 3\n")
    env = {"SLURMD_NODENAME": NODE, "GPUSHARE_NODE_CONFIG": str(outside_config(tmp_path, program))}
    lines: list[str] = []
    rc: list[int] = []
    health_hook.health(env, runner=only(program), out=lines.append, site_rc=rc)
    assert lines == [
        f"node {NODE}: outside the policy ({tmp_path / 'node.yaml'}): no gpushare checks; the site's health "
        f"program {program} runs",
        f"site health program {program}: ERROR: nhc: /scratch is full",
        f"site health program {program}: exited 3",
    ]
    assert rc == [3]
    assert health_hook.main(env, runner=only(program)) == 3


def test_a_passing_site_program_or_none_exits_0(tmp_path):
    program = site_program(tmp_path, "#!/bin/sh\nexit 0\n")
    env = {"SLURMD_NODENAME": NODE, "GPUSHARE_NODE_CONFIG": str(outside_config(tmp_path, program))}
    assert health_hook.main(env, runner=only(program)) == 0
    env["GPUSHARE_NODE_CONFIG"] = str(outside_config(tmp_path))
    lines: list[str] = []
    health_hook.health(env, runner=nothing_runs, out=lines.append)
    assert lines == [
        f"node {NODE}: outside the policy ({tmp_path / 'node.yaml'}): no gpushare checks; no site health program"
    ]
    assert health_hook.main(env, runner=nothing_runs) == 0


def test_a_site_program_that_cannot_start_is_the_sites_failure(tmp_path):
    program = tmp_path / "missing-nhc"
    env = {"SLURMD_NODENAME": NODE, "GPUSHARE_NODE_CONFIG": str(outside_config(tmp_path, program))}
    lines: list[str] = []
    health_hook.health(env, out=lines.append)
    assert lines[1].startswith(f"site health program {program}: `{program}` could not start"), lines
    assert health_hook.main(env) == 1


def test_node_boot_changes_nothing(tmp_path):
    config = outside_config(tmp_path)
    done = CliRunner().invoke(node_cli, ["boot", "--node-config", str(config), "--node", NODE])
    assert done.exit_code == 0, done.output
    assert done.output == f"node {NODE}: outside the policy (outside_policy in {config}): nothing to do at boot\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("outside_policy: yes\npolicy: /etc/gpushare/policy.yaml\n", "belong to a node of the policy"),
        ("outside_policy: yes\nstate_dir: /var/lib/gpushare\n", "takes only site_health_program besides; state_dir"),
        ("outside_policy: no\n", "the one value is 'yes'"),
        ("site_health_program: /usr/sbin/nhc\n", "is for a node outside the policy (outside_policy: yes)"),
    ],
)
def test_a_node_config_mixing_the_two_kinds_of_node_is_refused(tmp_path, text, says):
    config = tmp_path / "node.yaml"
    config.write_text(text)
    os.chmod(config, 0o644)
    with pytest.raises(NodeConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        read_config(config)
    out, err = io.StringIO(), io.StringIO()
    assert taskprolog.main({"SLURM_JOB_ID": "5", "GPUSHARE_NODE_CONFIG": str(config)}, out, err) == 1
    assert says in err.getvalue() and out.getvalue() == ""


def test_the_outside_config_reads_as_such(tmp_path):
    config = read_config(outside_config(tmp_path, Path("/usr/sbin/nhc")))
    assert config.outside_policy and config.site_health_program_str == "/usr/sbin/nhc"
    plain = tmp_path / "plain.yaml"
    plain.write_text("policy: /etc/gpushare/policy.yaml\n")
    os.chmod(plain, 0o644)
    assert not read_config(plain).outside_policy and read_config(plain).site_health_program_str is None
