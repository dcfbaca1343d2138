"""What each SmolLM2 head's update space costs to train: one training step of every space on the same windows,
interleaved in one run, and the bytes its feature cache stores a window. Writes head_spaces_cost.json.

    python benchmarks/bench_head_spaces.py                        # SmolLM2 from the local cache, one thread
    python benchmarks/bench_head_spaces.py --smoke --out /tmp     # the tiny random Llama, seconds (tests)

The spaces are the ones the results page compares ("Update spaces against their cost"), declared once in SPACES:
the shipped head's (16 rank-2 templates at attn_in, mlp_in above ℓ = 22), more templates, rank and sites, a
lower ℓ (more layers), and the shipped space with a token memory. A step is what `train-head` runs per update:
`distill.cached_loss` on a batch of cached windows, its backward and an AdamW step, with the head's weights at
their initial values (a step's cost does not depend on them). Each space's windows are its own feature cache's
rows (`distill.compute_features`: the LM's own pass, so a lower ℓ has its own suffix states). The times are
medians over --repeats, the spaces alternating every repeat; compare them as ratios to the shipped space's,
never across runs. The compiled model of every space costs what the LM costs (its updates are merged), so only
training and the cache differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts the repo root on sys.path)
import torch  # noqa: E402

ALL_SITES = ("attn_in", "mlp_in", "attn_out", "mlp_out")
# name -> the CGTLM arguments that differ from the shipped head's (templates, rank, sites, y_layer, memory)
SPACES: dict[str, dict] = {
    "shipped": {},
    "more templates, rank and sites": {"n_templates": 32, "template_rank": 4, "sites": ALL_SITES},
    "lower ℓ": {"y_layer": 16},
    "token memory": {"memory_layers": 4, "memory_rank": 64},
}
SHIPPED = {"y_layer": 22, "d_y": 64, "n_head_y": 4, "n_templates": 16, "template_rank": 2,
           "sites": ("attn_in", "mlp_in")}


def build(lm, space: dict, smoke: bool):
    from cgt_viz import hf
    kw = {**SHIPPED, **space}
    if smoke:                      # the tiny LM has 4 layers: ℓ 22 -> 2, 16 -> 1, a memory at the top layer
        kw = {**kw, "y_layer": 2 if kw["y_layer"] == 22 else 1, "d_y": 8, "n_head_y": 2,
              "memory_layers": min(kw.get("memory_layers", 0), 1), "memory_rank": min(kw.get("memory_rank", 64), 8)}
    model = hf.CGTLM(lm, pooled_only=True, aux_ce=1.0, aux_kl=1.0, aux_kl_top_k=64 if not smoke else 8, w_aux=1.0,
                     **kw)
    return model, {**kw, "sites": list(kw["sites"])}


def cached_batch(model, tokens: torch.Tensor, prefix_len: int, top_k: int) -> tuple[dict, int]:
    """A batch as `FeatureCache.batch` gives it, from the model's own features of tokens (b, p + m + 1), and the
    bytes the cache stores a window (its float16 tensors, the tokens, topic and document ids)."""
    from cgt_viz.hf import distill
    feats = distill.compute_features(model, tokens, prefix_len, top_k, batch_size=len(tokens))
    stored = sum(t.numel() * t.element_size() for t in feats.values()) + tokens.numel() * 8 + 2 * 8 * len(tokens)
    batch = {"pooled": feats["pooled"].float(), "suffix_x": feats["suffix_x"].float(),
             "targets": tokens[:, prefix_len + 1:].long(), "teacher_ids": feats["teacher_ids"].long(),
             "teacher_logp": feats["teacher_logp"].float()}
    if "prefix_x" in feats:
        batch.update(prefix_x=feats["prefix_x"].float(), prefix=tokens[:, :prefix_len].long())
    return batch, stored // len(tokens)


def main(argv=None) -> dict:
    from cgt_viz import hf
    from cgt_viz.hf import distill
    p = common.parser(__doc__)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16, help="windows a step (train-head's --batch)")
    p.add_argument("--prefix", type=int, default=64)
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="the tiny random Llama (seconds; for tests)")
    p.add_argument("--out", default=str(common.DEFAULT_RESULTS))
    args = p.parse_args(argv)
    for name in ("threads", "batch", "prefix", "suffix", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: an integer ≥ 1, not {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    length = args.prefix + args.suffix + 1
    if args.smoke:
        lm = hf.tiny_llama(seed=0)
        tokens = hf.tiny.RandomWindows().document_windows(length, "train", 1, None, 0)[0][:args.batch]
    else:
        lm, tok = hf.smollm2()
        task = hf.BBCTokens.for_head(tok, {"prefix": args.prefix, "suffix": args.suffix, "eval_prompts": [64, 128],
                                           "val_fraction": 0.1, "test_fraction": 0.1, "seed": 0})
        tokens = task.document_windows(length, "train", per_doc=1, per_topic=max(1, args.batch // 5), seed=0)[0]
        tokens = tokens[:args.batch]
    top_k = 8 if args.smoke else 64
    steps, rows = {}, {}
    for name, space in SPACES.items():
        torch.manual_seed(0)
        model, built = build(lm, space, args.smoke)
        batch, per_window = cached_batch(model, tokens, args.prefix, top_k)
        params = [q for q in model.parameters() if q.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4)

        def step(model=model, batch=batch, opt=opt):
            opt.zero_grad(set_to_none=True)
            distill.cached_loss(model, batch)["aux"].backward()
            opt.step()

        steps[name] = step
        rows[name] = {"space": built, "modulated_layers": len(model.modulated_layers),
                      "trainable_parameters": sum(q.numel() for q in params),
                      "cache_bytes_per_window": per_window}
    times = common.time_interleaved(steps, torch.device("cpu"), args.repeats)
    tokens_a_step = args.batch * (length - args.prefix - 1)
    base = common.summarize(times["shipped"])["median"]
    for name, row in rows.items():
        med = common.summarize(times[name])["median"]
        row.update(step_seconds=common.summarize(times[name]), tokens_per_second=tokens_a_step / med,
                   step_time_vs_shipped=med / base,
                   cache_bytes_vs_shipped=row["cache_bytes_per_window"] / rows["shipped"]["cache_bytes_per_window"])
    res = {"settings": vars(args), "environment": common.environment(torch.device("cpu")),
           "command": "python benchmarks/bench_head_spaces.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "lm": "tiny random Llama" if args.smoke else "SmolLM2-135M-Instruct", "spaces": rows}
    common.write_json(Path(args.out) / "head_spaces_cost.json", res)
    for name, row in rows.items():
        print(f"{name:32s} step ×{row['step_time_vs_shipped']:.2f}  cache ×{row['cache_bytes_vs_shipped']:.2f}  "
              f"{row['trainable_parameters']:>9d} parameters  {row['modulated_layers']} layers")
    return res


if __name__ == "__main__":
    main()
