"""The wheel installs the product folders inside dmae_fast, never as generic top-level modules."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_layout(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=1200, cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("dmae_fast-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level <= {"dmae_fast", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    for folder in ("kernels", "export", "train", "bench"):
        assert f"dmae_fast/{folder}/__init__.py" in names
    # every subpackage of the source tree (a wheel built from a list that lacks one would fail at its import)
    for init in sorted((ROOT / "dmae_fast").rglob("__init__.py")):
        assert str(init.relative_to(ROOT)) in names, f"{init.relative_to(ROOT)} is not in the wheel (pyproject)"
    assert "dmae_fast/assets/demo-digits-vit.safetensors" in names
    assert "dmae_fast/kernels/sound_noise_cpu.c" in names  # the C kernel compiles from its installed source
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for script in ("dmae-certify", "dmae-train", "dmae-export", "dmae-bench", "dmae-serve"):
        assert script in entry_points



def test_every_subpackage_is_listed_for_setuptools():
    """pyproject names every package folder of dmae_fast (setuptools ships an unlisted one only with a warning that
    it will stop: dmae_fast.distributed was unlisted until 2026-12-06)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "dmae_fast").rglob("__init__.py")}
    assert folders <= listed, f"not in pyproject's [tool.setuptools] packages: {sorted(folders - listed)}"

def test_namespaced_subpackages_import():
    import dmae_fast.bench
    import dmae_fast.export
    import dmae_fast.kernels
    import dmae_fast.train

    assert Path(dmae_fast.kernels.__file__).parent.name == "kernels"
    assert Path(dmae_fast.train.__file__).parent.name == "train"
    assert Path(dmae_fast.export.__file__).parent.name == "export"
    assert Path(dmae_fast.bench.__file__).parent.name == "bench"
