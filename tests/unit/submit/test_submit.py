"""The submission package piece by piece: grammar, sbatch options, tables, the Lua renderer, `gpushare check`."""

from __future__ import annotations

import re

import click
import pytest
import yaml
from click.testing import CliRunner

from slurm_gpushare.cli.check import check
from slurm_gpushare.cli.errors import ErrorsToExitCodes
from slurm_gpushare.errors import PolicyError
from slurm_gpushare.policy import build_site, load_file
from slurm_gpushare.render import header_ok
from slurm_gpushare.render.jobsubmit import job_submit_lua, lua_string, render_body, to_lua
from slurm_gpushare.sitepolicy import find_policy
from slurm_gpushare.submit import (
    BadRequest,
    Gres,
    OptionError,
    Other,
    build_tables,
    decide,
    parse_field,
    split_options,
    to_job,
)
from slurm_gpushare.submit.options import sbatch_lines
from tests.conftest import ROOT
from tests.unit.submit_corpus import CASES, TEST_POLICIES, case_job, case_site, python_decision

LAB = ROOT / "etc" / "small-lab.yaml"
PROD = ROOT / "etc" / "mixed-production.yaml"


# ---- grammar ----


@pytest.mark.parametrize(
    "text, name, gtype, count",
    [
        ("gres/gpu:a100:2", "gpu", "a100", 2),
        ("gres:gpu:2", "gpu", "", 2),
        ("gpu", "gpu", "", 1),
        ("gres/gpu:h100_3g.40gb", "gpu", "h100_3g.40gb", 1),
        ("gres/shard:2k", "shard", "", 2048),
        ("gres/mps:1M", "mps", "", 1048576),
        ("gres/gpu=3", "gpu", "", 3),
        ("gres/gpu:l40s=3", "gpu", "l40s", 3),
        ("gres/gpu:007", "gpu", "", 7),
        ("gres/gpu:a-b.c_d:1", "gpu", "a-b.c_d", 1),
    ],
)
def test_entry_forms(text, name, gtype, count):
    [entry] = parse_field("tres_per_node", text)
    assert (entry.name, entry.type, entry.count) == (name, gtype, count)


def test_other_tres_are_kept_verbatim():
    entries = parse_field("tres_per_task", "cpu=4,gres/gpu:1,mem:2G,license/matlab:1")
    assert [type(e) for e in entries] == [Other, Gres, Other, Other]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "is empty"),
        ("gres/gpu:1,,gres/shard:1", "empty entry"),
        ("gres/gpu:-3", "negative count"),
        ("gres/gpu:0k", "asks for 0"),
        ("gres/gpu:4294967296", "more than 4294967295"),
        ("gres/gpu:4194304k", "more than 4294967295"),
        ("gres/gpu:" + "9" * 30, "more than 4294967295"),
        ("gres/gpu:a:b:c", "write name[:type][:count]"),
        ("gres/gpu::1", "'' is not a valid type name"),
        ("gres/gpu:" + "a" * 65 + ":1", "at most 64"),
        ("gres/gpu:a100:1.5", "'1.5' is not a count"),
        ("gres/gpu:a100:0x10", "'0x10' is not a count"),
        ("gres/gpu:a100:١", "'١' is not a count"),  # a non-ASCII digit is not a digit to Lua
        ("gres/GPU:1", "'GPU' is not a GRES"),
        ("x" * 1025, "1025 characters long"),
        ("é" * 513, "1026 characters long"),  # bytes, as Slurm and Lua count them
    ],
)
def test_malformed_fields_name_the_field(text, fragment):
    with pytest.raises(BadRequest) as exc:
        parse_field("tres_per_node", text)
    assert fragment in str(exc.value) and str(exc.value).startswith("tres_per_node")


def test_largest_count_is_accepted():
    assert parse_field("tres_per_job", "gres/gpu:4294967295")[0].count == 4294967295
    assert parse_field("tres_per_job", "gres/gpu:4194303k")[0].count == 4194303 * 1024


# ---- sbatch options ----


def test_options_land_where_sbatch_puts_them():
    argv = [
        "--gres=gpu:1,shard:2",
        "--gpus-per-node",
        "a30:1",
        "-G",
        "3",
        "--gpus-per-socket=1",
        "--gpus-per-task=2",
        "-pbatch",
    ]
    assert to_job(split_options(argv), "gres/") == {
        "tres_per_node": "gres/gpu:1,gres/shard:2,gres/gpu:a30:1",
        "tres_per_job": "gres/gpu:3",
        "tres_per_socket": "gres/gpu:1",
        "tres_per_task": "gres/gpu=2",  # as 24.11 sbatch sends it (seen on the test cluster)
        "partition": "batch",
    }


def test_options_before_23_11_use_the_colon_prefix():
    assert to_job(split_options(["--gres=gpu:1", "--gpus=2"]), "gres:") == {
        "tres_per_node": "gres:gpu:1",
        "tres_per_job": "gres:gpu:2",
    }


def test_other_options_and_their_values_are_skipped():
    argv = ["-c", "2", "--time", "1:00", "--job-name=x", "-J", "gpu", "--gres", "shard:1", "-p=scavenger"]
    assert to_job(split_options(argv), "gres/") == {"tres_per_node": "gres/shard:1", "partition": "scavenger"}


@pytest.mark.parametrize(
    "argv, fields",
    [
        (["-n", "4"], {"num_tasks": "4"}),
        (["-n4", "--ntasks-per-node=2"], {"num_tasks": "4", "ntasks_per_node": "2"}),
        (["--ntasks", "3", "-N", "2"], {"num_tasks": "3", "min_nodes": "2"}),
        (["--nodes=2-4"], {"min_nodes": "2"}),
        (["-N1-2", "-n", "1"], {"min_nodes": "1", "num_tasks": "1"}),
    ],
)
def test_task_layout_options_are_read_as_job_submit_sees_them(argv, fields):
    """MPS_TASKS reads num_tasks, ntasks_per_node and min_nodes: sbatch's -n, --ntasks-per-node and -N (its minimum)."""
    assert to_job(split_options(["--gres=mps:50", *argv]), "gres/") == {"tres_per_node": "gres/mps:50", **fields}


def test_option_without_value_is_an_error():
    with pytest.raises(OptionError, match="--gres needs a value"):
        split_options(["--gres"])


def test_sbatch_lines_stop_at_the_first_command():
    text = (
        "#!/bin/bash\n# note\n#SBATCH --gres=gpu:1  # a comment\n\n#SBATCH -p 'scavenger'\n#SBATCHX --gres=shard:9\n"
        "  \nhostname\n#SBATCH --gres=shard:2\n"
    )
    assert sbatch_lines(text) == ["--gres=gpu:1", "-p", "scavenger"]


def test_sbatch_lines_need_the_exact_directive():
    assert sbatch_lines(" #SBATCH --gres=gpu:1\n#sbatch --gres=gpu:1\n#SBATCH\t--gpus=1\n") == ["--gpus=1"]


def test_corpus_options_are_whole_options():
    """YAML splits [--gres=a,b] into two items; every bare item must be the value of the option before it."""
    for case in CASES:
        argv = case.get("options", [])
        for before, arg in zip(["-x"] + argv, argv, strict=False):
            assert arg.startswith("-") or (before.startswith("-") and "=" not in before), case["id"]


# ---- tables and the decision ----


def test_routing_order_is_default_then_priority_then_name():
    assert [t.name for t in build_tables(load_file(PROD)).tiers] == ["training", "reserved", "inference", "notebook"]


def test_tier_gpu_types_narrow_what_a_tier_serves():
    tiers = {t.name: t for t in build_tables(load_file(PROD)).tiers}
    assert tiers["training"].gpu == ("h100",) and tiers["notebook"].gpu == ("h100", "h100_3g.40gb", "h100_reserved")
    assert tiers["training"].shared == {"shard": {"": 4, "h100": 4}}


def test_shared_caps_take_the_largest_gpu():
    raw = yaml.safe_load(LAB.read_text())
    small = {
        **raw["node_groups"][3],
        "name": "lab-mps-small",
        "nodes": "lab-mps02",
        "sharing": [{"gpus": 0, "mode": "mps", "units": 50, "type": "a30_small"}],
    }
    raw["node_groups"].append(small)
    raw["tiers"].append({"name": "small", "node_groups": ["lab-mps-small"]})
    t = build_tables(build_site(raw, "t"))
    assert t.shared["mps"] == {"": 100, "a30": 100, "a30_small": 50}
    assert decide(t, {"tres_per_node": "gres/mps:a30_small:60"}).codes == ["MPS_RANGE mps=60"]
    assert decide(t, {"tres_per_node": "gres/mps:60"}).accepted
    assert decide(t, {"tres_per_node": "gres/mps:a30_small:50"}).partition == "small"


def test_jobs_without_gpus_only_get_their_tier_qos():
    t = build_tables(load_file(PROD))
    default = t.default_tier.name
    every = ",".join(["normal", *(x.name for x in t.tiers)])
    for job, qos in (
        ({}, default),
        ({"partition": "debug"}, None),
        ({"tres_per_task": "cpu=2"}, default),
        ({"tres_per_node": "none"}, default),
        ({"partition": "notebook"}, "notebook"),
        ({"partition": "notebook,training"}, "notebook"),
        ({"partition": "notebook,debug"}, None),
        ({"qos": "mine"}, None),
        ({"qos": ""}, default),
    ):
        d = decide(t, {**job, "assoc_qos": every})
        assert d.accepted and d.partition is None and not d.fields and d.user_message is None, job
        assert d.qos == qos, job
        # without the association's QOS list (gpushare check) it is only what would be set if allowed
        d = decide(t, job)
        assert d.qos is None and d.qos_if_allowed == qos, job
        # an association without the tier's QOS (root, a site account) keeps its own
        assert decide(t, {**job, "assoc_qos": "normal"}).qos is None, job


def test_set_qos_resolves_by_slurm_version_and_if_allowed_needs_24_11():
    """Unset: if-allowed from 24.11 (job_desc.assoc_qos), never before; if-allowed on 23.11 is refused, naming the
    field."""
    raw = yaml.safe_load(LAB.read_text(encoding="utf-8"))
    assert {x.set_qos for x in build_tables(build_site(raw, "lab.yaml")).tiers} == {"if-allowed"}
    raw["cluster"]["slurm_version"] = "23.11"
    assert {x.set_qos for x in build_tables(build_site(raw, "lab.yaml")).tiers} == {"never"}
    raw["tiers"][0]["set_qos"] = True
    assert build_tables(build_site(raw, "lab.yaml")).tiers[0].set_qos == "always"
    raw["tiers"][0]["set_qos"] = "if-allowed"
    with pytest.raises(PolicyError) as err:
        build_site(raw, "lab.yaml")
    assert re.search(
        r"tiers\[0\]\.set_qos: 'if-allowed' reads job_desc.assoc_qos.*24.11.*give true", err.value.report()
    )


def test_untyped_gpu_must_be_whole_refuse_or_a_type_of_the_tier():
    raw = yaml.safe_load(LAB.read_text(encoding="utf-8"))
    raw["tiers"][0]["untyped_gpu"] = "h100"
    with pytest.raises(PolicyError) as err:
        build_site(raw, "lab.yaml")
    assert (
        "tiers[0].untyped_gpu: 'h100' is neither whole, refuse nor a GPU type of this tier; its types: "
        "a100_40g_1g.5gb, a30, l40s"
    ) in err.value.report()


def test_per_job_gpus_are_whole_gpus_and_their_slices_are_not():
    """An untyped request on a per-job tier takes the per-job GPU whole (its model's type), never a slice."""
    t = build_tables(load_file(TEST_POLICIES / "perjob-lab.yaml"))
    perjob = t.tier("perjob")
    assert perjob is not None and perjob.whole == ("a100_40g",) and perjob.gpu == ("a100_40g",)
    assert not set(perjob.slices) & set(perjob.whole)
    d = decide(t, {"tres_per_node": "gres/gpu:1", "features": "a100_40g"})
    assert d.partition == "perjob" and dict(d.fields) == {"tres_per_node": "gres/gpu:a100_40g:1"} and d.extra is None


def test_qos_is_never_set_on_update():
    t = build_tables(load_file(LAB))
    assert decide(t, {"tres_per_node": "gres/shard:1"}, True, "scavenger").qos is None
    assert decide(t, {"partition": "scavenger"}, True, "batch").qos is None
    job = {"partition": "scavenger", "tres_per_node": "gres/shard:1", "assoc_qos": "scavenger"}
    assert decide(t, job).qos == "scavenger"


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c["expect"]["accept"] and "modify" not in c and "extra" not in c["expect"]],
    ids=lambda c: c["id"],
)
def test_a_changed_job_is_not_changed_again(case):
    """Resubmitting (or requeueing) what gpushare produced must pass as it is: the rewrite is a fixed point.

    Not a per-job MIG slice carried by shards: its carrier form (shard:<weight> on a per-job tier) is refused on
    purpose, or a user could ask any count of carrier shards; requeueing does not run job_submit again, and a user
    cannot submit a job with its extra field there (test_a_carried_slice_is_not_asked_for_again, PER_JOB_EXTRA)."""
    d = python_decision(case)
    job = {
        **case_job(case),
        **({"partition": d.partition} if d.partition else {}),
        **d.fields,
        **({"qos": d.qos} if d.qos else {}),
    }
    again = decide(build_tables(case_site(case)), job)
    assert again.accepted and again.partition is None and not again.fields and again.qos is None


def test_user_message_lists_every_violation_once():
    d = decide(build_tables(load_file(LAB)), {"tres_per_node": "gres/gpu:h100:1,gres/shard:3"})
    lines = d.user_message.split("\n")
    assert lines[0] == "gpushare rejected this job:" and [line.split(": ")[0] for line in lines[1:]] == d.codes


# ---- renderer (the Lua tier runs it; these need no Lua) ----


def test_job_submit_lua_has_a_lua_header_and_is_deterministic():
    site = load_file(LAB)
    text = job_submit_lua(site)
    assert text == job_submit_lua(load_file(LAB))
    assert text.startswith("-- Generated by slurm-gpushare from small-lab.yaml") and header_ok(text, comment="--")
    assert "File: job_submit.lua" in text.split("\n")[1]


def test_job_submit_lua_avoids_what_lua_5_1_lacks():
    body = "\n".join(line.split("--")[0] for line in render_body(load_file(PROD)).splitlines())
    for word in ("goto", "table.unpack", "//", "math.tointeger", "utf8.", "<<", ">>"):
        assert word not in body, word


def test_to_lua_sorts_keys_and_quotes_odd_ones():
    assert (
        to_lua({"b": 1, "a": True, "": "x", "if": [], "a.b": False})
        == '{ [""] = "x", a = true, ["a.b"] = false, b = 1, ["if"] = {} }'
    )
    assert lua_string('a"b\\c\n') == '"a\\"b\\\\c\\010"'
    with pytest.raises(TypeError):
        to_lua(1.5)


# ---- gpushare check ----


def run(*args, env=None):
    """`gpushare check` with the site policy $GPUSHARE_POLICY=small-lab (unless ``env`` says otherwise)."""
    return CliRunner().invoke(check, list(args), env=env or {"GPUSHARE_POLICY": str(LAB)}, catch_exceptions=False)


def verdicts(res) -> str:
    """What check printed after its first line (the policy it used)."""
    return res.output.split("\n", 1)[1]


def test_check_options_reject_with_codes():
    res = run("--", "--gres=shard:2", "-p", "scavenger")
    assert res.exit_code == 1
    assert verdicts(res).startswith("OVER shard=2: 2 shards are not 2 GPUs")


def test_check_ok_and_what_would_change():
    res = run("--", "--gres=gpu:l40s:1")
    assert res.output == f"policy: {LAB} ($GPUSHARE_POLICY)\nOK (would set qos=batch if your association may use it)\n"
    res = run("--policy", str(PROD), "--", "--gres=gpu:inference:1")
    assert res.exit_code == 0
    assert res.output == (
        f"policy: {PROD} (--policy)\nOK (would set partition=inference, "
        "tres_per_node=gres/gpu:h100_3g.40gb:1, qos=inference if your association may use it)\n"
    )


def test_check_prints_every_change_the_filter_makes(tmp_path):
    """The QOS too (set_qos true: always; false: never), and an untyped request's rewrite to the whole GPU type."""
    raw = yaml.safe_load(LAB.read_text(encoding="utf-8"))
    raw["tiers"][0]["set_qos"] = True
    raw["tiers"][1]["set_qos"] = False
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert (
        verdicts(run("--policy", str(policy), "--", "--gres=gpu:1"))
        == "OK (would set tres_per_node=gres/gpu:l40s:1, qos=batch)\n"
    )
    assert verdicts(run("--policy", str(policy), "--", "-p", "scavenger", "--gres=gpu:l40s:1")) == "OK\n"


def test_check_without_a_site_policy_says_how_to_name_one(tmp_path, monkeypatch):
    """No bundled toy policy behind the user's back: --policy, $GPUSHARE_POLICY or /etc/gpushare/policy.yaml."""

    @click.group(cls=ErrorsToExitCodes)
    def cli():
        pass

    cli.add_command(check)
    monkeypatch.setattr("slurm_gpushare.sitepolicy.SITE_POLICY", tmp_path / "absent.yaml")
    monkeypatch.setattr(find_policy, "__defaults__", (tmp_path / "absent.yaml",))
    res = CliRunner().invoke(cli, ["check", "--", "--gres=gpu:1"], env={"GPUSHARE_POLICY": ""}, prog_name="gpushare")
    assert res.exit_code == 2 and "--policy FILE" in res.output and "GPUSHARE_POLICY" in res.output


def test_check_scripts(tmp_path):
    good = tmp_path / "good.sh"
    good.write_text("#!/bin/sh\n#SBATCH --gres=shard:1\nsrun true\n")
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\n#SBATCH --gres=gpu:h100:1,shard:1\n")
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\necho hi\n")
    assert verdicts(run(str(good))) == "OK (would set qos=batch if your association may use it)\n"
    res = run(str(good), str(bad), str(plain))
    assert res.exit_code == 1
    lines = verdicts(res).splitlines()
    assert lines[0] == f"{good}: OK (would set qos=batch if your association may use it)" and lines[-1].startswith(
        f"{plain}: OK"
    )
    assert [line.split(": ")[1] for line in lines[1:-1]] == ["UNKNOWN_TYPE gpu:h100", "MIXED gpu+shard"]


def test_check_command_line_options_win_over_the_script(tmp_path):
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n#SBATCH --gres=shard:2\n")
    assert run(str(job)).exit_code == 1
    assert verdicts(run(str(job), "--", "--gres=shard:1")).startswith("OK")


def test_check_unreadable_script_is_an_error_not_a_verdict(tmp_path):
    """Exit 2 with a message (the CLI group's error translation), never 1, which means 'rejected'."""

    @click.group(cls=ErrorsToExitCodes)
    def cli():
        pass

    cli.add_command(check)
    res = CliRunner().invoke(
        cli, ["check", str(tmp_path / "missing.sh")], env={"GPUSHARE_POLICY": str(LAB)}, prog_name="gpushare"
    )
    assert res.exit_code == 2 and "gpushare: error: cannot read" in res.output


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if "options" in c and not ({"submission", "slurm_version", "modify", "tiers"} & set(c))],
    ids=lambda c: c["id"],
)
def test_check_agrees_with_the_corpus(case):
    policy = ROOT / "etc" / f"{case.get('policy', 'small-lab')}.yaml"
    if not policy.exists():
        policy = TEST_POLICIES / policy.name
    res = run("--policy", str(policy), "--", *case["options"])
    assert res.exit_code == (0 if case["expect"]["accept"] else 1)
    if not case["expect"]["accept"]:
        assert [line.split(": ")[0] for line in verdicts(res).splitlines()] == case["expect"]["codes"]


def test_a_carried_slice_is_not_asked_for_again():
    """What the filter made of a per-job slice (shard:<weight> on the per-job tier) is refused when a job asks for
    it itself: only the filter hands out carrier shards, always with the profile's record."""
    t = build_tables(load_file(TEST_POLICIES / "perjob-lab.yaml"))
    carried = {"partition": "perjob", "tres_per_node": "gres/shard:2"}
    assert decide(t, carried).codes == ["OVER shard=2"]
    assert decide(t, carried, True, "perjob").codes == ["OVER shard=2"]
    assert decide(t, {**carried, "tres_per_node": "gres/shard:1"}).codes == ["PER_JOB_SHARD perjob"]
