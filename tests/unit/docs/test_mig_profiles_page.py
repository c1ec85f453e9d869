"""docs/reference/mig-profiles.md is what tools/mig_profiles_page.py generates from the GPU catalogue now."""

from __future__ import annotations

import importlib.util

from slurm_gpushare import hardware
from tests.conftest import ROOT


def _tool():
    spec = importlib.util.spec_from_file_location("mig_profiles_page", ROOT / "tools" / "mig_profiles_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_page_is_current():
    tool = _tool()
    assert tool.PAGE.read_text() == tool.page(), f"regenerate: {tool.COMMAND}"


def test_page_names_every_model_profile_and_nvml_name():
    text = _tool().page()
    for model in hardware.models():
        assert f"### {model.name} " in text
        for name in model.nvml_names:
            assert f"| `{name}` | [{model.name}]" in text
        for p in model.mig_profiles:
            assert f"| {p.name} | `{model.mig_slurm_type(p.name)}` |" in text


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    tool = _tool()
    stale = tmp_path / "mig-profiles.md"
    stale.write_text("old\n")
    monkeypatch.setattr(tool, "PAGE", stale)
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    assert tool.main(["--check"]) == 1
    assert tool.COMMAND in capsys.readouterr().err
    assert tool.main([]) == 0 and tool.main(["--check"]) == 0
