"""benchmarks/ship.py: every shipped artefact has the one command that makes it, and that command is the one it
was made with (the flags against the settings its metrics.json records)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ship  # noqa: E402

MODELS = ROOT / "data" / "models"


def test_every_folder_under_data_models_has_its_command_and_every_command_its_folder():
    folders = sorted(p.name for p in MODELS.iterdir() if p.is_dir())
    assert folders == sorted(ship.SHIPPED), "a shipped artefact without its entry in benchmarks/ship.py SHIPPED"


@pytest.mark.parametrize("name", sorted(ship.SHIPPED))
def test_the_command_hands_its_trainer_the_recorded_flags_and_a_later_flag_wins(monkeypatch, name):
    seen = []
    monkeypatch.setattr(ship, "trainer", lambda kind: (lambda argv: seen.append((kind, argv)) or 0))
    assert ship.main([name, "--out", "/tmp/elsewhere", "--measure-only"]) == 0
    kind, argv = seen[0]
    item = ship.SHIPPED[name]
    assert kind == item.trainer and argv[:2] == ["--out", str(MODELS / name)]
    assert argv[2:2 + len(item.flags)] == list(item.flags) and argv[-3:] == ["--out", "/tmp/elsewhere", "--measure-only"]


def _head_settings_of(argv):
    from cgt_viz.hf.head_run import parse_args
    return vars(parse_args(argv))


@pytest.mark.parametrize("name", [n for n, s in ship.SHIPPED.items() if s.trainer == "head"])
def test_a_heads_command_is_the_one_its_metrics_record(name):
    pytest.importorskip("transformers")
    import json
    recorded = json.loads((MODELS / name / "metrics.json").read_text())["settings"]
    now = _head_settings_of(ship.SHIPPED[name].argv(name, []))
    where = {"out", "results", "init_from"}                      # paths: the same file, written relative or not
    for key in where & set(recorded):
        if recorded[key] is not None:
            assert str(now[key]).endswith(Path(recorded[key]).name), key
    # how a run is shown or where it writes its scratch may differ; what it trains must not
    free = where | {"no_progress", "device", "resume", "measure_only", "keep_checkpoint"}
    differ = {k: (recorded[k], now.get(k)) for k in recorded if k not in free and recorded[k] != now.get(k)}
    assert differ == {}, f"{name}: benchmarks/ship.py would train with other settings than it was trained with"


def test_the_text_models_command_is_the_one_its_metrics_record():
    import json
    recorded = shlex.split(json.loads((MODELS / "text-bbc5" / "metrics.json").read_text())["command"])
    assert recorded[:2] == ["python", "benchmarks/train_text_reference.py"]
    assert recorded[2:] == list(ship.SHIPPED["text-bbc5"].flags)


def test_the_list_names_each_artefact_with_its_command(capsys):
    assert ship.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ship.SHIPPED:
        assert f"python benchmarks/ship.py {name}" in out
    assert str(ROOT) not in out                                  # paths shown from the repository root


def _chain(monkeypatch, argv):
    seen = []
    monkeypatch.setattr(ship, "trainer", lambda kind: (lambda a: seen.append((kind, a)) or 0))
    assert ship.main(argv) == 0
    return seen


def test_from_scratch_trains_what_an_artefact_starts_from_first_and_starts_from_that(monkeypatch, tmp_path):
    needing = [n for n, s in ship.SHIPPED.items() if s.needs]
    assert needing, "no shipped artefact starts from another: the chain is untested"
    name = needing[0]
    out = tmp_path / "mem"
    seen = _chain(monkeypatch, [name, "--out", str(out), "--from-scratch", "--threads", "2"])
    assert [kind for kind, _ in seen] == [ship.SHIPPED[ship.SHIPPED[name].needs].trainer, ship.SHIPPED[name].trainer]
    from cgt_viz.hf.head_run import parse_args
    first, then = (parse_args(a) for _, a in seen)
    assert Path(first.out) == tmp_path / "mem-base" and first.threads == 2 and not first.resume
    assert Path(first.results) == tmp_path / "mem-base" / "speeds.json"       # never the shipped results JSON
    assert Path(then.out) == out and Path(then.init_from) == tmp_path / "mem-base" and then.threads == 2
    assert Path(then.results) == out / "speeds.json"
    # a rerun resumes the base run found there (finished or interrupted), and never touches data/models
    (tmp_path / "mem-base").mkdir()
    (tmp_path / "mem-base" / "model.safetensors").write_bytes(b"")
    first, _ = (parse_args(a) for _, a in _chain(monkeypatch, [name, "--out", str(out), "--from-scratch"]))
    assert first.resume and Path(first.out) == tmp_path / "mem-base"


def test_from_scratch_is_refused_without_out_or_for_an_artefact_that_starts_from_nothing(monkeypatch, capsys):
    needing = next(n for n, s in ship.SHIPPED.items() if s.needs)
    alone = next(n for n, s in ship.SHIPPED.items() if not s.needs)
    monkeypatch.setattr(ship, "trainer", lambda kind: pytest.fail("nothing may train"))
    with pytest.raises(SystemExit, match="--from-scratch needs --out OUT"):
        ship.main([needing, "--from-scratch"])
    with pytest.raises(SystemExit, match=f"{alone} starts from nothing else"):
        ship.main([alone, "--out", "/tmp/x", "--from-scratch"])
