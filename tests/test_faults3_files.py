"""Faults from the third reliability audit (issue 23): the pretrained path and files. Folders that ask to run
their own code, saves that overwrite another kind of artefact, two writers on one run folder, old runs that
could not be resumed, model folders checked after building, a conversion cache never verified, reads of a run
in training, tokenizer data and messages. Each test failed on the code before the fix (see docs/RELIABILITY.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
TESTS = Path(__file__).resolve().parent


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def lm():
    pytest.importorskip("transformers")
    from cgt_viz import hf
    return hf.tiny_llama(seed=0)


def _hf_folder(lm, folder: Path) -> Path:
    """A plain Hugging Face model folder (config.json + model.safetensors) of the tiny Llama."""
    lm.save_pretrained(str(folder))
    return folder


# ---------------------------------------------------------------------------------------------- 2: remote code
EVIL = """from pathlib import Path
Path({marker!r}).write_text("ran")
from transformers import LlamaConfig, LlamaForCausalLM
class EvilConfig(LlamaConfig):
    model_type = "evil_llama"
class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
"""


def _evil_folder(lm, folder: Path, file: str) -> Path:
    """A tiny Llama folder whose `file` has an auto_map to evil.py (which writes a marker file when run)."""
    _hf_folder(lm, folder)
    marker = folder.parent / "marker"
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    data = json.loads((folder / file).read_text()) if (folder / file).exists() else {}
    data["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel",
                        "AutoTokenizer": ["evil.EvilTokenizer", None]}
    if file == "config.json":
        data["model_type"] = "evil_llama"          # unknown to transformers: it would ask whether to run evil.py
    (folder / file).write_text(json.dumps(data))
    return marker


def test_a_folder_with_auto_map_is_refused_before_transformers_and_runs_nothing(lm, tmp_path):
    marker = _evil_folder(lm, tmp_path / "evil", "config.json")
    code = "from cgt_viz import hf\nhf.load_local(%r)\n" % str(tmp_path / "evil")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert "Do you wish to run the custom code" not in proc.stdout + proc.stderr
    assert "ValueError" in proc.stderr and "config.json" in proc.stderr and "'auto_map'" in proc.stderr, proc.stderr
    assert not marker.exists()


def test_a_tokenizer_config_with_auto_map_is_refused_by_name(lm, tmp_path):
    from cgt_viz import hf
    marker = _evil_folder(lm, tmp_path / "evil", "tokenizer_config.json")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json.*'auto_map'"):
        hf.load_local(tmp_path / "evil")
    assert not marker.exists()


def test_strip_remote_code_drops_auto_map_from_a_config(lm, tmp_path):
    from cgt_viz.hf.source import strip_remote_code
    config = lm.config.__class__.from_dict({**lm.config.to_dict(), "auto_map": {"AutoConfig": "evil.EvilConfig"}})
    assert "auto_map" in config.to_dict()
    strip_remote_code(config)
    config.save_pretrained(str(tmp_path))
    assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())


@pytest.mark.xfail(reason="needs the one-line call `strip_remote_code(merged.config)` in CGTLM.merged_lm "
                          "(cgt_viz/hf/model.py, owned by the lead)", strict=False)
def test_a_compiled_model_of_an_lm_with_auto_map_saves_no_auto_map(lm, tmp_path):
    import copy

    from cgt_viz import hf
    base = copy.deepcopy(lm)
    base.config.auto_map = {"AutoModelForCausalLM": "evil.EvilModel"}
    model = hf.CGTLM(base, y_layer=2, d_y=16, n_head_y=2, n_templates=2)
    spec = model.specialize(torch.arange(8))
    spec.save_pretrained(str(tmp_path / "spec"))
    assert "auto_map" not in json.loads((tmp_path / "spec" / "config.json").read_text())
    assert base.config.auto_map                                  # the LM's own config is left alone
