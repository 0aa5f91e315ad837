"""The installed package: one import name, ``fi_profile``, and nothing else at top level.

The wheel is built from this checkout and installed (without dependencies) into a fresh venv that
borrows this venv's packages (torch, vLLM, ...) through a plain path entry. From a working folder
that has its own ``hooks/`` package and ``profiler.py`` (common names in application repos, first
on ``sys.path`` there), ``fi-profile validate`` and a tiny multi-process vLLM capture must run with
fi-profile's own modules, and the engine process must get the hooks through the entry point.
"""

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
                   check=True, capture_output=True, timeout=600)
    (found,) = out.glob("fi_profile-*.whl")
    return found


def test_wheel_holds_fi_profile_only_and_every_module(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"fi_profile"}
    shipped = {n for n in names if n.endswith(".py")}
    for folder, package in (("profiler", "fi_profile"), ("hooks", "fi_profile/hooks"), ("definitions", "fi_profile/definitions")):
        for source in (REPO / folder).rglob("*.py"):
            assert f"{package}/{source.relative_to(REPO / folder).as_posix()}" in shipped, source
    definitions = [n for n in names if n.startswith("fi_profile/definitions/") and n.endswith(".json")]
    assert len(definitions) == len(list((REPO / "definitions").rglob("*.json")))
    entry_points = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "fi_profile.hooks.vllm.plugin:register" in entry_points and "fi_profile.hooks.sglang.plugin:register" in entry_points
    assert "fi-profile = fi_profile.cli:app" in entry_points


@pytest.mark.skipif(os.environ.get("CI") != "true" and not os.path.isdir(sysconfig.get_paths()["purelib"] + "/vllm"),
                    reason="needs vLLM in this venv")
def test_installed_wheel_runs_beside_a_projects_own_hooks_and_profiler(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # a path: its own .pth files stay inactive
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    project = tmp_path / "project"
    (project / "hooks").mkdir(parents=True)
    (project / "hooks" / "__init__.py").write_text("raise ImportError('the project\\'s own hooks package was imported')\n")
    (project / "profiler.py").write_text("raise ImportError('the project\\'s own profiler.py was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(project)}  # the project's folder first, as in its own runs
    validate = subprocess.run([str(venv / "bin" / "fi-profile"), "validate"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=300)
    assert validate.returncode == 0 and "0 error(s)" in validate.stdout, validate.stdout + validate.stderr
    where = subprocess.run([str(python), "-c", "import fi_profile; print(fi_profile.__file__)"], cwd=project, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(purelib)), where
    out = project / "capture"
    capture = subprocess.run(
        [str(python), "-c", "from fi_profile.cli import app; app()", "--model", "fi-profile/tiny-llama",
         "--num-prompts", "2", "--input-len", "8", "--output-len", "3", "--out", str(out)],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )
    assert capture.returncode == 0, capture.stdout[-3000:] + capture.stderr[-3000:]
    run = json.loads((out / "record.json").read_text())["run"]
    assert run["hooks_missing"] == [] and run["hook_errors"] == {} and run["steps"]["learned"] >= 2
    assert "gemm_bf16_n512_k256" in (out / "record.json").read_text()
