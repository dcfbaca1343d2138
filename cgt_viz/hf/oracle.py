"""The ceiling of a head's update space: for each prompt, the best its reader could possibly do.

A compiled prompt is ȳ → coefficients → a low-rank update of the upper layers. When a head's compiled
prompts fall short of the prompted LM, either the reader (ȳ from the prompt) or the update space (what any
coefficients can express) is to blame. The oracle tells them apart: per window it optimises one part of the
head's output directly, under the head's own objective (aux_ce · cross-entropy + aux_kl · KL to the LM with the
prompt in context), with everything else frozen, and scores the result on the window's continuation.

kinds
    ybar     the best ȳ: a perfect reader of today's templates
    coeffs   the best coefficients of every template: the whole fixed template space
    lora     the compiled update plus a free rank-r update at the same maps: a space that can write any
             direction, the reference for what a richer template kind could reach
    memory   (a head with a token memory) the best factors A, B of the memory's update at each of its maps, the
             templates as compiled: any update of the memory's rank at its maps, the ceiling of its space

targets
    capacity KL to the prompted LM on the scored continuation itself: an upper bound of what the space can
             express of the prompt. Only the teacher's distributions are used, never the continuation's own
             next tokens (a cross-entropy on them would hand the optimum the answer: G far above 1)
    fair     the head's own objective (aux_ce · CE + aux_kl · KL) on continuations sampled from the prompted LM;
             the scored text is never seen

The from-scratch family's oracle (`cgt_viz.oracle`, on a task's queries) shares the optimiser and the free
update. Each optimum starts at the compiled prompt (the free update at zero) and keeps the best point seen, the start
included, so per window it is never worse than the compiled prompt on the objective it optimises.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .._checks import Has, check_float, check_int, checked, refuse
from ._args import Windows
from ..oracle import ORACLE_KINDS, best_of, oracle_pass
from ..sequences import eval_mode
from .measure import by_position, document_interval, prompt_token_positions, summarize_comparison, window_losses

ORACLE_TARGETS = ("capacity", "fair")
HF_ORACLE_KINDS = (*ORACLE_KINDS, "memory")


def _objective(model, logits: torch.Tensor, targets: torch.Tensor | None, teacher_logp: torch.Tensor) -> torch.Tensor:
    """The head's own objective per row: aux_ce · CE(targets) + aux_kl · KL(teacher ‖ student), each the mean over
    positions; logits (b, m, v), targets (b, m), teacher_logp (b, m, v) -> (b,). targets None: the KL alone (with
    weight 1 if the head has none). The KL is over the whole vocabulary (the head trains on the teacher's top-k
    plus a rest bucket, a lower bound of it)."""
    cfg = model.config
    logp = F.log_softmax(logits.float(), -1)
    value = torch.zeros(len(logits), device=logits.device)
    if targets is None:
        return (teacher_logp.exp() * (teacher_logp - logp)).sum(-1).mean(1)
    if cfg.aux_ce:
        value = value + cfg.aux_ce * F.nll_loss(logp.flatten(0, 1), targets.flatten(),
                                                reduction="none").view(targets.shape).mean(1)
    if cfg.aux_kl:
        value = value + cfg.aux_kl * (teacher_logp.exp() * (teacher_logp - logp)).sum(-1).mean(1)
    return value


@torch.no_grad()
def _sampled_continuations(model, prompts: torch.Tensor, length: int, samples: int,
                           generator: torch.Generator) -> torch.Tensor:
    """samples continuations of length + 1 tokens per prompt, drawn from the LM with the prompt in context
    -> (b, samples, length + 1)."""
    b, p = prompts.shape
    seq = prompts.repeat_interleave(samples, 0)                                # (b·s, p)
    for _ in range(length + 1):
        logits = model.lm(input_ids=seq, use_cache=False).logits[:, -1].float()
        nxt = torch.multinomial(logits.softmax(-1).cpu(), 1, generator=generator).to(seq.device)
        seq = torch.cat([seq, nxt], 1)
    return seq[:, p:].view(b, samples, length + 1)


@checked(tokens=Windows())
def oracle_window_losses(model, tokens: torch.Tensor, prefix_len: int, kinds: Sequence[str] = ORACLE_KINDS,
                         target: str = "capacity", steps: int = 30, lr: float = 0.05, rank: int = 8,
                         samples: int = 2, batch_size: int = 8, seed: int = 0,
                         lora_lr: float = 3e-3) -> dict[str, Any]:
    """The oracle of each kind on windows tokens (n, p + m + 1): per-position cross-entropy on the scored
    continuation under each optimum -> {"oracle_<kind>": (n, m), "objective": {kind: {"start": (n,),
    "best": (n,)}}}. See the module's docstring for kinds and targets. lr is Adam's step for ȳ and the
    coefficients, lora_lr for the free update's factors (a free rank-r update of every site moves the LM far
    more per unit of step)."""
    from .model import check_cgtlm
    check_cgtlm(model)
    for kind in kinds:
        if kind not in HF_ORACLE_KINDS:
            raise refuse("kinds", f"a subset of {HF_ORACLE_KINDS}", repr(kind))
        if kind == "memory" and model.memory is None:
            raise refuse("kinds", "'memory' only for a head with a token memory (memory_layers > 0)", repr(kind))
    if target not in ORACLE_TARGETS:
        raise refuse("target", f"one of {ORACLE_TARGETS}", repr(target))
    check_int("steps", steps, 0)
    check_float("lr", lr, 0.0, None, lo_open=True)
    check_float("lora_lr", lora_lr, 0.0, None, lo_open=True)
    check_int("rank", rank, 1)
    check_int("samples", samples, 1)
    check_int("batch_size", batch_size, 1)
    n, length = tokens.shape
    check_int("prefix_len", prefix_len, 1, length - 3)
    m = length - prefix_len - 1
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {f"oracle_{k}": torch.full((n, m), float("nan")) for k in kinds}
    out["objective"] = {k: {"start": torch.full((n,), float("nan")), "best": torch.full((n,), float("nan"))}
                        for k in kinds}
    with eval_mode(model):
        for i in range(0, n, batch_size):
            w = tokens[i:i + batch_size].to(model.device)
            b = len(w)
            prompt = w[:, :prefix_len]
            ybar = (model.summary_of_pooled(model.pooled_readout(prompt)) if model.pooled_only
                    else model.context(prompt)[:, -1]).detach()                 # (b, e)
            memory = {}
            if model.memory is not None:        # {"ν.memory": (A (b, m, i), B (b, o, m))}, as a compile writes it
                memory = {key: tuple(f.detach() for f in ab) for key, ab in
                          model.memory_coeffs(model.x_at_layer(prompt), prompt).items()}
            scored_x = model.x_at_layer(w[:, prefix_len:prefix_len + m])       # (b, m, d)
            scored_tgt = w[:, prefix_len + 1:]
            if target == "capacity":
                fit_x, fit_tgt = scored_x, None       # the teacher's distributions only, never the answer
                hidden, _ = model.teacher_pass(w[:, :prefix_len + m], prefix_len)
                fit_teacher = F.log_softmax(model._logits(hidden[:, prefix_len:]).float(), -1)
                rows = torch.arange(b, device=w.device)
            else:
                cont = _sampled_continuations(model, w[:, :prefix_len], m, samples, gen)   # (b, s, m + 1)
                cont = cont.flatten(0, 1)                                                  # (b·s, m + 1)
                prompts = w[:, :prefix_len].repeat_interleave(samples, 0)
                hidden, _ = model.teacher_pass(torch.cat([prompts, cont[:, :m]], 1), prefix_len)
                fit_teacher = F.log_softmax(model._logits(hidden[:, prefix_len:]).float(), -1)
                fit_x, fit_tgt = model.x_at_layer(cont[:, :m]), cont[:, 1:]
                rows = torch.arange(b, device=w.device).repeat_interleave(samples)
            compiled = {key: c.detach() for key, c in model._fixed_coeffs(ybar).items()}

            def per_row(value):       # (b·s,) -> (b,): a window's objective is the mean over its samples
                return torch.zeros(b, device=value.device).index_add(0, rows, value) / (len(rows) / b)

            for kind in kinds:
                run, params = oracle_pass(model, kind, ybar, compiled, rank, gen, hidden=model._upper_hidden,
                                          held=memory)
                objective = lambda ps: per_row(_objective(model, model._logits(run(ps, fit_x, rows)), fit_tgt,
                                                          fit_teacher))
                best, start, best_value = best_of(params, objective, steps,
                                                  lora_lr if kind in ("lora", "memory") else lr)
                with torch.no_grad():
                    logits = model._logits(run(best, scored_x, torch.arange(b, device=w.device)))
                    ce = F.cross_entropy(logits.flatten(0, 1).float(), scored_tgt.flatten(), reduction="none")
                out[f"oracle_{kind}"][i:i + b] = ce.view(b, m).cpu()
                out["objective"][kind]["start"][i:i + b] = start.cpu()
                out["objective"][kind]["best"][i:i + b] = best_value.cpu()
    return out


@checked(task=Has("document_windows", what="a task with document_windows (BBCTokens)"))
def oracle_comparison(model, task, part: str = "test", prompt_len: int = 64, suffix_len: int = 64,
                      draws: int = 3, per_topic: int | None = 8, topic_means: torch.Tensor | None = None,
                      kinds: Sequence[str] = ORACLE_KINDS, target: str = "capacity", steps: int = 30,
                      lr: float = 0.05, rank: int = 8, samples: int = 2, batch_size: int = 8,
                      seed: int = 0, lora_lr: float = 3e-3) -> dict[str, Any]:
    """`compile_comparison`'s windows and conditions for one prompt length, with each oracle beside the head:
    G_oracle_<kind>, the paired compiled − oracle_<kind> per document (its interval below 0 never happens on
    the objective; on the scored loss it says how much the space leaves), the objectives at the start and the
    optimum, and everything split by prompt-token positions (`by_position`)."""
    from .model import check_cgtlm
    check_cgtlm(model)
    check_int("prompt_len", prompt_len, 1)
    check_int("suffix_len", suffix_len, 2)
    check_int("draws", draws, 1)
    tokens, topics, docs = task.document_windows(prompt_len + suffix_len + 1, part, per_doc=draws,
                                                 per_topic=per_topic, seed=seed + prompt_len)
    losses = window_losses(model, tokens, prompt_len, topics, docs, topic_means, batch_size, seed,
                           per_position=True)
    oracle = oracle_window_losses(model, tokens, prompt_len, kinds, target, steps, lr, rank, samples,
                                  batch_size, seed, lora_lr)
    objective = oracle.pop("objective")
    losses.update(oracle)
    res = summarize_comparison({c: v.mean(1) for c, v in losses.items()}, docs, seed=seed)
    for kind in kinds:
        res[f"compiled_minus_oracle_{kind}"] = document_interval(
            losses["compiled"].mean(1) - losses[f"oracle_{kind}"].mean(1), docs, seed=seed)
        if topic_means is not None:   # does the optimum carry its document: against the topic's mean ȳ
            res[f"oracle_{kind}_minus_topic_mean"] = document_interval(
                losses[f"oracle_{kind}"].mean(1) - losses["topic_mean"].mean(1), docs, seed=seed)
        res[f"objective_{kind}"] = {"start": float(objective[kind]["start"].mean()),
                                    "best": float(objective[kind]["best"].mean()),
                                    "never_worse": bool((objective[kind]["best"] <= objective[kind]["start"]).all())}
    res["by_position"] = by_position(losses, prompt_token_positions(tokens, prompt_len), docs, seed=seed)
    res["oracle"] = {"target": target, "kinds": list(kinds), "steps": steps, "lr": lr, "lora_lr": lora_lr,
                     "rank": rank, "samples": samples}
    return res
