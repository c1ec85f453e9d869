"""The submission corpus through real sbatch: slurmctld's job_submit/lua running the rendered job_submit.lua.

Every ``cluster: true`` case of tests/cases/submit.yaml is submitted with
real sbatch, as alice in account physics (held, output /dev/null), with the
case's options. Real Slurm, the Python decision and the Lua must agree:

- accept: a job id; the job's Partition and TresPer* fields are the ones the
  decision leaves (rewritten fields exactly, untouched ones the same GRES);
- reject: sbatch fails, and what it prints (log_user text, one
  ``sbatch: error: `` line per line) is the Python decision's user message.

A second pass runs the same submissions through the same script wrapped by a
logger (``gpushare-debug`` lines in slurmctld's log): the tres_per_* strings
slurmctld really hands job_submit, against what ``submit/options.py``
predicts, and the Python decision on the real strings.

Then a deliberately broken job_submit.lua (policy tables corrupted through
``render_body(site, data=...)``) is installed in the running cluster: sbatch
must fail closed; the rendered file is put back and jobs pass again.

Every submitted job is held, cancelled at the end, and the queue drained.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager

import pytest

from slurm_gpushare.render.jobsubmit import job_submit_lua, lua_data, render_body
from slurm_gpushare.submit import FIELDS, build_tables, decide, parse_field
from slurm_gpushare.testcluster.cluster import parse_scontrol_oneliners
from tests.unit.submit_corpus import CASES, case_job, check_expectations, python_decision

CLUSTER_CASES = [c for c in CASES if c.get("cluster")]
CLUSTER_IDS = [c["id"] for c in CLUSTER_CASES]
USER, ACCOUNT = "alice", "physics"
BASE = [f"--account={ACCOUNT}", "--output=/dev/null", "--hold", "--job-name=gpushare-submission-test"]
SCRIPT = "#!/bin/bash\ntrue\n"
LIVE = "/etc/slurm/job_submit.lua"
LOG = "/var/log/slurm/slurmctld.log"
SUBMIT_FAILED = "sbatch: error: Batch job submission failed:"

# Where real Slurm 24.11 differs from the corpus, as observed on this cluster.
# sbatch refuses these itself (client-side GRES check), before slurmctld: job_submit
# never runs, so the user sees Slurm's generic error instead of gpushare's message.
SBATCH_REFUSES = {
    "mixed-gpu-and-shard": "sbatch: error: Invalid generic resource (gres) specification",
}
# sbatch writes --gpus-per-task as 'gres/gpu[:type]=N' ('=' before the count, and with
# -c a leading 'cpu=N,'), where options.py (to_job) predicts 'gres/gpu[:type]:N'.
# The decision is the same (the parser reads both forms); only the string differs.
FIELD_FORMAT: dict[str, dict[str, str]] = {}  # none left: options.py writes --gpus-per-task as sbatch does

# In-container submitter: one `docker exec` for a whole batch of sbatch calls.
SUBMITTER = r"""
import json, subprocess, sys
out = []
for tag, argv in json.loads(sys.argv[1]):
    p = subprocess.run(["sbatch", "--parsable", *argv], input=sys.argv[2], capture_output=True, text=True)
    out.append({"tag": tag, "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr})
print(json.dumps(out))
"""

# Wraps the rendered script: logs the fields job_submit gets, then runs the real slurm_job_submit.
DEBUG_WRAPPER = """
local gpushare_real_submit = slurm_job_submit
function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, text = pcall(function()
    local parts = { "gpushare-debug", tostring(job_desc.comment) }
    for _, f in ipairs({ "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task",
                         "partition", "features", "assoc_qos" }) do
      local v = job_desc[f]
      if v ~= nil then
        parts[#parts + 1] = f .. "=" .. tostring(v)
      end
    end
    -- the task layout MPS_TASKS reads, when set (below Slurm's NO_VAL16 / NO_VAL)
    for _, f in ipairs({ "num_tasks", "ntasks_per_node", "min_nodes" }) do
      local n = tonumber(job_desc[f])
      if n ~= nil and n > 0 and n < ((f == "ntasks_per_node" and 65534) or 4294967294) then
        parts[#parts + 1] = f .. "=" .. string.format("%d", n)
      end
    end
    return table.concat(parts, "\\t")
  end)
  slurm.log_info("%s", ok and text or ("gpushare-debug failed: " .. tostring(text)))
  return gpushare_real_submit(job_desc, part_list, submit_uid)
end
"""

# Atomic install in /etc/slurm: temp file, mtime strictly above the live file's
# (slurmctld reloads only when st_mtime > the loaded script's st_mtime, in seconds), mv.
INSTALL = f"""set -eu
f={LIVE}; t=/etc/slurm/.job_submit.lua.gpushare-test.$$
cat > "$t"; chmod 0644 "$t"
old=$(stat -c %Y "$f" 2>/dev/null || echo 0); now=$(date +%s)
new=$(( now > old ? now : old + 1 ))
touch -d "@$new" "$t"; mv -f "$t" "$f"
"""

SUBMITTED: list[int] = []


# ---- helpers ---------------------------------------------------------------
def install_lua(cluster, text: str) -> None:
    cluster.exec("slurmctld", ["sh", "-c", INSTALL], input=text)
    assert cluster.exec("slurmctld", ["cat", LIVE]).stdout == text


@contextmanager
def installed(cluster, text: str):
    """``text`` as the live job_submit.lua; the rendered file is put back afterwards."""
    rendered = rendered_lua(cluster)
    install_lua(cluster, text)
    try:
        yield
    finally:
        install_lua(cluster, rendered)


def rendered_lua(cluster) -> str:
    return (cluster.conf_dir / "job_submit.lua").read_text(encoding="utf-8")


def submit_batch(cluster, batch: list[tuple[str, list[str]]]) -> dict[str, dict]:
    """[(tag, sbatch options)] -> {tag: {rc, stdout, stderr, job}}, all submitted in one exec as alice."""
    res = cluster.exec(
        "slurmctld", ["python3", "-c", SUBMITTER, json.dumps(batch), SCRIPT], user=USER, timeout=60 + 5 * len(batch)
    )
    out = {}
    for rec in json.loads(res.stdout):
        rec["job"] = int(rec["stdout"].strip().split(";")[0]) if rec["rc"] == 0 else None
        if rec["job"] is not None:
            SUBMITTED.append(rec["job"])
        out[rec["tag"]] = rec
    return out


def jobs_by_id(cluster, ids: list[int]) -> dict[int, dict]:
    """The scontrol records of these jobs (one `scontrol -o show job` for all)."""
    out = cluster.slurm(["scontrol", "-o", "show", "job"], check=False).stdout
    want = set(ids)
    return {int(rec["JobId"]): rec for rec in parse_scontrol_oneliners(out) if int(rec.get("JobId", 0)) in want}


def user_text(stderr: str, rejected: bool) -> str | None:
    """What job_submit.lua's log_user said, as sbatch printed it (prefix per line)."""
    lines = stderr.rstrip("\n").splitlines()
    if rejected and lines and lines[-1].startswith(SUBMIT_FAILED):
        lines = lines[:-1]
    prefix = "sbatch: error: " if rejected else "sbatch: "
    if not lines or not all(line.startswith(prefix) for line in lines):
        return None if not lines else "\n".join(lines)
    return "\n".join(line[len(prefix) :] for line in lines) or None


def gres_of(field: str, text: str | None) -> list[tuple]:
    """A tres_per_* string as its requests, whatever the separators: [(name, type, count)] / raw entries."""
    if text in (None, "", "(null)"):
        return []
    return sorted(
        (e.name, e.type, e.count) if hasattr(e, "count") else ("", e.raw, 0) for e in parse_field(field, text)
    )


def qos_names(text: str | None) -> set[str]:
    return {q.strip().lower() for q in (text or "").split(",") if q.strip()}


def scontrol_field(name: str) -> str:
    return "TresPer" + name.split("_")[-1].capitalize()  # tres_per_node -> TresPerNode


def default_partition(cluster) -> str:
    return next(t.name for t in cluster.site.tiers if t.is_default)


def cancel_and_drain(cluster, timeout: float = 120) -> None:
    ids = sorted(set(SUBMITTED))
    if not ids:
        return
    for i in range(0, len(ids), 200):
        cluster.slurm(["scancel", *map(str, ids[i : i + 200])], check=False)
    deadline = time.monotonic() + timeout
    left = ids
    while time.monotonic() < deadline:
        out = cluster.slurm(["squeue", "-h", "-u", USER, "-t", "PD,R,CG,CF,S", "-o", "%i"], check=False).stdout
        left = [i for i in ids if str(i) in out.split()]
        if not left:
            SUBMITTED.clear()
            return
        time.sleep(1)
    raise AssertionError(f"jobs still queued {timeout:.0f} s after scancel: {left}")


# ---- fixtures ----------------------------------------------------------------
@pytest.fixture(scope="module")
def live(cluster):
    """The cluster, with the rendered job_submit.lua live; every job cancelled and the queue drained at the end."""
    text = cluster.exec("slurmctld", ["cat", LIVE]).stdout
    assert text == rendered_lua(cluster) == job_submit_lua(cluster.site), "live job_submit.lua is not the rendered one"
    assert "JobSubmitPlugins=lua" in cluster.exec("slurmctld", ["cat", "/etc/slurm/slurm.conf"]).stdout
    try:
        yield cluster
    finally:
        cancel_and_drain(cluster)
        assert cluster.exec("slurmctld", ["cat", LIVE]).stdout == rendered_lua(cluster)


@pytest.fixture(scope="module")
def real(live):
    """Each cluster case through real sbatch and the rendered script: {id: result + the job's scontrol record}."""
    results = submit_batch(live, [(c["id"], BASE + list(c["options"])) for c in CLUSTER_CASES])
    jobs = jobs_by_id(live, [r["job"] for r in results.values() if r["job"] is not None])
    for r in results.values():
        r["record"] = jobs.get(r["job"], {})
    return results


@pytest.fixture(scope="module")
def seen(live):
    """{id: the tres_per_*/partition fields, and the task layout where set, that slurmctld handed job_submit}
    (None: job_submit never ran)."""
    token = uuid.uuid4().hex[:12]
    wrapped = rendered_lua(live) + DEBUG_WRAPPER
    with installed(live, wrapped):
        results = submit_batch(
            live, [(c["id"], BASE + [f"--comment={token}:{c['id']}"] + list(c["options"])) for c in CLUSTER_CASES]
        )
        log = live.exec("slurmctld", ["grep", "-F", f"gpushare-debug\t{token}:", LOG], check=False).stdout
    fields: dict[str, dict | None] = {c["id"]: None for c in CLUSTER_CASES}
    for line in log.splitlines():
        parts = line.split("gpushare-debug\t", 1)[1].split("\t")
        case_id = parts[0].split(":", 1)[1]
        fields[case_id] = dict(p.split("=", 1) for p in parts[1:])
    return {"fields": fields, "results": results}


# ---- the corpus on real sbatch --------------------------------------------------
def test_there_are_cluster_cases():
    assert 20 <= len(CLUSTER_CASES) <= 40


@pytest.mark.parametrize("case", CLUSTER_CASES, ids=CLUSTER_IDS)
def test_real_sbatch_decision(real, live, case):
    """Accepted or refused as the corpus says; an accepted job carries the partition and fields the decision leaves."""
    r, want = real[case["id"]], case["expect"]
    assert (r["rc"] == 0) == want["accept"], f"{case['id']}: sbatch rc={r['rc']} stderr={r['stderr']!r}"
    if not want["accept"]:
        assert r["job"] is None
        return
    rec = r["record"]
    assert rec, f"{case['id']}: job {r['job']} not found by scontrol"
    decision = python_decision(case)
    asked = case_job(case)
    partition = want.get("partition") or asked.get("partition") or default_partition(live)
    assert rec["Partition"] == partition, f"{case['id']}: Partition={rec['Partition']}"
    # job_submit gives the job its tier's QOS (unless it named one), so the tier's UsageFactor applies
    assert rec["QOS"] == (want.get("qos") or asked.get("qos")), f"{case['id']}: QOS={rec['QOS']}"
    for name in FIELDS:
        got = rec.get(scontrol_field(name))
        got = None if got in (None, "(null)") else got
        if name in want.get("fields", {}):
            assert got == want["fields"][name], f"{case['id']}: {scontrol_field(name)}={got}"
        else:
            # untouched: the same GRES as asked (sbatch's own separators may differ, see FIELD_FORMAT)
            assert gres_of(name, got) == gres_of(name, decision.fields.get(name, asked.get(name))), (
                f"{case['id']}: {scontrol_field(name)}={got}, asked {asked.get(name)}"
            )


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            marks=pytest.mark.xfail(
                strict=True, reason=f"Slurm 24.11 sbatch refuses it itself: {SBATCH_REFUSES[c['id']]}"
            ),
        )
        if c["id"] in SBATCH_REFUSES
        else c
        for c in CLUSTER_CASES
    ],
    ids=CLUSTER_IDS,
)
def test_real_sbatch_shows_the_user_message(real, case):
    """What sbatch prints is the decision's user message byte for byte (codes and the case's fragment in it)."""
    r, want = real[case["id"]], case["expect"]
    decision = python_decision(case)
    text = user_text(r["stderr"], rejected=r["rc"] != 0)
    assert text == decision.user_message, f"{case['id']}: sbatch printed {r['stderr']!r}"
    if "message" in want:
        assert want["message"] in r["stderr"]
    if r["rc"] != 0:
        codes = [line.split(": ", 1)[0] for line in text.split("\n")[1:]]
        assert codes == want.get("codes", [])
        assert r["stderr"].rstrip("\n").splitlines()[-1].startswith(SUBMIT_FAILED)


def test_sbatch_refusals_are_sbatchs_own(real, live):
    """The SBATCH_REFUSES cases fail in sbatch with Slurm's text, and no gpushare message (job_submit never ran)."""
    for case_id, message in SBATCH_REFUSES.items():
        r = real[case_id]
        assert r["rc"] != 0 and message in r["stderr"] and "gpushare" not in r["stderr"], r


# ---- what slurmctld hands job_submit ----------------------------------------------
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            marks=pytest.mark.xfail(
                strict=True,
                reason=f"sbatch sends {FIELD_FORMAT[c['id']]}, options.py predicts "
                f"{ {k: case_job(c).get(k) for k in FIELD_FORMAT[c['id']]} }",
            ),
        )
        if c["id"] in FIELD_FORMAT
        else c
        for c in CLUSTER_CASES
        if c["id"] not in SBATCH_REFUSES
    ],
    ids=lambda c: c["id"],
)
def test_job_submit_gets_the_fields_options_py_predicts(seen, case):
    got = seen["fields"][case["id"]]
    assert got is not None, (
        f"{case['id']}: no gpushare-debug line (job_submit not called?) {seen['results'][case['id']]}"
    )
    want = case_job(case)
    assert {k: v for k, v in got.items() if k != "assoc_qos"} == {k: v for k, v in want.items() if k != "assoc_qos"}
    # job_desc.assoc_qos (24.11): the association's QOS, as the corpus assumes alice/physics has them (any order)
    assert qos_names(got.get("assoc_qos")) == qos_names(want.get("assoc_qos")), got


@pytest.mark.parametrize("case", [c for c in CLUSTER_CASES if c["id"] not in SBATCH_REFUSES], ids=lambda c: c["id"])
def test_python_decision_on_the_real_fields(seen, live, case):
    """The Python decision on the strings slurmctld really passes reaches the corpus's expectation."""
    got = seen["fields"][case["id"]]
    assert got is not None
    d = decide(build_tables(live.site), got)
    check_expectations(case, d.accepted, d.codes, d.user_message, d.partition, dict(d.fields), d.qos)
    assert d.user_message == python_decision(case).user_message
    r = seen["results"][case["id"]]
    assert (r["rc"] == 0) == case["expect"]["accept"], r


def test_field_format_table_is_what_slurm_sends(seen):
    for case_id, fields in FIELD_FORMAT.items():
        got = seen["fields"][case_id]
        assert got is not None and {k: got.get(k) for k in fields} == fields, got


def test_sbatch_refused_cases_never_reach_job_submit(seen):
    for case_id in SBATCH_REFUSES:
        assert seen["fields"][case_id] is None


# ---- fail closed on the real controller ------------------------------------------------
def test_broken_tables_fail_closed_then_restore(live):
    site = live.site
    broken = render_body(site, {**lua_data(build_tables(site)), "fields": 42, "fail_open": False})
    gpu = BASE + ["--gres=shard:1"]
    plain = BASE + ["-p", default_partition(live)]
    with installed(live, broken):
        res = submit_batch(live, [("gpu", gpu), ("plain", plain)])
        log = live.exec("slurmctld", ["grep", "-F", "internal error in slurm_job_submit", LOG], check=False).stdout
    for tag, r in res.items():
        assert r["rc"] != 0, f"{tag} job accepted by a broken job_submit.lua: {r}"
        assert "internal error in gpushare's job_submit.lua" in r["stderr"], r["stderr"]
        assert "fail closed" in r["stderr"] and "please tell your cluster admins" in r["stderr"], r["stderr"]
    assert "(the job is rejected: fail closed)" in log
    again = submit_batch(live, [("gpu", gpu), ("plain", plain)])
    for tag, r in again.items():
        assert r["rc"] == 0 and r["job"] is not None, f"{tag} job refused after the rendered script was restored: {r}"
        assert "gpushare" not in r["stderr"], r["stderr"]
