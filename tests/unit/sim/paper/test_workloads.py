"""The paper's workload family as shipped: every pod list loads, by name or file, with its published figures."""

from __future__ import annotations

import csv
import gzip
import io
from collections import Counter

import pytest

from slurm_gpushare.sim.paper.workloads import TRACE_DIR, WORKLOADS, load_workload, workload_name, workload_path
from slurm_gpushare.sim.trace import TraceError, load_pods

pytestmark = pytest.mark.repro


def published_rows() -> list[dict[str, str]]:
    with gzip.open(TRACE_DIR / "analysis_allo_discrete.csv.gz", "rt", newline="") as f:
        return list(csv.DictReader(f))


def test_family_is_the_seventeen_published_workloads_with_fgd_and_bestfit_for_seeds_42_to_51():
    rows = published_rows()
    assert len(WORKLOADS) == 17
    assert {r["workload"] for r in rows} == {f"openb_pod_list_{w}" for w in WORKLOADS}
    seeds = Counter((r["workload"], r["sc_policy"]) for r in rows)
    for w in WORKLOADS:
        for policy in ("06-FGD", "05-BestFit"):
            assert seeds[(f"openb_pod_list_{w}", policy)] == 10, (w, policy)


def test_the_default_rows_of_the_family_file_are_the_default_file():
    family = [r for r in published_rows() if r["workload"] == "openb_pod_list_default"]
    with open(TRACE_DIR / "fgd_expected_default.csv", newline="") as f:
        assert family == list(csv.DictReader(f))


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_loads_by_name_with_its_gpu_demand(name):
    pods = load_workload(name)
    assert len(pods) > 7000
    # the paper's variants keep the default trace's GPU demand except gpushare (fewer whole GPUs) and multigpu (more)
    demand = sum(p.gpu_demand_milli for p in pods)
    if name.startswith(("cpu", "gpuspec")) or name == "default":
        assert demand == 6_086_800
    specs = {p.gpu_spec for p in pods if p.gpu_spec}
    assert bool(specs) == name.startswith("gpuspec")


def test_multi_type_specs_are_kept_as_written():
    pods = load_workload("gpuspec33")
    specs = Counter(p.gpu_spec for p in pods if "|" in p.gpu_spec)
    assert sum(specs.values()) == 378 and specs["V100M16|V100M32"] == 141
    assert specs["V100M16|V100M32|V100M32"] == 22  # a model listed twice, as in the published file


def test_a_file_loads_the_same_plain_or_gzipped_and_names_are_resolved(tmp_path):
    plain = tmp_path / "openb_pod_list_gpuspec10.csv"
    with gzip.open(workload_path("gpuspec10"), "rt", newline="") as f:
        plain.write_text(f.read(), newline="")
    assert load_pods(plain) == load_workload("gpuspec10") == load_workload("openb_pod_list_gpuspec10")
    assert workload_name(plain) == "gpuspec10"
    assert workload_name(tmp_path / "mine.csv") == "mine.csv"
    assert load_workload(str(plain)) == load_workload("gpuspec10")


def test_an_unknown_workload_names_the_accepted_ones():
    with pytest.raises(
        TraceError, match=r"'gpushare50': neither a file nor one of the family's names \(accepted: default, cpu050"
    ):
        workload_path("gpushare50")


def test_a_truncated_gzip_fails_loudly(tmp_path):
    bad = tmp_path / "x.csv.gz"
    data = gzip.compress(b"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1,1,500\n")
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises((EOFError, OSError)):
        load_pods(bad)


def test_shipped_copies_are_the_csv_the_readme_describes():
    text = gzip.open(workload_path("multigpu50"), "rt").read()
    header = next(csv.reader(io.StringIO(text)))
    assert header == ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"]
