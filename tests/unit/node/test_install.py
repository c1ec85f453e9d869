"""`gpushare node install` into a temporary --root: fresh install, a second run unchanged, files it did not
write refused (and replaced with --force), dry runs that write nothing, modes (and owners, as root); the hook
scripts (python -IS and the import directories site would add) and what they accept at their paths."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_gpushare.cli.node import node
from slurm_gpushare.node import install as inst
from slurm_gpushare.node.nodeconfig import read_config
from slurm_gpushare.proc import run
from tests.conftest import ROOT
from tests.unit.hooks_support import HookNode

SMALL_LAB = ROOT / "etc" / "small-lab.yaml"
DIRS = inst.probe_import_dirs(sys.executable)  # what the CLI writes into the hook scripts (this interpreter's)


def invoke(*args):
    return CliRunner().invoke(node, ["install", *map(str, args)])


@pytest.fixture
def policy(tmp_path) -> Path:
    """The small lab with its metrics directories set and a state dir of its own."""
    raw = yaml.safe_load(SMALL_LAB.read_text())
    raw["cluster"].setdefault("paths", {})["state_dir"] = "/var/lib/gpushare-test"
    raw["cluster"].setdefault("metrics", {}).update(
        textfile_dir="/var/lib/node-exporter/textfile", dcgm_job_mapping_dir="/run/gpushare/dcgm-job-mapping"
    )
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def tree(root: Path) -> dict[str, tuple[int, str | None]]:
    """path -> (mode, text) of everything under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        info = p.lstat()
        out[str(p.relative_to(root))] = (stat.S_IMODE(info.st_mode), p.read_text() if p.is_file() else None)
    return out


def paths(root: Path):
    return {
        "config": root / "etc/gpushare/node.yaml",
        "task": root / "usr/local/bin/gpushare-task-prolog",
        "prolog": root / "usr/local/sbin/gpushare-prolog",
        "epilog": root / "usr/local/sbin/gpushare-epilog",
        "state": root / "var/lib/gpushare-test",
        "textfile": root / "var/lib/node-exporter/textfile",
        "dcgm": root / "run/gpushare/dcgm-job-mapping",
        "health": root / "usr/local/sbin/gpushare-node-health",
    }


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_fresh_install_writes_everything_with_its_mode(tmp_path, policy):
    root = tmp_path / "root"
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0, result.output
    p = paths(root)
    for name in p:
        assert f"created: {p[name]}:" in result.output
    assert {n: mode(p[n]) for n in p} == {
        "config": 0o644,
        "task": 0o755,
        "prolog": 0o755,
        "epilog": 0o755,
        "state": 0o711,
        "textfile": 0o755,
        "dcgm": 0o755,
        "health": 0o755,
    }
    if os.geteuid() == 0:
        assert all((p[n].lstat().st_uid, p[n].lstat().st_gid) == (0, 0) for n in p)
    config = read_config(p["config"], root_hook=os.geteuid() == 0)
    assert config.policy == policy and str(config.state_dir) == "/var/lib/gpushare-test"
    for name, module in (("task", "node.taskprolog"), ("prolog", "hooks.prolog"), ("epilog", "hooks.epilog")):
        lines = p[name].read_text().splitlines()
        assert lines[0] == f"#!{sys.executable} -IS" and lines[1] == inst.MARK and inst.ours(p[name].read_text())
        assert lines[3:] == [
            "import sys",
            f"sys.path.extend({DIRS!r})",
            f"from slurm_gpushare.{module} import main",
            "raise SystemExit(main())",
        ]


def test_installed_task_prolog_runs(tmp_path, policy):
    root = tmp_path / "root"
    assert invoke("--policy", policy, "--root", root).exit_code == 0
    script = paths(root)["task"]
    env = {"PATH": os.defpath, "GPUSHARE_NODE_CONFIG": str(tmp_path / "none.yaml"), "SLURM_JOB_ID": "5"}
    done = run([str(script)], env=env, timeout=30, check=False)
    assert done.returncode == 0, done.stderr  # no config, no task file: nothing to export, no error


def test_second_run_changes_nothing_and_says_so(tmp_path, policy):
    root = tmp_path / "root"
    assert invoke("--policy", policy, "--root", root).exit_code == 0
    before = tree(root)
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0, result.output
    assert result.output.count("unchanged: ") == 13 and "nothing to do" in result.output  # 8 + the boot unit's 5
    assert tree(root) == before


def test_foreign_file_is_refused_and_named_the_rest_installed(tmp_path, policy):
    root = tmp_path / "root"
    p = paths(root)
    p["config"].parent.mkdir(parents=True)
    p["config"].write_text("policy: /somewhere/else.yaml\n")
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 1
    assert (
        f"refused: {p['config']}: node config (not written by gpushare node install: move it away or merge it "
        "by hand, or run again with --force to replace it)"
    ) in result.output
    assert p["config"].read_text() == "policy: /somewhere/else.yaml\n"
    assert p["task"].exists() and p["state"].is_dir()


def test_our_file_edited_is_refused_unedited_is_updated(tmp_path, policy):
    root = tmp_path / "root"
    p = paths(root)
    assert invoke("--policy", policy, "--root", root).exit_code == 0
    p["config"].write_text(p["config"].read_text() + "mps_control: /opt/mps\n")
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 1 and "edited since gpushare node install wrote it" in result.output
    result = invoke("--policy", policy, "--root", root, "--force")
    assert result.exit_code == 0 and f"updated: {p['config']}" in result.output
    result = invoke("--policy", policy, "--root", root, "--mps-control", "/opt/mps")  # ours, unedited: replaced
    assert result.exit_code == 0 and f"updated: {p['config']}: node config (content changed)" in result.output
    assert "mps_control: /opt/mps" in p["config"].read_text()


def test_force_replaces_a_foreign_file(tmp_path, policy):
    root = tmp_path / "root"
    p = paths(root)
    p["task"].parent.mkdir(parents=True)
    p["task"].write_text("#!/bin/sh\necho mine\n")
    result = invoke("--policy", policy, "--root", root, "--force")
    assert result.exit_code == 0, result.output
    assert "replaced (--force)" in result.output and inst.ours(p["task"].read_text()) and mode(p["task"]) == 0o755


def test_dry_run_writes_nothing(tmp_path, policy):
    root = tmp_path / "root"
    root.mkdir()
    result = invoke("--policy", policy, "--root", root, "--dry-run")
    assert result.exit_code == 0 and result.output.count("would create: ") == 13
    assert list(root.iterdir()) == [] and "daemon-reload" not in result.output


def test_the_boot_unit_is_installed_and_enabled_before_slurmd(tmp_path, policy):
    root = tmp_path / "root"
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0, result.output
    unit = root / "etc/systemd/system/gpushare-node-boot.service"
    text = unit.read_text()
    assert inst.ours(text) and mode(unit) == 0o644 and f"created: {unit}: boot unit" in result.output
    (start,) = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert start == (
        f"ExecStart={sys.executable} -I -m slurm_gpushare.cli node boot --node-config /etc/gpushare/node.yaml"
    )
    assert "Before=slurmd.service" in text and "RequiredBy=slurmd.service" in text and "Type=oneshot" in text
    for folder in ("slurmd.service.requires", "multi-user.target.wants"):
        link = root / "etc/systemd/system" / folder / "gpushare-node-boot.service"
        assert os.readlink(link) == "/etc/systemd/system/gpushare-node-boot.service", folder
    assert "systemctl daemon-reload" in result.output
    # the unit's command, with this checkout's package (-I would import the installed one)
    argv = [sys.executable, "-m", "slurm_gpushare.cli", "node", "boot", "--help"]
    started = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert started.returncode == 0 and "before slurmd starts" in started.stdout, started.stderr


def test_a_link_elsewhere_is_refused_unless_forced(tmp_path, policy):
    root = tmp_path / "root"
    link = root / "etc/systemd/system/slurmd.service.requires/gpushare-node-boot.service"
    link.parent.mkdir(parents=True)
    link.symlink_to("/elsewhere.service")
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 1
    assert f"refused: {link}: boot unit enabled (RequiredBy=slurmd.service) (is a link to /elsewhere.service" in (
        result.output
    )
    assert os.readlink(link) == "/elsewhere.service"
    result = invoke("--policy", policy, "--root", root, "--force")
    assert result.exit_code == 0 and os.readlink(link) == "/etc/systemd/system/gpushare-node-boot.service"


def test_wrong_modes_are_fixed(tmp_path, policy):
    root = tmp_path / "root"
    p = paths(root)
    assert invoke("--policy", policy, "--root", root).exit_code == 0
    os.chmod(p["state"], 0o777)
    os.chmod(p["config"], 0o666)
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0
    assert f"fixed: {p['state']}: state dir (cluster.paths.state_dir) (mode 0777 -> 0711)" in result.output
    assert mode(p["state"]) == 0o711 and mode(p["config"]) == 0o644


def test_a_file_where_a_directory_belongs_is_refused(tmp_path, policy):
    root = tmp_path / "root"
    p = paths(root)
    p["state"].parent.mkdir(parents=True)
    p["state"].write_text("")
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 1 and f"refused: {p['state']}" in result.output and "not a directory" in result.output


def test_policy_under_root_is_named_as_the_node_sees_it(tmp_path, policy):
    root = tmp_path / "root"
    inside = root / "etc/gpushare/policy.yaml"
    inside.parent.mkdir(parents=True)
    inside.write_text(policy.read_text())
    assert invoke("--policy", inside, "--root", root).exit_code == 0
    assert "policy: /etc/gpushare/policy.yaml\n" in paths(root)["config"].read_text()


def test_marks_and_hashes():
    text = inst.marked("a: /b\n")
    assert inst.ours(text) and not inst.ours(text.replace("/b", "/c")) and not inst.ours("a: /b\n")
    script = inst.hook_script("/opt/py/bin/python3", ["/opt/py/lib/python3.13/site-packages"], inst.TASK_PROLOG)
    assert script.startswith("#!/opt/py/bin/python3 -IS\n") and inst.ours(script)
    assert not inst.ours(script.replace("-IS", "-I"))


def test_decide_is_pure_and_owner_aware():
    want = inst.Want("/x", "dir", 0o755, "x")
    assert inst.decide(want, inst.Found("dir", 0o755, 0, 0)).status == "unchanged"
    step = inst.decide(want, inst.Found("dir", 0o755, 1000, 1000))
    assert step.status == "fix" and step.detail == "owner 1000:1000 -> 0:0"
    assert inst.decide(want, inst.Found("dir", 0o755, 1000, 1000), owners=False).status == "unchanged"
    assert inst.decide(want, inst.Found("link")).status == "refuse"


# ---- the health check (cluster.health.program) -----------------------------------------------------


def test_health_program_is_installed_where_health_check_program_points(tmp_path, policy):
    """The bundled small lab turns the health check on: install writes the program at the very path the
    rendered HealthCheckProgram names, and it runs (no node config: one line on stderr, exit 1)."""
    from slurm_gpushare.policy import load_file
    from slurm_gpushare.render import render_all

    rendered = render_all(load_file(policy))["slurm-gpushare.conf"]
    program = next(line.split("=", 1)[1] for line in rendered.splitlines() if line.startswith("HealthCheckProgram="))
    root = tmp_path / "root"
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0, result.output
    script = inst.on_disk(root, program)
    assert script == paths(root)["health"] and mode(script) == 0o755 and inst.ours(script.read_text())
    lines = script.read_text().splitlines()
    assert lines[0] == f"#!{sys.executable} -IS" and lines[5:] == [inst.entry(inst.HEALTH), "raise SystemExit(main())"]
    env = {"PATH": os.defpath, "GPUSHARE_NODE_CONFIG": str(tmp_path / "none.yaml"), "SLURMD_NODENAME": "lab-excl01"}
    done = run([str(script)], env=env, timeout=60, check=False)
    assert done.returncode == 1 and done.stderr.startswith("gpushare-node-health: "), done.stderr


def test_health_check_off_installs_no_program(tmp_path, policy):
    raw = yaml.safe_load(policy.read_text())
    del raw["cluster"]["health"]
    policy.write_text(yaml.safe_dump(raw))
    root = tmp_path / "root"
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0 and "health check" not in result.output
    assert not paths(root)["health"].exists()


def test_the_packages_console_script_at_the_path_is_kept(tmp_path, policy):
    """A policy that names pip's gpushare-node-health console script: that file runs the same entry point."""
    root = tmp_path / "root"
    console = paths(root)["health"]
    console.parent.mkdir(parents=True)
    console.write_text(
        "#!/opt/gpushare/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
        f"{inst.entry(inst.HEALTH)}\nif __name__ == '__main__':\n    sys.exit(main())\n"
    )
    os.chmod(console, 0o755)
    before = console.read_text()
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0, result.output
    assert f"unchanged: {console}: health check" in result.output and console.read_text() == before
    console.write_text("#!/bin/sh\necho mine\n")  # anything else is refused, as every file install did not write
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 1 and f"refused: {console}: health check" in result.output


def test_node_config_names_the_live_policy_when_the_live_planner_is_on(tmp_path, policy):
    """With live.enabled the hooks must follow the layout the live planner writes: node.yaml names its file
    (the policy's live.policy_file, else gpushare-live.yaml beside slurm.conf); off, node.yaml names none."""
    root = tmp_path / "off"
    assert invoke("--policy", policy, "--root", root).exit_code == 0
    assert "live_policy" not in paths(root)["config"].read_text()
    raw = yaml.safe_load(policy.read_text())
    raw.setdefault("live", {})["enabled"] = True
    policy.write_text(yaml.safe_dump(raw))
    root = tmp_path / "on"
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0, result.output
    slurm_conf_dir = raw["cluster"].get("paths", {}).get("slurm_conf_dir", "/etc/slurm")
    assert f"live_policy: {slurm_conf_dir}/gpushare-live.yaml" in paths(root)["config"].read_text().splitlines()
    raw["live"]["policy_file"] = "/etc/gpushare/live.yaml"
    policy.write_text(yaml.safe_dump(raw))
    root = tmp_path / "file"
    assert invoke("--policy", policy, "--root", root).exit_code == 0
    assert "live_policy: /etc/gpushare/live.yaml" in paths(root)["config"].read_text().splitlines()


# ---- the hook scripts: python -IS and the import directories site would add ---------------------------


def test_import_dirs_are_what_site_adds_in_order_once_each():
    bare = ["/usr/lib/python313.zip", "/usr/lib/python3.13", "/usr/lib/python3.13/lib-dynload"]
    with_site = [
        *bare,
        "/opt/g/lib/python3.13/site-packages",
        "",
        "/src/checkout",
        "/opt/g/lib/python3.13/site-packages",
    ]
    assert inst.import_dirs(bare, with_site, "/src/checkout/slurm_gpushare") == [
        "/opt/g/lib/python3.13/site-packages",
        "/src/checkout",
    ]
    assert inst.import_dirs(bare, with_site, "/usr/lib/python3.13/slurm_gpushare") == [
        "/opt/g/lib/python3.13/site-packages",
        "/src/checkout",
    ]  # found on the bare path: fine too


def test_a_package_reached_only_through_an_import_hook_is_refused():
    """An editable install whose .pth installs a finder: under -S nothing would import it, so the prolog would
    fail every job; install says so instead of writing scripts that cannot run."""
    with pytest.raises(
        ValueError,
        match=r"slurm_gpushare is imported from /src/x/slurm_gpushare through an import "
        r"hook \(a \.pth file\), which the hook scripts \(python -S\) skip",
    ):
        inst.import_dirs(
            ["/usr/lib/python3.13"], ["/usr/lib/python3.13", "/opt/g/site-packages"], "/src/x/slurm_gpushare"
        )


def test_probe_finds_this_interpreters_import_dirs():
    import slurm_gpushare

    assert all(inst._absolute(d) for d in DIRS)
    assert str(Path(slurm_gpushare.__file__).parents[1]) in DIRS  # a test environment never has it in the stdlib
    assert "" not in DIRS and str(Path(sys.executable).parent) not in DIRS  # not the CLI's script dir


@pytest.mark.parametrize("bad", ["lib/site-packages", "/opt/my env/site-packages", "/opt/x'y", "/opt/a/../b"])
def test_an_import_dir_that_would_need_quoting_is_refused(bad):
    with pytest.raises(
        ValueError,
        match=rf"/usr/bin/python3's import path has {re.escape(repr(bad))}, not an absolute "
        r"path of letters, digits and _\./\+-",
    ):
        inst.script_wants(python="/usr/bin/python3", import_dirs=["/opt/ok", bad], prolog="/usr/sbin/p")


def test_the_cli_names_a_bad_import_dir_and_writes_nothing(tmp_path, policy, monkeypatch):
    monkeypatch.setattr(inst, "probe_import_dirs", lambda python, runner=None: ["/opt/my env/lib"])
    root = tmp_path / "root"
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code != 0 and "import path has '/opt/my env/lib'" in result.output
    assert not root.exists()


def test_prolog_and_epilog_off_in_the_policy_are_not_installed(tmp_path, policy):
    raw = yaml.safe_load(policy.read_text())
    raw["cluster"]["hooks"] = {"task_prolog": "/usr/local/bin/gpushare-task-prolog"}
    policy.write_text(yaml.safe_dump(raw))
    root = tmp_path / "root"
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0, result.output
    assert ": prolog (cluster.hooks.prolog)" not in result.output and ": epilog (cluster" not in result.output
    assert not paths(root)["prolog"].exists() and not paths(root)["epilog"].exists()


def console_script(path: Path, module: str) -> str:
    """pip's console script for ``module``'s main (as pip writes it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/opt/gpushare/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
        f"from {module} import main\nif __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(main())\n"
    )
    os.chmod(path, 0o755)
    return path.read_text()


@pytest.mark.parametrize("hook, module", [("prolog", inst.PROLOG), ("epilog", inst.EPILOG), ("health", inst.HEALTH)])
def test_a_link_to_the_console_script_is_replaced_the_script_kept(tmp_path, policy, hook, module):
    """The image (and the install page until now) linked the hook paths to pip's console scripts: the link is
    replaced by the lean script, the console script it led to is left as it was; then a run changes nothing."""
    root = tmp_path / "root"
    console = root / f"opt/gpushare/bin/{hook}"
    before = console_script(console, module)
    link = paths(root)[hook]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(console)
    result = invoke("--policy", policy, "--root", root, "--dry-run")
    assert result.exit_code == 0 and f"would update: {link}: " in result.output and link.is_symlink()
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0, result.output
    assert (
        f"updated: {link}: " in result.output and "a link to a script that runs the same entry point" in result.output
    )
    assert not link.is_symlink() and inst.ours(link.read_text()) and mode(link) == 0o755
    assert console.read_text() == before
    assert f"unchanged: {link}: " in invoke("--policy", policy, "--root", root).output


def test_a_link_to_anything_else_is_refused(tmp_path, policy):
    root = tmp_path / "root"
    other = root / "opt/site/prolog"
    other.parent.mkdir(parents=True)
    other.write_text("#!/bin/sh\nexec /opt/site/real-prolog\n")
    link = paths(root)["prolog"]
    link.parent.mkdir(parents=True)
    link.symlink_to(other)
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 1
    assert f"refused: {link}: prolog (cluster.hooks.prolog) (is a link, not a regular file" in result.output
    assert link.is_symlink()
    link.unlink()
    link.symlink_to(root / "nowhere")  # a dangling link too
    assert invoke("--policy", policy, "--root", root).exit_code == 1 and link.is_symlink()


def test_the_console_script_itself_at_the_prolog_path_is_kept(tmp_path, policy):
    """A policy that names pip's console script (e.g. /opt/gpushare/bin/gpushare-prolog): pip's file, kept."""
    root = tmp_path / "root"
    before = console_script(paths(root)["prolog"], inst.PROLOG)
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0 and f"unchanged: {paths(root)['prolog']}: prolog" in result.output
    assert paths(root)["prolog"].read_text() == before
    console_script(paths(root)["epilog"], inst.PROLOG)  # the prolog's script at the epilog's path: not the same hook
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 1 and f"refused: {paths(root)['epilog']}: epilog" in result.output


def test_the_written_prolog_and_epilog_run_a_job_ignoring_the_environment(tmp_path, policy):
    """The scripts as node install writes them, started as slurmd starts them (no PATH, the job's variables) on
    a test node: the prolog writes the job's journal, the epilog removes it. PYTHONPATH naming a package of the
    same name that would fail is ignored (-I), and so is site (-S: the import directories are the script's)."""
    root = tmp_path / "root"
    assert invoke("--policy", policy, "--root", root).exit_code == 0
    (tmp_path / "node").mkdir()
    node = HookNode(tmp_path / "node", "lab-excl01")
    decoy = tmp_path / "decoy" / "slurm_gpushare"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise SystemExit('the environment was read')\n")
    env = node.env(7, gpus="1", PYTHONPATH=str(decoy.parent), PYTHONSTARTUP=str(decoy / "__init__.py"))
    done = run([str(paths(root)["prolog"])], env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert node.journals() == ["7.json"]
    done = run([str(paths(root)["epilog"])], env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert node.journals() == []


def test_the_hook_scripts_run_without_site(tmp_path):
    """-S for real: a script with the same two first lines reports no site module and no .pth processing."""
    script = inst.hook_script(sys.executable, DIRS, inst.PROLOG).replace(
        inst.entry(inst.PROLOG) + "\nraise SystemExit(main())\n",
        "import slurm_gpushare.hooks.prolog\nprint('site' in sys.modules, sys.flags.isolated, sys.flags.no_site)\n",
    )
    path = tmp_path / "probe"
    path.write_text(script)
    os.chmod(path, 0o755)
    assert run([str(path)], env={}, timeout=30).stdout.split() == ["False", "1", "1"]


def test_the_task_prologs_console_script_is_kept_too(tmp_path, policy):
    """pip's gpushare-task-prolog imports slurm_gpushare.hooks.taskprolog (the lean script goes straight to
    slurm_gpushare.node.taskprolog): the same hook, so the same rule as for the others."""
    root = tmp_path / "root"
    before = console_script(paths(root)["task"], inst.TASK_PROLOG_CONSOLE)
    result = invoke("--policy", policy, "--root", root)
    assert result.exit_code == 0 and f"unchanged: {paths(root)['task']}: task prolog" in result.output
    assert paths(root)["task"].read_text() == before
