"""Paths that work where users run them: the shipped models and results from any working folder
(`cgt_viz.shipped_path`), the README's blocks from notebooks/ (where `make lab`'s kernels run), and the
pictures of the notebooks inside the folder `make lab` serves."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cgt_viz
from cgt_viz import shipped_path

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_path_resolves_against_the_repository_from_any_folder(tmp_path):
    code = ("import cgt_viz, json; p = cgt_viz.shipped_path('data/models/text-bbc5'); "
            "print(json.dumps([str(p), (p / 'config.json').is_file()]))")
    for cwd in (tmp_path, ROOT / "notebooks", ROOT):
        out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr
        path, has_config = json.loads(out.stdout.splitlines()[-1])
        assert Path(path) == ROOT / "data" / "models" / "text-bbc5" and has_config, cwd
    assert shipped_path() == ROOT and shipped_path(Path("benchmarks/results")).is_dir()


@pytest.mark.parametrize("bad, error, words", [
    ("/etc", ValueError, "relative must be a path inside the repository"),
    ("../outside", ValueError, "no leading / and no .."),
    ("data/models/no-such-model", FileNotFoundError, "does not exist in this clone"),
    (7, TypeError, "relative must be a path relative to the repository root"),
])
def test_shipped_path_refuses_what_is_not_shipped(bad, error, words):
    with pytest.raises(error, match=re.escape(words)):
        shipped_path(bad)


def test_shipped_path_says_when_the_package_has_no_repository(tmp_path, monkeypatch):
    """A wheel installs the package alone: the message says the shipped files come with a clone."""
    import cgt_viz.paths as paths

    fake = tmp_path / "site-packages"
    (fake / "data" / "models" / "x").mkdir(parents=True)        # even a folder that happens to exist there
    monkeypatch.setattr(paths, "REPOSITORY", fake)
    with pytest.raises(FileNotFoundError, match="installed without its repository.*pip install -e"):
        paths.shipped_path("data/models/x")


def test_the_readme_explorer_lines_load_the_shipped_model_from_notebooks(monkeypatch):
    """The README's two-liner, run where `make lab`'s kernels run (notebooks/): the model loads (the explorer
    call itself is left out: the widgets are tested elsewhere)."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## The ȳ explorer in two lines"):]
    block = block[block.index("```python") + len("```python"):]
    block = block[:block.index("```")]
    statements = [s.strip() for line in block.strip().splitlines() for s in line.split(";")]
    assert any("shipped_path(" in s for s in statements)
    monkeypatch.chdir(ROOT / "notebooks")
    scope: dict = {}
    for statement in statements:
        if not statement.startswith("explore("):
            exec(statement, scope)
    assert isinstance(scope["model"], cgt_viz.CGT)
    assert scope["task_from_config"](scope["model"].config).name == "text"


def test_readme_and_notebooks_name_shipped_files_through_shipped_path():
    """No path relative to a working folder ("../data", a bare "data/models/..." string) in the README's code or
    the notebooks' code: each resolves through shipped_path."""
    import nbformat

    readme = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(nb_path, 4)
        code += [c.source for c in nb.cells if c.cell_type == "code"]
    relative = re.compile(r"""["'](\.\./)*(data|benchmarks)/""")
    for text in code:
        for line in text.splitlines():
            if relative.search(line):
                assert "shipped_path(" in line, line
    assert "Path.cwd()" not in "\n".join(code)


def test_make_lab_serves_the_repository_so_the_notebook_pictures_resolve():
    """The server `make lab` starts is rooted where every relative picture of a notebook lies (jupyter_server
    roots a server started on a file at that file's folder, where ../docs/img is out of reach: a 404)."""
    from jupyter_server.serverapp import ServerApp

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", "lab"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    line = next(ln for ln in dry.stdout.splitlines() if "jupyter lab" in ln)
    args = shlex.split(line.split("jupyter lab", 1)[1])
    app = ServerApp()
    cwd = Path.cwd()
    try:                                         # make lab runs in the repository root
        os.chdir(ROOT)
        app.parse_command_line(args)
        served = Path(app.root_dir).resolve()
    finally:
        os.chdir(cwd)
    assert served == ROOT
    pictures = 0
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            text = "".join(cell["source"])
            for src in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", text) + re.findall(r"<img[^>]*src=[\"']([^\"']+)", text):
                if "://" in src or src.startswith("data:") or src.startswith("attachment:"):
                    continue
                target = (nb_path.parent / src).resolve()
                assert target.is_file(), f"{nb_path.name}: {src} does not exist"
                assert served in target.parents, f"{nb_path.name}: {src} lies outside the folder the lab serves"
                pictures += 1
    assert pictures >= 1                                   # notebook 01's architecture picture at least
