"""The backend imports pynvml without ctypes.util (gpu/backend.py ``_import_pynvml``): a stand-in is in
sys.modules only during the import, and its find_library is the real one when called."""

import subprocess
import sys

import pytest

pytest.importorskip("pynvml")

PROBE = """
import sys
from slurm_gpushare.gpu.backend import _import_pynvml
nv = _import_pynvml()
print("ctypes.util" in sys.modules, nv.find_library("c") is not None, "ctypes.util" in sys.modules)
import ctypes.util
print(ctypes.util.find_library("c") == nv.find_library("c"), hasattr(ctypes.util, "test"))
"""


def test_pynvml_is_imported_without_ctypes_util_and_find_library_still_works():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split("\n")
    # not imported by pynvml; the stand-in's find_library imports the real module when called
    assert out[0] == "False True True"
    assert out[1] == "True True"  # the real module afterwards, whole


def test_a_ctypes_util_imported_before_is_left_alone():
    probe = (
        "import ctypes.util, sys\nreal = sys.modules['ctypes.util']\nfrom slurm_gpushare.gpu.backend import "
        "_import_pynvml\n_import_pynvml()\nprint(sys.modules['ctypes.util'] is real)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
