"""Safe persistence: atomic writes (temp file + fsync + rename) and safetensors weights.

Loading never unpickles code: weights come from safetensors, metadata from JSON.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ._checks import Choice, Device, Folder, available_memory, checked, describe, refuse

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back), to give a file written through a temp
    file the permissions an ordinary new file would have."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call write(tmp_path) and move the result onto `path` in one rename.

    A crash mid-write leaves the previous file at `path` untouched (the temp file is removed).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:   # a read-only folder: name the file asked for, not mkstemp's random temp name
        raise _write_error(err, path) from None
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())   # mkstemp makes 0600; the file gets an ordinary file's permissions
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(err, (OSError, SafetensorError)):
            raise _write_error(err, path) from None
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


_OS_ERROR_CODE = re.compile(r"os error (\d+)")


def _write_error(err: BaseException, path: Path) -> OSError:
    """An error while writing `path` as an OSError naming `path` (the file asked for, not the temp file it was
    written to) with the OS's reason: safetensors reports a full disk (ENOSPC) or a file-size limit (EFBIG) as a
    SafetensorError whose text carries the OS error number; a plain write's OSError carries no file name."""
    code = getattr(err, "errno", None)
    if code is None and (found := _OS_ERROR_CODE.search(str(err))):
        code = int(found.group(1))
    if code is None:
        return OSError(f"could not write {str(path)!r}: {err}")
    return OSError(code, os.strerror(code), str(path))


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks (checkpoints, the model cache, feature caches)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    def _write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
    atomic_write(path, _write)


def _existing_file(path: str | os.PathLike, what: str = "file") -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {str(path)!r}")
    return path


def read_json(path: str | os.PathLike) -> Any:
    path = _existing_file(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{str(path)!r} is not UTF-8 text (byte {err.start} is {err.object[err.start:err.start + 1]!r}); "
                         f"a JSON file written by cgt_viz must be UTF-8 (truncated or tampered?)") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{str(path)!r} is not valid JSON (truncated or tampered?): {err}") from None
    except RecursionError:
        raise ValueError(f"{str(path)!r} nests JSON too deeply to read; cgt_viz never writes such a file "
                         f"(tampered?)") from None


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    # safetensors refuses shared or non-contiguous storage: give it private contiguous copies
    flat = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(flat, tmp, metadata=metadata))


def load_tensors(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    path = _existing_file(path, "weights file")
    return _read_safetensors(path, lambda name: load_file(name, device=str(device)))


def _read_safetensors(file: Path, read: Callable[[str], Any]) -> Any:
    """read(file name), a file safetensors cannot read named as damaged (not a bare SafetensorError). A file that
    vanished while it was read (a checkpoint rotated away: safetensors may then raise a RuntimeError) is a
    FileNotFoundError, which a reader of the latest checkpoint retries."""
    try:
        return read(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        if not file.exists():
            raise FileNotFoundError(errno.ENOENT, f"the safetensors file vanished while it was read ({err})",
                                    str(file)) from None
        raise ValueError(f"{str(file)!r} is not a readable safetensors file (truncated or tampered?): {err}") from None


def check_weights_match(file: Path, wrong: list[str], missing: list[str], unexpected: list[str], against: str,
                        hint: str) -> None:
    """ValueError naming how the weights in `file` differ from what `against` builds (shapes, missing, unexpected)."""
    if wrong or missing or unexpected:
        raise ValueError(f"the weights in {str(file)!r} do not match {against}: "
                         + "; ".join(filter(None, [f"shapes differ ({'; '.join(wrong[:3])})" if wrong else "",
                                                   f"missing {list(missing)[:5]}" if missing else "",
                                                   f"unexpected {list(unexpected)[:5]}" if unexpected else ""]))
                         + hint)


def config_from_saved(path: Path, saved: Any):
    """The CGTConfig of the model folder `path` from `saved`, the 'config' dict of its config.json; a dict lacking
    fields is refused with a ValueError (never silently given defaults)."""
    import dataclasses

    from .config import CGTConfig, with_added_fields
    if not isinstance(saved, dict):
        raise ValueError(f"{str(path / CONFIG_NAME)!r}: 'config' must be a dict of CGTConfig fields, got "
                         f"{describe(saved)}")
    fields = {f.name: f for f in dataclasses.fields(CGTConfig)}
    saved = with_added_fields(saved)   # saved before those fields existed
    missing = [n for n in fields if n not in saved]
    if missing:
        defaults = {n: (fields[n].default if fields[n].default is not dataclasses.MISSING else fields[n].default_factory())
                    for n in missing}
        raise ValueError(f"{str(path / CONFIG_NAME)!r} lacks the config fields {missing}; they are not filled in "
                         f"silently (they may change the model). If the model was saved before they existed, add "
                         f"them with the values it was trained with; this version's defaults are {defaults}")
    return CGTConfig.from_dict(saved, source=f"{str(path / CONFIG_NAME)!r}: config")


def safetensors_header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} from the safetensors header only (no tensor is read)."""
    from safetensors import safe_open
    if not file.is_file():
        raise FileNotFoundError(f"no weights file at {str(file)!r}")

    def read(name: str) -> dict[str, tuple[tuple[int, ...], str]]:
        with safe_open(name, framework="pt") as f:
            return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    return _read_safetensors(file, read)


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")    # safetensors' names of the dtypes a float weight may be stored in


def check_weight_dtypes(file: Path, header: dict, floats: Iterable[str]) -> None:
    """The tensors the model holds as floats (`floats`) must be stored as floats: int64, int32 or bool weights
    (a tampered or foreign file) would be cast silently by load_state_dict. ValueError naming them."""
    wrong = [f"{k} ({header[k][1]})" for k in floats if k in header and header[k][1] not in FLOAT_DTYPES]
    if wrong:
        raise ValueError(f"the weights in {str(file)!r} store float weights as other dtypes: {', '.join(wrong[:4])}"
                         f"{' ...' if len(wrong) > 4 else ''}; a cgt_viz save writes floats ({', '.join(FLOAT_DTYPES)})"
                         f" (tampered, or written by another tool?)")


def _check_sizes(path: Path, cfg: Any, header: dict) -> None:
    """Refuse sizes no file of this many numbers could hold, before any model is built (n_layer = 10**9 hangs)."""
    import dataclasses
    n_numbers = sum(math.prod(shape) for shape, _ in header.values())
    n_tensors = len(header)
    if cfg.n_layer > n_tensors:
        raise ValueError(f"{str(path / CONFIG_NAME)!r}: n_layer {cfg.n_layer} must be at most the {n_tensors} tensors "
                         f"in {WEIGHTS_NAME} (every block has weights); the config does not match the weights")
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and value > max(n_numbers, 1):
            raise ValueError(f"{str(path / CONFIG_NAME)!r}: {f.name} {value} must be at most the {n_numbers} numbers "
                             f"stored in {WEIGHTS_NAME}; the config does not match the weights")


def _available_memory() -> int | None:
    """Bytes of memory available to a new allocation (`_checks.available_memory`), or None."""
    return available_memory()


def check_memory_fits(path: Path, header: dict) -> None:
    """The weights in `header` ({name: (shape, dtype)}, safetensors_header) must fit the memory this machine has
    free, twice over (parameters plus the loaded state dict): else a ValueError naming `path`. Checked before
    anything is allocated."""
    sizes = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2}
    need = sum(math.prod(shape) * sizes.get(dtype, 1) for shape, dtype in header.values())
    free = _available_memory()
    if free is None:
        return
    if 2 * need > free:   # the model's parameters plus the loaded state dict
        raise ValueError(f"the model in {str(path)!r} needs about {2 * need / 2**30:.2f} GiB to load, but only "
                         f"{free / 2**30:.2f} GiB of memory is free; load it on a machine with more memory")


ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
PEFT_WRITER = "cgt_viz.export_peft"      # the safetensors metadata export_peft writes, to know its own weights


def _weights_metadata(file: Path) -> dict | None:
    """The metadata of a safetensors file's header (no tensor is read); None when it is not readable as one."""
    try:
        from safetensors import safe_open
        with safe_open(str(file), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception:   # noqa: BLE001 — any unreadable header is simply "not ours"
        return None


def _bare_weights(path: Path) -> dict[str, str]:
    """Weights with no config beside them: a save of ours that stopped between its two files (the weights carry
    our metadata: the same kind, which a save may finish), or another tool's files, which no save may replace."""
    found: dict[str, str] = {}
    if not (path / CONFIG_NAME).exists():
        weights = path / WEIGHTS_NAME
        if weights.exists():
            cls = (_weights_metadata(weights) or {}).get("model_class")
            if isinstance(cls, str) and cls:
                found[f"cgt_viz:{cls}"] = f"a cgt_viz {cls} model's {WEIGHTS_NAME} without its {CONFIG_NAME}"
            else:
                found["weights"] = f"a {WEIGHTS_NAME} with no {CONFIG_NAME} (not written by cgt_viz)"
        for name in ("pytorch_model.bin", "model.safetensors.index.json"):
            if (path / name).exists():
                found["weights"] = f"a {name} with no {CONFIG_NAME} (another tool's weights)"
    if not (path / ADAPTER_CONFIG_NAME).exists():
        adapter = path / ADAPTER_WEIGHTS_NAME
        if adapter.exists():
            if (_weights_metadata(adapter) or {}).get("written_by") == PEFT_WRITER:
                found["peft"] = f"a PEFT adapter's {ADAPTER_WEIGHTS_NAME} without its {ADAPTER_CONFIG_NAME}"
            else:
                found["adapter-weights"] = (f"an {ADAPTER_WEIGHTS_NAME} with no {ADAPTER_CONFIG_NAME} (not written "
                                            f"by cgt_viz)")
        if (path / "adapter_model.bin").exists():
            found["adapter-weights"] = f"an adapter_model.bin with no {ADAPTER_CONFIG_NAME} (another tool's adapter)"
    return found


def folder_artefacts(path: str | os.PathLike) -> dict[str, str]:
    """{kind: description} of what a folder already holds: a cgt_viz model ("cgt_viz:<model_class>"), a
    Hugging Face model ("hf"), a PEFT adapter ("peft"), a config.json of neither ("unknown"), or weights without
    their config: another tool's ("weights", "adapter-weights"), or ours from a save that did not finish (their
    kind, from the safetensors metadata). Empty when the folder holds none of them (or does not exist)."""
    path = Path(path)
    found: dict[str, str] = {}
    if (path / ADAPTER_CONFIG_NAME).exists():
        found["peft"] = f"a PEFT adapter ({ADAPTER_CONFIG_NAME})"
    config = path / CONFIG_NAME
    if config.exists():
        try:
            meta = json.loads(config.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            meta = None
        if isinstance(meta, dict) and isinstance(meta.get("model_class"), str) and "config" in meta:
            found[f"cgt_viz:{meta['model_class']}"] = (f"a cgt_viz {meta['model_class']} model ({CONFIG_NAME} with "
                                                       f"model_class {meta['model_class']!r})")
        elif isinstance(meta, dict) and "model_type" in meta:
            found["hf"] = f"a Hugging Face model ({CONFIG_NAME} with model_type {meta['model_type']!r})"
        else:
            found["unknown"] = f"a {CONFIG_NAME} of no kind cgt_viz knows (not a cgt_viz or Hugging Face model)"
    return {**found, **_bare_weights(path)}


def check_artefact_folder(path: Path, kind: str, writer: str, writes: str) -> None:
    """ValueError if `path` holds an artefact of another kind than `kind` (see folder_artefacts): one folder holds
    one kind, so a save never overwrites, or attaches itself to, another kind's files. The same kind may be re-saved."""
    other = [desc for k, desc in folder_artefacts(path).items() if k != kind]
    if other:
        raise refuse("path", f"a folder {writer} may write {writes} into (one folder holds one kind of artefact)",
                     f"{str(path)!r}, which holds {' and '.join(other)}",
                     hint="choose another folder (or remove those files first)")


def model_folder(path: Path, kind: str | None = None, writer: str = "save_pretrained", writes: str = "a model") -> Path:
    """The folder `save_pretrained` writes into (a path its caller declared `Folder(new=True)`), holding no
    artefact of another kind than `kind` (see check_artefact_folder)."""
    if kind is not None:
        check_artefact_folder(path, kind, writer, writes)
    path.mkdir(parents=True, exist_ok=True)
    return path


class PretrainedMixin:
    """save_pretrained / from_pretrained for GPT and CGT: a folder with config.json + model.safetensors."""

    config: Any

    @checked(path=Folder(new=True))
    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """Write the model into a folder: config.json + model.safetensors, read back by from_pretrained. (A GPT
        as a transformers GPT-2 that AutoModelForCausalLM opens: cgt_viz.hf.export_hf.)"""
        name = type(self).__name__
        path = model_folder(path, f"cgt_viz:{name}", f"{name}.save_pretrained", f"a cgt_viz {name} model")
        # weights first, config last: a folder with a config always has matching weights
        save_tensors(path / WEIGHTS_NAME, self.state_dict(), metadata={"model_class": type(self).__name__})
        write_json(path / CONFIG_NAME, {"model_class": type(self).__name__, "config": self.config.to_dict()})
        return path

    @classmethod
    @checked(path=Folder(), device=Device())
    def from_pretrained(cls, path: str | os.PathLike, device: str | torch.device = "cpu"):
        """Load a folder written by save_pretrained. config.json is checked against the safetensors header
        (shapes, and sizes no file this large could hold) before anything is built or allocated; a config
        lacking fields is refused; NaN/inf weights load with a RuntimeWarning naming them."""
        if not path.is_dir():
            raise FileNotFoundError(f"path must be a folder written by save_pretrained, got {str(path)!r}")
        meta = read_json(path / CONFIG_NAME)
        if not isinstance(meta, dict) or "config" not in meta or "model_class" not in meta:
            raise ValueError(f"{str(path / CONFIG_NAME)!r} lacks 'model_class'/'config'; not a cgt_viz model folder")
        if meta["model_class"] != cls.__name__:
            raise refuse("path", f"a {cls.__name__} for {cls.__name__}.from_pretrained", f"{str(path)!r}, which holds "
                         f"a {meta['model_class']}", hint=f"load it with {meta['model_class']}.from_pretrained",
                         verb="hold")
        cfg = config_from_saved(path, meta["config"])
        header = safetensors_header(path / WEIGHTS_NAME)
        _check_sizes(path, cfg, header)
        # the shapes the config implies, from a model on the meta device (no memory is allocated); loading
        # header-shaped meta tensors into it runs the model's own migrations of older checkpoints too
        with torch.device("meta"):
            skeleton = cls(cfg)
        check_weight_dtypes(path / WEIGHTS_NAME, header,
                            [k for k, v in skeleton.state_dict().items() if v.is_floating_point()])
        shaped = {k: torch.empty(shape, device="meta") for k, (shape, _) in header.items()}
        try:
            missing, unexpected = skeleton.load_state_dict(shaped, strict=False)
            wrong = []
        except RuntimeError as err:
            missing, unexpected = [], []
            wrong = [line.strip().replace("torch.Size", "").rstrip(".") for line in str(err).splitlines()
                     if "size mismatch" in line] or [str(err).splitlines()[0]]
        hint = "; the config must be the one saved with these weights"
        check_weights_match(path / WEIGHTS_NAME, wrong, missing, unexpected, "its config.json", hint)
        check_memory_fits(path, header)
        model = cls(cfg)
        state = load_tensors(path / WEIGHTS_NAME, device="cpu")
        missing, unexpected = model.load_state_dict(state, strict=False)
        check_weights_match(path / WEIGHTS_NAME, [], missing, unexpected, "its config.json", hint)
        warn_non_finite(state, path / WEIGHTS_NAME)
        return model.to(device)


def warn_non_finite(state: dict, file: Path) -> None:
    """A RuntimeWarning naming the tensors of a loaded state dict that hold NaN/inf (a run saved after it
    diverged): loading goes on, since the file is what the user asked for."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        warnings.warn(f"the weights in {str(file)!r} hold NaN/inf in {len(bad)} tensors "
                      f"({', '.join(bad[:4])}{', ...' if len(bad) > 4 else ''}): they were saved after the training "
                      f"diverged, and the model's outputs will be NaN", RuntimeWarning, stacklevel=3)


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


@contextlib.contextmanager
def published_folder(tmp: Path, final: Path, aside: Path):
    """The block fills the temp folder tmp; at its end tmp replaces final, whose old contents (if any) go to
    aside first and are removed only once the new folder is in place. On any failure tmp is removed, and an
    OSError about a file in it (a full disk) names that file in final instead: the temp folder is gone."""
    try:
        yield tmp
        if final.exists() or final.is_symlink():
            os.replace(final, aside)
            os.replace(tmp, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError) and err.filename and Path(err.filename).parent == tmp:
            raise OSError(err.errno, err.strerror, str(final / Path(err.filename).name)) from None
        raise
