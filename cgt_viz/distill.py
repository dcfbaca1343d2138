"""Context distillation: score a specialised model by how far its next-token distribution is from a teacher's.

The teacher is the model that saw the prefix (for a frozen pretrained LM, the LM with the prompt in context;
for a from-scratch CGT, its own full-mode pass, detached). The student is the specialised model on the suffix
alone. Prompt-to-weights methods (Doc-to-LoRA, Cartridges, prompt distillation) train this way because the
teacher's whole distribution carries what *this* prefix implies, where the one sampled next token mostly
carries what every text of the kind shares.

A teacher is stored as its top-k tokens plus one "rest" bucket holding the remaining probability mass, so a
cache of it is k + 1 numbers per position instead of the vocabulary:

    ids       (..., k)      the teacher's k most likely tokens
    logprobs  (..., k + 1)  their log-probabilities, then log(1 − Σ top-k): the rest bucket

KL(teacher ‖ student) over those k + 1 buckets is a lower bound of the full KL (merging outcomes never
increases a KL) and equals it when k is the vocabulary size.

Vectors mode (regression) has no distribution: there the "KL" is that of two unit-variance Gaussians centred
on the outputs, ½‖student − teacher‖², summed over output dims.
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def _rest_logprob(logprobs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log of the probability outside ids: logprobs (..., v) log-softmaxed, ids (..., k) -> (...,).

    Computed as a log-sum-exp over the tokens not in ids (not log(1 − Σ p)), so it stays exact when the
    top-k hold almost all the mass; −inf when ids cover the vocabulary."""
    return logprobs.scatter(-1, ids, NEG_INF).logsumexp(-1)


@torch.no_grad()
def teacher_topk(logits: torch.Tensor, k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A teacher's next-token distribution, compressed: logits (..., v) -> ids (..., k), logprobs (..., k + 1).

    k None or ≥ v keeps the whole vocabulary (ids in order, the rest bucket at −inf)."""
    logprobs = logits.float().log_softmax(-1)
    v = logits.shape[-1]
    if k is None or k >= v:
        ids = torch.arange(v, device=logits.device).expand(logits.shape)
        top = logprobs
    else:
        top, ids = logprobs.topk(k, dim=-1)
    rest = _rest_logprob(logprobs, ids)
    return ids, torch.cat([top, rest[..., None]], dim=-1)


def topk_kl(student_logits: torch.Tensor, teacher_ids: torch.Tensor,
            teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) per position over the teacher's top-k buckets plus the rest bucket.

    student_logits (..., v); teacher_ids (..., k); teacher_logprobs (..., k + 1) -> (...,) float32, ≥ 0."""
    student = student_logits.float().log_softmax(-1)
    ids = teacher_ids.long()
    student_top = student.gather(-1, ids)                                    # (..., k)
    student_rest = _rest_logprob(student, ids)                               # (...,)
    student_buckets = torch.cat([student_top, student_rest[..., None]], dim=-1)
    teacher = teacher_logprobs.float()
    p = teacher.exp()
    # a bucket the teacher gives no mass (the rest when k = v) adds 0, never 0 · (−inf − x)
    terms = torch.where(p > 0, p * (teacher - student_buckets), torch.zeros_like(p))
    return terms.sum(-1).clamp_min(0.0)


def full_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) per position over the whole vocabulary: (..., v), (..., v) -> (...,)."""
    teacher = teacher_logits.float().log_softmax(-1)
    student = student_logits.float().log_softmax(-1)
    return (teacher.exp() * (teacher - student)).sum(-1).clamp_min(0.0)


def distillation_loss(mode: str, student: torch.Tensor, teacher: torch.Tensor,
                      top_k: int | None = None) -> torch.Tensor:
    """Per-position distillation term: student and teacher outputs (..., v) of one shape -> (...,).

    tokens: KL(teacher ‖ student), over the teacher's top_k + rest buckets (None: the whole vocabulary);
    vectors: ½‖student − teacher‖² over the output dims. The teacher is detached."""
    teacher = teacher.detach()
    if mode == "vectors":
        return 0.5 * (student.float() - teacher.float()).pow(2).sum(-1)
    if top_k is None or top_k >= teacher.shape[-1]:
        return full_kl(student, teacher)
    return topk_kl(student, *teacher_topk(teacher, top_k))


def aux_objective(cfg, cross_entropy: torch.Tensor, student: torch.Tensor, teacher: torch.Tensor | None = None,
                  teacher_ids: torch.Tensor | None = None, teacher_logprobs: torch.Tensor | None = None) -> torch.Tensor:
    """The aux term at every position, the one definition both model families use:
    aux_ce · cross_entropy + aux_kl · KL(teacher ‖ student).

    cross_entropy (...,) per position; student outputs (..., v); the teacher either as outputs (..., v)
    (compressed to cfg.aux_kl_top_k here) or already compressed (teacher_ids, teacher_logprobs), as a feature
    cache holds it. With aux_kl = 0 no teacher is needed and the result is aux_ce · cross_entropy."""
    if cfg.aux_kl == 0:
        return cross_entropy if cfg.aux_ce == 1 else cfg.aux_ce * cross_entropy
    if teacher_ids is not None:
        kl = topk_kl(student, teacher_ids, teacher_logprobs)
    elif teacher is not None:
        kl = distillation_loss(cfg.mode, student, teacher, cfg.aux_kl_top_k)
    else:
        raise ValueError("aux_kl > 0 needs a teacher: the outputs of the model that saw the prefix")
    return cfg.aux_ce * cross_entropy + cfg.aux_kl * kl
