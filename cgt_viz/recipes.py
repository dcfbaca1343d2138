"""The recipe of each built-in task: what its notebook trains, and what `python -m cgt_viz train --task NAME`
uses by default (flags override any of it). docs/results.md measures these recipes.

    task    task constructor arguments          model       CGTConfig fields (beside the task's own)
    train   TrainConfig fields                  curriculum  updates of the task's curriculum: regression's live
                                                            dimensions grow from 1; icl's share of pure shifts
                                                            falls from 1

A task's arguments can call for another recipe: VARIANTS lists, per task, the arguments that select one and
what it changes. `recipe_for(task, args)` applies every variant whose arguments all match, in order:

    recipe_for("regression", {"dim": 16})       # the regression recipe with the 16-number variant on top
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

# task -> [(the arguments that select the variant, what it changes: sections as in RECIPES)]
VARIANTS: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {
    "regression": [
        # ȳ must carry 16 numbers: the dimensions grow over most of the run and the auxiliary loss is on from
        # the first update, while few are live and its signal is strong (docs/results.md, "Levers": it compiles
        # part of the prompt, where the dim-4 recipe compiles none of it, and prompting loses some accuracy)
        (dict(dim=16), {"task": dict(dim=16, n_points=32), "train": dict(aux_delay=0, aux_ramp=250),
                        "curriculum": 2500}),
    ],
    "icl": [
        # value answers of the affine family: first pure shifts (which compile), then the whole family, with
        # auxiliary splits that keep at least 4 pairs in the prefix and end before a query it has not shown, so
        # the auxiliary loss asks for the function rather than a copy (docs/results.md, "Levers")
        (dict(answer_tokens="value", family="affine"),
         {"task": dict(answer_tokens="value", family="affine", aux_min_pairs=4, novel_split=True, n_pairs=20),
          "train": dict(steps=16000), "curriculum": 3000}),
    ],
}


def recipe_for(task: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """The recipe of `task` built with these constructor arguments: RECIPES[task] (empty for a task without one)
    with each matching variant applied, section by section (its task, model and train fields update the
    recipe's; its curriculum replaces it). A variant matches the arguments the task will be built with: these,
    then the recipe's task fields, then the task's own defaults."""
    import inspect

    from ._checks import check_dict, describe, refuse
    from .tasks import TASKS

    if not isinstance(task, str):   # any name: a task of one's own ("module:Class") has no recipe, so {} comes back
        raise refuse("task", f"a task name (a str: one of {sorted(RECIPES)}, or another task's name)", describe(task),
                     TypeError)
    args = {} if args is None else check_dict("args", args, "None or a dict of the task's constructor arguments")
    recipe = copy.deepcopy(RECIPES.get(task, {}))
    defaults = ({name: p.default for name, p in inspect.signature(TASKS[task]).parameters.items()
                 if p.default is not inspect.Parameter.empty} if task in TASKS else {})
    for when, change in VARIANTS.get(task, []):
        merged = {**defaults, **recipe.get("task", {}), **args}   # the arguments the task will be built with
        if all(merged.get(key) == value for key, value in when.items()):
            for section, fields in change.items():
                recipe[section] = {**recipe.get(section, {}), **fields} if isinstance(fields, dict) else fields
    return recipe
