"""Why not just train a LoRA? (issue 27) The per-prompt LoRA for a CGTLM over a pretrained LM, trained with peft.

`peft_lora_baseline` trains, for one prompt, a peft LoRA of the compiled update's shape (`CGTLM.peft_config()`:
rank K·r, alpha = rank, the compile's target modules in layers ℓ+1..N) by KL to the compile objective's teacher
(the frozen LM with the prompt in context) on continuations sampled from that teacher. The LoRA sits above
layer ℓ only and the continuation runs alone from position 0, so the continuation's layer-ℓ states never
change: they are computed once and every step runs layers ℓ+1..N (`upper_only`, exact, ~N/(N−ℓ) times faster).

`lm_compare_methods` puts it beside prompting, the compile and no context on held-out document windows, with
`hf.measure.window_losses` (the quality columns of `compile_comparison`: the same windows, the same controls)
and `summarize_comparison` (G with a bootstrap interval over documents); rows come out in the shape of
`cgt_viz.lora_baseline.summarize`, so `cgt_viz.figures.lora_compile_figure` and the benchmark's table
(benchmarks/bench_lora_vs_compile.py) draw them with the others.
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from .._checks import Bool, Choice, Float, Has, Instance, Int, StepCounts, check_callable, check_int, checked
from ..contracts import IGNORE_INDEX
from ..evaluate import GAP_NOISE_FLOOR, gap_closed_unchecked, gap_note
from ..lora_baseline import (INITS, LR_CONSTRAINT, TOP_K_CONSTRAINT, Continuations, Factors, OnePrompt,
                             distill_kl, finite_median, fit_factors, lora_rank, lora_shapes, median_timed, sample_continuations,
                             teacher_outputs, update_bytes)
from ._args import HeadModel


def _peft_names(module_name: str) -> tuple[str, str]:
    return f"base_model.model.{module_name}.lora_A.default.weight", f"base_model.model.{module_name}.lora_B.default.weight"


def peft_factors(peft_model) -> Factors:
    """{LM weight name: (A, B · scale)} read from a peft LoRA model (scale = alpha / r, 1 for peft_config())."""
    out = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            scale = module.scaling["default"]
            key = name.removeprefix("base_model.model.") + ".weight"
            out[key] = (module.lora_A["default"].weight.detach().clone(),
                        module.lora_B["default"].weight.detach().clone() * scale)
    return out


@torch.no_grad()
def merged_lm(lm, factors: Factors):
    """A copy of the LM with W + B A at the factors' weights (the others shared), like CGTLM.merged_lm."""
    from .layouts import layout_of
    flip = layout_of(lm).fan_in_fan_out          # W stored (in, out) by a Conv1D: B A (out, in) goes in transposed
    memo = {id(t): t for t in list(lm.parameters()) + list(lm.buffers())}
    for name, (a, b) in factors.items():
        w = lm.get_parameter(name)
        delta = (b @ a).t() if flip else b @ a
        memo[id(w)] = nn.Parameter(w + delta.to(w.dtype), requires_grad=False)
    return copy.deepcopy(lm, memo).eval()


def upper_logits(lm, x_ell: torch.Tensor, ell: int) -> torch.Tensor:
    """Logits of a causal LM run from the output of its decoder layer ℓ: x_ell (b, t, d), positions from 0.
    The LM's own loop runs over layers ℓ+1..N only (`hf.stream.upper_hidden`, as CGTLM._upper_hidden)."""
    from .layouts import layout_of
    from .stream import pass_lock, upper_hidden
    with pass_lock(lm):
        return layout_of(lm).head_of(lm)(upper_hidden(lm, x_ell, ell))


@checked(model=HeadModel(), prompt=OnePrompt(),
         data=Instance(Continuations, "None or Continuations (lora_baseline.sample_continuations)", none=True),
         steps=StepCounts(), init=Choice(*INITS), lr=LR_CONSTRAINT, top_k=TOP_K_CONSTRAINT,
         n_samples=Int(1), sample_len=Int(1), temperature=Float(0.0, lo_open=True), seed=Int(0), upper_only=Bool())
def peft_lora_baseline(model, prompt: torch.Tensor, data: Continuations | None = None,
                       steps: Sequence[int] = (10, 30, 100), init: str = "random", lr: float = 1e-3,
                       top_k: int | None = None, n_samples: int = 8, sample_len: int = 64,
                       temperature: float = 1.0, seed: int = 0, upper_only: bool = True):
    """A per-prompt LoRA for a CGTLM, trained with peft: `model.peft_config()` (rank K·r, alpha = rank, the
    compile's target modules at layers ℓ+1..N) on a deep copy of model.lm, KL to the compile objective's
    teacher (the frozen LM with the prompt in context, its top-k + rest buckets; top_k None: the model's
    aux_kl_top_k) on `data` (None: n_samples continuations of sample_len tokens sampled from that teacher).
    init "compile" starts from model.lora_factors(ȳ of the prompt). upper_only: the continuation's layer-ℓ
    states once, then each step runs layers ℓ+1..N only (the same logits; False runs the whole LM each step).

    Returns (peft_model, checkpoints, seconds): peft_model holds the last checkpoint (`save_pretrained` writes
    an adapter `PeftModel.from_pretrained(copy of lm, path)` loads), checkpoints a Checkpoint per N with
    peft_factors (LM weight names, B scaled), seconds {"train_data", "layer_states" (upper_only),
    "copy_and_wrap", "compile_factors" (init "compile")}."""
    import peft

    prompt = prompt.to(model.device)
    seconds = {}
    t0 = time.perf_counter()
    if data is None:
        inputs = sample_continuations(model, prompt, n_samples, sample_len, temperature, seed)
        data = Continuations(inputs, torch.full_like(inputs, IGNORE_INDEX), torch.ones_like(inputs, dtype=torch.bool))
    if data.teacher is None:
        data.teacher = teacher_outputs(model, prompt, data.inputs)
    seconds["train_data"] = time.perf_counter() - t0
    ell = model.config.y_layer
    if upper_only:
        t0 = time.perf_counter()
        x_ell = model.x_at_layer(data.inputs)
        seconds["layer_states"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    t0 = time.perf_counter()
    factors = model.prompt_factors(prompt) if init == "compile" else None     # the compile's pass, timed below
    factor_seconds = time.perf_counter() - t0
    peft_model = peft.get_peft_model(copy.deepcopy(model.lm), model.peft_config(factors))
    seconds["copy_and_wrap"] = time.perf_counter() - t0
    if init == "compile":
        t0 = time.perf_counter()
        with torch.no_grad():
            state = dict(peft_model.named_parameters())
            for name, (a, b) in factors.items():
                name_a, name_b = _peft_names(name[:-len(".weight")])
                scale = peft_model.get_submodule(name_a.rsplit(".lora_A", 1)[0]).scaling["default"]
                state[name_a].copy_(a)
                state[name_b].copy_(b / scale)
        seconds["compile_factors"] = factor_seconds + time.perf_counter() - t0
    else:
        torch.manual_seed(seed)   # peft's own init draws from the global generator at wrap time; re-draw seeded
        for module in peft_model.modules():
            if hasattr(module, "reset_lora_parameters") and "default" in getattr(module, "lora_A", {}):
                module.reset_lora_parameters("default", True)
    inner = peft_model.get_base_model()
    forward: Callable[[], torch.Tensor] = ((lambda: upper_logits(inner, x_ell, ell)) if upper_only
                                           else (lambda: peft_model(input_ids=data.inputs, use_cache=False).logits))
    top_k = model.config.aux_kl_top_k if top_k is None else top_k
    params = [p for n, p in peft_model.named_parameters() if "lora_" in n]
    peft_model.eval()       # no dropout (lora_dropout = 0 anyway); gradients still flow into the LoRA
    out = fit_factors(params, lambda: distill_kl("tokens", forward(), data, top_k), steps, lr,
                      lambda: peft_factors(peft_model), "peft_lora_baseline")
    return peft_model, out, seconds


# ---------------------------------------------------------------------------- the comparison on document windows
def prompt_windows(task, length: int, part: str, n_prompts: int, seed: int = 0):
    """n_prompts windows of `length` tokens, one per document, the topics taken in turn (one document per topic
    first): `task.document_windows` of `part` -> tokens (n, length), topics (n,), doc ids (n,)."""
    check_int("n_prompts", n_prompts, 1)
    per_topic = math.ceil(n_prompts / len(task.topics))
    tokens, topics, docs = task.document_windows(length, part, per_doc=1, per_topic=per_topic, seed=seed)
    rank = torch.zeros_like(topics)
    for t in topics.unique():
        where = torch.nonzero(topics == t).flatten()
        rank[where] = torch.arange(len(where))
    order = sorted(range(len(topics)), key=lambda i: (int(rank[i]), int(topics[i])))[:n_prompts]
    return tokens[order], topics[order], docs[order]


@torch.no_grad()
def _suffix_loss(lm, suffix: torch.Tensor, targets: torch.Tensor) -> float:
    from .measure import token_cross_entropy
    return float(token_cross_entropy(lm(input_ids=suffix[None], use_cache=False).logits, targets[None])[0])


@checked(model=HeadModel(), task=Has("document_windows", what="a task with document_windows (BBCTokens)"),
         n_prompts=Int(1), prompt_len=Int(2), suffix_len=Int(2), steps=StepCounts(), lr=LR_CONSTRAINT, n_samples=Int(1),
         sample_len=Int(1, none=True), temperature=Float(0.0, lo_open=True), top_k=TOP_K_CONSTRAINT, seed=Int(0),
         timing_repeats=Int(1))
def lm_compare_methods(model, task, part: str = "test", n_prompts: int = 5, prompt_len: int = 64,
                       suffix_len: int = 64, steps: Sequence[int] = (0, 10, 30, 100),
                       compile_steps: Sequence[int] | None = None, lr: float = 1e-3, n_samples: int = 8, sample_len: int | None = None, temperature: float = 1.0,
                       top_k: int | None = None, topic_means: torch.Tensor | None = None, seed: int = 0,
                       timing_repeats: int = 3, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Prompting, the compile, no context and the per-prompt LoRA (random and compile init, checkpoints at every
    N of `steps`; the compile init at compile_steps, default the same) on n_prompts held-out windows of `part` (`prompt_windows`: prompt_len prompt tokens, then
    suffix_len scored tokens of the same document). The LoRA trains on n_samples continuations of sample_len
    (default suffix_len) tokens sampled from the prompted LM at `temperature`, never on the scored suffix.

    Returns {"per_prompt", "summary" (rows as lora_baseline.summarize: loss, G pooled over documents with
    "G_ci95", "G_median" over prompts, median update seconds and their parts, update bytes, train KL),
    "comparison" (summarize_comparison of every condition, the controls too), "rank", "update_bytes", ...}."""
    from .measure import summarize_comparison, window_losses

    say = log or (lambda msg: None)
    if log is not None:
        check_callable("log", log, "None or a callable (one line of progress)")
    compile_steps = steps if compile_steps is None else StepCounts().check("compile_steps", compile_steps)
    tokens, topics, docs = prompt_windows(task, prompt_len + suffix_len + 1, part, n_prompts, seed)
    was = model.training
    model.eval()
    try:
        losses = window_losses(model, tokens, prompt_len, topics, docs, topic_means, seed=seed)
        per_prompt = []
        for i in range(len(tokens)):
            row = tokens[i].to(model.device)
            prompt, suffix, targets = row[:prompt_len], row[prompt_len:-1], row[prompt_len + 1:]
            _, t_compile = median_timed(lambda: model.specialize(prompt), timing_repeats)
            data, t_data = median_timed(lambda: _sampled(model, prompt, n_samples, sample_len or suffix_len, temperature,
                                                   seed * 1000 + i), 1)
            methods = {"prompted": {"parts": {}}, "compile": {"parts": {"specialize": t_compile}},
                       "no_context": {"parts": {}}}
            for method, init, at in (("lora", "random", steps), ("lora_from_compile", "compile", compile_steps)):
                _, cks, secs = peft_lora_baseline(model, prompt, data, at, init, lr, top_k, seed=seed * 1000 + i)
                for ck in cks:
                    net, t_merge = median_timed(lambda: merged_lm(model.lm, ck.factors), 1)
                    key = f"{method}@{ck.step}"
                    losses.setdefault(key, torch.full((len(tokens),), float("nan")))[i] = _suffix_loss(net, suffix, targets)
                    methods[key] = {"parts": {**secs, "train_data": t_data, "train_steps": ck.train_seconds,
                                              "merge": t_merge}, "step": ck.step, "train_kl": ck.train_kl}
                    del net
            for key, m in methods.items():
                cond = {"compile": "compiled"}.get(key, key)
                m["loss"] = float(losses[cond][i])
                m["update_seconds"] = sum(m["parts"].values())
            per_prompt.append({"doc": int(docs[i]), "topic": task.topics[int(topics[i])], "methods": methods,
                               "train_rows": int(data.inputs.shape[0]), "train_positions": int(data.mask.sum())})
            say(f"prompt {i + 1}/{len(tokens)} ({task.topics[int(topics[i])]}): " + ", ".join(
                f"{k} {m['loss']:.3f}" for k, m in methods.items()))
    finally:
        model.train(was)
    comparison = summarize_comparison(losses, docs, seed=seed)
    return {"per_prompt": per_prompt, "summary": _lm_summary(model, per_prompt, comparison),
            "comparison": comparison, "rank": lora_rank(model), "update_bytes": update_bytes(model),
            "shapes": {n: list(s) for n, s in lora_shapes(model).items()}, "steps": steps,
            "compile_steps": compile_steps, "lr": lr,
            "n_samples": n_samples, "sample_len": sample_len or suffix_len, "part": part,
            "gap_note": gap_note(comparison["loss_no_context"]["value"], comparison["loss_prompted"]["value"],
                                 GAP_NOISE_FLOOR)}


def _sampled(model, prompt: torch.Tensor, n: int, length: int, temperature: float, seed: int) -> Continuations:
    """The LoRA's training data: n continuations sampled from the prompted LM, with its outputs as the teacher."""
    inputs = sample_continuations(model, prompt, n, length, temperature, seed)
    return Continuations(inputs, torch.full_like(inputs, IGNORE_INDEX), torch.ones_like(inputs, dtype=torch.bool),
                         teacher_outputs(model, prompt, inputs))


def _lm_summary(model, per_prompt: Sequence[dict], comparison: dict) -> list[dict[str, Any]]:
    nbytes = update_bytes(model)
    floor_ok = comparison["loss_no_context"]["value"] - comparison["loss_prompted"]["value"] > GAP_NOISE_FLOOR
    rows = []
    for key in per_prompt[0]["methods"]:
        cond = {"compile": "compiled"}.get(key, key)
        method, _, step = key.partition("@")
        per = [p["methods"][key] for p in per_prompt]
        g = comparison.get("G" if cond == "compiled" else f"G_{cond}")
        own = [gap_closed_unchecked(p["methods"]["no_context"]["loss"], x["loss"], p["methods"]["prompted"]["loss"])
               for p, x in zip(per_prompt, per)]
        row = {"method": method, "steps": int(step) if step else None, "loss": comparison[f"loss_{cond}"]["value"],
               "acc": float("nan"), "n_prompts": len(per), "G": {"prompted": 1.0, "no_context": 0.0}.get(key, g and g["value"]) if floor_ok else float("nan"),
               "G_ci95": g and g["ci95"], "G_per_prompt": own, "G_median": finite_median(own),
               "update_seconds": finite_median([x["update_seconds"] for x in per]),
               "update_parts": {part: finite_median([x["parts"][part] for x in per]) for part in per[0]["parts"]},
               "update_bytes": nbytes if method in ("compile", "lora", "lora_from_compile") else 0}
        if "train_kl" in per[0]:
            row["train_kl"] = finite_median([x["train_kl"] for x in per])
        rows.append(row)
    return rows
