"""Measurements for a CGTLM on BBCTokens: what ȳ knows about topics, what a compiled prompt buys."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .._checks import Bool, Has, Instance, Int, Ints, check_int, checked
from ..contracts import Model
from ._args import Comparison, Comparisons, HeadModel, PerWindow, Windows
from ..comparison import comparison_logits
from ..evaluate import gap_closed_unchecked
from ..sequences import eval_mode


_EXCERPTS = Has("excerpts", what="a task with excerpts (BBCTokens)")
_WINDOWS_TASK = Has("document_windows", what="a task with document_windows (BBCTokens)")


@torch.no_grad()
@checked(model=Model(), task=_EXCERPTS, batch_size=Int(1))
def excerpt_summaries(model, task, length: int = 64, per_topic: int | None = 80, part: str | None = "val",
                      batch_size: int = 32, seed: int = 0):
    """ȳ after the last token of one excerpt per document -> features (n, e) numpy, topics (n,), doc ids (n,)."""
    tokens, topics, docs = task.excerpts(length, per_topic=per_topic, part=part, seed=seed)
    with eval_mode(model):
        feats = torch.cat([model.context(tokens[i:i + batch_size].to(model.device))[:, -1].float().cpu()
                           for i in range(0, len(tokens), batch_size)])
    return feats.numpy(), topics.numpy(), docs.numpy()


def ybar_topic_knn(model, task, length: int = 64, per_topic: int | None = 80, part: str | None = "val",
                   n_neighbors: int = 10, seed: int = 0) -> float:
    """kNN topic accuracy (cosine, 5 folds; one excerpt per document, so folds never share a document)."""
    from ..evaluate import knn_topic_accuracy
    feats, topics, _ = excerpt_summaries(model, task, length, per_topic, part, seed=seed)
    return knn_topic_accuracy(feats, topics, n_neighbors=n_neighbors, seed=seed)


@torch.no_grad()
@checked(model=Model(), task=Has("eval_batch", what="a task with eval_batch (BBCTokens)"), n_batches=Int(1),
         batch_size=Int(2, hint=" (the control borrows another row's prompt)"), seed=Int(0))
def continuation_losses(model, task, k: int = 64, n_batches: int = 4, batch_size: int = 8,
                        seed: int = 0) -> dict[str, Any]:
    """Mean cross-entropy on the block_size − k tokens after a k-token prompt of the same document:

    prompted     the CGTLM with the prompt in context
    compiled     ȳ after the prompt frozen into the weights, continuation alone (= specialize(prompt))
    control      the same, but ȳ from another row's prompt (a different document)
    no_context   the LM alone on the continuation

    and gap_closed = (no_context − compiled) / (no_context − prompted), gap_closed_control likewise: G as
    `evaluate.gap_closed` defines it (NaN when no_context − prompted is under evaluate.GAP_NOISE_FLOOR)."""
    gen = torch.Generator().manual_seed(seed)
    sums = dict.fromkeys(("prompted", "compiled", "control", "no_context"), 0.0)
    count, no_context = 0, model.x_only()
    names = {"prompted": "prompted", "specialized": "compiled", "other_row": "control", "no_context": "no_context"}
    with eval_mode(model):
        for _ in range(n_batches):
            b = task.eval_batch(k, batch_size, generator=gen, device=model.device)
            tgt = b.targets[:, k:]
            for mode, logits in comparison_logits(model, b.inputs, k, no_context, other_row=True).items():
                ce = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), reduction="sum")
                sums[names[mode]] += float(ce)
            count += tgt.numel()
    res: dict[str, Any] = {f"loss_{m}": v / count for m, v in sums.items()}
    for name in ("compiled", "control"):     # evaluate's G: NaN under its noise floor
        res[f"gap_closed{'' if name == 'compiled' else '_control'}"] = gap_closed_unchecked(
            res["loss_no_context"], res[f"loss_{name}"], res["loss_prompted"])
    res["n_scored"] = count
    return res


CONDITIONS = ("prompted", "compiled", "other_doc", "same_topic", "other_topic", "topic_mean", "no_context")


@torch.no_grad()
@checked(model=HeadModel(), tokens=Windows(), topics=PerWindow(), docs=PerWindow(),
         topic_means=Instance(torch.Tensor, "None or a tensor (topics, d_y) of mean summaries", none=True),
         batch_size=Int(1), seed=Int(0), full_mode=Bool(), per_position=Bool())
def window_losses(model, tokens: torch.Tensor, prefix_len: int, topics: torch.Tensor, docs: torch.Tensor,
                  topic_means: torch.Tensor | None = None, batch_size: int = 8, seed: int = 0,
                  full_mode: bool = False, per_position: bool = False) -> dict[str, torch.Tensor]:
    """Mean cross-entropy on the suffix of each window tokens (n, p + m + 1) (its last m tokens scored) under
    every condition of `compile_comparison` -> {condition: (n,)}, or with per_position the cross-entropy at
    every scored position -> {condition: (n, m)} (its mean over positions is the (n,) form).

    prompted     the frozen LM with the p-token prompt in context (the distillation teacher)
    full_mode    (only when asked) the CGT's own full mode, ȳ_t at every token, prompt in context
    compiled     ȳ after the prompt frozen into the weights, suffix alone (= specialize(prompt) on it)
    other_doc    the same with ȳ of a random window of another document; same_topic / other_topic: of another
                 document of the same / another topic
    topic_mean   ȳ = topic_means[topic] (e.g. the mean ȳ of the topic's training windows)
    no_context   the LM alone on the suffix

    With a token memory (`CGTLM(memory_layers=...)`) a condition that borrows another window's ȳ borrows its
    memory too (the whole compiled prompt is swapped); topic_mean has no memory (a mean ȳ holds no tokens), and
    one more condition, compiled_ybar_only, is the own ȳ without the memory: what the memory adds."""
    n, length = tokens.shape
    check_int("prefix_len", prefix_len, 1, length - 2, hint=f" (the windows have {length} tokens: at least 2 are "
                                                            f"left for the suffix and its target)")
    m = length - prefix_len - 1
    gen = torch.Generator().manual_seed(seed)
    pick = {}
    for name, ok in (("other_doc", lambda i, j: docs[j] != docs[i]),
                     ("same_topic", lambda i, j: docs[j] != docs[i] and topics[j] == topics[i]),
                     ("other_topic", lambda i, j: topics[j] != topics[i])):
        choice = []
        for i in range(n):
            pool = [j for j in range(n) if ok(i, j)]
            choice.append(pool[int(torch.randint(len(pool), (1,), generator=gen))] if pool else -1)
        pick[name] = torch.tensor(choice)
    shape = (n, m) if per_position else (n,)
    memory = model.memory is not None
    extra = (("full_mode",) if full_mode else ()) + (("compiled_ybar_only",) if memory else ())
    out = {c: torch.full(shape, float("nan")) for c in CONDITIONS + extra}
    ce = lambda logits, targets: token_cross_entropy(logits, targets, per_position)
    with eval_mode(model):
        ybar, suffix_x, prefix_x = [], [], []
        for i in range(0, n, batch_size):
            w = tokens[i:i + batch_size].to(model.device)
            tgt = w[:, prefix_len + 1:]
            # the teacher's pass also gives the prompt's pooled read-out, all that a pooled-only head reads
            hidden, pooled, states = model.teacher_pass(w[:, :prefix_len + m], prefix_len, states=True)
            if memory:
                prefix_x.append(states)
            out["prompted"][i:i + len(w)] = ce(model._logits(hidden[:, prefix_len:]), tgt)
            if full_mode:
                out["full_mode"][i:i + len(w)] = ce(model(w[:, :prefix_len + m])[:, prefix_len:], tgt)
            if model.pooled_only:
                ybar.append(model.summary_of_pooled(pooled))
            else:
                ybar.append(model.context(w[:, :prefix_len])[:, -1])
            suffix_x.append(model.x_at_layer(w[:, prefix_len:prefix_len + m]))
        ybar, suffix_x = torch.cat(ybar), torch.cat(suffix_x)
        own = torch.arange(n)
        summaries = {"compiled": (ybar, own), "no_context": (None, None)}
        for name, rows in pick.items():
            summaries[name] = (torch.where((rows >= 0)[:, None], ybar[rows.clamp_min(0)], torch.nan), rows.clamp_min(0))
        if topic_means is not None:
            summaries["topic_mean"] = (topic_means.to(ybar)[topics.to(ybar.device)], None)
        if memory:
            prefix_x = torch.cat(prefix_x)
            summaries["compiled_ybar_only"] = (ybar, None)
        for name, (summary, source) in summaries.items():
            for i in range(0, n, batch_size):
                x, tgt = suffix_x[i:i + batch_size], tokens[i:i + batch_size, prefix_len + 1:].to(model.device)
                if summary is None:
                    coeffs = {k: torch.zeros_like(c) for k, c in model._fixed_coeffs(ybar[i:i + len(x)]).items()}
                else:
                    coeffs = model._fixed_coeffs(summary[i:i + len(x)])
                if memory and source is not None:     # the memory of the window whose ȳ is used
                    rows = source[i:i + len(x)]
                    coeffs.update(model.memory_coeffs(prefix_x[rows], tokens[rows, :prefix_len].to(model.device)))
                out[name][i:i + len(x)] = ce(model._logits(model._upper_hidden(x, coeffs)), tgt)
    return out


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, per_position: bool = False) -> torch.Tensor:
    """(b, m, v), (b, m) -> cross-entropy per position (b, m) or its mean per row (b,), on the CPU."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view(targets.shape).cpu()
    return ce if per_position else ce.mean(1)


POSITION_KINDS = ("prompt_token", "rest")


@checked(tokens=Windows())
def prompt_token_positions(tokens: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Which scored positions of windows tokens (n, p + m + 1) predict a token of the prompt that the
    continuation has not shown yet -> bool (n, m).

    Position j predicts tokens[:, p + 1 + j] after reading tokens[:, p .. p + j] of the continuation: it counts
    when that target occurs among the prompt's p tokens and not among those continuation tokens. These are the
    positions where a model that holds the document (not only its topic) can copy what the prompt said."""
    check_int("prefix_len", prefix_len, 1, tokens.shape[1] - 2)
    prompt, rest = tokens[:, :prefix_len], tokens[:, prefix_len:]
    m = rest.shape[1] - 1
    targets = rest[:, 1:]                                                       # (n, m)
    in_prompt = (targets[:, :, None] == prompt[:, None, :]).any(-1)            # (n, m)
    # seen[j] = target j among continuation inputs 0..j: compare with every input, keep those at or before j
    same = targets[:, :, None] == rest[:, None, :m]                            # (n, m target, m input)
    upto = torch.ones(m, m, dtype=torch.bool).tril()                           # (m target, m input)
    seen = (same & upto).any(-1)
    return in_prompt & ~seen


def losses_at(losses: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-position losses {condition: (n, m)} -> the mean over the positions where mask (n, m) holds, per
    window {condition: (n,)} (NaN for a window with no such position)."""
    count = mask.sum(1)
    return {c: torch.where(count > 0, (v * mask).nansum(1) / count.clamp_min(1), torch.nan) for c, v in losses.items()}


def by_position(losses: dict[str, torch.Tensor], mask: torch.Tensor, docs: torch.Tensor, n_boot: int = 2000,
                seed: int = 0) -> dict[str, Any]:
    """`summarize_comparison` on the prompt-token positions (mask (n, m), see `prompt_token_positions`) and on
    the rest, plus the share of positions that are prompt tokens and the share of the prompted LM's gain over
    no context that sits there -> {"prompt_token": {...}, "rest": {...}, "fraction_prompt_token",
    "gain_share_prompt_token"}."""
    out: dict[str, Any] = {kind: summarize_comparison(losses_at(losses, where), docs, n_boot, seed)
                           for kind, where in zip(POSITION_KINDS, (mask, ~mask))}
    gain = losses["no_context"] - losses["prompted"]                            # (n, m)
    out["fraction_prompt_token"] = float(mask.float().mean())
    out["gain_share_prompt_token"] = float((gain * mask).sum() / gain.sum())
    return out


def _nanmean(v: torch.Tensor) -> torch.Tensor:
    keep = v[~torch.isnan(v)]
    return keep.mean() if len(keep) else torch.tensor(float("nan"), dtype=v.dtype)


def _per_document(values: torch.Tensor, docs: torch.Tensor) -> np.ndarray:
    """Each document's mean of its windows' values (n,) -> (documents,), NaN windows left out (a window can lack
    a subset of positions, see by_position; an all-NaN document stays NaN)."""
    return torch.stack([_nanmean(values[docs == d]) for d in torch.unique(docs)]).double().numpy()


def _resamples(n_docs: int, n_boot: int, seed: int) -> np.ndarray:
    """n_boot bootstrap resamples of document indices (n_boot, n_docs)."""
    return np.random.default_rng(seed).integers(0, n_docs, size=(n_boot, n_docs))


def _interval(fn, boots: np.ndarray) -> dict[str, Any]:
    """fn(document indices) -> a number: its value on all documents and a 95 % interval over the resamples."""
    value = float(fn(np.arange(boots.shape[1])))
    with warnings.catch_warnings():   # a resample may hold only documents without data for a subset: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        draws = np.array([fn(b) for b in boots])
    lo, hi = np.nanpercentile(draws, [2.5, 97.5])
    return {"value": value, "ci95": [float(lo), float(hi)]}


def document_interval(values: torch.Tensor, docs: torch.Tensor, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The mean over documents of each document's mean of values (n,) (windows of docs (n,)), with a 95 %
    bootstrap interval over documents -> {"value", "ci95"}. For a paired difference, pass it per window."""
    per_doc = _per_document(values, docs)
    return _interval(lambda b: np.nanmean(per_doc[b]), _resamples(len(per_doc), n_boot, seed))


def summarize_comparison(losses: dict[str, torch.Tensor], docs: torch.Tensor, n_boot: int = 2000,
                         seed: int = 0) -> dict[str, Any]:
    """Per-document means of window losses, then: each condition's mean loss; G = (none − compiled) /
    (none − prompted) (`evaluate.gap_closed`: NaN where the prompt helps by less than its noise floor) and G for
    every control (G_other_doc, ...); own − other = compiled − other_doc per
    document; each with a 95 % bootstrap interval over documents (n_boot resamples)."""
    uniq = torch.unique(docs)
    per_doc = {c: torch.from_numpy(_per_document(v, docs)) for c, v in losses.items()}
    boots = _resamples(len(uniq), n_boot, seed)
    stats = lambda fn: _interval(fn, boots)

    # a control with no candidate (e.g. no other document of the same topic among few) has no value: left out
    arr = {c: v.numpy() for c, v in per_doc.items() if not bool(torch.isnan(v).all())}
    res: dict[str, Any] = {"n_documents": int(len(uniq)), "n_windows": int(len(docs))}
    for c in arr:
        res[f"loss_{c}"] = stats(lambda b, c=c: np.nanmean(arr[c][b]))
    for c in [c for c in arr if c not in ("prompted", "no_context")]:   # G as evaluate defines it, per resample
        key = "G" if c == "compiled" else f"G_{c}"
        res[key] = stats(lambda b, c=c: gap_closed_unchecked(*(float(np.nanmean(arr[k][b]))
                                                              for k in ("no_context", c, "prompted"))))
    for control, key in (("same_topic", "own_minus_same_topic"), ("topic_mean", "own_minus_topic_mean")):
        if control in arr:      # does ȳ carry more than the topic: against a same-topic document, the topic's mean
            res[key] = stats(lambda b, c=control: np.nanmean(arr["compiled"][b] - arr[c][b]))
    if "other_doc" in arr:
        res["own_minus_other"] = stats(lambda b: np.nanmean(arr["compiled"][b] - arr["other_doc"][b]))
        res["G_minus_G_control"] = {"value": res["G"]["value"] - res["G_other_doc"]["value"]}
    res["conditions_without_data"] = sorted(set(per_doc) - set(arr))
    return res


@checked(model=HeadModel(), task=_WINDOWS_TASK, prompt_lens=Ints(2), suffix_len=Int(2), draws=Int(1),
         per_topic=Int(1, none=True), batch_size=Int(1), seed=Int(0), full_mode=Bool(), needles=Bool())
def compile_comparison(model, task, part: str = "val", prompt_lens=(64, 128), suffix_len: int = 64,
                       draws: int = 3, per_topic: int | None = 8, topic_means: torch.Tensor | None = None,
                       batch_size: int = 8, seed: int = 0, full_mode: bool = False,
                       needles: bool = False) -> dict[str, Any]:
    """Does a compiled prompt carry *that* prompt? For each prompt length p: `draws` windows of p + suffix_len + 1
    tokens from each of up to per_topic documents per topic of `part`; the losses of `window_losses` and their
    summary (`summarize_comparison`), with the same summary split into positions whose target the prompt
    holds and the rest under "by_position" (`by_position`) -> {"p=64": {...}, "p=128": {...}}.

    With needles (a task with documents and a tokenizer, BBCTokens), each p also gets "needle": the needle probe
    (`hf.needle`) on up to `draws` needle windows of each of up to per_topic documents per topic: a proper noun of
    the prompt, renamed to an invented word in the whole window, scored where the continuation first names it."""
    if needles:
        from .needle import DOCUMENTS_TASK
        DOCUMENTS_TASK.check("task", task)     # before the windows are measured, not after
    out = {}
    for p in prompt_lens:
        tokens, topics, docs = task.document_windows(p + suffix_len + 1, part, per_doc=draws, per_topic=per_topic,
                                                     seed=seed + p)
        per_position = window_losses(model, tokens, p, topics, docs, topic_means, batch_size, seed, full_mode,
                                     per_position=True)
        res = summarize_comparison({c: v.mean(1) for c, v in per_position.items()}, docs, seed=seed)
        res["by_position"] = by_position(per_position, prompt_token_positions(tokens, p), docs, seed=seed)
        if needles:
            from .needle import needle_comparison, needle_windows
            found = needle_windows(task, part, p, suffix_len, per_doc=draws, per_topic=per_topic, seed=seed + p)
            res["needle"] = needle_comparison(model, found, topic_means, batch_size, seed)
        out[f"p={p}"] = res
    return out


LABELS = {"prompted": "prompted (LM reads the prompt)", "compiled": "compiled (own ȳ)", "other_doc": "another document's ȳ",
          "same_topic": "same topic, other document", "other_topic": "another topic's document",
          "topic_mean": "the topic's mean ȳ", "no_context": "no context", "full_mode": "CGT full mode",
          "compiled_ybar_only": "compiled, own ȳ without the token memory"}


@checked(result=Comparison("n_documents", "G", "G_other_doc", "own_minus_other"))
def comparison_verdict(result: dict[str, Any]) -> str:
    """One line read off a `summarize_comparison` result: does the compiled prompt carry its document, or its
    topic? The head of the line follows the paired own − topic-mean interval (own − other document when no
    topic means were given); the rest quotes the numbers it rests on."""
    fmt = lambda r: f"{r['value']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]"
    other, mean = result["own_minus_other"], result.get("own_minus_topic_mean")
    g, g_other = result["G"]["value"], result["G_other_doc"]["value"]
    if other["ci95"][0] > 0:
        head = "the compiled prompt is worse than another document's"
    elif other["ci95"][1] >= 0:
        head = "the compiled prompt is not shown to carry its prompt"
    elif mean is None:
        head = "the compiled prompt beats another document's (no topic means given to tell document from topic)"
    elif mean["ci95"][1] < 0:
        head = "the compiled prompt is specific to its document: it beats its topic's mean ȳ"
    else:
        head = "the compiled prompt carries its topic: it beats another document, not its topic's mean ȳ"
    line = (f"{head}; own − other = {fmt(other)} nats (95 % over {result['n_documents']} documents), "
            f"G = {g:.2f} against {g_other:.2f} with another document's ȳ")
    if "own_minus_same_topic" in result:
        line += f", own − same-topic document = {fmt(result['own_minus_same_topic'])}"
    if mean is not None:
        line += f", own − topic mean = {fmt(mean)}"
    split = result.get("by_position")
    if split and "G" in split["prompt_token"] and "G" in split["rest"]:
        line += (f"; G at positions whose target the prompt holds ({split['fraction_prompt_token']:.0%} of them) = "
                 f"{split['prompt_token']['G']['value']:.2f}, elsewhere {split['rest']['G']['value']:.2f}")
    return line


PAIRED = {"own_minus_other": "own − another document", "own_minus_same_topic": "own − same-topic document",
          "own_minus_topic_mean": "own − topic's mean ȳ"}


@checked(results=Comparisons())
def paired_differences_figure(results: dict[str, dict[str, Any]],
                              title: str = "compiled prompt against its controls, paired per document"):
    """results {"p=64": summarize_comparison(...), ...} -> a plotly Figure of the paired differences the verdict
    rests on (compiled − control, nats per token, below 0: the own prompt is better), each with its 95 %
    interval over documents, one marker per prompt length."""
    import plotly.graph_objects as go
    fig = go.Figure()
    for name, res in results.items():
        keys = [k for k in PAIRED if k in res]
        vals = [res[k]["value"] for k in keys]
        fig.add_scatter(name=name, x=[PAIRED[k] for k in keys], y=vals, mode="markers",
                        marker=dict(size=11),
                        error_y=dict(type="data", symmetric=False,
                                     array=[res[k]["ci95"][1] - v for k, v in zip(keys, vals)],
                                     arrayminus=[v - res[k]["ci95"][0] for k, v in zip(keys, vals)]))
    fig.add_hline(y=0, line=dict(color="grey", dash="dot"))
    fig.update_layout(title=title, height=360, legend_title_text="prompt length", template="plotly_white",
                      yaxis=dict(title="paired difference (nats / token)"), xaxis=dict(title="control"),
                      scattermode="group")
    return fig


@checked(results=Comparisons())
def comparison_figure(results: dict[str, dict[str, Any]], title: str = "continuation loss by condition"):
    """results {"p=64": summarize_comparison(...), ...} -> a plotly Figure: each condition's mean loss (nats per
    token) with its 95 % bootstrap interval, one group of bars per prompt length."""
    import plotly.graph_objects as go
    fig = go.Figure()
    for name, res in results.items():
        conds = [c for c in CONDITIONS + ("full_mode",) if f"loss_{c}" in res]
        vals = [res[f"loss_{c}"]["value"] for c in conds]
        fig.add_bar(name=name, x=[LABELS[c] for c in conds], y=vals,
                    error_y=dict(type="data", symmetric=False,
                                 array=[res[f"loss_{c}"]["ci95"][1] - v for c, v in zip(conds, vals)],
                                 arrayminus=[v - res[f"loss_{c}"]["ci95"][0] for c, v in zip(conds, vals)]))
    lows = [res[f"loss_{c}"]["ci95"][0] for res in results.values() for c in CONDITIONS if f"loss_{c}" in res]
    highs = [res[f"loss_{c}"]["ci95"][1] for res in results.values() for c in CONDITIONS if f"loss_{c}" in res]
    pad = 0.1 * (max(highs) - min(lows) + 1e-9)
    fig.update_layout(title=title, barmode="group", height=380, legend_title_text="prompt length",
                      yaxis=dict(title="cross-entropy (nats / token)", range=[min(lows) - pad, max(highs) + pad]),
                      xaxis=dict(title="condition"))
    return fig


@checked(results=Comparisons())
def comparison_markdown(results: dict[str, dict[str, Any]]) -> str:
    """results {"p=64": summarize_comparison(...), ...} -> a markdown table: mean losses, G (with its interval),
    G with each control, own − other and own − topic mean (with their intervals), G at prompt-token positions
    and elsewhere, one row per prompt length."""
    head = ("| prompt | docs / windows | prompted | compiled | other doc | same topic | other topic | topic mean | "
            "no context | G [95 %] | G other doc | G same topic | G topic mean | own − other [95 %] | "
            "own − topic mean [95 %] | G prompt tokens [95 %] | G rest |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def split_g(r, kind, interval):
        g = r.get("by_position", {}).get(kind, {}).get("G")
        if g is None:
            return "—"
        return f"{g['value']:.2f} [{g['ci95'][0]:.2f}, {g['ci95'][1]:.2f}]" if interval else f"{g['value']:.2f}"

    for name, r in results.items():
        one = lambda k, fmt: f"{r[k]['value']:{fmt}}" if k in r else "—"
        ci = lambda k, fmt: f"{one(k, fmt)} [{r[k]['ci95'][0]:{fmt}}, {r[k]['ci95'][1]:{fmt}}]" if k in r else "—"
        loss = " | ".join(one(f"loss_{c}", ".3f") for c in CONDITIONS)
        lines.append(f"| {name} | {r['n_documents']} / {r['n_windows']} | {loss} | {ci('G', '.2f')} | "
                     f"{one('G_other_doc', '.2f')} | {one('G_same_topic', '.2f')} | {one('G_topic_mean', '.2f')} | "
                     f"{ci('own_minus_other', '+.3f')} | {ci('own_minus_topic_mean', '+.3f')} | "
                     f"{split_g(r, 'prompt_token', True)} | {split_g(r, 'rest', False)} |")
    return "\n".join(lines)
