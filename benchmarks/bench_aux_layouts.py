"""How the auxiliary pass lays out the rows' suffixes, and what each layout costs (issue 16, item 1).

    python benchmarks/bench_aux_layouts.py [--repeats 8] [--out benchmarks/results]

Every layout computes each row's suffix with its own frozen ȳ, positions from 0, attending only within the
suffix, so all give the same aux loss and gradients (checked here on the benchmark batch, and in
tests/project/test_benchmarks.py on a tiny one); only the shapes of the work differ:
  groups4   the model's layout (cgt_viz.losses.AUX_LENGTH_GROUPS = 4): rows sorted by suffix length in 4 groups,
            each padded to its own longest suffix (cut where the padding is least)
  groups4_chunks  the same 4 groups as equal-size chunks (the model's layout before the least-padding cut)
  einsum_apply    groups4 with the templates applied by the two einsums SiteTemplates.apply used before (main
            pass and aux pass alike)
  previous  groups4_chunks with einsum_apply: the model as it was before both changes
  groups1   every row padded to the longest suffix of the batch (one pass)
  per_row   one pass per row, no padding (AUX_LENGTH_GROUPS = b)
  packed    suffixes packed first-fit decreasing into sequences as long as the longest suffix, positions
            restarting per suffix, a block-diagonal causal mask (F.scaled_dot_product_attention attn_mask); one pass
Reports the CGT / GPT training-step ratio (forward, backward, AdamW; same splits for every layout in a repeat)
from process CPU time (steadier than wall time on a shared machine; wall-time ratios beside it), and the mean
positions per row each layout computes. Writes aux_layouts.json.
"""
from __future__ import annotations

import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (puts the repo root on sys.path)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from einops import einsum, rearrange  # noqa: E402

import cgt_viz.losses as losses_module  # noqa: E402
import cgt_viz.model as model_module  # noqa: E402
from cgt_viz.contracts import IGNORE_INDEX  # noqa: E402
from cgt_viz.layers import SiteTemplates  # noqa: E402
from cgt_viz.losses import aux_length_groups, per_position_loss, take_positions  # noqa: E402

LAYOUTS = ("groups4", "groups4_chunks", "groups1", "per_row", "packed", "einsum_apply", "previous")


# ---------------------------------------------------------------------------------------------- packing
def pack_suffixes(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: row indices into bins of at most `capacity` positions (longest rows first)."""
    bins, room = [], []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        j = next((j for j, r in enumerate(room) if r >= lengths[i]), None)
        if j is None:
            bins.append([]), room.append(capacity)
            j = len(bins) - 1
        bins[j].append(i)
        room[j] -= lengths[i]
    return bins


def packed_layout(lengths: list[int]):
    """row, pos, valid (p, c) and the mask (p, 1, c, c): same row and key position ≤ query position (a padding
    slot sees itself only, so that no softmax row is empty)."""
    cap = max(lengths)
    bins = pack_suffixes(lengths, cap)
    row = torch.full((len(bins), cap), -1, dtype=torch.long)
    pos = torch.zeros(len(bins), cap, dtype=torch.long)
    for j, rows in enumerate(bins):
        start = 0
        for i in rows:
            row[j, start:start + lengths[i]], pos[j, start:start + lengths[i]] = i, torch.arange(lengths[i])
            start += lengths[i]
    valid = row >= 0
    mask = ((row[:, :, None] == row[:, None, :]) & (pos[:, None, :] <= pos[:, :, None]) & valid[:, :, None]) \
        | torch.eye(cap, dtype=torch.bool)
    return row.clamp_min(0), pos, valid, mask[:, None]


def _block_masked(block, x, modulate, mask):
    """layers.Block.forward with an explicit attention mask instead of the causal one (dropout 0)."""
    h = block.ln_1(x)
    if modulate is not None:
        h = modulate("attn_in", h)
    attn = block.attn
    q, k, v = rearrange(attn.c_attn(h), "b t (three h c) -> three b h t c", three=3, h=attn.n_head)
    out = rearrange(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), "b h t c -> b t (h c)")
    if modulate is not None:
        out = modulate("attn_out", out)
    x = x + attn.c_proj(out)
    return x + block.mlp(block.ln_2(x), modulate)


def _modulator(model, layer: int, coeffs: dict):
    """The modulate hook of CGT._upper for one layer, with per-slot coefficients."""
    temps = model.templates[str(layer)]

    def modulate(site, h):
        key = f"{layer}.{site}"
        return temps[site].apply(h, coeffs[key]) if key in coeffs else h
    return modulate


def packed_aux_loss(self, idx, targets, loss_mask, ybar, split, keep=None, teacher=None, memory=None):
    """CGT._aux_loss with the packed layout (tokens mode): the same estimate, term by term (cross-entropy aux
    only: the distillation term, aux_kl > 0, and a token memory's compiled prefixes are not laid out here)."""
    cfg = self.config
    if teacher is not None:
        raise NotImplementedError("the packed layout measures the cross-entropy aux term (aux_kl = 0)")
    if memory:
        raise NotImplementedError("the packed layout measures a CGT without a token memory (memory_layers = 0)")
    b, t = idx.shape[:2]
    ytilde = ybar[torch.arange(b), split - 1]
    m = t - int(split.min())
    if cfg.aux_suffix_len is not None:
        m = min(m, cfg.aux_suffix_len)
    src = split[:, None] + torch.arange(m)
    mask = (src < t) if loss_mask is None else (src < t) & take_positions(loss_mask.bool(), src)
    suffix, suffix_targets = take_positions(idx, src), take_positions(targets, src)
    mask = mask & (suffix_targets != IGNORE_INDEX)
    count = mask.sum().clamp_min(1).to(ybar.dtype)
    if keep is not None:
        split, suffix, suffix_targets, mask, ytilde = split[keep], suffix[keep], suffix_targets[keep], mask[keep], ytilde[keep]
    n = suffix.shape[0]
    row, pos, valid, attn_mask = packed_layout([min(m, t - s) for s in split.tolist()])
    gpt = self.gpt
    x = gpt.drop(gpt.embed(suffix[row, pos]) + gpt.wpe(pos))
    coeffs = {key: c[row] for key, c in self.coefficients(ytilde).items()}           # (p, c, K), per slot
    for layer in range(1, cfg.n_layer + 1):
        modulate = _modulator(self, layer, coeffs) if layer in self.modulated_layers else None
        x = _block_masked(gpt.blocks[layer - 1], x, modulate, attn_mask)
    logits = gpt.head(gpt.ln_f(x))
    loss, scored = per_position_loss(cfg.mode, logits, suffix_targets[row, pos], mask[row, pos] & valid)
    return (loss * scored).sum() * (b / n) / count


MATMUL_APPLY = SiteTemplates.apply


def einsum_apply(self, h: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """SiteTemplates.apply as it was: two einsums."""
    proj = einsum(h, self.V, "b t i, k i r -> b t k r")
    return h + einsum(proj * coeffs.unsqueeze(-1), self.U, "b t k r, k i r -> b t i")


def chunked_groups(split: torch.Tensor) -> list[torch.Tensor]:
    """The grouping before the least-padding cut: rows sorted by suffix length in 4 equal-size chunks."""
    return list(torch.argsort(split).chunk(4))


def use_layout(cgt, layout: str, batch: int) -> None:
    """Switch the CGT's aux pass to `layout` (the model's own code for the group layouts)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    cgt.__dict__.pop("_aux_loss", None)
    model_module.aux_length_groups = chunked_groups if layout in ("groups4_chunks", "previous") else aux_length_groups
    SiteTemplates.apply = einsum_apply if layout in ("einsum_apply", "previous") else MATMUL_APPLY
    losses_module.AUX_LENGTH_GROUPS = {"groups1": 1, "per_row": batch}.get(layout, 4)
    if layout == "packed":
        cgt._aux_loss = types.MethodType(packed_aux_loss, cgt)


def positions_per_row(layout: str, lengths: list[int]) -> float:
    """Positions the layout computes per row (padding included)."""
    b = len(lengths)
    if layout == "packed":
        return len(pack_suffixes(lengths, max(lengths))) * max(lengths) / b
    saved = losses_module.AUX_LENGTH_GROUPS
    losses_module.AUX_LENGTH_GROUPS = {"groups1": 1, "per_row": b}.get(layout, 4)
    group_fn = chunked_groups if layout in ("groups4_chunks", "previous") else aux_length_groups
    try:
        groups = group_fn(-torch.tensor(lengths))   # the model's own grouping (longest suffix first)
    finally:
        losses_module.AUX_LENGTH_GROUPS = saved
    return sum(len(g) * max(lengths[i] for i in g.tolist()) for g in groups) / b


# ---------------------------------------------------------------------------------------------- checks and timing
def max_differences(cgt, idx, targets, split, layouts) -> dict:
    """Per layout: |aux − aux(groups4)| and the largest difference of the aux term's gradients (all parameters,
    through ȳ too). The aux term is the model's own (`loss(..., split=split)["aux"]`), in eval mode so that every
    row runs the aux pass (no row sampling, no noise)."""
    out, ref = {}, None
    was_training = cgt.training
    cgt.eval()
    for layout in layouts:
        use_layout(cgt, layout, idx.shape[0])
        cgt.zero_grad(set_to_none=True)
        aux = cgt.loss(idx, targets, split=split)["aux"]
        aux.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in cgt.parameters()]
        if ref is None:
            ref = (aux.detach(), grads)
        out[layout] = {"aux": float(aux.detach()), "aux_difference": float((aux.detach() - ref[0]).abs()),
                       "max_grad_difference": max(float((g - r).abs().max()) for g, r in zip(grads, ref[1])),
                       "max_grad": max(float(r.abs().max()) for r in ref[1])}
    use_layout(cgt, "groups4", idx.shape[0])
    cgt.zero_grad(set_to_none=True)
    cgt.train(was_training)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    common.add_model_args(p)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(common.DEFAULT_RESULTS))
    args = p.parse_args(argv)
    layouts = [x for x in args.layouts.split(",") if x]
    if "groups4" not in layouts or any(x not in LAYOUTS for x in layouts):
        raise ValueError(f"--layouts must be a subset of {LAYOUTS} that includes groups4, got {layouts}")
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    cgt, gpt = common.build_models(args, args.seq, device)
    cgt.train(), gpt.train()
    gen = torch.Generator().manual_seed(args.seed)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    split_gen = torch.Generator().manual_seed(args.seed + 1)
    splits = [cgt.sample_split(args.batch, args.seq, split_gen) for _ in range(args.repeats + 1)]
    equal = max_differences(cgt, idx, targets, splits[0], layouts)
    opts = {"gpt": torch.optim.AdamW(gpt.parameters(), lr=1e-4), "cgt": torch.optim.AdamW(cgt.parameters(), lr=1e-4)}

    def step(name, split=None):
        opts[name].zero_grad(set_to_none=True)
        (gpt.loss(idx, targets) if name == "gpt" else cgt.loss(idx, targets, split=split))["total"].backward()
        opts[name].step()

    cpu = {k: [] for k in ["gpt"] + layouts}
    wall = {k: [] for k in cpu}
    for rep, split in enumerate(splits):        # repeat 0 warms up; every layout sees the same split per repeat
        for name in cpu:
            if name != "gpt":
                use_layout(cgt, name, args.batch)
            c0, w0 = time.process_time(), time.perf_counter()
            step("gpt" if name == "gpt" else "cgt", split)
            if rep:
                cpu[name].append(time.process_time() - c0)
                wall[name].append(time.perf_counter() - w0)
    use_layout(cgt, "groups4", args.batch)
    rows = []
    lengths = [(args.seq - s).tolist() for s in splits]
    for name in layouts:
        rows.append({"layout": name,
                     "ratio_cpu_median": statistics.median(cpu[name]) / statistics.median(cpu["gpt"]),
                     "ratio_cpu_per_repeat": common.summarize([c / g for c, g in zip(cpu[name], cpu["gpt"])]),
                     "ratio_wall_median": statistics.median(wall[name]) / statistics.median(wall["gpt"]),
                     "positions_per_row": statistics.fmean(positions_per_row(name, ls) for ls in lengths),
                     "exact_positions_per_row": statistics.fmean(statistics.fmean(ls) for ls in lengths),
                     **equal[name]})
    res = {"benchmark": "bench_aux_layouts", "environment": common.environment(device), "config": cgt.config.to_dict(),
           "args": vars(args), "gpt_step_cpu_s": common.summarize(cpu["gpt"]), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common.write_json(out / "aux_layouts.json", res)
    print(f"b {args.batch}, t {args.seq}, {args.repeats} repeats, load {res['environment']['load_average_1_5_15']}")
    print("| layout | CGT / GPT step (CPU time, median) | per-repeat p10–p90 | wall-time ratio | positions / row "
          "(exact) | aux − groups4 | max grad difference |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        pr = r["ratio_cpu_per_repeat"]
        print(f"| {r['layout']} | {r['ratio_cpu_median']:.3f} | {pr['p10']:.2f}–{pr['p90']:.2f} | {r['ratio_wall_median']:.3f} | "
              f"{r['positions_per_row']:.1f} ({r['exact_positions_per_row']:.1f}) | {r['aux_difference']:.1e} | "
              f"{r['max_grad_difference']:.1e} |")
    return res


if __name__ == "__main__":
    main()
