"""The demand model: request classes from an openb CSV, sacct records and squeue --json, counted by hand."""

from __future__ import annotations

import io
import json

import pytest

from slurm_gpushare.planner.demand import (
    DemandError,
    RequestClass,
    Units,
    cpus_of,
    format_demand,
    from_job_records,
    from_openb,
    from_squeue_json,
    pack_estimate,
    read_openb,
)
from slurm_gpushare.sim.trace import load_pods
from slurm_gpushare.slurm.sacct import parse_parsable2

CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase
p0,12000,16384,1,1000,,LS,Running
p1,6000,12288,1,470,,BE,Running
p2,5500,12288,1,470,,BE,Running
p3,4000,8192,0,0,,LS,Running
p4,32000,65536,8,1000,,LS,Running
p5,6000,12288,1,470,,LS,Running
"""


def test_openb_classes_counted_by_hand():
    d = from_openb(CSV, "six.csv")
    assert d.jobs == 6
    assert d.source == "openb:six.csv"
    # 5500 millicores are 6 whole CPUs, so p1 and p2 are one class
    assert d.counts[RequestClass(1, 470, 6, 12288, "BE")] == 2
    assert d.counts[RequestClass(1, 470, 6, 12288, "LS")] == 1
    assert d.by_kind() == {"cpu": 1, "fraction": 3, "whole": 1, "multi": 1}
    assert d.gpu_milli == 1000 + 3 * 470 + 8000
    assert d.fractions() == {470: 3}
    assert d.gpu_counts() == {1: 1, 8: 1}
    assert d.units_needed() == 100  # 470 needs 1 % steps


def test_units_needed_is_the_coarsest_exact_divisor():
    d = from_openb("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1,1,500\nb,1000,1,1,250\n")
    assert d.units_needed() == 4


def test_cpus_are_whole_as_slurm_allocates_them():
    assert [cpus_of(m) for m in (0, 1, 999, 1000, 1001, 88000)] == [1, 1, 1, 1, 2, 88]


def test_cpus_per_gpu_counts_gpu_jobs_only():
    d = from_openb(CSV)
    # GPU jobs: 12 + 6 + 6 + 32 + 6 CPUs over 1 + 1.41 + 8 GPUs
    assert d.cpus_per_gpu() == pytest.approx(62 / 10.41)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "t.csv: empty file; an openb pod list starts with a header row"),
        ("name,cpu_milli,memory_mib,num_gpu\n", "line 1: missing column(s) gpu_milli"),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1,1,x\n",
            "line 2, column gpu_milli: 'x' is not an integer from 0 to 1000",
        ),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1,1,1200\n",
            "line 2, column gpu_milli: 1200 is out of range",
        ),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1,2,500\n",
            "line 2, column gpu_milli: 500 with num_gpu 2; accepted: 1000",
        ),
        (
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,-5,1,1,500\n",
            "line 2, column cpu_milli: -5 is out of range; accepted: an integer >= 0",
        ),
    ],
)
def test_openb_errors_name_line_and_field(text, fragment):
    with pytest.raises(DemandError) as info:
        read_openb(text, "t.csv")
    assert fragment in str(info.value)
    assert str(info.value).startswith("t.csv")


def test_cpu_only_pod_ignores_its_gpu_milli():
    [pod] = read_openb("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1,0,1000\n")
    assert pod.gpu_milli == 0


SACCT = """JobID|User|Account|Partition|State|Start|End|Elapsed|ElapsedRaw|AllocTRES|ReqTRES|QOS
1|a|phys|main|COMPLETED|1700000000|1700003600|01:00:00|3600|billing=6,cpu=6,gres/mps=47,mem=12G,node=1||be
2|a|phys|main|COMPLETED|1700000000|1700003600|01:00:00|3600|cpu=12,gres/gpu=2,gres/gpu:a100_40g=2,mem=32G,node=1||ls
3|b|bio|mig|COMPLETED|1700000000|1700003600|01:00:00|3600|cpu=2,gres/gpu=1,gres/gpu:a100_40g_1g.5gb=1,mem=4G,node=1||ls
4|b|bio|main|COMPLETED|1700000000|1700003600|01:00:00|3600|cpu=4,mem=8G,node=1||normal
5|b|bio|shard|COMPLETED|1700000000|1700003600|01:00:00|3600|cpu=2,gres/shard=1,mem=4G,node=1||normal
"""


def test_sacct_records_through_the_existing_reader():
    records = parse_parsable2(io.StringIO(SACCT), source="t")
    units = Units(mps=100, shard=4, type_milli={"a100_40g_1g.5gb": 143})
    d = from_job_records(records, units, "t")
    assert d.counts == {
        RequestClass(0, 0, 4, 8192, "normal"): 1,
        RequestClass(1, 143, 2, 4096, "ls", "a100_40g_1g.5gb"): 1,
        RequestClass(1, 250, 2, 4096, "normal"): 1,
        RequestClass(1, 470, 6, 12288, "be"): 1,
        RequestClass(2, 1000, 12, 32768, "ls", "a100_40g"): 1,
    }


def test_sacct_shares_need_units():
    records = parse_parsable2(io.StringIO(SACCT), source="t")
    with pytest.raises(DemandError, match="job 5: gres/shard=1 but the policy gives no gres/shard units"):
        from_job_records(records, Units(shard=0), "t")


def test_pending_queue_from_squeue_json():
    doc = {
        "jobs": [
            {
                "job_id": 7,
                "job_state": ["PENDING"],
                "cpus": {"set": True, "number": 6},
                "memory_per_node": {"set": True, "number": 12288},
                "tres_per_node": "gres/mps:47",
                "qos": "be",
            },
            {
                "job_id": 8,
                "job_state": ["PENDING"],
                "cpus": {"set": True, "number": 4},
                "memory_per_cpu": {"set": True, "number": 1024},
                "tres_per_node": "gres/gpu:a100_40g:2",
                "qos": "ls",
            },
            {"job_id": 9, "job_state": ["RUNNING"], "cpus": 1, "tres_per_node": "gres/gpu:1"},
        ]
    }
    d = from_squeue_json(json.dumps(doc), Units(), "q.json")
    assert d.counts == {RequestClass(1, 470, 6, 12288, "be"): 1, RequestClass(2, 1000, 4, 4096, "ls", "a100_40g"): 1}


@pytest.mark.parametrize("text, fragment", [("[", "not squeue --json output"), ("{}", "no 'jobs' list")])
def test_squeue_errors(text, fragment):
    with pytest.raises(DemandError, match=fragment):
        from_squeue_json(text)


def test_squeue_unreadable_gres_names_the_job():
    doc = {"jobs": [{"job_id": 3, "job_state": "PENDING", "tres_per_node": "gres/gpu:a:b:c"}]}
    with pytest.raises(DemandError, match="job 3: GRES 'gres/gpu:a:b:c' is not readable"):
        from_squeue_json(json.dumps(doc))


def test_pack_estimate_pairs_complementary_shares():
    # 4 x 500 fill 2 GPUs; 2 x 810 cannot share: 2 more
    assert pack_estimate({500: 4}) == 2
    assert pack_estimate({810: 2}) == 2
    assert pack_estimate({810: 2, 190: 2}) == 2


def test_report_lines_name_kinds_and_qos():
    text = "\n".join(format_demand(from_openb(CSV, "six.csv")))
    assert "6 jobs from openb:six.csv" in text
    assert "fraction" in text and "470: 3" in text
    assert "BE/fraction: 2" in text


def test_one_openb_reader_serves_the_trace_and_the_demand(tmp_path):
    text = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,extra\np0,1500,10,1,470,,LS,x\np1,100,1,0,0,,BE,y\n"
    )
    path = tmp_path / "p.csv"
    path.write_text(text)
    assert tuple(read_openb(text, str(path))) == load_pods(path)
