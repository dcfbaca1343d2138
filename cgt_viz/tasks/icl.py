"""Synthetic in-context learning: each sequence demonstrates one hidden function f of two numbers (a, b).

Sequence layout (tokens mode, n_pairs pairs, length t = 2·n_pairs):

    u_1 A_1 u_2 A_2 ... u_n A_n          u_i ∈ 0..P−1 (query tokens), A_i the answer token of f(u_i)

Answer tokens have their own vocabulary, in one of two forms (`answer_tokens`):

    "pair"   (default)  A_i = P + u_i·P + f(u_i): one token names the whole demonstration "u_i→f(u_i)"
                        (vocabulary P + P²)
    "value"             A_i = P + f(u_i) (vocabulary 2P)

targets are the next tokens; the loss mask keeps only the positions whose target is an answer (the u
positions, even indices), so the model is scored only where the hidden function matters. Families:

    "affine"    f(u) = (a·u + b) mod P                      a coprime to P, b ∈ 0..P−1  (two numbers)
    "dihedral"  f(u) = (±u + b) mod P                       a ∈ {1, P−1}, b ∈ 0..P−1    (two numbers)
    "shift"     f(u) = (u + b) mod P                        a = 1, b ∈ 0..P−1      (one number)
    "mul"       f(u) = a·u mod P                            a coprime to P, b = 0  (one number)

`Batch.split` (the auxiliary split, a prefix length) falls on a pair boundary, so the specialized model's
suffix starts with a query pair (u, A); with `cfg.aux_suffix_len = 2` (set by `config_kwargs`) the
auxiliary pass sees exactly that one pair (docs/notes.md records the calibration).

Small P makes copying easy: a query u that already occurred earlier in the sequence can be answered by
look-up. `info["novel"]` marks query positions whose u is new, and `eval_batch` builds prompts whose
held-out queries are always new, so measurements test inference of (a, b), not copying.

Value answers and the token shift: with "value" answers the model must pair each answer with its u before it
can infer f. A plain Transformer has to grow a previous-token attention head for that, and small models
can sit on the ln P plateau (uniform over the P answers) for thousands of steps first. `config_kwargs()`
therefore sets the model's `token_shift="pair"` for value answers (x.0_t also gets an embedding of the token
pair (t−1, t)), so every answer position already holds its whole demonstration (u, f(u)). "pair" answers carry the whole
demonstration in one token and need neither. docs/results.md measures both formats.

    task = SyntheticICL()                                 # affine, P = 7, 20 pairs, pair answers
    cfg = CGTConfig(d_x=64, n_layer=4, n_head=4, d_y=32, n_head_y=2, y_layer=2, n_templates=16,
                    **task.config_kwargs())
    model, history = train(CGT(cfg), task, steps=3000, batch_size=32, lr=1e-3)
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .._checks import Bool, Choice, Device, Float, Generator, Int, check_fits, checked, check_int, describe, refuse
from ..contracts import IGNORE_INDEX
from ..plateau import NoInformationLoss
from .base import Batch, Task

FAMILIES = ("shift", "affine", "dihedral", "mul")


def check_batch_size(batch_size: Any) -> None:
    check_int("batch_size", batch_size, 1)


def check_eval_size(k: Any, n_queries: Any, batch_size: Any, block_size: int) -> None:
    """k demonstrations + n_queries queries, two positions each, must fit in block_size."""
    check_int("k", k, 1)
    check_int("n_queries", n_queries, 1)
    check_batch_size(batch_size)
    if 2 * (k + n_queries) > block_size:
        room = block_size // 2 - n_queries          # the most demonstrations these queries leave room for
        name, bound = ("k", room) if room >= 1 else ("n_queries", block_size // 2 - 1)
        raise refuse(name, f"<= {bound} (k demonstrations + n_queries queries, two positions each, fit in "
                     f"block_size = {block_size})", f"k={k} with n_queries={n_queries}, which need "
                     f"{2 * (k + n_queries)} positions")


class SyntheticICL(Task):
    """Pairs (u, f(u)) of a hidden function f_{a,b} over Z_P; see the module docstring for the layout.

    The defaults (affine, P = 7, 20 pairs, pair answers) are notebook 01's recipe (cgt_viz.recipes);
    20 pairs leave room for the k = 16 demonstrations + 1 held-out query of the standard evaluation.

    family          "affine" | "dihedral" | "shift" | "mul"
    P               modulus (P query tokens); a prime P makes every a in 1..P−1 invertible, for a
                    composite P only a coprime to P is used
    n_pairs         pairs per training sequence (block_size = 2·n_pairs)
    aux_min_pairs   the auxiliary split leaves at least this many demonstrations in the prefix
    novel_split     if True the auxiliary split is placed before a pair whose u is new to the prefix,
                    when the row has one (the specialized model must then infer f, not look it up)
    answer_tokens   "value": the answer token is f(u) + P (vocabulary 2P); "pair": the answer token names
                    the whole demonstration (u, f(u)) as P + u·P + f(u) (vocabulary P + P²), so one token
                    carries a demonstration and in-context look-up needs no previous-token head
    shift_fraction  share of training rows drawn with a = 1 (a pure shift) in a two-number family, meant
                    to give a denser signal on the plateau before in-context learning starts (for
                    experiments; `curriculum` lowers it from 1 to this value along training). `eval_batch`
                    ignores it and draws (a, b) uniformly over the family.
    """

    name = "icl"

    @checked(family=Choice(*FAMILIES), P=Int(2), n_pairs=Int(2), aux_min_pairs=Int(1), novel_split=Bool(),
             shift_fraction=Float(0.0, 1.0), answer_tokens=Choice("value", "pair"))
    def __init__(self, family: str = "affine", P: int = 7, n_pairs: int = 20, aux_min_pairs: int = 1,
                 novel_split: bool = False, shift_fraction: float = 0.0, answer_tokens: str = "pair"):
        check_int("aux_min_pairs", aux_min_pairs, 1, n_pairs - 1, hint=" (n_pairs − 1: the suffix needs a pair)")
        check_int("P", P, 3 if family == "dihedral" else 2, hint=" for family 'dihedral' (a = ±1 must differ)"
                  if family == "dihedral" else "")
        # sizes before anything is built: the values of a and b (Python ints), the least embedding any model of
        # this vocabulary trains (one float per token, with its gradient and AdamW's two moments), and one
        # attention map of the block (forward and backward) for one row, head and layer
        vocab = 2 * P if answer_tokens == "value" else P + P ** 2
        check_fits("P", P, 72 * P + 16 * vocab, f"the vocabulary of {vocab} tokens (answer_tokens={answer_tokens!r})")
        check_fits("n_pairs", n_pairs, 8 * (2 * n_pairs) ** 2, f"the attention over the block of {2 * n_pairs} "
                                                               f"positions (2·n_pairs)")
        self.answer_tokens = answer_tokens
        self.family, self.P, self.n_pairs = family, P, n_pairs
        self.aux_min_pairs, self.novel_split, self.shift_fraction = aux_min_pairs, novel_split, float(shift_fraction)
        units = [a for a in range(1, P) if math.gcd(a, P) == 1]
        self.a_values = {"shift": [1], "affine": units, "dihedral": [1, P - 1], "mul": units}[family]
        self.b_values = [0] if family == "mul" else list(range(P))

    # ------------------------------------------------------------------ registry
    @property
    def vocab_size(self) -> int:
        return 2 * self.P if self.answer_tokens == "value" else self.P + self.P ** 2

    @property
    def block_size(self) -> int:
        return 2 * self.n_pairs

    @property
    def n_tasks(self) -> int:
        """How many distinct hidden functions the family has."""
        return len(self.a_values) * len(self.b_values)

    def kwargs(self) -> dict[str, Any]:
        return {"family": self.family, "P": self.P, "n_pairs": self.n_pairs,
                "aux_min_pairs": self.aux_min_pairs, "novel_split": self.novel_split,
                "shift_fraction": self.shift_fraction, "answer_tokens": self.answer_tokens}

    def config_kwargs(self) -> dict[str, Any]:
        """The config fields this task fixes; value answers also turn the token shift on (each answer position
        then holds its query, which the model otherwise has to pair by growing a previous-token head)."""
        return {"vocab_size": self.vocab_size, "block_size": self.block_size, "aux_suffix_len": 2,
                **({"token_shift": "pair"} if self.answer_tokens == "value" else {}),
                "extra": {"task": {"name": self.name, **self.kwargs()}}}

    def __repr__(self) -> str:
        return "SyntheticICL(" + ", ".join(f"{k}={v!r}" for k, v in self.kwargs().items()) + ")"

    def no_information_loss(self) -> NoInformationLoss:
        hint = ("Likely cause: the model has not yet learned to pair each answer with its query. Train longer, or "
                + ("build the model with token_shift='pair' (task.config_kwargs() sets it for value answers)"
                   if self.answer_tokens == "value" else "try another seed or a lower learning rate") + ".")
        return NoInformationLoss(math.log(self.P), f"ln {self.P} = {math.log(self.P):.3f} (a uniform guess over the "
                                                   f"{self.P} answers)", hint)

    # ------------------------------------------------------------------ sampling
    def sample_params(self, batch_size: int, generator: torch.Generator | None = None,
                      shift_fraction: float = 0.0) -> torch.Tensor:
        """Hidden numbers (a, b) per row: (b, 2) long, uniform over the family; a share shift_fraction of
        the rows (in expectation) gets a = 1."""
        a_vals, b_vals = torch.tensor(self.a_values), torch.tensor(self.b_values)
        a = a_vals[torch.randint(len(a_vals), (batch_size,), generator=generator)]
        b = b_vals[torch.randint(len(b_vals), (batch_size,), generator=generator)]
        if shift_fraction > 0:
            a = torch.where(torch.rand(batch_size, generator=generator) < shift_fraction, torch.ones_like(a), a)
        return torch.stack([a, b], dim=1)

    @checked(steps=Int(1))
    def curriculum(self, steps: int):
        """A `train` callback: the share of pure shifts (a = 1) among training rows falls linearly from 1 (set
        now) to this task's own shift_fraction at step `steps`. The model first learns the one-number family,
        which compiles, then the whole family (docs/results.md measures it on value-answer affine). As
        regression's curriculum: the share lives on the task, a resumed run passes the same callback, and under
        torchrun only rank 0 would follow it; use it for single-process training.

            model, history = train(model, task, ..., callbacks=[task.curriculum(1500)])
        """
        final = self.shift_fraction
        self.shift_fraction = 1.0

        def fall(event: dict) -> None:
            if event.get("kind") == "step":
                self.shift_fraction = final + (1.0 - final) * max(0.0, 1.0 - event["step"] / steps)
        return fall

    def apply(self, params: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """f_{a,b}(u) = (a·u + b) mod P: params (b, 2), u (b, n) -> (b, n) in 0..P−1."""
        return (params[:, :1] * u + params[:, 1:]) % self.P

    def answer_token(self, u: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Token id of the answer f(u) = value to the query u (see answer_tokens)."""
        return value + self.P if self.answer_tokens == "value" else self.P + u * self.P + value

    def answer_value(self, tokens: torch.Tensor) -> torch.Tensor:
        """f(u) encoded by answer tokens (inverse of answer_token)."""
        return tokens - self.P if self.answer_tokens == "value" else (tokens - self.P) % self.P

    def _assemble(self, params: torch.Tensor, u: torch.Tensor, split: torch.Tensor, device) -> Batch:
        """Interleave u and f(u) + P into (b, 2n) tokens and build targets, mask and info."""
        answers = self.answer_token(u, self.apply(params, u))
        seq = torch.stack([u, answers], dim=2).flatten(1)                   # (b, n, 2) -> (b, 2n)
        targets = torch.full_like(seq, IGNORE_INDEX)
        targets[:, :-1] = seq[:, 1:]
        loss_mask = torch.zeros_like(seq, dtype=torch.bool)
        loss_mask[:, 0::2] = True                                           # u positions predict answers
        info = {"task_params": params, "u": u, "novel": self._novel_mask(u)}
        return Batch(seq, targets, loss_mask, split, info).to(device)

    @staticmethod
    def novel_positions(u: torch.Tensor) -> torch.Tensor:
        """(b, n) query values -> (b, n) bool: u_i did not occur among u_1..u_{i−1}."""
        earlier = u[:, None, :] == u[:, :, None]                            # (b, i, j): u_i == u_j
        earlier = earlier & torch.ones(u.shape[1], u.shape[1], dtype=torch.bool).tril(-1)
        return ~earlier.any(-1)

    def _novel_mask(self, u: torch.Tensor) -> torch.Tensor:
        """(b, n) -> (b, 2n) bool on the token grid: true at u positions whose u is new."""
        novel = torch.zeros(u.shape[0], 2 * u.shape[1], dtype=torch.bool)
        novel[:, 0::2] = self.novel_positions(u)
        return novel

    def _sample_split(self, u: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Per-row prefix length 2j, j uniform in aux_min_pairs..n−1 (restricted to new u when novel_split)."""
        b, n = u.shape
        allowed = torch.zeros(b, n, dtype=torch.bool)
        allowed[:, self.aux_min_pairs:] = True                               # j = index of the query pair
        if self.novel_split:
            novel = self.novel_positions(u) & allowed
            allowed = torch.where(novel.any(1, keepdim=True), novel, allowed)
        scores = torch.rand(b, n, generator=generator).masked_fill(~allowed, -1.0)
        return 2 * scores.argmax(1)

    @checked(batch_size=Int(1), part=Choice("train", "val"), generator=Generator(), device=Device())
    def get_batch(self, batch_size: int, part: str = "train", generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu") -> Batch:
        """batch_size sequences of n_pairs pairs; part is accepted for the Task contract ("train"/"val"
        draw from the same distribution, the caller's generator makes them different)."""
        params = self.sample_params(batch_size, generator, self.shift_fraction)
        u = torch.randint(self.P, (batch_size, self.n_pairs), generator=generator)
        return self._assemble(params, u, self._sample_split(u, generator), device)

    @checked(k=Int(1), batch_size=Int(1), generator=Generator(), device=Device(), n_queries=Int(1))
    def eval_batch(self, k: int, batch_size: int, generator: torch.Generator | None = None,
                   device: str | torch.device = "cpu", n_queries: int = 1) -> Batch:
        """k demonstrations, then n_queries held-out query pairs whose u never occurs in the demonstrations.

        Returns a Batch of length 2(k + n_queries) with split = 2k for every row (the prompt) and loss_mask
        true only at the query u positions (their targets are the answers). The demonstrations are drawn
        from the values other than the queries' (so k may exceed P − n_queries).
        """
        check_eval_size(k, n_queries, batch_size, self.block_size)
        check_int("n_queries", n_queries, 1, self.P - 1, hint=f" (< P = {self.P}, so that demonstrations can avoid them)")
        params = self.sample_params(batch_size, generator)
        # a random permutation per row: its first n_queries values are the queries, the rest feed the demos
        perm = torch.rand(batch_size, self.P, generator=generator).argsort(1)
        queries = perm[:, :n_queries]
        pool = perm[:, n_queries:]
        demos = pool.gather(1, torch.randint(pool.shape[1], (batch_size, k), generator=generator))
        u = torch.cat([demos, queries], dim=1)
        split = torch.full((batch_size,), 2 * k, dtype=torch.long)
        batch = self._assemble(params, u, split, "cpu")
        batch.loss_mask[:, :2 * k] = False
        batch.info["novel"] = batch.loss_mask.clone()   # held-out queries are new to the prompt by construction
        return batch.to(device)

    @checked(n_queries=Int(1), generator=Generator(), device=Device())
    def queries_like(self, batch: Batch, n_queries: int, generator: torch.Generator | None = None,
                     device: str | torch.device = "cpu") -> Batch:
        """n_queries fresh pairs of each row's hidden function (`batch.info["task_params"]`) with no prompt
        (split 0), loss_mask on the u positions. The oracle fits on them (cgt_viz.oracle); the rows are cut into
        single queries, so block_size does not bound n_queries."""
        if "task_params" not in getattr(batch, "info", {}):
            raise refuse("batch", "a Batch of this task (its info holds the hidden (a, b))", describe(batch),
                         TypeError)
        params = batch.info["task_params"].cpu()
        u = torch.randint(self.P, (len(params), n_queries), generator=generator)
        return self._assemble(params, u, torch.zeros(len(params), dtype=torch.long), device)

    def decode(self, tokens) -> list[str]:
        """Query tokens print as 'u3', answer tokens as '→5' ("value") or '3→5' ("pair")."""
        out = []
        for t in tokens:
            t = int(t)
            if t < self.P:
                out.append(f"u{t}")
            elif self.answer_tokens == "value":
                out.append(f"→{t - self.P}")
            else:
                out.append(f"{(t - self.P) // self.P}→{(t - self.P) % self.P}")
        return out
