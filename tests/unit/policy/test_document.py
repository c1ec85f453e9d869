"""Alias editing of the policy document (policy/document.py ``remap_aliases``) on the small lab's policy."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from slurm_gpushare.policy import build_site
from slurm_gpushare.policy.document import remap_aliases

ETC = Path(__file__).resolve().parents[3] / "etc"


def _lab() -> dict:
    return yaml.safe_load((ETC / "small-lab.yaml").read_text())


def _group(doc: dict, name: str) -> dict:
    return next(g for g in doc["node_groups"] if g["name"] == name)


def test_a_vanished_mig_slice_goes_to_the_smallest_slice_of_its_model_that_covers_it():
    before = build_site(_lab(), "given")
    doc = _lab()
    _group(doc, "lab-mig")["sharing"] = [{"gpus": 0, "mode": "mig", "layout": "all-3g.20gb"}]
    why = remap_aliases(doc, before)
    assert doc["submission"]["aliases"] == {"small": "gpu:a100_40g_3g.20gb", "half": "mps:50"}
    assert why == [
        "alias 'small': gpu:a100_40g_1g.5gb no longer exists in the planned layout; remapped to "
        "gpu:a100_40g_3g.20gb (it asked 0.14 of a A100-SXM4-40GB)"
    ]
    build_site(doc, "remapped")  # the edited document is a valid policy


def test_an_mps_share_without_mps_goes_to_a_covering_slice_and_what_nothing_covers_is_dropped():
    before = build_site(_lab(), "given")
    doc = _lab()
    _group(doc, "lab-mps")["sharing"] = [{"gpus": 0, "mode": "exclusive"}]
    _group(doc, "lab-mig")["sharing"] = [{"gpus": 0, "mode": "mig", "layout": "all-3g.20gb"}]
    doc["submission"]["aliases"]["big"] = "mps:90"
    why = remap_aliases(doc, before)
    assert doc["submission"]["aliases"] == {"small": "gpu:a100_40g_3g.20gb", "half": "gpu:a100_40g_3g.20gb"}
    assert why[-1] == (
        "alias 'big': mps:90 no longer exists in the planned layout and nothing planned covers 0.90 of a GPU; dropped"
    )


def test_a_document_whose_aliases_all_exist_is_left_as_it_is():
    doc = _lab()
    kept = copy.deepcopy(doc)
    assert remap_aliases(doc, build_site(_lab(), "given")) == []
    assert doc == kept
