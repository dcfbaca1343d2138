"""Sphinx configuration of the cgt_viz site (`make docs`; see docs/build.py for what runs before Sphinx).

Offline by construction: no intersphinx, no CDN, no MathJax (no page uses math markup); plotly.js comes
inside the notebooks' static view outputs (cgt_viz.widgets._static), from the installed plotly package.
The notebooks are rendered from executed copies (nb_execution_mode "off"): `make test` executes them once
under nbmake and the site reuses that run.
"""
from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

import build  # noqa: E402  (docs/build.py: the generated pages)

project = "cgt_viz"
author = "cgt_viz contributors"
copyright = "cgt_viz contributors"
release = build.version()

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.autosummary"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "make_images.py", "build.py", "conf.py", "img/*.py", "**/.ipynb_checkpoints"]
templates_path: list[str] = []

# -- notebooks: rendered from their executed copies, never executed by Sphinx
nb_execution_mode = "off"
nb_ipywidgets_js: dict = {}        # no require.js / widget manager from a CDN; the views carry static copies
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]   # the pages start at "#", the notebooks' first heading is their title

# -- API reference: signatures and docstrings (docs/build.py writes the api/ pages from each module's names)
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autosummary_generate = False
default_role = "literal"           # the docstrings write `name` for code
smartquotes = False                # quotes as written: the docstrings quote values ("pca", 'all') in prose

# -- HTML
html_theme = "furo"
html_title = "cgt_viz"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False


def setup(app):
    build.prepare(ROOT)   # tutorials, API pages, results page: written before Sphinx reads the sources
    app.connect("autodoc-process-docstring", build.docstring_as_written)
    app.connect("autodoc-process-signature", build.class_signature)
