"""The two install paths (pip + pyproject.toml, conda + environment.yml) list the same packages,
and notebooks are stored without outputs."""
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\s\[]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _environment_yml_names() -> set[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = set()
    for dep in env["dependencies"]:
        items = dep["pip"] if isinstance(dep, dict) else [dep]
        names |= {_name(d) for d in items if not d.startswith("-e")}
    return names - {"python", "pip"}


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        wanted |= {_name(r) for r in extra}
    have = _environment_yml_names()
    assert wanted - have == set(), f"in pyproject.toml but not environment.yml: {sorted(wanted - have)}"
    assert have - wanted == set(), f"in environment.yml but not pyproject.toml: {sorted(have - wanted)}"


def test_make_env_installs_every_extra():
    """`make env` (and so `make test`, CI) installs every extra pyproject.toml defines: the png extra too,
    so that CI, with Debian's chromium from `make browser-deps`, runs the PNG path (tests/views/test_png.py)."""
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    installed = re.search(r'-e "\.\[([^\]]*)\]"', (ROOT / "Makefile").read_text())
    assert installed, "the Makefile's env recipe no longer installs the project with its extras"
    assert set(installed.group(1).split(",")) == extras


def test_torch_pinned_where_installed():
    assert "torch==2.13.0" in (ROOT / "requirements.txt").read_text()
    assert "torch==2.13.0" in (ROOT / "environment.yml").read_text()


def test_notebooks_in_git_have_no_outputs():
    tracked = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    paths = [ROOT / p for p in tracked] or sorted(ROOT.glob("notebooks/*.ipynb"))
    dirty = []
    for path in paths:
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count")):
                dirty.append(path.name)
                break
    assert not dirty, f"notebooks stored with outputs (strip them): {dirty}"
