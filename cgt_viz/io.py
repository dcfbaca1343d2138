"""Safe persistence: atomic writes (temp file + fsync + rename) and safetensors weights.

Loading never unpickles code: weights come from safetensors, metadata from JSON.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ._checks import check_device, describe

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call write(tmp_path) and move the result onto `path` in one rename.

    A crash mid-write leaves the previous file at `path` untouched (the temp file is removed).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def write_json(path: str | os.PathLike, obj: Any) -> None:
    def _write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
    atomic_write(path, _write)


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file at {str(path)!r}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{str(path)!r} is not valid JSON (truncated or tampered?): {err}") from None


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    # safetensors refuses shared or non-contiguous storage: give it private contiguous copies
    flat = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(flat, tmp, metadata=metadata))


def load_tensors(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file at {str(path)!r}")
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{str(path)!r} is not a readable safetensors file (truncated or tampered?): {err}") from None


class PretrainedMixin:
    """save_pretrained / from_pretrained for GPT and CGT: a folder with config.json + model.safetensors."""

    config: Any

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike folder, got {describe(path)}")
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"path must be a directory (or not exist yet), got the file {str(path)!r}")
        path.mkdir(parents=True, exist_ok=True)
        # weights first, config last: a folder with a config always has matching weights
        save_tensors(path / WEIGHTS_NAME, self.state_dict(), metadata={"model_class": type(self).__name__})
        write_json(path / CONFIG_NAME, {"model_class": type(self).__name__, "config": self.config.to_dict()})
        return path

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str | torch.device = "cpu"):
        from .config import CGTConfig

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike folder, got {describe(path)}")
        device = check_device("device", device)
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"path must be a folder written by save_pretrained, got {str(path)!r}")
        meta = read_json(path / CONFIG_NAME)
        if not isinstance(meta, dict) or "config" not in meta or "model_class" not in meta:
            raise ValueError(f"{str(path / CONFIG_NAME)!r} lacks 'model_class'/'config'; not a cgt_viz model folder")
        if meta["model_class"] != cls.__name__:
            raise ValueError(f"path must hold a {cls.__name__} for {cls.__name__}.from_pretrained, but {str(path)!r} "
                             f"holds a {meta['model_class']}; load it with {meta['model_class']}.from_pretrained")
        model = cls(CGTConfig.from_dict(meta["config"]))
        state = load_tensors(path / WEIGHTS_NAME, device="cpu")
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"weights in {str(path)!r} do not match the config: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        return model.to(device)


def fold_affine_ln_y(module, state_dict, prefix, *args) -> None:
    """Load-time migration of CGT checkpoints written when LN_y had a gain g and bias β: fold them into every
    coefficient map, exactly: A (g ⊙ ŷ + β) + b = (A diag g) ŷ + (A β + b)."""
    gain = state_dict.pop(prefix + "ln_y.weight", None)
    shift = state_dict.pop(prefix + "ln_y.bias", None)
    if gain is None and shift is None:
        return
    for key in [k for k in state_dict if k.startswith(prefix + "templates.") and k.endswith(".coeff.weight")]:
        weight, bias_key = state_dict[key], key[:-len("weight")] + "bias"
        if shift is not None:
            state_dict[bias_key] = state_dict[bias_key] + weight @ shift
        if gain is not None:
            state_dict[key] = weight * gain
