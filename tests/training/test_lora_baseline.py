"""The per-prompt LoRA baseline of issue 27 (cgt_viz.lora_baseline) and its benchmark's --smoke run."""
from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cgt_viz import CGT, CGTConfig
from cgt_viz import lora_baseline as lb
from cgt_viz.figures import lora_compile_figure
from cgt_viz.tasks.base import Batch, Task
from cgt_viz.train import train

from helpers import randomize_templates

ROOT = Path(__file__).resolve().parents[2]


class TopicTask(Task):
    """Each row draws one of n_topics disjoint sets of `per_topic` tokens; even positions are filler tokens
    (uniform over n_fill shared ones), odd positions i.i.d. tokens of the row's topic. After a filler only the
    topic tokens seen earlier say which set comes next: a continuation that starts at a filler needs the prompt."""

    name = "topics"

    def __init__(self, n_topics: int = 4, per_topic: int = 4, n_fill: int = 4, length: int = 24):
        self.n_topics, self.per_topic, self.n_fill, self.length = n_topics, per_topic, n_fill, length

    def config_kwargs(self):
        return {"vocab_size": self.n_topics * self.per_topic + self.n_fill, "block_size": self.length}

    def _rows(self, b, generator):
        topic = torch.randint(self.n_topics, (b, 1), generator=generator)
        seq = topic * self.per_topic + torch.randint(self.per_topic, (b, self.length + 1), generator=generator)
        fill = self.n_topics * self.per_topic + torch.randint(self.n_fill, (b, self.length + 1), generator=generator)
        seq[:, 0::2] = fill[:, 0::2]
        return seq, topic[:, 0]

    def get_batch(self, batch_size, part="train", generator=None, device="cpu"):
        seq, topic = self._rows(batch_size, generator)
        return Batch(seq[:, :-1], seq[:, 1:], None, None, {"topic": topic}).to(device)

    def eval_batch(self, k, batch_size, generator=None, device="cpu", part="val"):
        seq, topic = self._rows(batch_size, generator)
        mask = torch.zeros(batch_size, self.length, dtype=torch.bool)
        mask[:, k:] = True
        return Batch(seq[:, :-1], seq[:, 1:], mask, torch.full((batch_size,), k), {"topic": topic}).to(device)


@pytest.fixture(scope="module")
def topic_model():
    task = TopicTask()
    torch.manual_seed(0)
    cfg = CGTConfig(**task.config_kwargs(), n_layer=3, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=1,
                    n_templates=4, template_rank=2, w_aux=0.0)
    model, _ = train(CGT(cfg), task, steps=150, batch_size=32, lr=3e-3, seed=0, progress=False, device="cpu",
                     eval_every=0)
    return model.eval(), task


def _tiny_cgt(seed=0):
    torch.manual_seed(seed)
    cfg = CGTConfig(vocab_size=20, block_size=32, n_layer=3, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=1,
                    n_templates=3, template_rank=2, sites=("attn_in", "mlp_in", "mlp_out"))
    return randomize_templates(CGT(cfg)).eval()


def test_update_bytes_are_rank_times_widths():
    model = _tiny_cgt()
    d = model.config.d_x
    rank = 3 * 2
    # layers 2 and 3 modulated: attn_in (3d × d), mlp_in (4d × d), mlp_out (d × 4d)
    per_layer = (3 * d + d) + (4 * d + d) + (d + 4 * d)
    assert lb.lora_rank(model) == rank
    assert lb.update_bytes(model) == rank * 2 * per_layer * 4
    assert lb.update_bytes(model, torch.bfloat16) == rank * 2 * per_layer * 2
    prompt = torch.randint(0, 20, (10,), generator=torch.Generator().manual_seed(0))
    assert lb.factor_bytes(lb.compiled_factors(model, prompt)) == lb.update_bytes(model)
    assert lb.factor_bytes(lb.random_factors(model)) == lb.update_bytes(model)


def test_lora_initialised_from_the_compile_is_the_compiled_model_at_step_0():
    model = _tiny_cgt()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 20, (12,), generator=gen)
    rows = torch.randint(0, 20, (3, 9), generator=gen)
    data = lb.Continuations(rows, rows, torch.ones_like(rows, dtype=torch.bool), lb.teacher_outputs(model, prompt, rows))
    cks = lb.train_lora(model, data, steps=(0, 2), init=lb.compiled_factors(model, prompt), lr=1e-2)
    assert [c.step for c in cks] == [0, 2]
    with torch.no_grad():
        want = model.specialize(prompt)(rows)
        merged = lb.merge(model.gpt, cks[0].factors)(rows)
        unmerged = lb.lora_logits(model.gpt, cks[0].factors, rows)
        moved = lb.merge(model.gpt, cks[1].factors)(rows)
    assert torch.allclose(merged, want, atol=1e-5)
    assert torch.allclose(unmerged, want, atol=1e-5)
    assert (moved - want).abs().max() > 1e-4                     # two steps did change it
    assert cks[1].train_kl < cks[0].train_kl
    # the random init is PEFT's: B = 0, so step 0 is the no-context model
    rnd = lb.train_lora(model, data, steps=(0,))
    with torch.no_grad():
        assert torch.allclose(lb.merge(model.gpt, rnd[0].factors)(rows), model.x_only()(rows), atol=1e-6)
    assert all(p.requires_grad for p in model.parameters())      # the model is left trainable, untouched


def test_trained_lora_beats_no_context_on_held_out_continuations(topic_model):
    model, task = topic_model
    gen = torch.Generator().manual_seed(123)
    # a continuation shows its topic from its second token on: score the first two (filler -> topic -> filler)
    cases = [lb.text_case(task, k=task.length - 2, n_samples=8, generator=gen) for _ in range(4)]
    res = lb.compare_methods(model, cases, steps=(0, 40), lr=1e-2, timing_repeats=1)
    rows = {(r["method"], r["steps"]): r for r in res["summary"]}
    nc, lora = rows[("no_context", None)], rows[("lora", 40)]
    assert rows[("prompted", None)]["loss"] < nc["loss"] - 0.3          # the prompt matters on this task
    assert lora["loss"] < nc["loss"] - 0.2 and lora["G"] > 0.3, (lora, nc)
    assert rows[("lora", 0)]["loss"] == pytest.approx(nc["loss"], abs=1e-5)
    assert rows[("lora_from_compile", 0)]["loss"] == pytest.approx(rows[("compile", None)]["loss"], abs=1e-5)
    assert lora["update_seconds"] > rows[("compile", None)]["update_seconds"] > 0
    assert lora["update_bytes"] == rows[("compile", None)]["update_bytes"] == lb.update_bytes(model)
    # trained on samples of the prompted model (its own outputs as the teacher), scored on the row's own text
    case = cases[0]
    data = case.make_train(model, case.prompt)
    assert data.inputs.shape == (8, 2) and data.mask.all()
    with torch.no_grad():
        full = torch.cat([case.prompt[None].expand(8, -1), data.inputs], 1)
        assert torch.allclose(data.teacher, model(full)[:, -2:])


def test_icl_case_trains_on_other_queries_than_it_scores():
    from cgt_viz.tasks import make_task
    task = make_task("icl")
    case = lb.icl_case(task, k=8, n_held_out=2, generator=torch.Generator().manual_seed(0))
    assert case.prompt.shape == (16,)
    held = set(case.info["held_out_u"])
    assert len(held) == 2 and held.isdisjoint(case.info["train_u"]) and len(case.info["train_u"]) == task.P - 2
    assert held.isdisjoint(case.prompt[0::2].tolist())                  # held-out queries never occur in the prompt
    assert case.held_out.mask[:, 0].all() and not case.held_out.mask[:, 1].any()


def test_break_even():
    assert lb.break_even_tokens(1.0, 0.0, 0.1, 0.0, 0.2) == 11
    assert lb.break_even_tokens(0.0, 0.0, 0.1, 0.5, 0.2) == 1
    assert lb.break_even_tokens(0.0, 0.0, 0.3, 0.5, 0.2) is None      # dearer per token: never, whatever its lead


def test_peft_baseline_on_tiny_llama_loads_as_an_adapter_and_matches_the_merged_weights(tmp_path):
    pytest.importorskip("peft")
    from peft import PeftModel

    from cgt_viz import hf
    from cgt_viz.hf import lora as hl
    lm = hf.tiny_llama(seed=0)
    model = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=3, template_rank=2)
    randomize_templates(model, bias_std=0.3)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 96, (12,), generator=gen)
    rows = torch.randint(0, 96, (2, 10), generator=gen)
    before = {n: p.clone() for n, p in lm.named_parameters()}

    # init from the compile: step 0 is model.specialize(prompt)
    peft_model, cks, seconds = hl.peft_lora_baseline(model, prompt, steps=(0, 3), init="compile", lr=1e-2,
                                                     n_samples=2, sample_len=8)
    assert set(seconds) == {"train_data", "layer_states", "copy_and_wrap", "compile_factors"}
    assert lb.factor_bytes(cks[0].factors) == lb.update_bytes(model)
    with torch.no_grad():
        want = model.specialize(prompt)(input_ids=rows).logits
        got0 = hl.merged_lm(lm, cks[0].factors)(input_ids=rows).logits
    assert torch.allclose(got0, want, atol=1e-4)
    assert cks[1].train_kl < cks[0].train_kl

    # random init, trained; its adapter loads with PeftModel and equals the merged weights
    peft_model, cks, _ = hl.peft_lora_baseline(model, prompt, steps=(0, 3), init="random", lr=1e-2,
                                               n_samples=2, sample_len=8)
    with torch.no_grad():
        assert torch.allclose(hl.merged_lm(lm, cks[0].factors)(input_ids=rows).logits, lm(input_ids=rows).logits,
                              atol=1e-6)
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 6 and config["lora_alpha"] == 6
    loaded = PeftModel.from_pretrained(copy.deepcopy(lm), str(tmp_path / "adapter")).eval()
    merged = hl.merged_lm(lm, cks[-1].factors)
    with torch.no_grad():
        a, b = loaded(input_ids=rows).logits, merged(input_ids=rows).logits
        assert torch.allclose(a, b, atol=1e-4)
        assert (b - lm(input_ids=rows).logits).abs().max() > 1e-4           # the LoRA did something
    unloaded = loaded.merge_and_unload()
    for name, (a_, b_) in cks[-1].factors.items():
        assert torch.allclose(unloaded.get_parameter(name), merged.get_parameter(name), atol=1e-6), name
    assert all(torch.equal(p, before[n]) for n, p in lm.named_parameters())   # the CGTLM's LM is untouched


def _sharp_tiny_llama():
    """The tiny random Llama with its decoder layers' maps ×5 and its final norm ×8: peaked next-token
    distributions that depend on the prompt (at init they are near uniform, so no prompt would matter)."""
    from cgt_viz import hf
    lm = hf.tiny_llama(seed=0)
    with torch.no_grad():
        for p in lm.model.layers.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
        lm.model.norm.weight.mul_(8.0)
    return lm


def test_peft_lora_bytes_are_rank_times_widths_and_it_beats_no_context_on_held_out_continuations():
    pytest.importorskip("peft")
    from cgt_viz import hf
    from cgt_viz.distill import distillation_loss
    from cgt_viz.hf import lora as hl
    lm = _sharp_tiny_llama()
    model = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=3, template_rank=2, aux_kl_top_k=16).eval()
    # 4 layers, ℓ = 2: layers 3-4 modulated at attn_in (q 64×64, k and v 32×64: 2 kv heads of 16) and
    # mlp_in (gate, up 128×64)
    widths = (64 + 64) + 2 * (32 + 64) + 2 * (128 + 64)
    assert lb.lora_rank(model) == 6 and lb.update_bytes(model) == 6 * 2 * widths * 4
    prompt = torch.randint(0, 96, (16,), generator=torch.Generator().manual_seed(3))
    _, cks, _ = hl.peft_lora_baseline(model, prompt, steps=(0, 2, 60), lr=1e-2, n_samples=16, sample_len=8, seed=1)
    assert all(lb.factor_bytes(c.factors) == lb.update_bytes(model) for c in cks)
    # the fast path (layer-ℓ states once, layers ℓ+1..N per step) is the whole LM's pass
    _, slow, _ = hl.peft_lora_baseline(model, prompt, steps=(0, 2), lr=1e-2, n_samples=16, sample_len=8, seed=1,
                                       upper_only=False)
    assert [c.train_kl for c in slow] == pytest.approx([c.train_kl for c in cks[:2]], rel=1e-4)

    # held out: other continuations of the prompted LM (another seed), never trained on
    held = lb.sample_continuations(model, prompt, 16, 8, seed=99)
    with torch.no_grad():
        teacher = lb.teacher_outputs(model, prompt, held)
        kl = lambda net: float(distillation_loss("tokens", net(input_ids=held).logits, teacher).mean())
        ce = lambda logits: float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), held[:, 1:].flatten()))
        lora = hl.merged_lm(lm, cks[-1].factors)
        kl_nc, kl_lora = kl(lm), kl(lora)
        ce_prompted, ce_nc, ce_lora = ce(teacher), ce(lm(input_ids=held).logits), ce(lora(input_ids=held).logits)
    assert ce_prompted < ce_nc - 0.1                       # the prompt matters for this LM
    assert kl_lora < 0.5 * kl_nc, (kl_lora, kl_nc)
    assert ce_lora < ce_nc - 0.2 * (ce_nc - ce_prompted), (ce_prompted, ce_lora, ce_nc)   # G > 0.2


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_lora_vs_compile.py"), "--smoke",
                           "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "lora_vs_compile.json").read_text())
    assert set(res["tasks"]) == {"icl", "text"}
    for task in res["tasks"].values():
        methods = {(r["method"], r["steps"]) for r in task["summary"]}
        assert {("prompted", None), ("prompted_kv", None), ("compile", None), ("no_context", None),
                ("lora", 10), ("lora_from_compile", 10)} <= methods
        assert all("per_token_seconds" in r for r in task["summary"])
    assert "| task | method |" in (out / "lora_vs_compile.md").read_text()
    assert "plotly" in (out / "lora_vs_compile.html").read_text()[:5000].lower()


def test_benchmark_smoke_smollm2_task_runs_alone_and_keeps_the_other_rows(tmp_path):
    """--tasks smollm2 (a tiny random Llama under --smoke) merges into a JSON that already holds other tasks."""
    pytest.importorskip("peft")
    out = tmp_path / "out"
    out.mkdir()
    row = {"method": "compile", "steps": None, "G": 0.5, "loss": 1.0, "acc": 0.5, "update_seconds": 0.01,
           "update_bytes": 64}
    earlier = {"benchmark": "lora_vs_compile", "command": "an earlier run", "finished_utc": "then",
               "environment": {"device": "cpu", "threads": 1, "torch": "x"},
               "tasks": {"icl": {"summary": [row], "config": {"n_templates": 2, "template_rank": 1},
                                 "model": {"source": "earlier"}, "per_prompt": [{"train_positions": 5}],
                                 "prompt_len": 16, "rank": 2, "shapes": {}, "update_bytes": 64, "lr": 0.001,
                                 "gap_note": ""}}}
    (out / "lora_vs_compile.json").write_text(json.dumps(earlier))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_lora_vs_compile.py"), "--smoke",
                           "--tasks", "smollm2", "--out", str(out)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "lora_vs_compile.json").read_text())
    assert list(res["tasks"]) == ["icl", "smollm2"]
    assert res["tasks"]["icl"]["summary"] == earlier["tasks"]["icl"]["summary"]
    assert res["tasks"]["icl"]["run"]["command"] == "an earlier run"
    lm_task = res["tasks"]["smollm2"]
    rows = {(r["method"], r["steps"]): r for r in lm_task["summary"]}
    assert {("prompted", None), ("prompted_kv", None), ("compile", None), ("no_context", None), ("lora", 0),
            ("lora", 10), ("lora_from_compile", 10)} <= set(rows)
    # scored with compile_comparison's columns; step 0 of each init is its starting model
    assert rows[("compile", None)]["loss"] == pytest.approx(lm_task["comparison"]["loss_compiled"]["value"])
    assert rows[("lora", 0)]["loss"] == pytest.approx(rows[("no_context", None)]["loss"], abs=1e-4)
    assert rows[("lora_from_compile", 0)]["loss"] == pytest.approx(rows[("compile", None)]["loss"], abs=1e-4)
    assert rows[("lora", 10)]["update_seconds"] > rows[("lora", 0)]["update_seconds"]
    assert rows[("lora", 10)]["update_bytes"] == rows[("compile", None)]["update_bytes"] == lm_task["update_bytes"] > 0
    assert all(p["train_positions"] == 2 * 8 for p in lm_task["per_prompt"])
    assert "| smollm2 |" in (out / "lora_vs_compile.md").read_text()


def test_compile_compare_view_draws_the_lora_comparison_under_its_losses():
    import cgt_viz
    model = _tiny_cgt()
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 20, (3, 16), generator=gen)
    case = lb.PromptCase(rows[0, :8], lb.Continuations(rows[1:, :4], rows[1:, 1:5], torch.ones(2, 4, dtype=torch.bool)),
                         lambda m, p: lb.Continuations(rows[1:, 4:8], rows[1:, 5:9], torch.ones(2, 4, dtype=torch.bool),
                                                       lb.teacher_outputs(m, p, rows[1:, 4:8])))
    res = lb.compare_methods(model, [case], steps=(0, 2), timing_repeats=1)
    plain = cgt_viz.CompileCompare(model, rows, split=8)
    view = cgt_viz.CompileCompare(model, rows, split=8, lora=res)
    assert len(view.children) == len(plain.children) + 1 and view.lora_figure is not None
    fig = view.static_figures()[-1]
    assert len(view.static_figures()) == len(plain.static_figures()) + 1
    assert fig.layout.xaxis.type == "log"
    names = {t.name for t in fig.data}
    assert {lb.METHOD_LABELS["compile"], lb.METHOD_LABELS["lora"], lb.METHOD_LABELS["lora_from_compile"]} <= names
    lora_trace = next(t for t in fig.data if t.name == lb.METHOD_LABELS["lora"])
    want = [r["G"] if math.isfinite(r["G"]) else None for r in res["summary"] if r["method"] == "lora"]   # NaN: a gap
    assert list(lora_trace.y) == pytest.approx(want)
    escaped = lora_compile_figure({"<b>mine</b>": res}, title="a & b")
    assert escaped.layout.annotations[0].text == "&lt;b&gt;mine&lt;/b&gt;" and escaped.layout.title.text == "a &amp; b"


def test_a_hand_built_case_with_an_id_outside_the_vocabulary_is_refused_by_name_not_by_torch():
    model = _tiny_cgt()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, vocab, (12,), generator=gen)
    rows = torch.randint(0, vocab, (3, 9), generator=gen)
    bad = rows.clone()
    bad[1, 4] = vocab + 3                     # one id the embedding does not have
    held = lb.Continuations(bad, bad, torch.ones_like(bad, dtype=torch.bool))
    make_train = lambda m, p: lb.Continuations(rows, rows, torch.ones_like(rows, dtype=torch.bool),  # noqa: E731
                                               lb.teacher_outputs(m, p, rows))
    case = lb.PromptCase(prompt, held, make_train)
    for run in (lambda: lb.run_case(model, case, steps=(0,), timing_repeats=1),
                lambda: lb.compare_methods(model, [case], steps=(0,), timing_repeats=1)):
        with pytest.raises(ValueError, match="vocab_size"):
            run()
    data = lb.Continuations(bad, bad, torch.ones_like(bad, dtype=torch.bool), lb.teacher_outputs(model, prompt, rows))
    with pytest.raises(ValueError, match="vocab_size"):
        lb.train_lora(model, data, steps=(1,))
