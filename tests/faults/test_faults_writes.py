"""Faults from the fourth reliability audit (issue 39) on what cgt_viz writes: a lock never writes through a link,
the results pages escape what they quote, a PNG draws no local file through an inline map style, the head's
training keeps train()'s promises (NaN guard, one run per folder, a finished run resumes to itself), and a save
never overwrites another tool's weights. Real symlinks and real files throughout."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers import record_png_renders


TESTS = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------------------------- B61: lock links
VICTIM_TEXT = "a file the user owns; the lock must never write into it\n"


def _victim_and_link(folder: Path, tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".lock").symlink_to(os.path.relpath(victim, folder))
    return victim


def test_a_lock_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    from cgt_viz.checkpoint import RunLock
    victim = _victim_and_link(tmp_path / "run", tmp_path)
    with pytest.raises(ValueError, match=r"lock file .*\.lock.* must be a regular file.*symbolic link to '\.\./victim"):
        RunLock(tmp_path / "run", "--out").acquire()
    assert victim.read_text() == VICTIM_TEXT
    assert (tmp_path / "run" / ".lock").is_symlink()             # left for the user to look at
    dangling = tmp_path / "run2"
    dangling.mkdir()
    (dangling / ".lock").symlink_to(tmp_path / "nowhere.txt")    # a dangling link: O_CREAT would create the target
    with pytest.raises(ValueError, match="symbolic link"):
        RunLock(dangling).acquire()
    assert not (tmp_path / "nowhere.txt").exists()
    hard = tmp_path / "run3"
    hard.mkdir()
    os.link(victim, hard / ".lock")                              # a hard link to the user's file
    with pytest.raises(ValueError, match="hard link"):
        RunLock(hard).acquire()
    assert victim.read_text() == VICTIM_TEXT


def test_train_and_train_head_refuse_a_linked_lock_in_one_line(tmp_path, capsys, monkeypatch):
    """`train --out` (its .lock and, from Python, the checkpoint folder's ckpt/.lock) and `train-head --out`:
    exit 2, one line naming the lock, the target unchanged."""
    from cgt_viz.__main__ import main
    from test_faults import ICL
    victim = _victim_and_link(tmp_path / "run", tmp_path)
    assert main(["train", *ICL, "--out", str(tmp_path / "run"), "--steps", "1", "--batch-size", "4",
                 "--eval-every", "0"]) == 2
    err = capsys.readouterr().err
    assert "lock file" in err and "symbolic link" in err and "Traceback" not in err
    assert victim.read_text() == VICTIM_TEXT
    _victim_and_link(tmp_path / "head", tmp_path)
    assert main(["train-head", "--out", str(tmp_path / "head"), "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "lock file" in err and "symbolic link" in err
    assert victim.read_text() == VICTIM_TEXT
    from cgt_viz.train import train
    from test_train import QUIET, TinyTask, fresh, tiny_config
    _victim_and_link(tmp_path / "new" / "ckpt", tmp_path)       # a new run's checkpoint folder
    task = TinyTask()
    with pytest.raises(ValueError, match="symbolic link"):
        train(fresh(tiny_config(task)), task, steps=1, batch_size=4, eval_every=0,
              checkpoint_dir=tmp_path / "new" / "ckpt", **QUIET)
    assert victim.read_text() == VICTIM_TEXT


# ---------------------------------------------------------------------------------------------- B62: results pages
HOSTILE_CMD = "--runs a`b|c <!-- results:end -->"
HOSTILE_CPU = "<script>window.__xss = 1</script> Xeon | fake"


def _hostile_results(root: Path) -> None:
    """A results root whose tasks.json carries strings that are markdown and HTML, and an embedded end marker."""
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "README.md").write_text("# readme\n\n<!-- results:begin -->\nold\n<!-- results:end -->\n\nafter\n")
    (root / "docs" / "results.md").write_text("# Results\n")
    table = ("| run | steps | gap closed G |\n|---|---|---|\n"
             "| icl (k = 8, acc) | 6 | 0.5 `x <!-- results:end --> |\n<img src=x onerror=alert(1)>")
    (root / "benchmarks" / "results" / "tasks.json").write_text(json.dumps({
        "argv": HOSTILE_CMD.split(" ", 1), "tuning_seeds": ["0 <b>bold</b>"], "rows": [], "table": table,
        "environment": {"cpu_model": HOSTILE_CPU, "time_utc": "today`", "torch": "2|x"}}))


def _html(md_text: str) -> str:
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md_text)


def test_results_pages_quote_what_the_result_files_say(tmp_path):
    """Backticks, pipes, HTML and an embedded end marker in a result file's strings are shown as text: the built
    page has no script or img element, each table row keeps its cells, the command is one code element, and a
    second rewrite (and --check) finds one section."""
    sys.path.insert(0, str(TESTS.parents[1] / "benchmarks"))
    import results_pages as rp
    _hostile_results(tmp_path)
    rp.write(tmp_path)
    for path in (tmp_path / "README.md", tmp_path / "docs" / "results.md"):
        content = path.read_text()
        assert content.count("<!-- results:begin -->") == 1 and content.count("<!-- results:end -->") == 1, path
    page = (tmp_path / "docs" / "results.md").read_text()
    built = _html(page)
    assert "<script" not in built and "<img" not in built and "<b>" not in built
    assert "&lt;script&gt;window.__xss = 1&lt;/script&gt; Xeon | fake" in built      # shown, as text, in one piece
    rows = [line for line in page.splitlines() if "icl (k = 8, acc)" in line]
    cells = __import__("re").findall(r"<td>(.*?)</td>", built)
    assert len(rows) == 1 and "0.5 `x &lt;!-- results:end --&gt;" in cells          # a backtick opens no code span
    codes = __import__("re").findall(r"<code>(.*?)</code>", built)
    assert "python benchmarks/tasks_results.py --runs a`b|c &lt;!-- results:end --&gt;" in codes
    readme = (tmp_path / "README.md").read_text()
    assert readme.endswith("\n\nafter\n") and "old" not in readme
    assert rp.stale(tmp_path) == []
    rp.write(tmp_path)                                               # a later rewrite changes nothing
    assert (tmp_path / "docs" / "results.md").read_text() == page
    assert (tmp_path / "README.md").read_text() == readme


def test_results_check_flags_a_duplicated_section_and_write_repairs_it(tmp_path):
    sys.path.insert(0, str(TESTS.parents[1] / "benchmarks"))
    import results_pages as rp
    _hostile_results(tmp_path)
    rp.write(tmp_path)
    readme = (tmp_path / "README.md").read_text()
    debris = readme.replace("\n\nafter\n", "\nleft over -->\n| a | b |\n<!-- results:end -->\n\nafter\n")
    (tmp_path / "README.md").write_text(debris)       # what an embedded end marker left behind before
    assert rp.stale(tmp_path) == [tmp_path / "README.md"]
    rp.write(tmp_path)
    assert (tmp_path / "README.md").read_text() == readme
    assert rp.stale(tmp_path) == []


# ---------------------------------------------------------------------------------------------- B60: PNG map styles
def _inline_style_figure(secret: Path) -> dict:
    """A stored plotly JSON whose map style is a MapLibre style object that reads local files five ways."""
    url = secret.as_uri()
    style = {"version": 8,
             "sprite": url[:-4], "glyphs": f"{secret.parent.as_uri()}/{{fontstack}}/{{range}}.pbf",
             "sources": {"tiles": {"type": "raster", "tiles": [url, "data:image/png;base64,AAAA"], "tileSize": 256},
                         "tilejson": {"type": "raster", "url": url},
                         "geo": {"type": "geojson", "data": url},
                         "inline": {"type": "geojson", "data": {"type": "FeatureCollection", "features": []}},
                         "sprites": {"type": "raster", "tiles": [str(secret)]}},
             "layers": [{"id": "bg", "type": "background", "paint": {"background-pattern": url,
                                                                      "background-color": "rgba(1, 2, 3, 0.5)"}},
                        {"id": "t", "type": "raster", "source": "tiles"},
                        {"id": "i", "type": "fill", "source": "geo",
                         "paint": {"fill-pattern": ["image", "../" + secret.name]}}]}
    return {"data": [{"type": "scattermap", "lat": [0], "lon": [0]}],
            "layout": {"map": {"style": style},
                       "template": {"layout": {"mapbox": {"style": {"version": 8, "sprite": [{"id": "a", "url": url}],
                                                                    "sources": {}, "layers": []}}}}}}


def test_a_png_drops_every_local_file_of_an_inline_map_style(tmp_path, monkeypatch):
    """`layout.map.style` as a MapLibre style object (also in the template): sprite, glyphs, tiles, TileJSON url,
    GeoJSON data and patterns naming a real local PNG never reach the renderer; inline data, source names,
    colours and the style's structure stay."""
    import warnings

    from cgt_viz.widgets import StaticPNGWarning, _png
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\xff" * 64)
    spec = _inline_style_figure(secret)
    original = json.dumps(spec)
    safe, dropped = _png.safe_spec(spec)
    assert json.dumps(spec) == original                                     # the input is left alone
    sent = json.dumps(safe)
    assert "file:" not in sent and "secret" not in sent and str(tmp_path) not in sent, sent
    style = safe["layout"]["map"]["style"]
    assert style["sources"]["tiles"]["tiles"] == ["data:image/png;base64,AAAA"]
    assert style["sources"]["inline"]["data"]["type"] == "FeatureCollection"
    assert style["layers"][1]["source"] == "tiles" and style["layers"][0]["paint"]["background-color"] == "rgba(1, 2, 3, 0.5)"
    assert len(dropped) == 9, dropped
    drawn = record_png_renders(monkeypatch)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", StaticPNGWarning)
            assert _png.figure_png(_inline_style_figure(secret)) is not None
    finally:
        _png._reset()
    assert any("sprite" in str(w.message) for w in caught)
    assert len(drawn) == 1 and "secret" not in json.dumps(drawn[0])


# ---------------------------------------------------------------------------------------------- head runs
HEAD_FLAGS = ["--steps", "4", "--batch", "4", "--y-layer", "2", "--d-y", "8", "--templates", "2", "--rank", "1",
              "--threads", "1", "--no-progress", "--device", "cpu", "--checkpoint-every", "1", "--prefix", "8",
              "--suffix", "8", "--train-per-topic", "4", "--val-windows", "5", "--eval-per-topic", "2",
              "--eval-draws", "1", "--eval-prompts", "8", "--top-k", "5", "--skip-test"]


def _train_head(capsys, out: Path, *extra: str) -> tuple[int, str]:
    from cgt_viz.__main__ import main
    capsys.readouterr()
    code = main(["train-head", *HEAD_FLAGS, "--out", str(out), *extra])
    return code, capsys.readouterr().err


def test_a_diverging_head_stops_before_the_update_and_keeps_the_last_good_state(tmp_path):
    """B17: train_head with an lr that blows the head up at step 1: step 2's loss is NaN; no update is applied,
    the head holds step 1's finite weights, the checkpoint folder keeps its last periodic checkpoint (train's
    rule, one loop for both), and the error names the step, the term and that checkpoint."""
    pytest.importorskip("transformers")
    from cgt_viz import hf
    from cgt_viz.hf import distill as hfd
    from cgt_viz.checkpoint import latest_checkpoint, load_checkpoint
    from cgt_viz.train import TrainingDiverged
    from test_distill import _head, _windows
    lm = hf.tiny_llama(seed=0)
    model = _head(lm)
    cache = hfd.build_feature_cache(model, _windows(n=8), 6, top_k=7, root=tmp_path, progress=False)
    seen = []
    with pytest.raises(TrainingDiverged, match=r"diverged at step 2: the aux loss is nan \(no update was applied; "
                                               r"the last good checkpoint is .*ckpt.*step-00000001"):
        hfd.train_head(model, cache, steps=8, batch_size=4, warmup=1, lr=1e10, progress=False,
                       checkpoint_dir=tmp_path / "ckpt", checkpoint_every=1,
                       callback=lambda step, out: seen.append({k: v.clone() for k, v in model.state_dict().items()}))
    assert len(seen) == 1                                              # one update, then the stop
    now = model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in seen[0].items())    # the NaN step changed nothing
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    saved = load_checkpoint(latest_checkpoint(tmp_path / "ckpt"))
    assert saved.step == 1 and all(bool(torch.isfinite(v).all()) for v in saved.model_state.values())
    assert all(torch.equal(saved.model_state[k], v) for k, v in seen[0].items())


def test_a_diverging_train_head_is_one_line_and_writes_no_head(tiny_smollm2, tmp_path, capsys, monkeypatch):
    code, err = _train_head(capsys, tmp_path / "run", "--lr", "1e10")
    assert code == 1 and err.startswith("error: training diverged at step ") and "Traceback" not in err, err
    assert "KeyError" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "model.safetensors").exists() and not (tmp_path / "run" / "metrics.json").exists()
    from cgt_viz.checkpoint import latest_checkpoint
    import re
    diverged_at = int(re.search(r"diverged at step (\d+)", err).group(1))
    # the last good state, for --resume (HEAD_FLAGS checkpoint every step)
    assert latest_checkpoint(tmp_path / "run" / "ckpt").name == f"step-{diverged_at - 1:08d}"


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under a folder with its bytes (what a refused command must leave as it was)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_train_head_into_a_from_scratch_run_is_refused_and_deletes_nothing(tiny_smollm2, tmp_path, capsys, monkeypatch):
    """B28: --out naming a run of `train` (run.json, ckpt/ with its checkpoints, model/) is refused before anything
    is loaded or written, with or without --resume; the run keeps every file."""
    from cgt_viz.__main__ import main
    from test_faults import ICL
    run = tmp_path / "scratch"
    assert main(["train", *ICL, "--out", str(run), "--steps", "2", "--batch-size", "4", "--eval-every", "0",
                 "--checkpoint-every", "1"]) == 0
    before = _tree(run)
    assert any(name.startswith("ckpt/") for name in before)
    for extra in ([], ["--resume"], ["--measure-only"]):
        code, err = _train_head(capsys, run, *extra)
        assert code == 2 and "--out must be a new folder or a head run of train-head" in err, err
        assert "run.json of a run of task 'icl'" in err and "ckpt/" in err and "Traceback" not in err
        assert _tree(run) == before


def test_a_head_run_is_refused_without_resume_and_a_finished_one_resumes_to_itself(tiny_smollm2, tmp_path, capsys, monkeypatch):
    """B29: train-head twice on one --out without --resume is refused (the first head and its metrics kept).
    B30: --resume of the finished run (its ckpt/ removed at the end) changes nothing and says so."""
    out = tmp_path / "head"
    code, err = _train_head(capsys, out)
    assert code == 0, err
    finished = _tree(out)
    assert "model.safetensors" in finished and not (out / "ckpt").exists()
    code, err = _train_head(capsys, out, "--seed", "1")
    assert code == 2 and "already holds a head run" in err and "--resume" in err and "Traceback" not in err, err
    assert _tree(out) == finished
    capsys.readouterr()
    from cgt_viz.__main__ import main
    assert main(["train-head", *HEAD_FLAGS, "--out", str(out), "--resume"]) == 0
    said = capsys.readouterr().out
    assert "is finished (4 steps" in said and "nothing was changed" in said, said
    assert _tree(out) == finished                                      # the same head, the same metrics


def test_resume_of_a_head_saved_before_its_measurement_measures_it(tiny_smollm2, tmp_path, capsys, monkeypatch):
    """B30, the other finished state: the head was saved but the run died in the measurement (no metrics.json);
    --resume measures that head rather than training a new one."""
    out = tmp_path / "head"
    assert _train_head(capsys, out)[0] == 0
    weights = (out / "model.safetensors").read_bytes()
    (out / "metrics.json").unlink()
    from cgt_viz.hf import distill as hfd
    trained = []
    monkeypatch.setattr(hfd, "train_head", lambda *a, **k: trained.append(1))
    code, err = _train_head(capsys, out, "--resume")
    assert trained == []                                               # no new head was trained
    assert code == 0, err
    assert (out / "model.safetensors").read_bytes() == weights and (out / "metrics.json").exists()


# ---------------------------------------------------------------------------------------------- B55: bare weights
def _bare(folder: Path, name: str, metadata: dict | None) -> bytes:
    """A weights file of another tool (or of a save of ours that stopped before its config), no config beside it."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.arange(6, dtype=torch.float32)}, str(folder / name), metadata=metadata)
    return (folder / name).read_bytes()


@pytest.mark.parametrize("writer", ["CGT.save_pretrained", "CGTLM.save_pretrained", "export_peft"])
@pytest.mark.parametrize("name", ["model.safetensors", "adapter_model.safetensors"])
def test_a_save_refuses_a_folder_with_another_tools_bare_weights(tmp_path, writer, name):
    """B55: a model.safetensors or adapter_model.safetensors with no config beside it (another tool's: its header
    carries no cgt_viz metadata) is never overwritten; the refusal names the file, and it keeps its bytes."""
    pytest.importorskip("peft")
    from cgt_viz import hf
    from test_faults_files import WRITERS
    lm = hf.tiny_llama(seed=0)
    folder = tmp_path / "out"
    before = _bare(folder, name, {"format": "pt"})
    with pytest.raises(ValueError, match=rf"path must be a folder .*which holds an? {name} with no (adapter_)?config\.json"):
        WRITERS[writer](lm, folder)
    assert sorted(p.name for p in folder.iterdir()) == [name] and (folder / name).read_bytes() == before


def test_a_save_of_ours_that_stopped_before_its_config_may_be_finished(tmp_path):
    """The weights of an unfinished save carry cgt_viz's metadata (model_class, or export_peft's writer): saving the
    same kind again completes the folder, another kind is still refused."""
    pytest.importorskip("peft")
    from cgt_viz import hf
    from cgt_viz.io import PEFT_WRITER
    from test_faults_files import WRITERS
    lm = hf.tiny_llama(seed=0)
    _bare(tmp_path / "cgt", "model.safetensors", {"model_class": "CGT"})
    WRITERS["CGT.save_pretrained"](lm, tmp_path / "cgt")
    assert (tmp_path / "cgt" / "config.json").exists()
    _bare(tmp_path / "peft", "adapter_model.safetensors", {"format": "pt", "written_by": PEFT_WRITER})
    WRITERS["export_peft"](lm, tmp_path / "peft")
    assert (tmp_path / "peft" / "adapter_config.json").exists()
    _bare(tmp_path / "half", "model.safetensors", {"model_class": "CGT"})
    with pytest.raises(ValueError, match="a cgt_viz CGT model's model.safetensors without its config.json"):
        WRITERS["CGTLM.save_pretrained"](lm, tmp_path / "half")


# ---------------------------------------------------------------------------------------------- A17: rotation
def test_a_checkpoint_that_vanishes_inside_safetensors_is_retried_not_a_runtime_error(tmp_path, monkeypatch):
    """A17: the checkpoint being read is rotated away (a real save of the next step with keep=1 deletes it) while
    safetensors reads it, and safetensors raises a RuntimeError, as it did in the attack: load_checkpoint reads the
    new latest. A file that is still there but unreadable is still a ValueError naming it."""
    import cgt_viz.io as cio
    from cgt_viz.checkpoint import capture_rng, load_checkpoint, save_checkpoint
    root = tmp_path / "ckpt"
    weights, rng, opt = {"w": torch.randn(8, 8)}, capture_rng({}), {"state": {}, "param_groups": []}
    save_checkpoint(root, 1, {"run": 1}, weights, opt, rng, {"step": [1]}, keep=1)
    real = cio.load_file
    rotated = []

    def load_while_rotating(name, device="cpu"):
        if not rotated:
            rotated.append(name)
            save_checkpoint(root, 2, {"run": 1}, weights, opt, rng, {"step": [2]}, keep=1)   # deletes step 1
            assert not Path(name).exists()
            raise RuntimeError("safetensors: No such file or directory (os error 2)")
        return real(name, device=device)

    monkeypatch.setattr(cio, "load_file", load_while_rotating)
    ckpt = load_checkpoint(root)
    assert rotated and ckpt.step == 2 and torch.equal(ckpt.model_state["w"], weights["w"])
    monkeypatch.setattr(cio, "load_file", lambda name, device="cpu": (_ for _ in ()).throw(RuntimeError("bad dtype")))
    with pytest.raises(ValueError, match="not a readable safetensors file .*bad dtype"):
        cio.load_tensors(ckpt.path / "model.safetensors")


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999"])
@pytest.mark.parametrize("command", ["train", "train-head"])
def test_a_seed_outside_torchs_range_is_refused_naming_seed_before_anything_is_written(tmp_path, capsys, command,
                                                                                      seed):
    """B25: `--seed -1` reached train-head's cache build; a seed past 64 bits died in torch ("Overflow when
    unpacking long long") without naming --seed."""
    from cgt_viz.__main__ import main
    task = ["--task", "icl", "--steps", "2"] if command == "train" else []
    code = main([command, *task, "--seed", seed, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --seed must be an int in 0..") and seed in err[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["heavy", -1.0, True])
def test_report_names_the_file_and_field_of_a_bad_loss_weight_in_run_json(tmp_path, capsys, value):
    """A16: `config.w_aux = "heavy"` in run.json made `report` say only "could not convert string to float"."""
    from cgt_viz.__main__ import main
    from test_faults import ICL
    run = tmp_path / "run"
    assert main(["train", *ICL, "--out", str(run), "--steps", "2", "--batch-size", "4", "--eval-every", "0",
                 "--aux-delay", "0"]) == 0
    info = json.loads((run / "run.json").read_text())
    info["config"]["w_aux"] = value
    (run / "run.json").write_text(json.dumps(info))
    capsys.readouterr()
    code = main(["report", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"config.w_aux in {str(run / 'run.json')!r} must be a finite number >= 0, got {value!r}" in err[0]
    assert not (run / "report.html").exists()
