"""Why not just train a LoRA? A per-prompt LoRA trained by context distillation, beside the compile.

A CGT compiles a prompt into W' = W + B A at its modulated maps in one forward pass (`CGT.specialize`,
`CGT.lora_factors`). The obvious alternative is to *train* a LoRA of the same shape for that one prompt.
This module builds that baseline and puts it next to the compile on the same held-out continuations:

    same rank and sites   R = K·r (n_templates × template_rank) at the compile's weights, layers ℓ+1..N
                          (`lora_shapes`); W' = W + B A with scale 1 (PEFT's alpha = r)
    same teacher          the compile objective's: for a from-scratch CGT the model's own full-mode pass with the
                          prompt in context; for a CGTLM the frozen LM with the prompt in context.
                          KL(teacher ‖ student) at every scored position (`cgt_viz.distill.distillation_loss`)
    other continuations   the LoRA is trained on continuations that are NOT the ones it is scored on:
                          synthetic ICL: fresh queries u of the same hidden function (the values not held out);
                          text: continuations sampled from the prompted model
    init                  "random" (PEFT's: A ~ U(±1/√i), B = 0, so step 0 is the no-context model) or
                          "compile" (A, B = the compile's lora_factors, so step 0 *is* the compiled model)
    update latency        wall time from the prompt to a merged model: for the LoRA, building its training
                          data (sampling, teacher pass) + N Adam steps + the merge (+ the compile for init="compile")
    update bytes          R × Σ (o + i) × dtype size over the modulated weights (`update_bytes`), the same for
                          the compile and the LoRA

Quality uses `cgt_viz.evaluate`'s definitions: mean cross-entropy and accuracy over the scored positions, and
G = (L_no_context − L_method) / (L_no_context − L_prompted), NaN under the noise floor.

    cases = [icl_case(task, k=8, n_held_out=2, generator=g) for _ in range(5)]
    res = compare_methods(model, cases, steps=(10, 30, 100), lr=3e-3)
    res["summary"]            # one row per method (and N): loss, acc, G, update seconds, update bytes
    fig = cgt_viz.figures.lora_compile_figure({"icl": res})

For a CGTLM (pretrained LM) `cgt_viz.hf.lora.peft_lora_baseline` trains the same LoRA with peft,
`CGTLM.peft_config()` as its LoraConfig, so its adapter is interchangeable with `CGTLM.export_peft`'s, and
`cgt_viz.hf.lora.lm_compare_methods` scores it with `hf.measure.compile_comparison`'s columns.
"""
from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
from torch.func import functional_call

from ._checks import (Constraint, Device, Float, Generator, Has, Instance, Int, StepCounts, checked, describe,
                      refuse)
from .contracts import IGNORE_INDEX, Model, check_prompts
from .distill import distillation_loss
from .evaluate import GAP_NOISE_FLOOR, GAP_NOISE_FLOOR_ACC, gap_closed_unchecked, gap_note
from .losses import per_position_loss
from .steps import FullBatchStep, Parameters
from .train import train

Factors = dict[str, tuple[torch.Tensor, torch.Tensor]]     # weight name -> (A (R, i), B (o, R)), W' = W + B A
INITS = ("random", "compile")


# ---------------------------------------------------------------------------- argument contracts
class OnePrompt(Constraint):
    """The contract of a `prompt` argument (compiled_factors here, and cgt_viz/hf/lora.py): one
    prompt for the model passed as `of`, (t,) token ids (or (t, input_dim) vectors) that fit it -> (t, ...)."""

    def __init__(self, of: str = "model"):
        self.of = of

    def check(self, name, value, args=None):
        if isinstance(value, (list, tuple)):
            raise refuse(name, "one prompt tensor (t,), not a list", describe(value), TypeError)
        batch, single = check_prompts(args[self.of].config, value, None)
        if not single:
            raise refuse(name, "one prompt: shape (t,) (or (1, t))", f"shape {tuple(value.shape)}", verb="have")
        return batch[0]

    def bad_values(self):
        return ["text", [1, 2], torch.zeros(0, dtype=torch.long), torch.full((3,), 10 ** 6),
                torch.zeros(2, 3, dtype=torch.long)]

    def shown(self, value):
        if not isinstance(value, torch.Tensor):
            return type(value).__name__
        return str(int(value.max())) if value.numel() and value.dim() == 1 and value.max() >= 10 ** 6 else \
            str(tuple(value.shape))


class _FloatDtype(Constraint):
    def check(self, name, value, args=None):
        if not isinstance(value, torch.dtype) or not value.is_floating_point:
            raise refuse(name, "a floating-point torch dtype (torch.float32, torch.bfloat16, ...)", describe(value),
                         TypeError)
        return value

    def bad_values(self):
        return [torch.int64, "float32", None]

    def shown(self, value):
        return str(value)


class _PromptCases(Constraint):
    """A non-empty list of PromptCase -> a list."""

    def check(self, name, value, args=None):
        want = "a non-empty list of PromptCase (icl_case, text_case)"
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise refuse(name, want, describe(value), TypeError)
        bad = [i for i, c in enumerate(value) if not isinstance(c, PromptCase)]
        if bad:
            raise refuse(name, want, f"{type(value[bad[0]]).__name__} at {name}[{bad[0]}]", TypeError)
        if not value:
            raise refuse(name, want, "an empty list")
        return list(value)

    def bad_values(self):
        return [[], "x", [5], None]

    def shown(self, value):
        return "an empty list" if isinstance(value, list) and not value else \
            "int" if isinstance(value, list) else type(value).__name__


_MODEL = Model()                       # a CGT (or CGTLM) with weights
_SHAPES = Model(weights=False)         # shapes only: the meta device will do
# the contracts of `lr` and `top_k`, shared by the LoRA entry points here and in cgt_viz/hf/lora.py
LR_CONSTRAINT = Float(0.0, lo_open=True)     # a learning rate > 0
TOP_K_CONSTRAINT = Int(1, none=True)         # the teacher's top-k tokens the KL keeps (>= 1), or None for all


# ---------------------------------------------------------------------------- shapes and bytes
@checked(model=_SHAPES)
def lora_rank(model) -> int:
    """R = K·r: the rank of the compiled update, and of the baseline LoRA."""
    return model.config.n_templates * model.config.template_rank


@checked(model=_SHAPES)
def lora_shapes(model) -> dict[str, tuple[int, int]]:
    """{weight name: (o, i)} of every map the compile modulates, named as the x stream's own module names them
    (GPT state-dict names for a CGT, the LM's names for a CGTLM: q, k, v each for attn_in over a Llama)."""
    stream, base, out = model.stream, model.stream.base(model), {}
    for layer, site in model.template_sites:
        for name in stream.site_maps(model, layer, site):
            shape = tuple(base.get_parameter(name).shape)
            out[name] = shape[::-1] if stream.fan_in_fan_out(model, name) else shape   # a Conv1D stores (i, o)
    return out


@checked(model=_SHAPES, dtype=_FloatDtype())
def update_bytes(model, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one prompt's update as LoRA factors: R × Σ (o + i) × element size over the modulated maps."""
    elem = torch.finfo(dtype).bits // 8
    return lora_rank(model) * sum(o + i for o, i in lora_shapes(model).values()) * elem


def factor_bytes(factors: Factors) -> int:
    """Bytes the factors actually hold (to check against update_bytes)."""
    return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in factors.values())


# ---------------------------------------------------------------------------- factors
@torch.no_grad()
@checked(model=_MODEL, prompt=OnePrompt())
def compiled_factors(model, prompt: torch.Tensor) -> Factors:
    """The compile's update for one prompt (t,): lora_factors at ȳ after its last token, as fresh tensors."""
    ybar = model.context(prompt[None].to(model.device))[0, -1]
    return {n: (a.detach().clone(), b.detach().clone()) for n, (a, b) in model.lora_factors(ybar).items()}


@checked(model=_SHAPES, generator=Generator())
def random_factors(model, generator: torch.Generator | None = None) -> Factors:
    """PEFT's default LoRA init at the compile's sites: A ~ U(−1/√i, 1/√i) (kaiming-uniform, a = √5), B = 0."""
    rank, out = lora_rank(model), {}
    device = model.device
    for name, (o, i) in lora_shapes(model).items():
        bound = 1.0 / math.sqrt(i)
        a = (torch.rand(rank, i, generator=generator) * 2 - 1) * bound
        out[name] = (a.to(device), torch.zeros(o, rank, device=device))
    return out


def _gpt(model) -> nn.Module:
    return model.gpt


def merged_weights(base: nn.Module, factors: Factors) -> dict[str, torch.Tensor]:
    """{name: W + B @ A} for the factors' weights of `base` (gradients flow into A and B, not W)."""
    return {n: base.get_parameter(n).detach() + b @ a for n, (a, b) in factors.items()}


def lora_logits(base: nn.Module, factors: Factors, idx: torch.Tensor) -> torch.Tensor:
    """The GPT `base` with W + B A at the factors' weights, unmerged (for training): idx (b, t) -> logits."""
    return functional_call(base, merged_weights(base, factors), (idx,))


@torch.no_grad()
def merge(base: nn.Module, factors: Factors, share_weights: bool = True) -> nn.Module:
    """A copy of the GPT `base` whose weights are W + B A (a plain GPT, as `CGT.merged_gpt` makes one).
    share_weights: the weights no factor touches are base's own tensors (for inference)."""
    memo: dict[int, Any] = {id(p): p for p in base.parameters()} if share_weights else {}
    for name, w in merged_weights(base, factors).items():
        memo[id(base.get_parameter(name))] = nn.Parameter(w.clone(), requires_grad=False)
    return copy.deepcopy(base, memo).eval()


@contextlib.contextmanager
def _frozen(module: nn.Module):
    """Parameters of `module` do not require gradients inside (restored after)."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield module
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


# ---------------------------------------------------------------------------- prompts and their continuations
@dataclass
class Continuations:
    """Rows a specialised model runs on *alone* (positions from 0), after one prompt.

    inputs (n, m) tokens; targets (n, m) (−100 = not scored); mask (n, m) bool: the scored positions.
    teacher (n, m, v): the prompted model's outputs at those positions (training data only)."""
    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    teacher: torch.Tensor | None = None


@dataclass
class PromptCase:
    """One held-out prompt: the prompt (s,), the held-out continuations it is scored on, and a function that
    builds the LoRA's training continuations (its time counts in the update latency)."""
    prompt: torch.Tensor
    held_out: Continuations
    make_train: Callable[[Any, torch.Tensor], Continuations]
    info: dict = field(default_factory=dict)


@torch.no_grad()
def teacher_outputs(model, prompt: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """The compile objective's teacher at the continuation positions: the model with the prompt in context
    (a CGT's full-mode pass; a CGTLM's frozen LM, T = I). prompt (s,), inputs (n, m) -> (n, m, v)."""
    full = torch.cat([prompt[None].expand(inputs.shape[0], -1), inputs], dim=1)
    teacher = model if model.stream.self_teacher else model.x_only()   # over an LM: the LM itself, T = I
    return teacher(full)[:, prompt.shape[0]:]


@checked(task=Has("eval_batch", "answer_token", "apply", what="a synthetic ICL task (make_task('icl'))"),
         k=Int(1), n_held_out=Int(1), generator=Generator(), device=Device())
def icl_case(task, k: int = 8, n_held_out: int = 2, generator: torch.Generator | None = None,
             device: str | torch.device = "cpu") -> PromptCase:
    """A synthetic ICL prompt of k demonstrations of one hidden f (`task.eval_batch`), scored on n_held_out
    queries u that never occur in it, each alone as a pair (u, f(u)) scored at u (as evaluate's rows).
    The LoRA trains on the other P − n_held_out values u, each a pair (u, f(u)), with the teacher at u."""
    batch = task.eval_batch(k, 1, generator=generator, n_queries=n_held_out)
    s = int(batch.split[0])
    prompt = batch.inputs[0, :s].to(device)
    params, held = batch.info["task_params"], batch.info["u"][0, k:]

    def pairs(u: torch.Tensor) -> Continuations:
        u = u[:, None]
        answers = task.answer_token(u, task.apply(params.expand(len(u), -1), u))
        inputs = torch.cat([u, answers], dim=1)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, 0] = answers[:, 0]
        mask = torch.zeros_like(inputs, dtype=torch.bool)
        mask[:, 0] = True
        return Continuations(inputs.to(device), targets.to(device), mask.to(device))

    train_u = torch.tensor([u for u in range(task.P) if u not in set(held.tolist())])

    def make_train(model, prompt_: torch.Tensor) -> Continuations:
        data = pairs(train_u)
        data.teacher = teacher_outputs(model, prompt_, data.inputs)
        return data

    return PromptCase(prompt, pairs(held), make_train,
                      {"task_params": params[0].tolist(), "held_out_u": held.tolist(), "train_u": train_u.tolist()})


@checked(task=Has("eval_batch", what="a task with eval_batch (make_task('text'))"), k=Int(1), n_samples=Int(1),
         sample_len=Int(1, none=True), temperature=Float(0.0, lo_open=True), generator=Generator(), device=Device())
def text_case(task, k: int = 128, n_samples: int = 8, sample_len: int | None = None, temperature: float = 1.0,
              generator: torch.Generator | None = None, device: str | torch.device = "cpu",
              part: str = "val") -> PromptCase:
    """A text prompt: k tokens of a validation document (`task.eval_batch`), scored on that document's own
    next block_size − k tokens. The LoRA trains on n_samples continuations of sample_len tokens (default: the
    scored length) sampled from the prompted model at `temperature`; never on the document's own text."""
    batch = task.eval_batch(k, 1, generator=generator, part=part)
    prompt = batch.inputs[0, :k].to(device)
    held = Continuations(batch.inputs[:, k:].to(device), batch.targets[:, k:].to(device),
                         batch.loss_mask[:, k:].bool().to(device))
    length = sample_len or held.inputs.shape[1]
    seed = int(torch.randint(2 ** 31 - 1, (1,), generator=generator))

    def make_train(model, prompt_: torch.Tensor) -> Continuations:
        inputs = sample_continuations(model, prompt_, n_samples, length, temperature, seed)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, :-1] = inputs[:, 1:]
        mask = torch.ones_like(inputs, dtype=torch.bool)     # the teacher scores every position, the last too
        return Continuations(inputs, targets, mask, teacher_outputs(model, prompt_, inputs))

    info = {"k": k, "n_samples": n_samples, "sample_len": length}
    if "doc" in batch.info:
        info["doc"] = int(batch.info["doc"][0])
    return PromptCase(prompt, held, make_train, info)


@torch.no_grad()
def sample_continuations(model, prompt: torch.Tensor, n: int, length: int, temperature: float = 1.0,
                         seed: int = 0) -> torch.Tensor:
    """n continuations (n, length) of prompt (s,) sampled from the prompted model (a CGT's full mode with its KV
    cache; a CGTLM's frozen LM, the teacher) at `temperature`, seeded."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        rows = prompt[None].expand(n, -1).contiguous()
        if not model.stream.self_teacher:        # the teacher is the x stream's own model (an LM): its KV cache
            return sample_lm(model.stream.base(model), rows, length, temperature)[:, prompt.shape[0]:]
        return model.generate(rows, length, temperature=temperature)[:, prompt.shape[0]:]
    finally:
        torch.random.set_rng_state(state)


@torch.no_grad()
def sample_lm(lm, idx: torch.Tensor, length: int, temperature: float = 1.0) -> torch.Tensor:
    """Sample `length` tokens after idx (b, t) from a transformers causal LM with its KV cache -> (b, t + length)."""
    from .generation import sample_next
    out = lm(input_ids=idx, use_cache=True)
    past = out.past_key_values
    for i in range(length):
        nxt = sample_next(out.logits[:, -1], temperature, None)
        idx = torch.cat([idx, nxt], dim=1)
        if i < length - 1:
            out = lm(input_ids=nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
    return idx


# ---------------------------------------------------------------------------- training the LoRA
@dataclass
class Checkpoint:
    """The LoRA after `step` Adam steps: its factors, the training KL then, and the seconds spent training."""
    step: int
    factors: Factors
    train_kl: float
    train_seconds: float


def distill_kl(mode: str, student: torch.Tensor, data: Continuations, top_k: int | None) -> torch.Tensor:
    """The LoRA's training loss: distillation_loss of the student's outputs (n, m, v) against data.teacher (top_k
    of the teacher's tokens, or all), averaged over the positions data.mask (n, m) keeps -> a scalar tensor."""
    kl = distillation_loss(mode, student, data.teacher, top_k)
    return (kl * data.mask).sum() / data.mask.sum().clamp_min(1)


# the records below hold tensors the caller may have built by hand: the forward passes inside check them again
@checked(skip_nested=False, model=_MODEL, data=Instance(Continuations, "Continuations (a PromptCase's make_train(model, prompt))"),
         steps=StepCounts(), init=Instance(dict, "factors, a dict {weight name: (A, B)} (compiled_factors)", none=True),
         lr=LR_CONSTRAINT, top_k=TOP_K_CONSTRAINT, generator=Generator())
def train_lora(model, data: Continuations, steps: Sequence[int] = (10, 30, 100), init: Factors | None = None,
               lr: float = 3e-3, top_k: int | None = None, generator: torch.Generator | None = None) -> list[Checkpoint]:
    """Adam on the factors (A, B) of a LoRA at the compile's sites, KL(teacher ‖ LoRA model) on `data`
    (full batch every step); the rest of the model is frozen. Returns one Checkpoint per N in `steps`
    (0 allowed: the init). init: starting factors (None: `random_factors`). top_k: the teacher's top-k
    + rest buckets (None: the model's aux_kl_top_k, i.e. the compile objective's)."""
    if data.teacher is None:
        raise refuse("data.teacher", "the prompted model's outputs (training a LoRA needs them)", "None")
    top_k = model.config.aux_kl_top_k if top_k is None else top_k
    base = _gpt(model)
    factors = random_factors(model, generator) if init is None else init
    params = {n: (nn.Parameter(a.detach().clone()), nn.Parameter(b.detach().clone())) for n, (a, b) in factors.items()}
    was = base.training
    base.eval()
    try:
        with _frozen(base):
            return fit_factors([p for ab in params.values() for p in ab],
                               lambda: distill_kl(model.config.mode, lora_logits(base, params, data.inputs), data, top_k),
                               steps, lr, lambda: {n: (a.detach().clone(), b.detach().clone()) for n, (a, b) in params.items()},
                               "train_lora")
    finally:
        base.train(was)


def fit_factors(held: Sequence[nn.Parameter], objective: Callable[[], torch.Tensor], steps: Sequence[int], lr: float,
                snapshot: Callable[[], Factors], name: str) -> list[Checkpoint]:
    """A per-prompt LoRA's optimisation, through `cgt_viz.train.train` (the one training loop): Adam at a constant
    lr (train's AdamW without decay, no warm-up, no clipping) on the `held` parameters, minimising objective()
    on its full batch every step -> a Checkpoint per N in `steps` (increasing; 0: before the first update):
    snapshot() then, the objective of the N-th update (measured before it, as train logs it) and the seconds
    spent in the loop up to it (the snapshots' own time left out). torch's global random stream, which train
    seeds, is restored after."""
    out: list[Checkpoint] = []
    if steps[0] == 0:
        with torch.no_grad():
            out.append(Checkpoint(0, snapshot(), float(objective()), 0.0))
    if steps[-1] == 0:
        return out
    wanted, clock = set(steps), {"start": 0.0, "aside": 0.0}

    def record(event: dict) -> None:
        if event["kind"] == "start":
            clock["start"] = time.perf_counter()
        elif event["kind"] == "step" and event["step"] in wanted:
            t = time.perf_counter()
            out.append(Checkpoint(event["step"], snapshot(), event["main"], t - clock["start"] - clock["aside"]))
            clock["aside"] += time.perf_counter() - t
    dev = held[0].device
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        train(Parameters(held), FullBatchStep(objective, name), steps=steps[-1], lr=lr, warmup=0, min_lr_ratio=1.0,
              weight_decay=0.0, grad_clip=None, eval_every=0, plateau_steps=0, device=dev, amp=False, progress=False,
              callbacks=[record])
    return out


# ---------------------------------------------------------------------------- scoring
@torch.no_grad()
def score(mode: str, logits: torch.Tensor, data: Continuations) -> tuple[float, float, int]:
    """(loss sum, correct sum, n scored) over data's scored positions, as evaluate_specialization sums them."""
    loss, _ = per_position_loss(mode, logits, data.targets)
    mask = data.mask & (data.targets != IGNORE_INDEX) if mode == "tokens" else data.mask
    correct = (logits.argmax(-1) == data.targets)[mask].sum() if mode == "tokens" else torch.tensor(float("nan"))
    return float(loss[mask].sum()), float(correct), int(mask.sum())


def median_timed(fn: Callable[[], Any], repeats: int) -> tuple[Any, float]:
    """fn's result and its median wall time in seconds over `repeats` calls (at least one)."""
    times, result = [], None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return result, sorted(times)[len(times) // 2]


METHODS = ("prompted", "compile", "lora", "lora_from_compile", "no_context")


@torch.no_grad()
def _method_scores(model, case: PromptCase, specialised: dict[str, nn.Module]) -> dict[str, tuple[float, float, int]]:
    mode, held = model.config.mode, case.held_out
    full = torch.cat([case.prompt[None].expand(held.inputs.shape[0], -1), held.inputs], dim=1)
    out = {"prompted": score(mode, model(full)[:, case.prompt.shape[0]:], held)}
    for name, net in specialised.items():
        out[name] = score(mode, net(held.inputs), held)
    return out


@checked(skip_nested=False, model=_MODEL, case=Instance(PromptCase, "a PromptCase (icl_case, text_case)"),
         steps=StepCounts(),
         lr=LR_CONSTRAINT, top_k=TOP_K_CONSTRAINT, seed=Int(0), timing_repeats=Int(1))
def run_case(model, case: PromptCase, steps: Sequence[int] = (10, 30, 100), lr: float = 3e-3,
             top_k: int | None = None, seed: int = 0, timing_repeats: int = 3) -> dict[str, Any]:
    """Every method on one prompt: loss/correct sums on its held-out continuations and the update costs.

    Returns {"methods": {key: {"loss_sum", "correct_sum", "n", "update_seconds", "parts": {...}, "step"}},
    "info": case.info}; LoRA keys are "lora@N" and "lora_from_compile@N"."""
    was = model.training
    model.eval()
    try:
        prompt = case.prompt
        compiled, t_compile = median_timed(lambda: model.specialize(prompt), timing_repeats)
        factors_c, t_factors = median_timed(lambda: compiled_factors(model, prompt), 1)
        data, t_data = median_timed(lambda: case.make_train(model, prompt), 1)
        base = _gpt(model)
        _, t_merge = median_timed(lambda: merge(base, factors_c), timing_repeats)
        nets = {"compile": compiled, "no_context": model.x_only().eval()}
        costs = {"compile": {"specialize": t_compile}, "no_context": {}}
        steps_of = {}
        for method, init in (("lora", None), ("lora_from_compile", factors_c)):
            gen = torch.Generator().manual_seed(seed)
            for ck in train_lora(model, data, steps, init=init, lr=lr, top_k=top_k, generator=gen):
                key = f"{method}@{ck.step}"
                nets[key] = merge(base, ck.factors)
                parts = {"train_data": t_data, "train_steps": ck.train_seconds, "merge": t_merge}
                if method == "lora_from_compile":
                    parts["compile_factors"] = t_factors
                costs[key] = parts
                steps_of[key] = (ck.step, ck.train_kl)
        scores = _method_scores(model, case, nets)
    finally:
        model.train(was)
    methods = {}
    for key, (loss, correct, n) in scores.items():
        parts = costs.get(key, {})
        methods[key] = {"loss_sum": loss, "correct_sum": correct, "n": n, "parts": parts,
                        "update_seconds": sum(parts.values())}
        if key in steps_of:
            methods[key]["step"], methods[key]["train_kl"] = steps_of[key]
    return {"methods": methods, "info": case.info, "train_rows": int(data.inputs.shape[0]),
            "train_positions": int(data.mask.sum())}


def finite_median(values: Sequence[float]) -> float:
    """The (upper) median of the finite values, None and NaN left out; NaN when none is left."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    return vals[len(vals) // 2] if vals else float("nan")


def median_gap(per_prompt: Sequence[dict], key: str) -> float:
    """The median over prompts of each prompt's G for one method key (from `run_case`'s loss sums)."""
    return finite_median([gap_closed_unchecked(*(p["methods"][k]["loss_sum"] / p["methods"][k]["n"]
                                                 for k in ("no_context", key, "prompted")))
                    for p in per_prompt])


def summarize(model, per_prompt: Sequence[dict]) -> list[dict[str, Any]]:
    """Pool every prompt's sums (as evaluate does over rows): one row per method key with loss, acc, G (on loss),
    G_acc, median update seconds over prompts, and update bytes (0 for prompting and no context)."""
    keys = list(per_prompt[0]["methods"])
    pooled = {}
    for key in keys:
        loss = sum(p["methods"][key]["loss_sum"] for p in per_prompt)
        correct = sum(p["methods"][key]["correct_sum"] for p in per_prompt)
        n = sum(p["methods"][key]["n"] for p in per_prompt)
        pooled[key] = (loss / n, correct / n if model.config.mode == "tokens" else float("nan"), n)
    l_nc, a_nc, _ = pooled["no_context"]
    l_p, a_p, _ = pooled["prompted"]
    rows = []
    nbytes = update_bytes(model)
    for key in keys:
        loss, acc, n = pooled[key]
        method, _, step = key.partition("@")
        per = [p["methods"][key] for p in per_prompt]
        row = {"method": method, "steps": int(step) if step else None, "loss": loss, "acc": acc, "n_scored": n,
               "n_prompts": len(per_prompt), "G": gap_closed_unchecked(l_nc, loss, l_p),
               "G_acc": gap_closed_unchecked(-a_nc, -acc, -a_p, GAP_NOISE_FLOOR_ACC),
               "update_seconds": finite_median([x["update_seconds"] for x in per]),
               "update_parts": {part: finite_median([x["parts"][part] for x in per]) for part in per[0]["parts"]},
               "update_bytes": nbytes if method in ("compile", "lora", "lora_from_compile") else 0}
        if "train_kl" in per[0]:
            row["train_kl"] = finite_median([x["train_kl"] for x in per])
        row["G_median"] = median_gap(per_prompt, key)
        rows.append(row)
    return rows


@checked(skip_nested=False, model=_MODEL, cases=_PromptCases(), steps=StepCounts(), lr=LR_CONSTRAINT,
         top_k=TOP_K_CONSTRAINT, seed=Int(0), timing_repeats=Int(1))
def compare_methods(model, cases: Sequence[PromptCase], steps: Sequence[int] = (10, 30, 100), lr: float = 3e-3,
                    top_k: int | None = None, seed: int = 0, timing_repeats: int = 3) -> dict[str, Any]:
    """`run_case` on every held-out prompt, then `summarize`: {"per_prompt": [...], "summary": [...],
    "gap_note": "" or why G is NaN, "rank", "update_bytes", "shapes"}."""
    per = [run_case(model, c, steps, lr, top_k, seed + i, timing_repeats) for i, c in enumerate(cases)]
    summary = summarize(model, per)
    by = {r["method"]: r for r in summary if r["steps"] is None}
    return {"per_prompt": per, "summary": summary, "rank": lora_rank(model), "update_bytes": update_bytes(model),
            "shapes": {n: list(s) for n, s in lora_shapes(model).items()}, "steps": sorted(set(steps)), "lr": lr,
            "gap_note": gap_note(by["no_context"]["loss"], by["prompted"]["loss"], GAP_NOISE_FLOOR)}


# ---------------------------------------------------------------------------- break-even
@checked(update_s=Float(0.0), ttft_s=Float(0.0), per_token_s=Float(0.0), ref_ttft_s=Float(0.0),
         ref_per_token_s=Float(0.0))
def break_even_tokens(update_s: float, ttft_s: float, per_token_s: float, ref_ttft_s: float,
                      ref_per_token_s: float) -> int | None:
    """Smallest n from which on update + ttft + (n − 1)·per_token ≤ ref_ttft + (n − 1)·ref_per_token stays true
    (ref = prompting with a KV cache, whose ttft is the prompt's prefill). None: never, i.e. the method is not
    cheaper per token, so any lead it has at the first token is lost (bench_cost's _break_even answers 1 there)."""
    head = update_s + ttft_s - ref_ttft_s
    gain = ref_per_token_s - per_token_s
    if gain <= 0:
        return None
    return 1 if head <= 0 else 1 + int(math.ceil(head / gain))


# ---------------------------------------------------------------------------- what the results are
# the figure (cgt_viz.figures.lora_compile_figure) and the benchmark's table (benchmarks/bench_lora_vs_compile.py)
# name the methods with these labels and read results that check_lora_results accepts
METHOD_LABELS = {"prompted": "prompting (no cache)", "prompted_kv": "prompting + KV cache",
                 "compile": "CGT compile (one forward)", "lora": "per-prompt LoRA, N steps",
                 "lora_from_compile": "LoRA init from compile, N steps", "no_context": "no context"}


def check_lora_results(results, name: str = "lora") -> dict[str, dict]:
    """{task name: results} for `cgt_viz.figures.lora_compile_figure` and the benchmark's table; one
    `compare_methods` result (with "summary") becomes {"this model": it}. TypeError / ValueError naming the argument (`name`) otherwise."""
    if not isinstance(results, dict):
        raise refuse(name, "a dict: compare_methods' result or {task name: result}", type(results).__name__,
                     TypeError)
    if "summary" in results:
        results = {"this model": results}
    bad = [k for k, v in results.items() if not isinstance(v, dict) or not isinstance(v.get("summary"), list)]
    if bad or not results:
        raise refuse(name, "results with a 'summary' list of rows (compare_methods')",
                     "no task" if not results else "none for " + repr(bad), verb="hold")
    return results
