"""The input audit of issue 7: every public entry point, fed invalid arguments one at a time.

Each case calls one entry point with exactly one bad argument (everything else valid) and checks that
  * it raises ValueError or TypeError (FileNotFoundError for a missing path) — not an IndexError,
    RuntimeError, AttributeError or a crash deep inside torch/numpy/plotly, and not silent acceptance;
  * the message names the argument, shows the received value (or its shape/dtype), and says what is
    allowed ("must", "one of", ...); where a row gives `says`, the message also matches that pattern.
This is the one place that tests bad arguments: other test files keep only errors about file contents,
state, relations between arguments and behaviour around an error.
The table is the audit: `docs/RELIABILITY.md` lists its counts and what broke before it was fixed.
`test_every_public_entry_point_is_audited` fails when a new public function or method is added without
cases here (or an explicit reason in NOT_AUDITED).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from cgt_viz import CGT, GPT, CGTConfig
from cgt_viz.config import FIELD_CONSTRAINTS
from cgt_viz.io import PretrainedMixin
from cgt_viz.oracle import specialization_oracle
from cgt_viz.train_config import TrainConfig
from cgt_viz import analysis as A
from cgt_viz import evaluate as E
from cgt_viz import figures as F
from cgt_viz import lora_baseline as LB
from cgt_viz import widgets as W
from cgt_viz.__main__ import FLAG_CONSTRAINTS
from cgt_viz._checks import Int
from cgt_viz.tasks import make_task
from cgt_viz.tasks.icl import SyntheticICL
from cgt_viz.tasks.regression import LinearRegression
from cgt_viz.tasks.text import TextMixture
from cgt_viz.tasks.tokenizer import ByteTokenizer, CorpusBPE, GPT2Tokenizer, tokenizer_from_spec
from cgt_viz.train import TrainHistory, resolve_device, train
from cgt_viz.recipes import recipe_for, recipe_task, variants_selected
from helpers import ByteTokenizer as HFByteTokenizer   # bytes as tokens, with the transformers tokenizer's calls

# words that say what is allowed; "need"/"use" only as a requirement or a bound ("needs a tokens-mode model",
# "use k <= 5"), not anywhere ("k=6 demonstrations need 14 positions" alone says nothing allowed)
ALLOWED_WORDS = re.compile(r"must|one of|allowed|expected|at least|at most|needs? (?:a|an|the|one)\b|between|"
                           r"use \w+ [<>]=?|pass |choose from")


@dataclass
class Case:
    entry: str                 # "module.function" or "Class.method"
    arg: str                   # the argument the message must name
    value: Any                 # the bad value
    call: Callable[[Any], Any]
    shows: str | None = None   # what of the value the message must show (default: str/repr of a scalar)
    errors: tuple = (ValueError, TypeError)
    says: str | None = None    # a regex the message must also match: what the entry says beyond the usual

    @property
    def id(self) -> str:
        v = self.shows if self.shows is not None else repr(self.value)
        return f"{self.entry}:{self.arg}={v[:24]}"


@dataclass
class InTmp:
    """What a call returns when it needs a temporary folder: fn(tmp_path) is the call; with cli=True it is the
    argv of a CLI command, and the error the CLI prints is the message."""
    fn: Callable[[Path], Any]
    cli: bool = False


CASES: list[Case] = []


def case(entry: str, arg: str, values, call, shows=None, errors=(ValueError, TypeError), says=None) -> None:
    for v in values:
        CASES.append(Case(entry, arg, v, call, shows, errors, says))


# ------------------------------------------------------------------------------------------ fixtures
def tok_cfg(**kw) -> CGTConfig:
    base = dict(vocab_size=16, block_size=12, n_layer=3, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                n_templates=2)
    return CGTConfig(**{**base, **kw})


ICL = SyntheticICL(n_pairs=6)


def icl_model() -> CGT:
    return CGT(CGTConfig(**ICL.config_kwargs(), n_layer=2, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                         n_templates=2)).eval()


with torch.random.fork_rng(devices=[]):   # seeded here; the global stream the tests see is left as it was
    torch.manual_seed(0)
    CGT_T = CGT(tok_cfg()).eval()
    GPT_T = GPT(tok_cfg()).eval()
    CGT_V = CGT(CGTConfig(input_dim=3, output_dim=2, block_size=12, n_layer=3, d_x=16, n_head=2, d_y=8,
                          n_head_y=1, y_layer=1, n_templates=2)).eval()
    IDX = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(0))
    VEC = torch.randn(2, 8, 3)
    CGT_ICL = icl_model()
YBAR = torch.zeros(2, 8)
with torch.random.fork_rng(devices=[]):
    torch.manual_seed(0)
    CGT_MEM = CGT(tok_cfg(memory_layers=1, memory_rank=4)).eval()     # a token memory at layer 3

# ------------------------------------------------------------------------------------------ config
CFG_FIELDS = {   # each field's declared contract (FIELD_CONSTRAINTS), plus the bounds that relate fields
    **{name: c.bad_values() for name, c in FIELD_CONSTRAINTS.items()},
    "vocab_size": [0, 1, 2.5, "16"], "d_x": [0, -2, 7, 2.5], "n_head": [0, 3, 1.5], "n_head_y": [0, 3],
    "y_layer": [0, 3, 2.5], "sites": [("nope",), "attn_in", (), 5], "aux_min_prefix": [0, 1.5, 12],
    "aux_min_suffix": [0, 1.5, 12], "extra": [5, "x"], "input_dim": [0, 2.5], "output_dim": [0, "2"],
}
for _field, _values in CFG_FIELDS.items():
    case("CGTConfig", _field if _field != "sites" else "site", _values, lambda v, f=_field: tok_cfg(**{f: v}))
case("CGTConfig", "input_dim", [4], lambda v: tok_cfg(input_dim=v), shows="input_dim")  # both modes set
case("CGTConfig.from_dict", "d", ["not a dict", 5], lambda v: CGTConfig.from_dict(v))
case("CGTConfig.from_dict", "nonsense", [{"vocab_size": 4, "nonsense": 1}], lambda v: CGTConfig.from_dict(v),
     shows="nonsense")
case("CGTConfig.replace", "n_head", [3], lambda v: tok_cfg().replace(n_head=v))
case("CGTConfig.replace", "nonsense", [1], lambda v: tok_cfg().replace(nonsense=v), shows="nonsense")
case("CGTConfig.site_dim", "site", ["nope", 3], lambda v: tok_cfg().site_dim(v))
case("CGT", "config", [{"vocab_size": 4}, None, "cfg"], lambda v: CGT(v))
case("GPT", "config", [{"vocab_size": 4}, None], lambda v: GPT(v))

# ------------------------------------------------------------------------------------------ model calls
BAD_TOKENS = [  # (value, what the message must show)
    (IDX.float(), "float32"), (IDX.bool(), "bool"), (IDX[0], "(8,)"), (IDX[..., None], "(2, 8, 1)"),
    (IDX[:, :0], "(2, 0)"), (torch.full((2, 4), 16), "16"), (torch.full((2, 4), -1), "-1"),
    (torch.zeros(2, 13, dtype=torch.long), "13"), (IDX.tolist(), "list"), (IDX.numpy(), "ndarray"),
]
TOKEN_ENTRIES = {
    "CGT.forward": lambda v: CGT_T(v), "CGT.context": lambda v: CGT_T.context(v),
    "CGT.run_with_cache": lambda v: CGT_T.run_with_cache(v), "GPT.forward": lambda v: GPT_T(v),
    "CGT.loss": lambda v: CGT_T.loss(v, torch.zeros_like(torch.as_tensor(v)).long()),
    "GPT.loss": lambda v: GPT_T.loss(v, torch.zeros_like(torch.as_tensor(v)).long()),
    "CGT.aux_logits": lambda v: CGT_T.aux_logits(v, 1),
    "CGT.forward_specialized": lambda v: CGT_T.forward_specialized(v, YBAR),
    "CGT.generate": lambda v: CGT_T.generate(v, 1), "GPT.generate": lambda v: GPT_T.generate(v, 1),
}
for _entry, _call in TOKEN_ENTRIES.items():
    for _v, _shows in BAD_TOKENS:
        case(_entry, "idx", [_v], _call, shows=_shows)
for _v, _shows in [(VEC.long(), "int64"), (VEC[..., :2], "(2, 8, 2)"), (VEC[0], "(8, 3)"),
                   (torch.full((1, 4, 3), math.nan), "NaN"), (torch.zeros(1, 13, 3), "13")]:
    case("CGT.forward[vectors]", "idx", [_v], lambda v: CGT_V(v), shows=_shows)
    case("CGT.context[vectors]", "idx", [_v], lambda v: CGT_V.context(v), shows=_shows)

for _v, _shows in [(IDX.float(), "float32"), (IDX[:, :5], "(2, 5)"), (torch.full((2, 8), 16), "16"), ([1, 2], "list")]:
    case("CGT.loss", "targets", [_v], lambda v: CGT_T.loss(IDX, v), shows=_shows)
    case("GPT.loss", "targets", [_v], lambda v: GPT_T.loss(IDX, v), shows=_shows)
for _v, _shows in [(torch.ones(2, 5, dtype=torch.bool), "(2, 5)"), ([1, 0], "list")]:
    case("CGT.loss", "loss_mask", [_v], lambda v: CGT_T.loss(IDX, IDX, loss_mask=v), shows=_shows)
case("CGT.loss", "targets", [torch.zeros(2, 8, 3)], lambda v: CGT_V.loss(VEC, v), shows="(2, 8, 3)")
for _v, _shows in [(0, "0"), (8, "8"), (-2, "-2"), (1.5, "1.5"), (torch.tensor([1, 2, 3]), "(3,)"),
                   (torch.tensor([0, 3]), "0"), ("3", "'3'")]:  # split must leave a prefix and a suffix
    case("CGT.loss", "split", [_v], lambda v: CGT_T.loss(IDX, IDX, split=v), shows=_shows)
    case("CGT.aux_logits", "split", [_v], lambda v: CGT_T.aux_logits(IDX, v), shows=_shows)
case("CGT.loss", "generator", ["seed"], lambda v: CGT_T.loss(IDX, IDX, generator=v), shows="str")
for _v, _shows in [(torch.zeros(5), "(5,)"), (torch.zeros(2, 5), "(2, 5)"), (torch.zeros(3, 8), "(3, 8)"),
                   (torch.full((2, 8), math.nan), "NaN"), ([0.0] * 8, "list")]:
    case("CGT.forward_specialized", "ybar_vec", [_v], lambda v: CGT_T.forward_specialized(IDX, v), shows=_shows)
for _v, _shows in [(torch.zeros(5), "(5,)"), (torch.full((8,), math.nan), "NaN"), ("y", "str")]:
    case("CGT.coefficients", "ybar", [_v], lambda v: CGT_T.coefficients(v), shows=_shows)
for _v, _shows in [(torch.zeros(5), "(5,)"), (torch.zeros(2, 8), "(2, 8)"), (torch.full((8,), math.inf), "inf")]:
    case("CGT.merged_gpt", "ybar_vec", [_v], lambda v: CGT_T.merged_gpt(v), shows=_shows)
for _v, _shows in [(torch.zeros(5), "(5,)"), (torch.zeros(2, 3, 8), "(2, 3, 8)"), (torch.full((8,), math.inf), "inf")]:
    case("CGT.lora_factors", "ybar_vec", [_v], lambda v: CGT_T.lora_factors(v), shows=_shows)  # (b, e) is allowed
for _v, _shows in [(torch.zeros(0, dtype=torch.long), "(0,)"), (torch.full((4,), 16), "16"),
                   (torch.zeros(13, dtype=torch.long), "13"), (torch.zeros(4), "float32"),
                   ([torch.zeros(3, dtype=torch.long), torch.zeros(0, dtype=torch.long)], "(0,)"), ([], "[]"),
                   ("hello", "str"), (torch.zeros(2, 2, 2, dtype=torch.long), "(2, 2, 2)")]:
    case("CGT.specialize", "prompt", [_v], lambda v: CGT_T.specialize(v), shows=_shows)
for _v, _shows in [(torch.zeros(2, 3, dtype=torch.long), "(2, 3)"), ("hello", "str"),
                   ([torch.zeros(3, dtype=torch.long)] * 2, "list"), (torch.full((4,), 16), "16")]:
    case("CGT.prompt_summary", "prompt", [_v], lambda v: CGT_T.prompt_summary(v), shows=_shows)
for _v, _shows in [({"2.attn_in": [2]}, "2"), ({"9.attn_in": [0]}, "9.attn_in"), ({"2.attn_in": []}, "[]"),
                   ({"2.attn_in": [0.5]}, "0.5"), (["2.attn_in"], "list")]:
    case("CGT.forward", "ablate", [_v], lambda v: CGT_T(IDX, ablate=v), shows=_shows)
    case("CGT.run_with_cache", "ablate", [_v], lambda v: CGT_T.run_with_cache(IDX, ablate=v), shows=_shows)
    case("CGT.forward_specialized", "ablate", [_v], lambda v: CGT_T.forward_specialized(IDX, YBAR, ablate=v),
         shows=_shows)
for _v, _shows in [("ybar2", "ybar2"), (["ybar", "coeffs.9.*"], "coeffs.9.*"), (3, "int"), ([b"ybar"], "list")]:
    case("CGT.run_with_cache", "names", [_v], lambda v: CGT_T.run_with_cache(IDX, names=v), shows=_shows)
case("CGT.sample_split", "length", [1, 0, 13, 2.5, None], lambda v: CGT_T.sample_split(2, v))
# the token memory's entry points (a from-scratch CGT with memory_layers=1)
for _entry, _call in {"compiled_coeffs": lambda v: CGT_MEM.compiled_coeffs(v),
                      "prompt_factors": lambda v: CGT_MEM.prompt_factors(v),
                      "forward_compiled": lambda v: CGT_MEM.forward_compiled(IDX, v)}.items():
    case(f"CGT.{_entry}", "prompt", ["hello"], _call, shows="str")
    case(f"CGT.{_entry}", "prompt", [IDX[:, :4]], _call, shows="(2, 4)")
case("CGT.forward_compiled", "idx", [IDX.float()], lambda v: CGT_MEM.forward_compiled(v, IDX[0, :4]), shows="float32")
case("CGT.memory_reads", "layer", [1, 99], lambda v: CGT_MEM.memory_reads(IDX[0, :6], IDX[0], v))
case("CGT.memory_reads", "idx", ["x"], lambda v: CGT_MEM.memory_reads(IDX[0, :6], v), shows="str")
case("CGT.memory_reads", "prompt", ["hello"], lambda v: CGT_MEM.memory_reads(v, IDX[0]), shows="str")
case("CGT.memory_reads", "model", [CGT_T], lambda v: v.memory_reads(IDX[0, :6], IDX[0]), shows="memory_layers=0")
case("CGT.calibrate_memory", "model", [CGT_T], lambda v: v.calibrate_memory(IDX), shows="memory_layers=0")
case("CGT.generate", "max_new_tokens", [0, -1, 2.5, 100], lambda v: CGT_T.generate(IDX[:, :2], v))
case("CGT.generate", "generate", [None], lambda v: CGT_V.generate(VEC, 1), shows="vectors")

# ------------------------------------------------------------------------------------------ save / load
case("CGT.from_pretrained", "path", ["/nonexistent/run"], lambda v: CGT.from_pretrained(v),
     errors=(FileNotFoundError,))
case("CGT.save_pretrained", "path", [5, None], lambda v: CGT_T.save_pretrained(v))


def _reload(model, tmp, **kw):
    model.save_pretrained(tmp / "m")
    return CGT.from_pretrained(tmp / "m", **kw)


case("CGT.from_pretrained", "GPT", [GPT_T], lambda v: InTmp(lambda tmp: _reload(v, tmp)), shows="CGT")  # a GPT folder
case("CGT.from_pretrained", "device", ["nonsense", 5], lambda v: InTmp(lambda tmp: _reload(CGT_T, tmp, device=v)))

# ------------------------------------------------------------------------------------------ tasks
case("make_task", "name", ["nonsense", 5], lambda v: make_task(v))
case("make_task", "nonsense", [1], lambda v: make_task("icl", nonsense=v), shows="nonsense")
REG = LinearRegression(dim=2, n_points=4)
# bounds that depend on other arguments (the declared contracts below cover the rest)
case("SyntheticICL", "aux_min_pairs", [6], lambda v: SyntheticICL(n_pairs=6, aux_min_pairs=v))
case("SyntheticICL.eval_batch", "k", [6], lambda v: ICL.eval_batch(v, 2))
case("LinearRegression", "aux_min_points", [32], lambda v: LinearRegression(aux_min_points=v))
case("LinearRegression.eval_batch", "k", [4], lambda v: REG.eval_batch(v, 2))
case("LinearRegression.eval_batch", "n_queries", [5], lambda v: REG.eval_batch(1, 2, n_queries=v))
case("LinearRegression.set_active_dims", "n", [0, 3, 1.5], lambda v: REG.set_active_dims(v))
case("LinearRegression.curriculum", "start", [0, 3, 1.5], lambda v: REG.curriculum(10, start=v))
case("LinearRegression.queries_like", "batch", [ICL.eval_batch(2, 2), None], lambda v: REG.queries_like(v, 3),
     shows="batch")
case("SyntheticICL.queries_like", "batch", [REG.eval_batch(1, 2), None], lambda v: ICL.queries_like(v, 3),
     shows="batch")
REG_CGT = functools.lru_cache(None)(lambda: CGT(CGTConfig(**REG.config_kwargs(), n_layer=2, d_x=8, n_head=1, d_y=4,
                                                          n_head_y=1, y_layer=1, n_templates=2)).eval())

_CORPUS = tempfile.TemporaryDirectory()   # two topics of four small documents, for the session
for _topic in ("sport", "tech"):
    (Path(_CORPUS.name) / _topic).mkdir()
    for _i in range(4):
        (Path(_CORPUS.name) / _topic / f"{_i}.txt").write_text(f"{_topic} story {_i}. " * 30)
text_case = lambda **kw: TextMixture(source=_CORPUS.name, **{"block_size": 32, "min_excerpt": 8, **kw})  # noqa: E731
TEXT = functools.lru_cache(None)(text_case)   # TEXT(): one built task for the batch cases
TEXT_CGT = functools.lru_cache(None)(lambda: CGT(tok_cfg(**TEXT().config_kwargs())).eval())
case("TextMixture", "source", ["/nonexistent/corpus"], lambda v: TextMixture(source=v),
     errors=(FileNotFoundError, ValueError))
case("TextMixture", "source", [5], lambda v: TextMixture(source=v), shows="5")
case("TextMixture", "topics", [["nonsense"], "sport", []], lambda v: text_case(topics=v))
case("TextMixture", "min_excerpt", [17], lambda v: text_case(min_excerpt=v))
case("TextMixture.get_batch", "boundary", [0, 64, 1.5], lambda v: TEXT().get_batch(2, boundary=v))
case("TextMixture.eval_batch", "k", [64], lambda v: TEXT().eval_batch(v, 2))
case("ByteTokenizer.encode", "text", [5, None, ["a"]], lambda v: ByteTokenizer().encode(v))
case("ByteTokenizer.decode", "ids", [[300], [-1], "abc", [1.5]], lambda v: ByteTokenizer().decode(v))
case("GPT2Tokenizer.encode", "text", [5, None, ["a"]], lambda v: GPT2Tokenizer().encode(v))
case("GPT2Tokenizer.decode", "ids", [[-1], "abc", [1.5]], lambda v: GPT2Tokenizer().decode(v))
case("GPT2Tokenizer.decode", "ids", [[50257]], lambda v: GPT2Tokenizer().decode(v), says=r"0\.\.50256")
case("CorpusBPE", "definition", [5, None, "{not json"], lambda v: CorpusBPE(v))
case("CorpusBPE.encode", "text", [5, None], lambda v: CorpusBPE.train(["a b c"], 260).encode(v))
case("CorpusBPE.decode", "ids", [[260], [-1], "abc"], lambda v: CorpusBPE.train(["a b c"], 260).decode(v))
case("tokenizer_from_spec", "spec", ["sentencepiece", 5, None], lambda v: tokenizer_from_spec(v))
case("tokenizer_from_spec", "spec", [{"name": "wordpiece"}], lambda v: tokenizer_from_spec(v), shows="'wordpiece'")
case("TextMixture", "tokenizer", ["wordpiece", 5], lambda v: text_case(tokenizer=v))

# ------------------------------------------------------------------------------------------ train
def train_case(model=None, task=ICL, **kw):
    return train(icl_model() if model is None else model, task, **{"steps": 1, "batch_size": 2, "progress": False, **kw})


TRAIN_ARGS = {   # each TrainConfig field's declared contract, plus train()'s own arguments
    **{f.name: f.metadata["check"].bad_values() for f in dataclasses.fields(TrainConfig) if f.metadata.get("check")},
    "betas": [(0.9,), "0.9"], "callbacks": [5, "print"], "eval_fn": [5, "evaluate"],
    "device": ["nonsense", 5] + (["cuda:99"] if not torch.cuda.is_available() else []),  # not a device here
}
for _arg, _values in TRAIN_ARGS.items():   # the message opens with the argument's name: "steps must be ..., got 0"
    case("train", _arg, _values, lambda v, a=_arg: train_case(**{a: v}), says=rf"^{_arg} must .+, got ")
for _v, _shows in [((1.5, 0.9), "1.5"), ((0.9, -0.1), "-0.1")]:  # the message shows the bad element
    case("train", "betas", [_v], lambda v: train_case(betas=v), shows=_shows)
case("train", "callbacks", [[print, 5]], lambda v: train_case(callbacks=v), shows="5")
case("train", "model", ["model", None], lambda v: train(v, ICL, steps=1, batch_size=2, progress=False))
case("train", "task", ["icl", None], lambda v: train_case(CGT_ICL, v))
# a task that does not fit the model is refused before any step runs, naming what differs
case("train", "task", [ICL], lambda v: train_case(task=SyntheticICL(n_pairs=10)), shows="block_size")
case("train", "task", [ICL], lambda v: train_case(CGT_T, v), shows="vocab_size")
case("train", "resume", [True], lambda v: train_case(CGT_ICL, resume=v), shows="checkpoint_dir")

case("TrainHistory.from_dict", "d", ["history", 5, {"step": 5}], lambda v: TrainHistory.from_dict(v), shows="")
_POINTS = A.Points(np.zeros((3, 2)), np.zeros(3, int), np.arange(3), np.zeros(3, int), np.array(["a"] * 3, object),
                   np.array(["a"] * 3, object), None, np.zeros(3, bool))
case("Points.take", "rows", [[3], [-1], [0.5], "all"], lambda v: _POINTS.take(v))

# ------------------------------------------------------------------------------------------ evaluate
def evaluate_case(model=CGT_ICL, task=ICL, **kw):
    return E.evaluate_specialization(model, task, **{"k_values": 2, "n_batches": 1, "batch_size": 2, **kw})


case("evaluate_specialization", "model", [GPT_T, "m"], lambda v: evaluate_case(v), shows="")
case("evaluate_specialization", "k_values", [0, [0], "4", [2, 99], 2.5], lambda v: evaluate_case(k_values=v))
case("evaluate_specialization", "baseline", ["gpt", CGT_T], lambda v: evaluate_case(baseline=v), shows="")
case("evaluate_specialization", "task", ["icl", REG], lambda v: evaluate_case(task=v), shows="")
case("mean_ci", "values", ["abc", 5], lambda v: E.mean_ci(v), shows="")
case("seeds_summary", "by", ["nonsense"], lambda v: E.seeds_summary([[{"k": 2, "loss": 1.0}]], by=v))
case("seeds_summary", "runs", [[], 5], lambda v: E.seeds_summary(v), shows="")
_X, _Y = np.random.default_rng(0).normal(size=(40, 3)), np.arange(40) % 2
case("linear_probe", "targets", [_Y[:10], np.zeros((40, 2, 2))], lambda v: E.linear_probe(_X, v), shows="")
case("linear_probe", "features", [_X[:, 0], np.full((40, 3), np.nan)], lambda v: E.linear_probe(v, _Y), shows="")
case("knn_topic_accuracy", "n_neighbors", [0, 1.5, 100], lambda v: E.knn_topic_accuracy(_X, _Y, n_neighbors=v))
case("knn_topic_accuracy", "folds", [1, 0, 100], lambda v: E.knn_topic_accuracy(_X, _Y, folds=v))
case("knn_topic_accuracy", "labels", [_Y[:10]], lambda v: E.knn_topic_accuracy(_X, v), shows="10")
case("smoothness_stats", "ybar", [np.zeros(5), np.zeros((1, 5)), np.full((4, 3), np.nan)],
     lambda v: E.smoothness_stats(v), shows="")
case("collect_summaries", "k", [99], lambda v: E.collect_summaries(CGT_ICL, ICL, k=v, n_batches=1, batch_size=2))
case("gap_closed", "loss_no_context", [math.nan, "1"], lambda v: E.gap_closed(v, 1.0, 0.5))
case("text_position_curves", "task", [ICL], lambda v: E.text_position_curves(CGT_ICL, v), shows="SyntheticICL")
case("collect_excerpt_ends", "task", [ICL], lambda v: E.collect_excerpt_ends(CGT_ICL, v), shows="SyntheticICL")

# ------------------------------------------------------------------------------------------ analysis
case("collect_ybar", "model", [GPT_T, "m"], lambda v: A.collect_ybar(v, IDX), shows="")
case("collect_ybar", "inputs", [IDX.float(), torch.full((2, 3), 99), "text"], lambda v: A.collect_ybar(CGT_T, v),
     shows="")
case("collect_cache", "names", [["nonsense"], "ybar", [5]], lambda v: A.collect_cache(CGT_T, IDX, v))
_LENGTHS = np.array([5, 8])
case("select_positions", "positions", ["middle", [100], -20, 2.5, [[1]]], lambda v: A.select_positions(_LENGTHS, v))
case("select_positions", "lengths", [np.array([-1, 3]), np.array([[1]]), "5"], lambda v: A.select_positions(v), shows="")
case("Projector", "n_neighbors", [-1], lambda v: A.Projector("umap", n_neighbors=v).fit_transform(np.zeros((20, 3))))
case("Projector.fit_transform", "X", [np.zeros(5), np.zeros((1, 3)), np.full((5, 3), np.nan), "x"],
     lambda v: A.Projector("pca").fit_transform(v), shows="")
case("Projector.transform", "X", [np.zeros((3, 4))],
     lambda v: (p := A.Projector("pca")).fit_transform(np.random.rand(9, 3)) is None or p.transform(v), shows="4")
case("token_smoothness", "ybar", [np.zeros(5), np.zeros((2, 3, 4, 5))], lambda v: A.token_smoothness(v), shows="")
case("parse_site", "site", ["9.attn_in", "1.nope", "attn_in", 5, None], lambda v: A.parse_site(CGT_T, v))
case("site_coefficients", "ybar", [np.zeros((3, 5))], lambda v: A.site_coefficients(CGT_T, v, "2.attn_in"), shows="5")
case("delta_w_singular_values", "ybar_vec", [np.zeros(5), np.zeros((2, 8))],
     lambda v: A.delta_w_singular_values(CGT_T, v, "2.attn_in"), shows="")
case("template_ablation", "templates", [[5], [-1], "all"],
     lambda v: A.template_ablation(CGT_T, IDX, IDX, "2.attn_in", templates=v))
case("template_ablation", "targets", [IDX[:, :3]], lambda v: A.template_ablation(CGT_T, IDX, v, "2.attn_in"),
     shows="(2, 3)")
case("compare_losses", "split", [0, 8, 2.5, -1], lambda v: A.compare_losses(CGT_T, IDX, IDX, v))
case("compare_losses", "no_context", ["gpt", CGT_V], lambda v: A.compare_losses(CGT_T, IDX, IDX, 3, no_context=v), shows="")
case("training_series", "history", [5, "h", {"step": [1, 2], "main": [1.0]}], lambda v: A.training_series(v), shows="")

# ------------------------------------------------------------------------------------------ figures
_C2 = np.zeros((4, 2))
case("ybar_map_figure", "coords", [np.zeros((4, 4)), np.zeros(4), "xy", np.full((4, 2), np.nan)],
     lambda v: F.ybar_map_figure(v), shows="")
case("ybar_map_figure", "color", [[1, 2]], lambda v: F.ybar_map_figure(_C2, v), shows="2")
case("token_text_figure", "tokens", ["abc", 5], lambda v: F.token_text_figure(v, [1.0]))
case("token_text_figure", "tokens", [[]], lambda v: F.token_text_figure(v, []), shows="")
case("token_text_figure", "values", [[1.0, 2.0], "ab"], lambda v: F.token_text_figure(["a"], v), shows="")
case("token_text_figure", "highlight", [5, -1], lambda v: F.token_text_figure(["a"], [1.0], highlight=v))
case("colored_tokens_html", "tokens", ["abc", 5, []], lambda v: F.colored_tokens_html(v, [1.0]), shows="")
case("memory_figure", "weights", [np.zeros(3), "ab"], lambda v: F.memory_figure(v, ["a"], ["b"]), shows="")
case("memory_figure", "written, read_at and positions", [["a", "b"]],
     lambda v: F.memory_figure(np.zeros((1, 1)), v, ["b"]), shows="")
case("color_categories", "values", [np.zeros((2, 2))], lambda v: F.color_categories(v), shows="")
case("map_groups", "color", [np.zeros((2, 2))], lambda v: F.map_groups(v), shows="")
case("ybar_map_figure", "hover", [["a"]], lambda v: F.ybar_map_figure(_C2, hover=v), shows="1")
_YB = np.random.default_rng(0).normal(size=(6, 4))
STEP_PROFILE = {"positions": np.arange(1, 8), "step_switch": np.ones(7), "step_no_switch": np.ones(7), "boundary": 4,
                "window": 2, "ratio": 1.0, "ratio_no_switch": 1.0}
case("smoothness_figure", "ybar", [np.zeros(6), np.zeros((2, 3, 4))], lambda v: F.smoothness_figure(v),
     shows="")
case("smoothness_figure", "tokens", [["a", "b"]], lambda v: F.smoothness_figure(_YB, v), shows="2")
case("smoothness_figure", "boundary", [10, -1, 1.5], lambda v: F.smoothness_figure(_YB, boundary=v))
case("smoothness_figure", "highlight", [6, -1], lambda v: F.smoothness_figure(_YB, highlight=v))
case("smoothness_figure", "overlay", [{"ybar": np.zeros((3, 4))}, 5], lambda v: F.smoothness_figure(_YB, overlay=v),
     shows="")
case("template_figure", "coeffs", [np.zeros(6), "c"], lambda v: F.template_figure(v), shows="")
case("template_figure", "tokens", [["a"]], lambda v: F.template_figure(np.zeros((6, 2)), v), shows="1")
case("template_figure", "highlight", [6], lambda v: F.template_figure(np.zeros((6, 2)), highlight=v))
case("template_figure", "mean_abs", [np.zeros((3, 5))], lambda v: F.template_figure(np.zeros((6, 2)), mean_abs=v),
     shows="5")
case("compare_figure", "losses", [5, {}, {"prompted": [1.0, 2.0], "specialized": [1.0]}],
     lambda v: F.compare_figure(v), shows="")
case("loss_difference_figure", "diff", [[1.0], np.zeros((2, 2))],
     lambda v: F.loss_difference_figure([1, 2], v, [0.1, 0.1]), shows="shape")
case("loss_difference_figure", "diff", ["d"], lambda v: F.loss_difference_figure([1, 2], v, [0.1, 0.1]))
case("loss_difference_figure", "level", [1.5, 0.1, "x"],
     lambda v: F.loss_difference_figure([1, 2], [0.1, 0.2], [0.1, 0.1], level=v))
case("training_curves_figure", "history", [5, "h"], lambda v: F.training_curves_figure(v), shows="")
case("color_spec", "kind", ["nonsense"], lambda v: F.color_spec([1, 2], kind=v))

# ------------------------------------------------------------------------------------------ widgets
_DATA = torch.randint(0, 16, (3, 10), generator=torch.Generator().manual_seed(2))


explorer_case = lambda **kw: W.explore(**{"model": CGT_T, "data": _DATA, "background": None, **kw})  # noqa: E731
EXPLORER = functools.lru_cache(None)(explorer_case)   # EXPLORER(): one explorer for the method cases (each refused)
case("explore", "model", [GPT_T, "m", None], lambda v: W.explore(v, _DATA), shows="")
case("explore", "data", [5, torch.full((2, 4), 99), torch.zeros(2, 4), None],
     lambda v: W.explore(CGT_T, v, background=None), shows="")
case("explore", "labels", [[1, 2], np.zeros((3, 4))], lambda v: explorer_case(labels=v), shows="")
case("explore", "positions", ["middle", [99], 2.5], lambda v: explorer_case(positions=v))
case("explore", "color_by", ["nonsense"], lambda v: explorer_case(color_by=v))
case("explore", "boundary", [[1, 2], 99, 2.5], lambda v: explorer_case(boundary=v), shows="")
case("explore", "projection_params", [{"isomap": {}}, 5], lambda v: explorer_case(projection_params=v), shows="")
EXPLORER_METHODS = {
    "set_color": ("by", ["nonsense"], lambda ex, v: ex.set_color(v)),
    "select": ("points", [[999], [-1], "all", [1.5]], lambda ex, v: ex.select(v)),
    "select_box": ("x", [(1,), "ab", (math.nan, 1)], lambda ex, v: ex.select_box(v, (0, 1))),
    "select_lasso": ("xs", [[0, 1], "abc"], lambda ex, v: ex.select_lasso(v, [0, 1, 2])),
    "open_point": ("point", [999, -1, 1.5, "0"], lambda ex, v: ex.open_point(v)),
    "open_sequence": ("sequence", [3, -1, 1.5], lambda ex, v: ex.open_sequence(v)),
    "open_sequence ": ("position", [10, -1, 1.5], lambda ex, v: ex.open_sequence(0, v)),
    "add": ("data", [torch.full((2, 4), 99), 5], lambda ex, v: ex.add(v)),
    "search": ("query", [5, ""], lambda ex, v: ex.search(v)),
    "neighbors": ("point", [999, -1, 1.5], lambda ex, v: ex.neighbors(v)),
    "neighbors ": ("k", [0, 1.5, "3"], lambda ex, v: ex.neighbors(0, v)),
    "set_components": ("a", [0, 9, 1.5], lambda ex, v: ex.set_components(v, 2)),
    "set_hidden": ("categories", ["a", 5], lambda ex, v: ex.set_hidden(v)),
}
for _m, (_arg, _values, _call) in EXPLORER_METHODS.items():
    case(f"Explorer.{_m.strip()}", _arg, _values, lambda v, c=_call: c(EXPLORER(), v),
         shows="" if _m in ("add", "select_box", "select_lasso") else None)


VIEWS = {"SmoothnessStrip": W.SmoothnessStrip, "TemplateInspector": W.TemplateInspector,
         "CompileCompare": W.CompileCompare}
for _name, _cls in VIEWS.items():
    case(_name, "model", [GPT_T, None], lambda v, c=_cls: c(v, _DATA), shows="")
strip_case, inspector_case, compare_case = ((lambda c: lambda **kw: c(CGT_T, _DATA, **kw))(c) for c in VIEWS.values())
case("SmoothnessStrip", "sequence", [3, -1, 1.5], lambda v: strip_case(sequence=v))
case("SmoothnessStrip", "highlight", [10, -1], lambda v: strip_case(highlight=v))
case("SmoothnessStrip", "other", ["m", GPT_T, CGT_V], lambda v: strip_case(other=v), shows="")
case("SmoothnessStrip", "ybar", [np.zeros((3, 10, 5)), np.zeros((2, 10, 8))], lambda v: strip_case(ybar=v), shows="")
case("SmoothnessStrip.show", "sequence", [3, "0"], lambda v: strip_case().show(v))
case("TemplateInspector", "site", ["9.attn_in", "nope", 5], lambda v: inspector_case(site=v))
case("TemplateInspector", "sequence", [3, -1], lambda v: inspector_case(sequence=v))
case("TemplateInspector", "token", [10, -1, 1.5], lambda v: inspector_case(token=v))
case("TemplateInspector.ablate", "site", ["9.attn_in"], lambda v: inspector_case().ablate(v))
case("CompileCompare", "split", [0, 10, 2.5, -1], lambda v: compare_case(split=v))
case("CompileCompare", "sequence", [3, -1, 1.5], lambda v: compare_case(sequence=v))
case("CompileCompare.losses", "split", [0, 99], lambda v: compare_case().losses(v))
case("TrainingMonitor.__call__", "record", [{"nonsense": 1}, 5, {"step": "one", "main": 1.0}],
     lambda v: W.TrainingMonitor()(v), shows="")
case("TrainingMonitor.set_smoothing", "smoothing", [-0.1, 1.0, "0.5", float("nan")],
     lambda v: W.TrainingMonitor().set_smoothing(v))
case("Explorer.set_highlight", "points", [[10 ** 6], [-1], "a"], lambda v: EXPLORER().set_highlight(v), shows="")
case("Explorer.set_highlight", "labels", [["a", "b"]], lambda v: EXPLORER().set_highlight([0], v), shows="")

# ------------------------------------------------------------------------------------------ CLI
CLI_TRAIN = ["train", "--task", "icl", "--task-arg", "n_pairs=6", "--steps", "1", "--batch-size", "2",
             "--n-layer", "2", "--d-x", "16", "--n-head", "2", "--d-y", "8", "--n-head-y", "1", "--y-layer", "1",
             "--no-progress"]
# the numeric flags are declared (TrainConfig fields, FLAG_CONSTRAINTS): each gets its contract's out-of-range
# values, typed as text; argparse itself refuses text of the wrong type
CLI_FLAGS = {f"--{name.replace('_', '-')}": [str(v) for v in c.bad_values() if type(v) is (int if isinstance(c, Int)
                                                                                           else float)]
             for name, c in {**{f.name: f.metadata["check"] for f in dataclasses.fields(TrainConfig)
                                if f.metadata.get("check")}, **FLAG_CONSTRAINTS}.items()}
CLI_FLAGS.update({"--device": ["nonsense"], "--d-x": ["7"], "--y-layer": ["5"], "--sites": ["attn_in,nope"],
                  "--task": ["nonsense", "nomodule:Nothing"], "--task-arg": ["P", "nonsense=3", "P=1"],
                  "--model": ["rnn"], "--n-templates": ["0"],
                  # not a recipe; a recipe of another task than CLI_TRAIN's --task icl
                  "--recipe": ["nonsense", "regression-dim16"]})


def cli_train(tmp: Path, *flags: str) -> list[str]:
    """CLI_TRAIN into tmp/run, with the given flags (and values) in place of its own."""
    argv = CLI_TRAIN + ["--out", str(tmp / "run")]
    for flag in flags[::2]:
        if flag in argv:
            del argv[argv.index(flag):argv.index(flag) + 2]
    return argv + list(flags)


def trained_run(tmp: Path) -> str:
    from cgt_viz.__main__ import main
    assert main(cli_train(tmp, "--eval-every", "0")) == 0
    return str(tmp / "run")


for _flag, _values in CLI_FLAGS.items():
    for _v in _values:
        case("cli train", _flag, [_v], lambda v, f=_flag: InTmp(lambda tmp: cli_train(tmp, f, v), cli=True),
             shows=_v.split("=")[0].split(",")[-1])
for _v in ["0", "a,b", "4,x"]:
    case("cli evaluate", "--k", [_v], lambda v: InTmp(lambda tmp: ["evaluate", str(tmp), "--k", v], cli=True), shows=_v)
case("cli evaluate", "run", ["/nonexistent/run"], lambda v: InTmp(lambda tmp: ["evaluate", v], cli=True))
# --task on evaluate (issue 11): only the run's own task; a module:Class named elsewhere is never imported
case("cli evaluate", "--task", ["nonsense", "os:system", "regression"], lambda v: InTmp(lambda tmp: [
    "evaluate", trained_run(tmp), "--task", v, "--n-batches", "1", "--batch-size", "2"], cli=True))
case("cli report", "run", ["/nonexistent/run"], lambda v: InTmp(lambda tmp: ["report", v], cli=True))


# ------------------------------------------------------------------------------------------ moved here (issue 24)
# Bad-argument tests that were written by hand in other test files, one block per file they came from. The
# values are theirs (a value tied to their fixture's sizes is the same mistake at this table's sizes: the
# first index past the end, a k past the prompt room); `says` keeps what their message checked beyond
# naming the argument, showing the value and saying what is allowed.

# tests/model/test_tasks.py
case("SyntheticICL", "answer_tokens", ["text"], lambda v: SyntheticICL(answer_tokens=v))
case("SyntheticICL", "shift_fraction", [1.5], lambda v: SyntheticICL(shift_fraction=v))
case("SyntheticICL", "family", ["cube"], lambda v: SyntheticICL(family=v))
case("SyntheticICL.eval_batch", "k", [16], lambda v: SyntheticICL("affine", P=7, n_pairs=16).eval_batch(v, 4))
case("SyntheticICL.get_batch", "part", ["test"], lambda v: ICL.get_batch(2, part=v))
case("LinearRegression", "layout", ["interleaved"], lambda v: LinearRegression(layout=v), says=r"\('pair', 'split'\)")
case("LinearRegression.eval_batch", "k", [6], lambda v: LinearRegression(dim=4, n_points=6).eval_batch(v, 2))
REG4 = LinearRegression(dim=4, n_points=6)
case("LinearRegression.set_active_dims", "n", [5], lambda v: REG4.set_active_dims(v), says=r"1\.\.4")
TEXT64 = functools.lru_cache(None)(lambda: text_case(block_size=64))   # the excerpt bounds of a 64-token block
TEXT64_CGT = functools.lru_cache(None)(lambda: CGT(tok_cfg(**TEXT64().config_kwargs())).eval())
case("TextMixture", "topics", [["sport", "zebra"]], lambda v: text_case(topics=v), shows="'zebra'")
case("TextMixture", "min_excerpt", [40], lambda v: text_case(block_size=64, min_excerpt=v))
case("TextMixture.get_batch", "boundary", [60], lambda v: TEXT64().get_batch(1, boundary=v))
case("make_task", "name", ["vision"], lambda v: make_task(v))
case("make_task", "colour", ["red"], lambda v: make_task("icl", colour=v), shows="colour")

# tests/model/test_analysis.py
case("collect_cache", "names", [["nope"]], lambda v: A.collect_cache(CGT_T, IDX, v))
case("prepare_sequences", "model", [GPT_T], lambda v: A.prepare_sequences(v, _DATA), shows="GPT")
case("prepare_sequences", "data", [["text needs bytes"]], lambda v: A.prepare_sequences(CGT_T, v), shows="",
     says=r"vocab_size=16 < 256")
case("select_positions", "positions", ["some", 0, [], True], lambda v: A.select_positions(_LENGTHS, v))
case("select_positions", "positions", [[10]], lambda v: A.select_positions(_LENGTHS, v), says="selects no token")
case("Projector", "method", ["mds"], lambda v: A.Projector(v))
case("Projector.fit_transform", "X", [np.full((3, 4), np.nan)], lambda v: A.Projector("pca").fit_transform(v),
     shows="NaN")
case("Projector.fit_transform", "X", [np.zeros((1, 4))], lambda v: A.Projector("pca").fit_transform(v),
     shows="got 1")
case("token_smoothness", "ybar", [np.zeros(3)], lambda v: A.token_smoothness(v), shows="(3,)")
case("parse_site", "site", ["1.attn_in", "3.attn_out", "x.y", 3], lambda v: A.parse_site(CGT_T, v))
_COEFFS = np.zeros((7, 4))
case("mean_abs_by_label", "labels", [np.array(["a"])], lambda v: A.mean_abs_by_label(_COEFFS, v), shows="1")
case("training_series", "history", [3], lambda v: A.training_series(v), shows="int")
for _v, _shows in [(torch.zeros(0, 5, dtype=torch.long), "(0, 5)"), ([], "empty list"), ([1, 2], "list"),
                   (torch.rand(2, 5), "float32"), (torch.full((2, 5), 300), "300"),
                   (torch.zeros(2, 60, dtype=torch.long), "60"), ({"x": 1}, "dict")]:
    case("prepare_sequences", "data", [_v], lambda v: A.prepare_sequences(CGT_T, v), shows=_shows)
_ROWS = torch.zeros(2, 5, dtype=torch.long)
for _v, _shows in [(["a"], "1"), ([["a"] * 3, ["b"] * 5], "3"), ("ab", "str")]:
    case("prepare_sequences", "labels", [_v], lambda v: A.prepare_sequences(CGT_T, _ROWS, v), shows=_shows)

# tests/views/test_widgets.py
case("Explorer.set_color", "by", ["nope"], lambda v: EXPLORER().set_color(v))
for _v, _shows in [(torch.zeros(0, 4, dtype=torch.long), "(0, 4)"), ([], "empty list"),
                   (torch.zeros(1, 1, dtype=torch.long), "1 token")]:
    case("explore", "data", [_v], lambda v: explorer_case(data=v), shows=_shows)
case("explore", "labels", [["a", "b"]], lambda v: explorer_case(labels=v), shows="2")
case("explore", "projection", ["mds"], lambda v: explorer_case(projection=v))
case("explore", "color_by", ["label"], lambda v: explorer_case(color_by=v))   # no labels were given
case("explore", "positions", ["last"], lambda v: explorer_case(positions=v))
case("Explorer.select", "points", [[30]], lambda v: EXPLORER().select(v), says=r"0\.\.29")  # 3 × 10 points
case("Explorer", "sequences", [_DATA], lambda v: W.Explorer(CGT_T, v), shows="(3, 10)")
case("SmoothnessStrip", "other", [CGT(tok_cfg(vocab_size=20))], lambda v: strip_case(other=v),
     shows="vocab_size 20", says="the same inputs")
case("TemplateInspector.show", "site", ["1.attn_in"], lambda v: inspector_case().show(site=v))
case("CompileCompare.show", "split", [10], lambda v: compare_case().show(split=v), says=r"1\.\.9")
case("CompileCompare", "data", [torch.randn(2, 8, 3)], lambda v: W.CompileCompare(CGT_V, v), shows="",
     says="carry no targets")
case("TrainingMonitor.__call__", "record", [{"kind": "stop", "step": 1}], lambda v: W.TrainingMonitor()(v),
     shows="'stop'")
case("TrainingMonitor.__call__", "record", [[1, 2]], lambda v: W.TrainingMonitor()(v), shows="list")
case("Explorer.set_components", "b", [1], lambda v: EXPLORER().set_components(1, v), says="two different")

# tests/model/test_model.py
case("CGTConfig", "d_y", [15], lambda v: tok_cfg(d_y=v, n_head_y=2))
case("CGTConfig", "d_x", [30], lambda v: tok_cfg(d_x=v, n_head=4))
case("CGTConfig", "site", [("attn_in", "bogus")], lambda v: tok_cfg(sites=v), shows="bogus")
case("CGTConfig", "smooth", ["gauss"], lambda v: tok_cfg(smooth=v))
case("CGTConfig", "template_rank", [1.5], lambda v: tok_cfg(template_rank=v))
case("CGTConfig", "y_reads", ["both"], lambda v: tok_cfg(y_reads=v))
case("CGTConfig", "vocab_size", [None], lambda v: tok_cfg(vocab_size=v))
case("CGT.forward_specialized", "ybar_vec", [torch.zeros(3, 7)], lambda v: CGT_T.forward_specialized(IDX, v),
     shows="(3, 7)", says="d_y=8")
case("CGT.generate", "max_new_tokens", [12], lambda v: CGT_T.generate(IDX[:, :2], v), says="block_size")

# tests/hf/test_text.py
case("tokenizer_from_spec", "spec", [{"name": "sentencepiece"}], lambda v: tokenizer_from_spec(v),
     shows="'sentencepiece'", says=r"\['bytes', 'gpt2', 'bpe'\]")
case("make_task", "tokenizer", ["wordpiece"], lambda v: make_task("text", source=_CORPUS.name, tokenizer=v),
     says=r"\['bytes', 'gpt2', 'bpe'\]")
case("CGTConfig", "y_readout", ["mean"], lambda v: tok_cfg(y_readout=v), says="'stream'.*'ema'")
case("TextMixture.get_batch", "switch", ["no"], lambda v: TEXT().get_batch(2, switch=v))
case("text_step_profile", "window", [30], lambda v: E.text_step_profile(TEXT64_CGT(), TEXT64(), boundary=40, window=v,
                                                                        n_batches=1, batch_size=2, part="train"))
case("step_window_means", "window", [3], lambda v: E.step_window_means(np.ones(10), boundary=10, window=v))
case("step_profile_figure", "profiles", [{"m": {"positions": np.arange(3)}}], lambda v: F.step_profile_figure(v),
     shows="['positions']", says="text_step_profile")

# tests/faults/test_faults.py, tests/faults/test_faults_files.py
case("train", "model", ["float16"], lambda v: train_case(icl_model().half()), shows="float16", says="AdamW's eps")
case("train", "model", ["float64"], lambda v: train_case(CGT(CGTConfig(**REG.config_kwargs(), n_layer=2, d_x=16,
     n_head=2, d_y=8, n_head_y=1, y_layer=1)).double(), REG), shows="float64", says="float32")
case("Projector.fit_transform", "X", [np.full((50, 4), 0.5, np.float32)],
     lambda v: A.Projector("umap").fit_transform(v), shows="1 distinct", says="at least 4 distinct points")
case("CGT.loss", "idx", [torch.zeros(2, 1, dtype=torch.long)], lambda v: CGT_T.loss(v, v), shows="(2, 1)",
     says=r"aux_min_prefix \+ aux_min_suffix = 2")

# tests/views/test_figures.py
case("color_spec", "values", [np.zeros((2, 2))], lambda v: F.color_spec(v), shows="(2, 2)", says="1-D")
for _v in [np.zeros((5, 4)), np.zeros((0, 2))]:
    case("ybar_map_figure", "coords", [_v], lambda v: F.ybar_map_figure(v), shows=str(_v.shape))
case("ybar_map_figure", "color", [np.zeros(4)], lambda v: F.ybar_map_figure(np.zeros((5, 2)), v), shows="4",
     says=r"\(5,\)")
case("smoothness_figure", "overlay", [{"x": _YB[:5]}], lambda v: F.smoothness_figure(_YB, overlay=v), shows="(5, 4)")
case("template_figure", "mean_abs", [np.ones((2, 3))],
     lambda v: F.template_figure(np.zeros((6, 4)), label_names=["x", "y"], mean_abs=v), shows="3",
     says=r"\(labels=2, K=4\)")
case("template_figure", "ablation", [np.zeros(3)], lambda v: F.template_figure(np.zeros((6, 4)), ablation=v),
     shows="(3,)", says=r"\(4,\)")
case("compare_figure", "losses", [[1, 2]], lambda v: F.compare_figure(v), shows="list")
case("compare_figure", "losses", [{"position": np.arange(5), "prompted": np.ones(4)}], lambda v: F.compare_figure(v),
     shows="(4,)", says=r"losses\['prompted'\] must have shape \(5,\)")
case("compare_figure", "losses", [{"pos": np.arange(3), "prompted": np.ones(3)}], lambda v: F.compare_figure(v),
     shows="['pos', 'prompted']")

# tests/training/test_train.py
case("resolve_device", "device", ["tpu"], lambda v: resolve_device(v))
# the message opens with the argument's name and ends with the value it got (as given: 0 -> "0.0" for a float)
for _arg, _v, _shows in [("steps", -3, "-3"), ("batch_size", -1, "-1"), ("lr", -1e-3, "-0.001"),
                         ("min_lr_ratio", 1.5, "1.5"), ("grad_clip", 0, "0.0"), ("device", "tpu", "'tpu'"),
                         ("callbacks", [42], "42")]:
    case("train", _arg, [_v], lambda v, a=_arg: train_case(**{a: v}), shows=_shows, says=rf"^{_arg} must .+, got ")
case("train", "model", [torch.nn.Linear(2, 2)], lambda v: train(v, ICL, steps=1, batch_size=2, progress=False),
     shows="Linear")
case("train", "stepz", [3], lambda v: train_case(stepz=v), shows="stepz", says="TrainConfig fields")

# tests/model/test_evaluate.py
case("seeds_summary", "by", ["seed"], lambda v: E.seeds_summary([[{"k": 2, "loss": 1.0}]], by=v))
case("evaluate_specialization", "k_values", [()], lambda v: evaluate_case(k_values=v), shows="[]")   # shown as a list
case("evaluate_specialization", "k_values", [(6,)], lambda v: evaluate_case(k_values=v), shows="6", says="k=6")
case("text_position_curves", "split", [40], lambda v: E.text_position_curves(TEXT_CGT(), TEXT(), split=v,
                                                                             n_batches=1, batch_size=2, part="train"))

# tests/model/test_devices.py: inputs left on the CPU for a model on the meta device, with where to move them
with torch.random.fork_rng(devices=[]):
    torch.manual_seed(0)
    CGT_META = CGT(tok_cfg()).to("meta")
    GPT_META = GPT(tok_cfg()).to("meta")
_META_IDX = torch.zeros(2, 6, dtype=torch.long, device="meta")
for _entry, _arg, _call in [
        ("CGT.forward", "idx", lambda v: CGT_META(v)), ("CGT.context", "idx", lambda v: CGT_META.context(v)),
        ("CGT.run_with_cache", "idx", lambda v: CGT_META.run_with_cache(v)),
        ("CGT.loss", "idx", lambda v: CGT_META.loss(v, v)),
        ("CGT.aux_logits", "idx", lambda v: CGT_META.aux_logits(v, 2)),
        ("CGT.specialize", "prompt", lambda v: CGT_META.specialize(v[0])),
        ("CGT.generate", "idx", lambda v: CGT_META.generate(v, 1)),
        ("CGT.forward_specialized", "idx", lambda v: CGT_META.forward_specialized(v, torch.zeros(8))),
        ("GPT.forward[x_only]", "idx", lambda v: CGT_META.x_only()(v)), ("GPT.forward", "idx", lambda v: GPT_META(v))]:
    case(_entry, _arg, [torch.zeros(2, 6, dtype=torch.long)], _call, shows="cpu", says=r"\.to\('meta'\)")
case("CGT.forward_specialized", "ybar_vec", [torch.zeros(8)], lambda v: CGT_META.forward_specialized(_META_IDX, v),
     shows="cpu", says="model's device")
case("CGT.merged_gpt", "ybar_vec", [torch.zeros(8)], lambda v: CGT_META.merged_gpt(v), shows="cpu",
     says="model's device")
case("CGT.loss", "targets", [torch.zeros(2, 6, dtype=torch.long)], lambda v: CGT_META.loss(_META_IDX, v),
     shows="cpu", says="device of idx")

# tests/training/test_lora_baseline.py
case("CompileCompare", "lora", [["results"]], lambda v: compare_case(lora=v), shows="list")
case("CompileCompare", "lora", [{"icl": {"rows": []}}], lambda v: compare_case(lora=v), shows="['icl']")

# tests/hf/test_hf.py (a CGT over a pretrained LM; skipped where transformers is not installed)
@functools.lru_cache(None)
def _hf():
    pytest.importorskip("transformers")
    from cgt_viz import hf
    return hf


LM = functools.lru_cache(None)(lambda: _hf().tiny_llama(seed=0))
CGTLM_ = functools.lru_cache(None)(lambda: _hf().CGTLM(LM(), y_layer=2, d_y=16, n_head_y=2))
cgtlm_case = lambda **kw: _hf().CGTLM(LM(), **{"y_layer": 2, "d_y": 16, "n_head_y": 2, **kw})  # noqa: E731
_HF_IDX = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(0))


def _opt():
    from transformers import OPTConfig, OPTForCausalLM
    return OPTForCausalLM(OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
                                    max_position_embeddings=32, word_embed_proj_dim=16))


case("CGTLM", "site", [("attn_in", "attn_mid")], lambda v: cgtlm_case(sites=v), shows="attn_mid")
case("CGTLM", "y_layer", [4], lambda v: cgtlm_case(y_layer=v), says=r"1\.\.3")
case("CGTLM", "y_layer", [0], lambda v: cgtlm_case(y_layer=v))
case("CGTLM", "lm", ["opt"], lambda v: _hf().CGTLM(_opt()), shows="'opt'", says="family with a layout")
case("CGTLM", "lm", [torch.nn.Linear(2, 2)], lambda v: _hf().CGTLM(v), shows="Linear", says="transformers causal LM")
case("CGTLM", "smooth", ["vae"], lambda v: cgtlm_case(smooth=v), says="'l2' or 'relative'")
case("CGTLM", "block_size", [500], lambda v: cgtlm_case(block_size=v), says=r"2\.\.128")
case("CGTLM", "pool_half_life", [0, -1.0, math.nan], lambda v: cgtlm_case(pool_half_life=v))
case("CGTLM.context", "idx", [torch.tensor([[0, 200]])], lambda v: CGTLM_().context(v), shows="[0, 200]",
     says=r"0\.\.95")
case("CGTLM.specialize", "prompt", ["hello"], lambda v: CGTLM_().specialize(v), shows="str")
case("CGTLM.specialize", "prompt", [torch.zeros(1, 2, 3, dtype=torch.long)], lambda v: CGTLM_().specialize(v),
     shows="(1, 2, 3)", says=r"\(t,\) or \(b, t\)")
case("CGTLM.calibrate_pool", "idx", [_HF_IDX[:, :1]], lambda v: CGTLM_().calibrate_pool(v), shows="(2, 1)",
     says="at least 2 positions")
case("CGTLM.forward", "ablate", [{"9.attn_in": [0]}], lambda v: CGTLM_()(_HF_IDX, ablate=v), shows="9.attn_in")
case("CGTLM.loss", "idx", [torch.zeros(2, 1, dtype=torch.long)], lambda v: CGTLM_().loss(v, v), shows="(2, 1)")
case("CGTLM.generate", "use_cache", [True], lambda v: CGTLM_().generate(_HF_IDX, 2, use_cache=v),
     says="a KV cache is not available for a CGT over a pretrained LM")
case("CGTLM.from_pretrained", "lm", [None], lambda v: _hf().CGTLM.from_pretrained("somewhere", v),
     says=r"CGTLM.from_pretrained\(path, lm\) needs lm")
# tests/hf/test_export_hf.py (a from-scratch GPT as a transformers GPT-2): what GPT-2 cannot express, by name
_export = lambda model: InTmp(lambda tmp: _hf().export_hf(model, tmp / "gpt2"))  # noqa: E731
case("export_hf", "model", [CGT_T], _export, shows="a CGT", says=r"specialize\(prompt\)")
case("export_hf", "model", ["gpt2"], lambda v: _export(v), shows="'gpt2'")
case("export_hf", "path", [5, None], lambda v: _hf().export_hf(GPT_T, v))
case("export_hf", "config.input_dim", [3], lambda v: _export(CGT_V.x_only()), says="vectors mode")
case("export_hf", "config.token_shift", ["previous"], lambda v: _export(GPT(tok_cfg(token_shift=v))),
     says="no token-shift")
case("export_hf_peft", "config.token_shift", ["pair"],
     lambda v: InTmp(lambda tmp: _hf().export_hf_peft(CGT(tok_cfg(token_shift=v)), IDX[0], tmp / "adapter")),
     says="no token-shift")
case("export_hf_peft", "config.input_dim", [3],
     lambda v: InTmp(lambda tmp: _hf().export_hf_peft(CGT_V, VEC[0], tmp / "adapter")), says="vectors mode")
case("export_hf_peft", "prompt", ["hello"], lambda v: InTmp(lambda tmp: _hf().export_hf_peft(CGT_T, v, tmp / "adapter")),
     shows="str")
case("to_transformers", "model", [None], lambda v: _hf().to_transformers(v))
case("to_transformers", "model", ["LlamaForCausalLM"], lambda v: _hf().to_transformers(LM()), shows="LlamaForCausalLM",
     says="use its own save_pretrained")
case("CGTConfig", "token_shift", ["pair"], lambda v: CGTConfig(input_dim=3, token_shift=v),
     says="token_shift='pair' embeds token pairs and needs tokens mode")
case("static_png", "on", ["yes"], lambda v: W.static_png(v), says="True, False or nothing")

# tests/training/test_distill.py (the feature cache of a pooled-only head; BBCTokens.for_head)
_SETTINGS = {"eval_prompts": [16], "prefix": 8, "suffix": 8, "val_fraction": 0.2, "test_fraction": 0.2}
_WINDOWS = torch.randint(0, 96, (6, 15), generator=torch.Generator().manual_seed(0))


def _head(**kw):
    return _hf().CGTLM(LM(), y_layer=2, d_y=8, n_head_y=2, n_templates=3, template_rank=2,
                       **{"pooled_only": True, "aux_kl": 1.0, "aux_ce": 0.5, "aux_kl_top_k": 7, **kw})


def _feature_cache(model=None, tokens=_WINDOWS, prefix_len=6):
    from cgt_viz.hf import distill
    return InTmp(lambda tmp: distill.build_feature_cache(_head() if model is None else model, tokens, prefix_len,
                                                         top_k=7, root=tmp, progress=False))


case("build_feature_cache", "model", ["pooled_only=False"], lambda v: _feature_cache(_head(pooled_only=False)),
     shows="pooled_only=True")
case("build_feature_cache", "prefix_len", [14], lambda v: _feature_cache(prefix_len=v))
case("build_feature_cache", "tokens", [_WINDOWS.float()], lambda v: _feature_cache(tokens=v), shows="float32")
case("BBCTokens.for_head", "settings", [{k: v for k, v in _SETTINGS.items() if k != "suffix"}],
     lambda v: _hf().BBCTokens.for_head(ByteTokenizer(), v, source=_CORPUS.name), shows="['suffix']")
case("BBCTokens.for_head", "settings", [[16]], lambda v: _hf().BBCTokens.for_head(ByteTokenizer(), v,
                                                                                  source=_CORPUS.name),
     says="the dict")


# ------------------------------------------------------------------------------------------ hf.*, recipes (issue 39, B46)
# The pretrained-LM side (tiny random Llama, built offline; skipped where transformers or peft is missing) and the
# task recipes. The arguments declared with `@checked` get their generated rows under "declared contracts" below.
HF_PACKAGES = ("transformers", "peft")
HF_AVAILABLE = all(importlib.util.find_spec(p) is not None for p in HF_PACKAGES)
HF_MODULES = ["cgt_viz.hf"] + [f"cgt_viz.hf.{m}" for m in ("data", "distill", "export", "head_run", "interp", "layouts",
                                                            "lora", "measure", "model", "needle", "oracle", "source",
                                                            "stream", "tiny")]


def _hf_mod(name: str):
    """cgt_viz.hf.<name>, or a skip where the hf extra is not installed."""
    for package in HF_PACKAGES:
        pytest.importorskip(package)
    return importlib.import_module(f"cgt_viz.hf.{name}")


case("recipe_for", "task", [5, None, ("regression",)], lambda v: recipe_for(v))
case("recipe_for", "args", [5, "dim=16", [("dim", 16)]], lambda v: recipe_for("regression", v))
# a recipe by name: not a recipe, or a recipe of another task (regression-dim16 for icl)
case("recipe_for", "recipe", [5, "nonsense", "regression-dim16"], lambda v: recipe_for("icl", recipe=v))
case("recipe_task", "recipe", [5, None, "nonsense"], lambda v: recipe_task(v))
case("variants_selected", "task", [5, None], lambda v: variants_selected(v))
case("variants_selected", "args", [5, "dim=16"], lambda v: variants_selected("regression", v))

# hf.data: BBCTokens over the session's small corpus, bytes as tokens
BBC = functools.lru_cache(None)(lambda: _hf_mod("data").BBCTokens(HFByteTokenizer(), block_size=16,
                                                                   source=_CORPUS.name))
case("BBCTokens", "test_fraction", [0.8, -0.1], lambda v: _hf_mod("data").BBCTokens(
    HFByteTokenizer(), block_size=16, source=_CORPUS.name, test_fraction=v))
case("BBCTokens", "source", ["/nonexistent/corpus"], lambda v: _hf_mod("data").BBCTokens(HFByteTokenizer(), source=v),
     errors=(FileNotFoundError, ValueError))
case("BBCTokens.check_part", "part", ["nonsense", 5], lambda v: BBC().check_part(v))
case("BBCTokens.n_docs", "part", ["test"], lambda v: BBC().n_docs(v), says="test_fraction > 0")
case("BBCTokens.get_batch", "part", ["nonsense"], lambda v: BBC().get_batch(2, part=v))
case("BBCTokens.eval_batch", "k", [0, 16, 2.5], lambda v: BBC().eval_batch(v, 2))
case("BBCTokens.excerpts", "length", [0, 18], lambda v: BBC().excerpts(v))
case("BBCTokens.excerpts", "per_topic", [0, -1, 1.5], lambda v: BBC().excerpts(8, per_topic=v))
case("BBCTokens.excerpts", "part", ["nonsense"], lambda v: BBC().excerpts(8, part=v))
case("BBCTokens.excerpts", "seed", [-1, "0"], lambda v: BBC().excerpts(8, seed=v))
case("BBCTokens.document_ids", "part", ["nonsense"], lambda v: BBC().document_ids(v))
case("BBCTokens.document_ids", "topic", [2, -1, 1.5], lambda v: BBC().document_ids("train", v))
case("BBCTokens.document_windows", "length", [1, 10 ** 4], lambda v: BBC().document_windows(v, "train"))
case("BBCTokens.document_windows", "per_doc", [0, 1.5], lambda v: BBC().document_windows(8, "train", per_doc=v))
case("BBCTokens.document_windows", "per_topic", [0], lambda v: BBC().document_windows(8, "train", per_topic=v))
case("BBCTokens.document_windows", "seed", [-1], lambda v: BBC().document_windows(8, "train", seed=v))
case("BBCTokens.document_windows", "part", ["test"], lambda v: BBC().document_windows(8, v))

# hf.distill: a feature cache of the pooled-only head, built once into the session's own folder
HEAD = functools.lru_cache(None)(_head)
_FEATURE_ROOT = tempfile.TemporaryDirectory()
FEATURES = functools.lru_cache(None)(lambda: _hf_mod("distill").build_feature_cache(
    HEAD(), _WINDOWS, 6, top_k=7, root=_FEATURE_ROOT.name, progress=False))
train_head_case = lambda **kw: _hf_mod("distill").train_head(**{  # noqa: E731
    "model": HEAD(), "cache": FEATURES(), "steps": 1, "batch_size": 2, "progress": False, **kw})
case("train_head", "batch_size", [1000], lambda v: train_head_case(batch_size=v), says="the cache holds 6 windows")
case("train_head", "steps", [None], lambda v: train_head_case(steps=v, minutes=None), shows="neither")
case("train_head", "checkpoint_dir", [None], lambda v: train_head_case(checkpoint_dir=v, resume=True))
case("train_head", "callback", [5, "print"], lambda v: train_head_case(callback=v))
case("train_head", "log", [5], lambda v: train_head_case(log=v))
case("train_head", "model", ["pooled_only=False"], lambda v: train_head_case(model=_head(pooled_only=False)),
     shows="pooled_only=True")
case("evaluate_cache", "model", ["m", CGT_T], lambda v: _hf_mod("distill").evaluate_cache(v, FEATURES()), shows="")

# hf.interp: the functions take nnsight-wrapped models; everything here is refused before a pass runs
class _Traceable:
    """Stands in for an nnsight-wrapped model (the argument checks look for its `trace`)."""
    trace = None


_DEPARTURES = {"layer": np.arange(1, 5), **{k: np.zeros(4) for k in ("compiled", "prompted", "to_prompted", "cosine")}}
departures_case = lambda **kw: _hf_mod("interp").residual_departures(**{  # noqa: E731
    "base": _Traceable(), "compiled": _Traceable(), "prompt": IDX[0], "rest": IDX[1, :3], **kw})
case("residual_stream", "wrapped", [5], lambda v: _hf_mod("interp").residual_stream(v, IDX), shows="int")
case("residual_stream", "wrapped", ["lm"], lambda v: _hf_mod("interp").residual_stream(v, IDX),
     shows="str")
case("residual_departures", "base", [5], lambda v: departures_case(base=v), shows="int")
case("residual_departures", "compiled", ["lm"], lambda v: departures_case(compiled=v), shows="str")
case("residual_departures", "rest", ["x", torch.zeros(3), torch.zeros(0, dtype=torch.long)],
     lambda v: departures_case(rest=v), shows="")
case("residual_departures", "prompt", [[1, 2], torch.zeros(2, 3, dtype=torch.long)], lambda v: departures_case(prompt=v),
     shows="")
case("residual_departures", "skip", [-1, 3, 1.5], lambda v: departures_case(skip=v))
case("departure_figure", "departures", [5, {"layer": [1]}], lambda v: _hf_mod("interp").departure_figure(v), shows="")
case("departure_figure", "y_layer", [-1, 9, 1.5], lambda v: _hf_mod("interp").departure_figure(_DEPARTURES, y_layer=v))
case("departure_figure", "height", [5], lambda v: _hf_mod("interp").departure_figure(_DEPARTURES, height=v))

# hf.layouts, hf.lora
case("layout_of", "lm", [5, "llama"], lambda v: _hf_mod("layouts").layout_of(v), shows="")
case("layout_of", "lm", ["opt"], lambda v: _hf_mod("layouts").layout_of(_opt()), shows="'opt'")
compare_lm_case = lambda **kw: _hf_mod("lora").lm_compare_methods(**{  # noqa: E731
    "model": CGTLM_(), "task": _hf_mod("tiny").RandomWindows(), "n_prompts": 1, "prompt_len": 4, "suffix_len": 4,
    "steps": (0,), "timing_repeats": 1, **kw})
case("lm_compare_methods", "compile_steps", [[-1], "5"], lambda v: compare_lm_case(compile_steps=v))
case("lm_compare_methods", "log", [5], lambda v: compare_lm_case(log=v))

# hf.measure, hf.oracle
_WIN_TOPICS, _WIN_DOCS = torch.arange(6) // 3, torch.arange(6)
case("excerpt_summaries", "length", [0], lambda v: _hf_mod("measure").excerpt_summaries(CGTLM_(), BBC(), v))
case("ybar_topic_knn", "length", [0], lambda v: _hf_mod("measure").ybar_topic_knn(CGTLM_(), BBC(), v))
case("ybar_topic_knn", "model", [GPT_T, 5], lambda v: _hf_mod("measure").ybar_topic_knn(v, BBC(), 8), shows="")
case("continuation_losses", "k", [0, 16], lambda v: _hf_mod("measure").continuation_losses(
    CGTLM_(), BBC(), v, n_batches=1, batch_size=2))
case("window_losses", "prefix_len", [0, 14, 2.5], lambda v: _hf_mod("measure").window_losses(
    CGTLM_(), _WINDOWS, v, _WIN_TOPICS, _WIN_DOCS))
case("prompt_token_positions", "prefix_len", [0, 14], lambda v: _hf_mod("measure").prompt_token_positions(_WINDOWS, v))
oracle_case = lambda **kw: _hf_mod("oracle").oracle_window_losses(**{  # noqa: E731
    "model": CGTLM_(), "tokens": _WINDOWS, "prefix_len": 6, "steps": 0, **kw})
case("oracle_window_losses", "kinds", [("ybar", "nope")], lambda v: oracle_case(kinds=v), shows="'nope'")
for _arg, _values in {"target": ["nonsense", 5], "steps": [-1, 1.5], "lr": [0.0, math.nan], "lora_lr": [0.0],
                      "rank": [0], "samples": [0], "batch_size": [0], "prefix_len": [0, 13], "model": ["m"]}.items():
    case("oracle_window_losses", _arg, _values, lambda v, a=_arg: oracle_case(**{a: v}))
MEMORY_CGTLM = functools.lru_cache(None)(lambda: cgtlm_case(sites=("attn_in", "mlp_in"), memory_layers=1))
case("oracle_window_losses", "kinds", [("coeffs", "memory")], lambda v: oracle_case(kinds=v),   # the head has no memory
     says="token memory", shows="'memory'")
oracle_comparison_case = lambda **kw: _hf_mod("oracle").oracle_comparison(**{  # noqa: E731
    "model": CGTLM_(), "task": _hf_mod("tiny").RandomWindows(), "prompt_len": 4, "suffix_len": 4, "draws": 1,
    "steps": 0, **kw})
for _arg, _values in {"prompt_len": [0], "suffix_len": [1], "draws": [0], "model": ["m"]}.items():
    case("oracle_comparison", _arg, _values, lambda v, a=_arg: oracle_comparison_case(**{a: v}))

# hf.model: CGTLM's own methods
for _entry, _call in {"compiled_coeffs": lambda v: CGTLM_().compiled_coeffs(v),
                      "prompt_factors": lambda v: CGTLM_().prompt_factors(v),
                      "forward_compiled": lambda v: CGTLM_().forward_compiled(_HF_IDX, v)}.items():
    case(f"CGTLM.{_entry}", "prompt", ["hello"], _call, shows="str")
    case(f"CGTLM.{_entry}", "prompt", [_HF_IDX[:, :4]], _call, shows="(2, 4)")
case("CGTLM.forward_compiled", "idx", [_HF_IDX.float()], lambda v: CGTLM_().forward_compiled(v, _HF_IDX[0, :4]),
     shows="float32")
for _entry, _call in {"lower_cache": lambda v: CGTLM_().lower_cache(v),
                      "pooled_readout": lambda v: CGTLM_().pooled_readout(v),
                      "x_at_layer": lambda v: CGTLM_().x_at_layer(v)}.items():
    for _v, _shows in [("x", "str"), (_HF_IDX.float(), "float32"), (torch.full((1, 4), 96), "96")]:
        case(f"CGTLM.{_entry}", "idx", [_v], _call, shows=_shows)
case("CGTLM.x_at_layer", "layer", [0, 5, 1.5], lambda v: CGTLM_().x_at_layer(_HF_IDX, v))
case("CGTLM.calibrate_pool_from", "pooled", ["x", torch.zeros(3, 5)], lambda v: CGTLM_().calibrate_pool_from(v),
     shows="")
case("CGTLM.from_config", "config", [5, "config"], lambda v: _hf().CGTLM.from_config(v, LM()), shows="")
case("CGTLM.from_config", "config", [tok_cfg()], lambda v: _hf().CGTLM.from_config(v, LM()), shows="CGTConfig")
case("CGTLM.merged_lm", "ybar_vec", ["y", torch.zeros(5)], lambda v: CGTLM_().merged_lm(v), shows="")
case("CGTLM.memory_reads", "layer", [1, 99], lambda v: MEMORY_CGTLM().memory_reads(_HF_IDX[0, :6], _HF_IDX[0], v))
case("CGTLM.memory_reads", "idx", ["x"], lambda v: MEMORY_CGTLM().memory_reads(_HF_IDX[0, :6], v), shows="str")
case("CGTLM.memory_reads", "prompt", ["hello"], lambda v: MEMORY_CGTLM().memory_reads(v, _HF_IDX[0]), shows="str")

# hf.source: nothing is converted or loaded; the real SmolLM2 is never touched here
case("smollm2", "cache_dir", [5], lambda v: _hf_mod("source").smollm2(cache_dir=v), shows="int")
case("smollm2", "dtype", ["float16", torch.int64], lambda v: _hf_mod("source").smollm2(dtype=v))


def _load_local_dtype(dtype, tmp: Path):
    (tmp / "config.json").write_text("{}")     # the folder passes the path checks: the dtype is what is refused
    return _hf_mod("source").load_local(tmp, dtype=dtype)


case("load_local", "dtype", ["float32", torch.int32], lambda v: InTmp(lambda tmp: _load_local_dtype(v, tmp)))

# hf.head_run: `python -m cgt_viz train-head`, its flags checked before the LM is loaded
HEAD_FLAGS = {"--threads": ["0"], "--device": ["nonsense"], "--sites": ["nope"], "--train-per-topic": ["0"],
              "--memory-layers": ["-1"], "--memory-rank": ["0"], "--init-from": ["/nonexistent/head"],
              "--steps": ["0"], "--seed": ["-1"], "--minutes": ["0"], "--lr": ["0"], "--aux-ce": ["-1"],
              "--aux-kl": ["-1"], "--eval-prompts": ["1"], "--val-fraction": ["1.5"], "--test-fraction": ["0.95"],
              **{f"--{flag}": ["0"] for flag in ("y-layer", "d-y", "templates", "rank", "prefix", "suffix", "per-doc",
                                                  "top-k", "batch", "val-windows", "eval-per-topic", "eval-draws",
                                                  "checkpoint-every")}}
for _flag, _values in HEAD_FLAGS.items():
    for _v in _values:   # the message shows the value as typed
        case("cli train-head", _flag, [_v], lambda v, f=_flag: InTmp(
            lambda tmp: ["train-head", "--out", str(tmp / "head"), f, v], cli=True), shows=_v)


# ------------------------------------------------------------------------------------------ the check
def _in_tmp(call: InTmp, tmp_path, capsys):
    if not call.cli:
        return call.fn(tmp_path)
    from cgt_viz.__main__ import main
    argv = call.fn(tmp_path)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:   # argparse refuses the value itself
        code = exit_.code
    if code == 0:
        return "accepted"
    raise ValueError(capsys.readouterr().err)   # the printed message is what the user sees; check it like any other


def _shown(c: Case) -> str:
    if c.shows is not None:
        return c.shows
    if isinstance(c.value, float) and math.isnan(c.value):
        return "nan"
    return repr(c.value) if isinstance(c.value, str) else str(c.value)


# ------------------------------------------------------------------------------------------ declared contracts
# Entry points whose arguments are declared with `@checked(...)`: each gets every bad value its constraints
# know (`Constraint.bad_values`), so declaring an argument audits it. Each row is a valid call that takes the
# argument under test as a keyword.
_UNWRITTEN = Path(tempfile.gettempdir()) / "cgt_viz-audit-never-written"   # every value fed with it is refused first
DECLARED = {
    "SyntheticICL": SyntheticICL,
    "SyntheticICL.get_batch": lambda **kw: ICL.get_batch(**{"batch_size": 2, **kw}),
    "SyntheticICL.eval_batch": lambda **kw: ICL.eval_batch(**{"k": 2, "batch_size": 2, **kw}),
    "SyntheticICL.curriculum": lambda **kw: ICL.curriculum(**kw),
    "LinearRegression": LinearRegression,
    "LinearRegression.get_batch": lambda **kw: REG.get_batch(**{"batch_size": 2, **kw}),
    "LinearRegression.eval_batch": lambda **kw: REG.eval_batch(**{"k": 1, "batch_size": 2, **kw}),
    "LinearRegression.curriculum": lambda **kw: REG.curriculum(**{"steps": 10, **kw}),
    "LinearRegression.queries_like": lambda **kw: REG.queries_like(**{"batch": REG.eval_batch(1, 2), "n_queries": 3,
                                                                       **kw}),
    "SyntheticICL.queries_like": lambda **kw: ICL.queries_like(**{"batch": ICL.eval_batch(2, 2), "n_queries": 3,
                                                                   **kw}),
    "specialization_oracle": lambda **kw: specialization_oracle(**{
        "model": REG_CGT(), "task": REG, "k": 1, "n_batches": 1, "batch_size": 2, "fit_queries": 2, "steps": 0, **kw}),
    "GPT": lambda **kw: GPT(**{"config": tok_cfg(), **kw}),
    "CGT": lambda **kw: CGT(**{"config": tok_cfg(), **kw}),
    "CGT.specialize": lambda **kw: CGT_T.specialize(**{"prompt": IDX[0], **kw}),
    "CGT.merged_gpt": lambda **kw: CGT_T.merged_gpt(**{"ybar_vec": YBAR[0], **kw}),
    "CGT.lora_factors": lambda **kw: CGT_T.lora_factors(**{"ybar_vec": YBAR[0], **kw}),
    "CGT.forward": lambda **kw: CGT_T(**{"idx": IDX, **kw}),
    "CGT.loss": lambda **kw: CGT_T.loss(**{"idx": IDX, "targets": IDX, **kw}),
    "train": lambda **kw: train(**{"model": icl_model(), "task": ICL, "steps": 1, "batch_size": 2, "progress": False,
                                   **kw}),
    "CGT.sample_split": lambda **kw: CGT_T.sample_split(**{"batch": 2, "length": 8, **kw}),
    "PretrainedMixin.save_pretrained": lambda **kw: CGT_T.save_pretrained(**{"path": _UNWRITTEN, **kw}),
    "PretrainedMixin.from_pretrained": lambda **kw: CGT.from_pretrained(**{"path": "/nonexistent/run", **kw}),
    "CGT.context": lambda **kw: CGT_T.context(**{"idx": IDX, **kw}),
    "CGT.run_with_cache": lambda **kw: CGT_T.run_with_cache(**{"idx": IDX, **kw}),
    "CGT.forward_specialized": lambda **kw: CGT_T.forward_specialized(**{"idx": IDX, "ybar_vec": YBAR, **kw}),
    "CGT.coefficients": lambda **kw: CGT_T.coefficients(**{"ybar": YBAR, **kw}),
    "CGT.calibrate_memory": lambda **kw: CGT_MEM.calibrate_memory(**{"idx": IDX, **kw}),
    "CGT.generate": lambda **kw: CGT_T.generate(IDX[:, :2], 1, **kw),
    "evaluate_specialization": evaluate_case,
    "mean_ci": lambda **kw: E.mean_ci([1.0, 2.0], **kw),
    "seeds_summary": lambda **kw: E.seeds_summary([[{"k": 2, "loss": 1.0}]], **kw),
    "collect_summaries": lambda **kw: E.collect_summaries(**{"model": CGT_ICL, "task": ICL, "n_batches": 1,
                                                             "batch_size": 2, **kw}),
    "linear_probe": lambda **kw: E.linear_probe(_X, _Y, **kw),
    "knn_topic_accuracy": lambda **kw: E.knn_topic_accuracy(_X, _Y, **kw),
    "step_window_means": lambda **kw: E.step_window_means(**{"steps": np.ones(20), "boundary": 8, "window": 4, **kw}),
    "text_step_profile": lambda **kw: E.text_step_profile(**{"model": TEXT_CGT(), "task": TEXT(), "n_batches": 1,
                                                             "batch_size": 2, "window": 4, "part": "train", **kw}),
    "text_position_curves": lambda **kw: E.text_position_curves(**{"model": TEXT_CGT(), "task": TEXT(), "n_batches": 1,
                                                                   "batch_size": 2, "part": "train", **kw}),
    "collect_excerpt_ends": lambda **kw: E.collect_excerpt_ends(**{"model": TEXT_CGT(), "task": TEXT(), "n_batches": 1,
                                                                   "batch_size": 2, "part": "train", **kw}),
    "collect_ybar": lambda **kw: A.collect_ybar(**{"model": CGT_T, "inputs": IDX, **kw}),
    "collect_cache": lambda **kw: A.collect_cache(**{"model": CGT_T, "inputs": IDX, "names": ["ybar"], **kw}),
    "Projector": A.Projector,
    "stratified_subsample": lambda **kw: A.stratified_subsample(np.arange(10), **{"cap": 5, **kw}),
    "color_kind": lambda **kw: F.color_kind([1, 2], **kw),
    "ybar_map_figure": lambda **kw: F.ybar_map_figure(_C2, [1, 2, 3, 4], **kw),
    "smoothness_figure": lambda **kw: F.smoothness_figure(_YB, **kw),
    "step_profile_figure": lambda **kw: F.step_profile_figure({"m": STEP_PROFILE}, **kw),
    "token_text_figure": lambda **kw: F.token_text_figure(**{"tokens": ["a"], "values": [1.0], **kw}),
    "colored_tokens_html": lambda **kw: F.colored_tokens_html(**{"tokens": ["a"], "values": [1.0], **kw}),
    "memory_figure": lambda **kw: F.memory_figure(np.zeros((1, 1)), ["a"], ["b"], **kw),
    "template_figure": lambda **kw: F.template_figure(np.zeros((6, 2)), **kw),
    "compare_figure": lambda **kw: F.compare_figure({"position": [1], "prompted": [1.0]}, **kw),
    "training_curves_figure": lambda **kw: F.training_curves_figure({"step": [1], "main": [1.0]}, **kw),
    "explore": explorer_case,
    "Explorer": lambda **kw: W.Explorer(**{"model": CGT_T, "sequences": A.prepare_sequences(CGT_T, _DATA), **kw}),
    "Explorer.set_projection": lambda **kw: EXPLORER().set_projection(**{"method": "pca", **kw}),
    "Explorer.search": lambda **kw: EXPLORER().search("a", **kw),
    "Explorer.select_box": lambda **kw: EXPLORER().select_box(**{"x": (0, 1), "y": (0, 1), **kw}),
    "SmoothnessStrip": strip_case,
    "TemplateInspector": inspector_case,
    "CompileCompare": compare_case,
    "TrainingMonitor": W.TrainingMonitor,
    "TextMixture": text_case,
    "TextMixture.n_docs": lambda **kw: TEXT().n_docs(**kw),
    "TextMixture.get_batch": lambda **kw: TEXT().get_batch(**{"batch_size": 2, **kw}),
    "TextMixture.eval_batch": lambda **kw: TEXT().eval_batch(**{"k": 2, "batch_size": 2, **kw}),
    "CorpusBPE.train": lambda **kw: CorpusBPE.train(["a b c"], **kw),
}
# declared for views (issue 24, item 3): analysis entry points that now check once at their door
DECLARED.update({
    "template_ablation": lambda **kw: A.template_ablation(**{"model": CGT_T, "inputs": IDX, "targets": IDX,
                                                             "site": "2.attn_in", **kw}),
    "compare_losses": lambda **kw: A.compare_losses(**{"model": CGT_T, "inputs": IDX, "targets": IDX, "split": 3, **kw}),
    # the views now declare their model: their rows take it as a keyword too
    **{name: (lambda c: lambda **kw: c(**{"model": CGT_T, "data": _DATA, **kw}))(cls) for name, cls in VIEWS.items()},
})


# cgt_viz.lora_baseline (issue 39, B46): its entry points declare their arguments
@functools.lru_cache(None)
def _lb_case():
    return LB.icl_case(ICL, k=2, n_held_out=1, generator=torch.Generator().manual_seed(0))


_LB_ROWS = {"icl": {"summary": []}}
_LB_TIMES = {"update_s": 1.0, "ttft_s": 1.0, "per_token_s": 0.1, "ref_ttft_s": 1.0, "ref_per_token_s": 0.2}
LB_DECLARED = {
    "lora_rank": lambda **kw: LB.lora_rank(**{"model": CGT_ICL, **kw}),
    "lora_shapes": lambda **kw: LB.lora_shapes(**{"model": CGT_ICL, **kw}),
    "update_bytes": lambda **kw: LB.update_bytes(**{"model": CGT_ICL, **kw}),
    "compiled_factors": lambda **kw: LB.compiled_factors(**{"model": CGT_ICL, "prompt": _lb_case().prompt, **kw}),
    "random_factors": lambda **kw: LB.random_factors(**{"model": CGT_ICL, **kw}),
    "icl_case": lambda **kw: LB.icl_case(**{"task": ICL, "k": 2, "n_held_out": 1, **kw}),
    "text_case": lambda **kw: LB.text_case(**{"task": TEXT(), "k": 2, "n_samples": 1, **kw}),
    "train_lora": lambda **kw: LB.train_lora(**{"model": CGT_ICL, "data": _lb_case().make_train(CGT_ICL, _lb_case().prompt),
                                                "steps": (0,), **kw}),
    "run_case": lambda **kw: LB.run_case(**{"model": CGT_ICL, "case": _lb_case(), "steps": (0,), "timing_repeats": 1,
                                            **kw}),
    "compare_methods": lambda **kw: LB.compare_methods(**{"model": CGT_ICL, "cases": [_lb_case()], "steps": (0,),
                                                          "timing_repeats": 1, **kw}),
    "break_even_tokens": lambda **kw: LB.break_even_tokens(**{**_LB_TIMES, **kw}),
}
DECLARED.update(LB_DECLARED)
DECLARED["lora_compile_figure"] = lambda **kw: F.lora_compile_figure(**{"results": _LB_ROWS, **kw})   # its figure


# the pretrained-LM side and recipes (issue 39, B46): every hf entry point that declares its arguments
@functools.lru_cache(None)
def _comparison():
    """A small summarize_comparison result (random losses of four documents): what the figures and verdict read."""
    measure = _hf_mod("measure")
    gen = torch.Generator().manual_seed(0)
    losses = {c: torch.rand(4, generator=gen) for c in measure.CONDITIONS}
    return measure.summarize_comparison(losses, torch.arange(4), n_boot=20)


def _needles():
    """A hand-made Needles over the audit's windows (prompt 6, one scored position each): a valid `needles`."""
    mask = torch.zeros(6, 8, dtype=torch.bool)
    mask[:, 2] = True
    return _hf_mod("needle").Needles(_WINDOWS, _WINDOWS, _WIN_TOPICS, _WIN_DOCS, mask, mask, 6, [("Kolar", "Zupax")] * 6)


HF_DECLARED = {
    "BBCTokens": lambda **kw: _hf_mod("data").BBCTokens(**{"tokenizer": HFByteTokenizer(), "block_size": 16,
                                                           "source": _CORPUS.name, **kw}),
    "BBCTokens.get_batch": lambda **kw: BBC().get_batch(**{"batch_size": 2, **kw}),
    "BBCTokens.eval_batch": lambda **kw: BBC().eval_batch(**{"k": 4, "batch_size": 2, **kw}),
    "CGTLM.specialize": lambda **kw: CGTLM_().specialize(**{"prompt": _HF_IDX[0, :6], **kw}),
    "CGTLM.export_peft": lambda **kw: CGTLM_().export_peft(**{"prompt": _HF_IDX[0, :6], "path": _UNWRITTEN, **kw}),
    "CGTLM.save_pretrained": lambda **kw: CGTLM_().save_pretrained(**{"path": _UNWRITTEN, **kw}),
    "CGTLM.from_pretrained": lambda **kw: _hf().CGTLM.from_pretrained(**{"path": "/nonexistent/run", "lm": LM(), **kw}),
    "build_feature_cache": lambda **kw: _hf_mod("distill").build_feature_cache(**{
        "model": HEAD(), "tokens": _WINDOWS, "prefix_len": 6, "top_k": 7, "root": _UNWRITTEN, "progress": False, **kw}),
    "train_head": train_head_case,
    "evaluate_cache": lambda **kw: _hf_mod("distill").evaluate_cache(**{"model": HEAD(), "cache": FEATURES(), **kw}),
    "load_feature_cache": lambda **kw: _hf_mod("distill").load_feature_cache(**{"path": "/nonexistent/cache", **kw}),
    "cache_root": lambda **kw: _hf_mod("source").cache_root(**kw),
    "convert_gguf": lambda **kw: _hf_mod("source").convert_gguf(**{"gguf": "/nonexistent/model.gguf",
                                                                    "out": _UNWRITTEN, **kw}),
    "load_local": lambda **kw: _hf_mod("source").load_local(**{"path": "/nonexistent/model", **kw}),
    "export_hf": lambda **kw: _hf_mod("export").export_hf(**{"model": GPT_T, "path": _UNWRITTEN, **kw}),
    "export_hf_peft": lambda **kw: _hf_mod("export").export_hf_peft(**{"cgt": CGT_T, "prompt": IDX[0],
                                                                        "path": _UNWRITTEN, **kw}),
    "peft_lora_baseline": lambda **kw: _hf_mod("lora").peft_lora_baseline(**{
        "model": CGTLM_(), "prompt": _HF_IDX[0, :6], "steps": (0,), "n_samples": 1, "sample_len": 2, **kw}),
    "lm_compare_methods": compare_lm_case,
    "excerpt_summaries": lambda **kw: _hf_mod("measure").excerpt_summaries(**{"model": CGTLM_(), "task": BBC(),
                                                                              "length": 8, "per_topic": 1, **kw}),
    "continuation_losses": lambda **kw: _hf_mod("measure").continuation_losses(**{
        "model": CGTLM_(), "task": BBC(), "k": 4, "n_batches": 1, "batch_size": 2, **kw}),
    "window_losses": lambda **kw: _hf_mod("measure").window_losses(**{
        "model": CGTLM_(), "tokens": _WINDOWS, "prefix_len": 6, "topics": _WIN_TOPICS, "docs": _WIN_DOCS, **kw}),
    "prompt_token_positions": lambda **kw: _hf_mod("measure").prompt_token_positions(**{"tokens": _WINDOWS,
                                                                                        "prefix_len": 6, **kw}),
    "compile_comparison": lambda **kw: _hf_mod("measure").compile_comparison(**{
        "model": CGTLM_(), "task": _hf_mod("tiny").RandomWindows(), "prompt_lens": (4,), "suffix_len": 4, "draws": 1,
        "per_topic": 1, **kw}),
    "comparison_verdict": lambda **kw: _hf_mod("measure").comparison_verdict(**{"result": _comparison(), **kw}),
    **{name: (lambda name: lambda **kw: getattr(_hf_mod("measure"), name)(**{"results": {"p=4": _comparison()},
                                                                              **kw}))(name)
       for name in ("comparison_figure", "paired_differences_figure", "comparison_markdown")},
    "oracle_window_losses": oracle_case,
    "needle_windows": lambda **kw: _hf_mod("needle").needle_windows(**{"task": BBC(), "part": "train", "prefix_len": 6,
                                                                      "suffix_len": 6, **kw}),
    **{name: (lambda name: lambda **kw: getattr(_hf_mod("needle"), name)(**{"model": CGTLM_(), "needles": _needles(),
                                                                           **kw}))(name)
       for name in ("needle_losses", "needle_comparison")},
    "oracle_comparison": oracle_comparison_case,
}


@functools.lru_cache(None)
def _hf_objects() -> dict:
    """{name: object} defined in the hf modules: what an HF_DECLARED entry stands for."""
    return {name: obj for m in HF_MODULES for name, obj in vars(importlib.import_module(m)).items()
            if getattr(obj, "__module__", None) == m}


if HF_AVAILABLE:   # without the hf extra the hf modules are not audited (their rows would all be skips)
    DECLARED.update(HF_DECLARED)


def _declared(entry: str):
    """The function an entry name stands for: a class's constructor or method, or a function of a module."""
    head, _, meth = entry.partition(".")
    if head in LB_DECLARED:      # names the test module also uses for its own helpers (text_case)
        return getattr(LB, head)
    if entry in HF_DECLARED:     # the hf modules' own (train_head_case and the like are this module's helpers)
        obj = _hf_objects()[head]
        return getattr(obj, meth or "__init__") if inspect.isclass(obj) else obj
    obj = globals().get(head) or next(getattr(m, head) for m in (A, E, F, W) if hasattr(m, head))
    return getattr(obj, meth or "__init__") if inspect.isclass(obj) else obj


for _entry, _call in DECLARED.items():
    for _arg, _constraint in _declared(_entry).__contracts__.items():
        for _v in _constraint.bad_values():
            case(_entry, _arg, [_v], lambda v, a=_arg, c=_call: c(**{a: v}), shows=_constraint.shown(_v))


def test_every_declaration_names_parameters_of_its_function():
    """A declared constraint checks an argument the function takes (`checked` refuses others when it decorates;
    this holds the audit's view of the signature to the same)."""
    for entry in DECLARED:
        fn = _declared(entry)
        params = inspect.signature(fn).parameters
        assert fn.__contracts__ and set(fn.__contracts__) <= set(params), (entry, sorted(fn.__contracts__), list(params))


def test_allowed_words_need_a_message_that_says_what_is_allowed():
    for says in ("n must be >= 1, got 0", "generate needs a tokens-mode model", "need 14 positions; use k <= 5",
                 "method must be one of 'pca', 'umap'", "per-token labels need one label per token"):
        assert ALLOWED_WORDS.search(says), says
    for says_not in ("k=6 demonstrations need 14 positions, more than block_size = 12", "the only value was 3",
                     "use of x failed", "bad value for n: 0"):
        assert not ALLOWED_WORDS.search(says_not), says_not


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_argument_is_refused_with_a_clear_message(c: Case, tmp_path, capsys):
    try:
        out = c.call(c.value)
        if isinstance(out, InTmp):
            out = _in_tmp(out, tmp_path, capsys)
    except c.errors as err:
        msg = str(err)
    except Exception as err:  # noqa: BLE001 — the point of the audit: any other exception is a finding
        pytest.fail(f"{c.entry}({c.arg}={c.value!r}) raised {type(err).__name__}, not {c.errors}: {err}")
    else:
        pytest.fail(f"{c.entry} accepted {c.arg}={c.value!r} silently (returned {type(out).__name__})")
    assert c.arg.lstrip("-").replace("-", "_") in msg.replace("-", "_"), f"message does not name {c.arg}: {msg}"
    assert _shown(c) in msg, f"message does not show the value {_shown(c)!r}: {msg}"
    assert ALLOWED_WORDS.search(msg), f"message does not say what is allowed: {msg}"
    assert c.says is None or re.search(c.says, msg), f"message does not say {c.says!r}: {msg}"


def test_every_declared_entry_point_is_in_the_generated_audit():
    declared = set()
    for m in AUDITED_MODULES:
        for name, obj in vars(importlib.import_module(m)).items():
            if inspect.isclass(obj) and obj.__module__ == m:
                declared |= {name if meth == "__init__" else f"{name}.{meth}" for meth, fn in _members(obj).items()
                             if hasattr(getattr(fn, "__func__", fn), "__contracts__")}   # classmethods too
            elif hasattr(obj, "__contracts__") and getattr(obj, "__module__", None) == m:
                declared.add(name)
    assert declared and declared <= set(DECLARED), f"declared but not audited: {sorted(declared - set(DECLARED))}"
    assert all(CLI_FLAGS["--" + name] for name in FLAG_CONSTRAINTS), "a declared CLI flag without cases"


# ------------------------------------------------------------------------------------------ coverage
AUDITED_MODULES = ["cgt_viz.config", "cgt_viz.model", "cgt_viz.io", "cgt_viz.train", "cgt_viz.evaluate",
                   "cgt_viz.analysis", "cgt_viz.figures", "cgt_viz.tasks", "cgt_viz.tasks.icl",
                   "cgt_viz.tasks.regression", "cgt_viz.tasks.text", "cgt_viz.tasks.tokenizer",
                   "cgt_viz.widgets.explorer", "cgt_viz.widgets.smoothness", "cgt_viz.widgets.templates",
                   "cgt_viz.widgets.compare", "cgt_viz.widgets.monitor", "cgt_viz.geometry", "cgt_viz.lora_baseline",
                   "cgt_viz.oracle", "cgt_viz.recipes", "cgt_viz.steps"] + (HF_MODULES if HF_AVAILABLE else [])
NOT_AUDITED = {  # public names with arguments but no bad-argument cases here, and why
    **dict.fromkeys([f"{cls}.{verb}" for cls in ("TrainStep", "TaskStep", "CachedHeadStep", "FullBatchStep")
                     for verb in ("check_fits", "identity", "train_batch", "val_batches", "shard", "loss",
                                  "no_information_loss", "preflight")]
                    + ["TaskStep", "CachedHeadStep", "FullBatchStep", "Parameters", "check_batch", "class_name"],
                    "a training step's protocol, called by train (audited) with the model, batch sizes and device it "
                    "checked; a step's data is checked where it is made (the task, train_head), check_batch is a "
                    "checker itself"),
    "fit_factors": "the per-prompt LoRA's optimisation, an internal step of train_lora and peft_lora_baseline "
                   "(audited), fed the factors and objective they built",
    **dict.fromkeys(["head_checkpoint_run", "checkpoint_settings", "old_head_state", "refuse_old_head_state"],
                    "train-head's reading of its own checkpoint folder: train_head and the CLI (audited) pass the "
                    "folder they checked"),
    **dict.fromkeys(["best_of", "free_sites", "free_start", "oracle_pass", "factor_pairs", "FreeSite", "FreeSite.apply"],
                    "the oracles' optimiser and free update, called with tensors the oracle itself made"),
    "published_folder": "a writer's own temp and aside folders, made by the caller (checkpoint, feature cache)",
    **dict.fromkeys(["ByteTokenizer.token_str", "SyntheticICL.decode", "LinearRegression.decode", "TextMixture.decode",
                     "BBCTokens.decode", "BBCTokens.text",
                     "TextMixture.text", "hover_escape", "natural_key"], "a display helper: any token or value"),
    **dict.fromkeys(["CompileCompare.figure_for", "CompileCompare.token_figure_for",
                     "SmoothnessStrip.figure_for", "SmoothnessStrip.token_figure_for", "TemplateInspector.figure_for",
                     "TemplateInspector.token_figure_for", "TemplateInspector.set_data",
                     "SmoothnessStrip.set_data", "Explorer.static_figures",
                     "Explorer.figure_static", "TrainingMonitor.redraw"],
                    "the arguments of the view's audited constructor and methods (show, losses)"),
    **dict.fromkeys(["GPT.embed_inputs", "SyntheticICL.answer_token", "SyntheticICL.answer_value", "SyntheticICL.apply",
                     "SyntheticICL.novel_positions", "SyntheticICL.sample_params", "aux_length_groups", "lr_at",
                     "aux_weight_scale", "param_groups", "config_differences", "drawn_series", "gap_note",
                     "collect_points", "points_at", "thin", "Points", "Points.concat",
                     "Points.frame", "ByteTokenizer.encode_array", "is_validation_document", "fold_affine_ln_y",
                     "check_batch_size", "check_eval_size", "check_part", "TrainHistory", "PCA", "PCA.fit_transform",
                     "PCA.transform", "in_box", "in_polygon", "cosine_neighbours"],
                    "an internal step, fed arguments its audited caller has checked (or a checker itself)"),
    **dict.fromkeys(["evaluate", "save"], "train's evaluation and checkpoint write, fed the settings train() checked"),
    **dict.fromkeys(["atomic_write", "write_json", "read_json", "save_tensors", "load_tensors", "model_folder",
                     "check_weight_dtypes",
                     "sha256_file", "warn_non_finite"],
                    "internal I/O under save_pretrained/from_pretrained (tamper and fault cases: test_checkpoint)"),
    **dict.fromkeys(["colorbar", "ema", "heat_colors", "plotly_scale", "plural", "robust_range", "short_token",
                     "total_of", "format_seconds", "highlight_trace", "run_info", "TrainingMonitor.status_text",
                     "finish", "folder_artefacts", "check_artefact_folder", "with_added_fields"],
                    "an internal step of an audited view, save or load (its callers check the arguments; "
                    "tests/views/test_views_language.py, tests/faults/test_faults_files.py hold its behaviour)"),
    "LoraFactors": "the dict lora_factors returns, built from checked arguments",
    **dict.fromkeys(["factor_bytes", "merged_weights", "lora_logits", "merge", "teacher_outputs", "sample_continuations",
                     "sample_lm", "score", "median_gap", "summarize", "check_lora_results", "Continuations",
                     "PromptCase", "Checkpoint"],
                    "an internal step (or record) of lora_baseline's audited entry points (compare_methods, run_case, "
                    "train_lora, the cases): fed what they checked"),
    # the pretrained-LM side (issue 39, B46)
    **dict.fromkeys(["HFStream.base", "HFStream.caches", "HFStream.fan_in_fan_out", "HFStream.final_logits",
                     "HFStream.finish_merged", "HFStream.merged_logits", "HFStream.no_context", "HFStream.readout",
                     "HFStream.run", "HFStream.site_maps", "HFStream.widths", "HFStream.y_input", "NoContext",
                     "NoContext.forward", "hooks", "own_thread", "pass_lock", "upper_hidden"],
                    "the pretrained x stream's plumbing under CGTLM's audited entry points (forward, loss, context, "
                    "specialize, x_at_layer): fed the inputs and coefficients they checked"),
    **dict.fromkeys(["LMLayout", "SiteAt", "LMLayout.body_of", "LMLayout.embedding_of", "LMLayout.final_hidden",
                     "LMLayout.head_of", "LMLayout.layers_of", "LMLayout.peft_targets", "LMLayout.problems",
                     "LMLayout.site_module", "LMLayout.weight_name", "LMLayout.widths"],
                    "a family's declared module paths and their lookups, used on an LM that check_lm or layout_of "
                    "(audited) accepted; a layout with overlapping sites is refused where it is declared "
                    "(tests/hf/test_hf_layouts.py)"),
    **dict.fromkeys(["CGTLM.calibrate_memory", "CGTLM.peft_config", "CGTLM.teacher_pass", "causal_ema_skip_first", "causal_mean_skip_first",
                     "chunked_cross_entropy", "lm_facts", "check_cgtlm", "check_lm"],
                    "an internal step of CGTLM's audited entry points and of train-head (calibrate_memory runs on "
                    "the feature cache train_head was given), or a checker itself"),
    **dict.fromkeys(["CGT.memory_coeffs", "CGT.memory_slots", "CGT.memory_map", "HFStream.output_rows"],
                    "an internal step of the token memory's audited entry points (specialize, forward_compiled, "
                    "compiled_coeffs, prompt_factors, memory_reads, loss) and of the feature cache's losses, fed the "
                    "states and tokens they checked (tests/model/test_token_memory_gpt.py, "
                    "tests/hf/test_token_memory.py hold them)"),
    **dict.fromkeys(["CGTLM.load_state_dict", "CGTLM.state_dict", "CGTLM.train"],
                    "nn.Module's own API, overridden only to leave the frozen LM out"),
    **dict.fromkeys(["FeatureCache", "FeatureCache.batch", "cache_key", "compute_features", "lm_fingerprint",
                     "cached_loss", "uncached_loss", "trainable_parameters", "resume_differences"],
                    "an internal step (or record) of the feature cache and train_head (build_feature_cache, "
                    "load_feature_cache, train_head, evaluate_cache are audited): fed what they checked; "
                    "uncached_loss is the reference tests/training/test_distill.py holds cached_loss to"),
    **dict.fromkeys(["losses_at", "by_position", "document_interval", "summarize_comparison"],
                    "the statistics of compile_comparison and oracle_comparison (audited), fed the losses "
                    "window_losses computed"),
    **dict.fromkeys(["Needles", "word_runs", "corpus_words", "invent_word", "needle_in", "substitute", "needle_masks",
                     "summarize_needles"],
                    "an internal step (or record) of the needle probe's audited entry points (needle_windows, "
                    "needle_losses, needle_comparison), fed what they checked; tests/test_needle.py holds each on "
                    "hand-made cases"),
    **dict.fromkeys(["head_block_size", "document_parts"], "an internal step of BBCTokens and BBCTokens.for_head "
                    "(audited), fed the settings and documents they checked"),
    **dict.fromkeys(["check_exportable", "gpt2_config", "gpt2_module", "gpt2_state_dict"],
                    "an internal step of export_hf, export_hf_peft and to_transformers (audited; check_exportable is "
                    "their checker)"),
    **dict.fromkeys(["merged_lm", "peft_factors", "upper_logits", "prompt_windows"],
                    "an internal step of peft_lora_baseline and lm_compare_methods (audited), fed what they checked"),
    **dict.fromkeys(["main", "parse_args", "check_args", "check_out", "check_sizes", "head_settings", "init_from",
                     "run", "train_route"],
                    "train-head's command line (python -m cgt_viz train-head; train --task smollm2-bbc routes to "
                    "it): its flags are audited by the `cli train-head` cases (check_args), the rest are its steps"),
    **dict.fromkeys(["freeze", "plain_copy", "strip_remote_code", "write_manifest", "verify_cache", "require",
                     "refuse_remote_code"],
                    "an internal step of load_local, convert_gguf and smollm2 (audited); folder faults: "
                    "tests/faults/test_faults_files.py"),
    **dict.fromkeys(["RandomWindows", "RandomWindows.document_windows", "tiny_gpt2", "tiny_llama", "tiny_qwen2"],
                    "a fixture for tests and examples (a tiny random model, random windows): its sizes go to the "
                    "transformers config as given"),
    # names made public by issue 35 ("`_` means private"): shared internals other modules of the package call
    "gap_closed_unchecked": "gap_closed without its checks (audited), fed losses a measurement computed (evaluate's "
                            "rows, the LoRA baselines)",
    **dict.fromkeys(["check_weights_match", "config_from_saved", "safetensors_header", "check_memory_fits"],
                    "an internal step of CGT.from_pretrained and CGTLM.from_pretrained (audited; tamper and fault "
                    "cases: test_checkpoint, test_faults_files)"),
    **dict.fromkeys(["OnePrompt", "OnePrompt.check", "OnePrompt.shown", "distill_kl", "median_timed", "finite_median"],
                    "an internal step (or contract) of lora_baseline's and hf.lora's audited entry points: OnePrompt "
                    "is the `prompt` contract their cases exercise; the rest are fed what they checked"),
    **dict.fromkeys(["term_weights", "rgb_triplet"],
                    "an internal step of training_curves_figure, TrainingMonitor and colored_tokens_html (audited): "
                    "term_weights is their `weights` check, rgb_triplet converts the package's own colours"),
    **dict.fromkeys(["token_cross_entropy", "ensure_cache_folder"],
                    "an internal step of the hf measurements and caches (window_losses, lm_compare_methods, "
                    "smollm2, build_feature_cache: audited), fed what they checked"),
    **dict.fromkeys(["CGTLM.summary_of_pooled", "CGTLM.ybar_from_states"],
                    "a step of CGTLM's audited passes, public for the feature cache, the measures and the benchmarks: "
                    "fed what pooled_readout, lower_cache or the feature cache computed (tests/hf/test_hf.py and "
                    "tests/training/test_distill.py hold them to context())"),
    "load_corpus": "via TextMixture(source=...)",
    "task_from_config": "reads a saved config (test_tasks)", "Explorer.export": "a file path, written by pandas",
}


# mixins whose methods are the public methods of the class that uses them (the explorer's rooms)
MIXIN_MODULES = {"cgt_viz.widgets._selection", "cgt_viz.widgets._projections"}


def _members(cls) -> dict:
    """A class's own members and those it takes from mixins in MIXIN_MODULES."""
    members = {}
    for klass in reversed(cls.__mro__):
        if klass is cls or klass.__module__ in MIXIN_MODULES:
            members.update(vars(klass))
    return members


def _public_names() -> set[str]:
    names = set()
    for m in AUDITED_MODULES:
        mod = importlib.import_module(m)
        for name, obj in vars(mod).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != m:
                continue
            if inspect.isfunction(obj) and _takes_arguments(obj):
                names.add(name)
            elif inspect.isclass(obj) and not issubclass(obj, BaseException):
                if _takes_arguments(obj):
                    names.add(name)
                for meth, fn in _members(obj).items():
                    fn = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
                    if not meth.startswith("_") and inspect.isfunction(fn) and _takes_arguments(fn):
                        names.add(f"{name}.{meth}")
    return names


def _takes_arguments(fn) -> bool:
    """Whether there is an argument to feed a bad value (self and cls are not)."""
    return any(p not in ("self", "cls") for p in inspect.signature(fn).parameters)


def test_every_public_entry_point_is_audited():
    covered = {c.entry.split("[")[0].split(" ")[0] for c in CASES} | set(NOT_AUDITED)
    missing = sorted(n for n in _public_names() if n.replace("PretrainedMixin.", "CGT.") not in covered)  # inherited
    assert not missing, f"public entry points without audit cases (add cases or a reason in NOT_AUDITED): {missing}"
