"""The recipe of each built-in task: what its notebook trains, and what `python -m cgt_viz train --task NAME`
uses by default (flags override any of it). docs/results.md measures these recipes.

    task    task constructor arguments          model       CGTConfig fields (beside the task's own)
    train   TrainConfig fields                  curriculum  updates of the task's curriculum: regression's live
                                                            dimensions grow from 1; icl's share of pure shifts
                                                            falls from 1

A recipe has a name: the task's own (RECIPES) or a variant's (VARIANTS: "regression-dim16", "icl-value-affine"),
a named change on top of its task's recipe. `recipe_for(task, args)` applies, as the default, every variant whose
selecting task arguments all match (`variants_selected`); `recipe_for(task, args, recipe=NAME)` takes that one
recipe instead, matching or not (`python -m cgt_viz train --recipe NAME`):

    recipe_for("regression", {"dim": 16})                  # the regression recipe with regression-dim16 on top
    recipe_for("regression", recipe="regression-dim16")    # the same, chosen by name
    recipe_for("regression", {"dim": 16}, recipe="regression")   # the plain regression recipe, on dim 16
"""
from __future__ import annotations

import copy
from typing import Any

_SMALL = dict(n_layer=4, d_x=64, n_head=4, d_y=32, n_head_y=2, y_layer=2, n_templates=16, template_rank=1)

RECIPES: dict[str, dict[str, Any]] = {
    # 13 pairs a sequence: prompts of up to 12 demonstrations and a query fit, and notebook 01 trains the CGT and
    # its baseline within minutes on a 2-core CPU (benchmarks/bench_notebook01.py)
    "icl": {"task": dict(n_pairs=13), "model": dict(_SMALL, sites=("attn_in", "mlp_in")),
            "train": dict(steps=2000, batch_size=32, lr=1e-3, aux_delay=500, aux_ramp=250)},
    "regression": {"task": dict(dim=4, n_points=16, noise=0.1),
                   "model": dict(_SMALL, sites=("attn_in", "attn_out", "mlp_in", "mlp_out")),
                   "train": dict(steps=3000, batch_size=32, lr=1e-3, aux_delay=500, aux_ramp=250),
                   "curriculum": 1000},
    "text": {"task": {}, "model": dict(n_layer=4, d_x=128, n_head=4, d_y=64, n_head_y=2, y_layer=2, n_templates=8,
                                       template_rank=2),
             "train": dict(steps=1500, batch_size=32, lr=1e-3)},
}

# name -> {"task": the task whose recipe it changes, "when": the task arguments that select it by default,
#          "change": what it changes, in sections as in RECIPES}
VARIANTS: dict[str, dict[str, Any]] = {
    # ȳ must carry 16 numbers: the dimensions grow over most of the run and the auxiliary loss is on from
    # the first update, while few are live and its signal is strong (docs/results.md, "Levers": it compiles
    # part of the prompt, where the dim-4 recipe compiles none of it, and prompting loses some accuracy)
    "regression-dim16": {"task": "regression", "when": dict(dim=16),
                         "change": {"task": dict(dim=16, n_points=32), "train": dict(aux_delay=0, aux_ramp=250),
                                    "curriculum": 2500}},
    # value answers of the affine family: first pure shifts (which compile), then the whole family, with
    # auxiliary splits that keep at least 4 pairs in the prefix and end before a query it has not shown, so
    # the auxiliary loss asks for the function rather than a copy (docs/results.md, "Levers")
    "icl-value-affine": {"task": "icl", "when": dict(answer_tokens="value", family="affine"),
                         "change": {"task": dict(answer_tokens="value", family="affine", aux_min_pairs=4,
                                                 novel_split=True, n_pairs=20),
                                    "train": dict(steps=16000), "curriculum": 3000}},
}
RECIPE_NAMES = (*RECIPES, *VARIANTS)     # what recipe_for's `recipe` (the CLI's --recipe) accepts


def recipe_task(recipe: str) -> str:
    """The task a recipe name (one of RECIPE_NAMES) is for: a task's own recipe is named after it, a variant names
    its task."""
    _check_name(recipe)
    return VARIANTS[recipe]["task"] if recipe in VARIANTS else recipe


def _check_name(recipe: Any) -> None:
    from ._checks import describe, refuse

    if not isinstance(recipe, str) or recipe not in RECIPE_NAMES:
        raise refuse("recipe", f"one of {', '.join(RECIPE_NAMES)}", describe(recipe),
                     TypeError if not isinstance(recipe, str) else ValueError)


def _check_task(task: Any) -> None:
    from ._checks import describe, refuse

    if not isinstance(task, str):   # any name: a task of one's own ("module:Class") has no recipe, so {} comes back
        raise refuse("task", f"a task name (a str: one of {sorted(RECIPES)}, or another task's name)", describe(task),
                     TypeError)


def _built_with(task: str, recipe: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """The arguments the task will be built with: these, then the recipe's task fields, then the task's defaults."""
    import inspect

    from .tasks import TASKS

    defaults = ({name: p.default for name, p in inspect.signature(TASKS[task]).parameters.items()
                 if p.default is not inspect.Parameter.empty} if task in TASKS else {})
    return {**defaults, **recipe.get("task", {}), **args}


def _apply(recipe: dict[str, Any], change: dict[str, Any]) -> None:
    """A variant's change on the recipe, section by section: its task, model and train fields update the
    recipe's; its curriculum replaces it."""
    for section, fields in change.items():
        recipe[section] = {**recipe.get(section, {}), **fields} if isinstance(fields, dict) else fields


def variants_selected(task: str, args: dict[str, Any] | None = None) -> list[str]:
    """The names of the variants `recipe_for(task, args)` applies by default, in order: those whose selecting
    arguments ("when") all match the arguments the task will be built with."""
    from ._checks import check_dict

    _check_task(task)
    args = {} if args is None else check_dict("args", args, "None or a dict of the task's constructor arguments")
    recipe = copy.deepcopy(RECIPES.get(task, {}))
    names = []
    for name, variant in VARIANTS.items():
        if variant["task"] != task:
            continue
        built = _built_with(task, recipe, args)     # after the variants before it, as recipe_for applies them
        if all(built.get(key) == value for key, value in variant["when"].items()):
            _apply(recipe, variant["change"])
            names.append(name)
    return names


def recipe_for(task: str, args: dict[str, Any] | None = None, recipe: str | None = None) -> dict[str, Any]:
    """The recipe of `task` built with these constructor arguments (empty for a task without one).

    recipe None (the default): RECIPES[task] with each variant the arguments select applied (`variants_selected`).
    recipe NAME (one of RECIPE_NAMES, a recipe of this task): that recipe alone, the task's own or its own with
    that variant on top, whatever the arguments; a name that is not a recipe, or one of another task, is refused."""
    from ._checks import check_dict, refuse

    _check_task(task)
    args = {} if args is None else check_dict("args", args, "None or a dict of the task's constructor arguments")
    if recipe is None:
        chosen = variants_selected(task, args)
    else:
        _check_name(recipe)
        if recipe_task(recipe) != task:
            own = [name for name in RECIPE_NAMES if recipe_task(name) == task]
            raise refuse("recipe", f"a recipe of task {task!r} ({', '.join(own) if own else 'it has none'})",
                         f"{recipe!r}, a recipe of task {recipe_task(recipe)!r}")
        chosen = [recipe] if recipe in VARIANTS else []
    out = copy.deepcopy(RECIPES.get(task, {}))
    for name in chosen:
        _apply(out, VARIANTS[name]["change"])
    return out
