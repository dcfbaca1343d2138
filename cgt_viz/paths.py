"""Where the files shipped with the repository are, wherever Python runs from.

A notebook's kernel runs in notebooks/ (`make lab`), a script or the README's blocks usually in the
repository root, a test in a temporary folder: a path such as "data/models/text-bbc5" typed relative to the
working folder works in one of them only. `shipped_path` resolves it against the repository instead:

    CGT.from_pretrained(shipped_path("data/models/text-bbc5"))
"""
from __future__ import annotations

import os
from pathlib import Path

from ._checks import describe, refuse

REPOSITORY = Path(__file__).resolve().parent.parent   # cgt_viz/ sits in the repository root


def shipped_path(relative: str | os.PathLike = "") -> Path:
    """The absolute path of `relative`, a file or folder shipped with the repository, spelled as the repository
    spells it ("data/models/smollm2-bbc-head", "benchmarks/results/lora_vs_compile.json"); "" is the
    repository itself. The shipped models and results come with a clone (installed with `pip install -e .`),
    not with a wheel: a missing one is a FileNotFoundError that says which and why."""
    if not isinstance(relative, (str, os.PathLike)):
        raise refuse("relative", "a path relative to the repository root, e.g. 'data/models/text-bbc5'",
                     describe(relative), TypeError)
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts:
        raise refuse("relative", "a path inside the repository, relative to its root (no leading / and no ..)",
                     repr(str(relative)), hint="an absolute path needs no shipped_path: use it as it is")
    path = REPOSITORY / rel
    if not (REPOSITORY / "pyproject.toml").is_file():     # a wheel: the package without the repository around it
        raise FileNotFoundError(f"shipped_path({str(relative)!r}): cgt_viz is installed without its repository "
                                f"({str(REPOSITORY)!r} is not a clone); the shipped models and results come with a "
                                f"clone of the repository installed with pip install -e .")
    if not path.exists():
        raise FileNotFoundError(f"relative {str(relative)!r} must name a file or folder shipped with cgt_viz, "
                                f"got {str(path)!r}, which does not exist in this clone")
    return path
