"""A from-scratch cgt_viz `GPT` as a `transformers` GPT-2: the plain baseline, `cgt.x_only()` or a compiled CGT
(`cgt.specialize(prompt)`), opened by `AutoModelForCausalLM.from_pretrained(folder)` with the same logits.

    from cgt_viz.hf import export_hf, to_transformers
    export_hf(cgt.specialize(prompt), "compiled/")     # a folder AutoModelForCausalLM opens
    lm = to_transformers(baseline)                     # the same model in memory, a GPT2LMHeadModel
    export_hf(cgt.x_only(), "base/"); export_hf_peft(cgt, prompt, "adapter/")   # the prompt as a LoRA adapter

The block is GPT-2's: learned positions, pre-LN LayerNorm, a fused q/k/v map, exact (erf) GELU. What differs
is only the storage: GPT-2's `Conv1D` keeps a map's weight as (in, out), an `nn.Linear` as (out, in), so each
block weight is transposed; a model without biases gets zero biases (GPT-2 always has them: the same function);
the output head is cgt_viz's own matrix, untied from the embeddings unless it is the same tensor. What GPT-2
cannot express is refused by the config field's name: vectors mode (input_dim) and a token shift.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn as nn

from .._checks import Folder, checked, describe, refuse
from ..contracts import Model
from ..io import CONFIG_NAME, model_folder

# a block's nn.Linear maps, stored transposed by GPT-2's Conv1D
_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
# what transformers' save_pretrained writes for a GPT-2 (config.json last: a folder with a config has its weights)
_WRITTEN_LAST = CONFIG_NAME


def check_exportable(model, name: str = "model"):
    """`model` if it is a cgt_viz GPT that GPT-2 can express; otherwise an error naming what it cannot."""
    from ..model import CGT, GPT
    if isinstance(model, CGT):
        raise refuse(name, "a cgt_viz GPT (a CGT's y stream and templates have no GPT-2 form)", "a CGT", TypeError,
                     hint="export the compiled model cgt.specialize(prompt), or cgt.x_only() (no context)")
    if not isinstance(model, GPT):
        hint = ("a model over a pretrained LM is a transformers model already: use its own save_pretrained"
                if isinstance(model, nn.Module) and hasattr(model, "config") and hasattr(model.config, "model_type")
                else "")
        raise refuse(name, "a cgt_viz GPT", describe(model), TypeError, hint=hint)
    cfg = model.config
    if cfg.mode != "tokens":
        raise refuse("config.input_dim", "None for a GPT-2 export (GPT-2 embeds token ids; vectors mode has no "
                     "GPT-2 form)", f"input_dim={cfg.input_dim}")
    if cfg.token_shift != "none":
        raise refuse("config.token_shift", "'none' for a GPT-2 export (GPT-2 has no token-shift embedding)",
                     repr(cfg.token_shift))
    return model


def gpt2_config(model):
    """The transformers GPT2Config of a cgt_viz GPT (checked by check_exportable)."""
    from transformers import GPT2Config
    cfg = model.config
    eps = {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}
    if len(eps) != 1:   # cgt_viz builds every LayerNorm alike; GPT-2 has one epsilon for all of them
        raise refuse("model", "a GPT whose LayerNorms share one eps", f"eps {sorted(eps)}")
    tied = model.head.weight is model.embed.weight
    return GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.d_x, n_layer=cfg.n_layer,
        n_head=cfg.n_head, n_inner=cfg.mlp_ratio * cfg.d_x, activation_function="gelu",   # F.gelu is the erf GELU
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=eps.pop(),
        scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
        tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        dtype=str(model.head.weight.dtype).removeprefix("torch."))


def gpt2_state_dict(model) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel's state dict holding a cgt_viz GPT's weights (Conv1D maps transposed, absent biases 0)."""
    own = model.state_dict()
    out = {"transformer.wte.weight": own["embed.weight"], "transformer.wpe.weight": own["wpe.weight"],
           "lm_head.weight": own["head.weight"]}

    def norm(src: str, dst: str) -> None:
        weight = own[f"{src}.weight"]
        out[f"{dst}.weight"] = weight
        out[f"{dst}.bias"] = own.get(f"{src}.bias", torch.zeros_like(weight))

    for i in range(model.config.n_layer):
        for ln in ("ln_1", "ln_2"):
            norm(f"blocks.{i}.{ln}", f"transformer.h.{i}.{ln}")
        for conv in _CONV1D:
            weight = own[f"blocks.{i}.{conv}.weight"]                       # (out, in)
            out[f"transformer.h.{i}.{conv}.weight"] = weight.t().contiguous()
            out[f"transformer.h.{i}.{conv}.bias"] = own.get(f"blocks.{i}.{conv}.bias", weight.new_zeros(weight.shape[0]))
    norm("ln_f", "transformer.ln_f")
    return {k: v.detach() for k, v in out.items()}


@torch.no_grad()
def to_transformers(model):
    """A cgt_viz GPT -> a transformers GPT2LMHeadModel with the same logits (a copy, in eval mode, on the
    GPT's device and dtype). Refuses, by name, a CGT and the config fields GPT-2 has no form for."""
    from transformers import GPT2LMHeadModel
    check_exportable(model)
    weight = model.head.weight
    lm = GPT2LMHeadModel(gpt2_config(model)).to(device=weight.device, dtype=weight.dtype)
    state = gpt2_state_dict(model)
    missing, unexpected = lm.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if lm.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:   # a transformers release that names GPT-2's weights otherwise
        raise RuntimeError(f"GPT2LMHeadModel's weights are not named as cgt_viz expects: missing "
                           f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}")
    return lm.eval()


def _check_gpt2_folder(path: Path) -> None:
    """A folder holding a transformers model of another type (a Llama) is another model's, not one to export into:
    refused in check_artefact_folder's words. A GPT-2 folder may be written again, as every saver re-saves its kind."""
    from ..io import folder_artefacts, read_json
    found = folder_artefacts(path)
    if "hf" in found and read_json(path / CONFIG_NAME).get("model_type") != "gpt2":
        raise refuse("path", "a folder export_hf may write a transformers GPT-2 model into (one folder holds one "
                     "model)", f"{str(path)!r}, which holds {found['hf']}",
                     hint="choose another folder (or remove those files first)")


@checked(path=Folder(new=True))
def export_hf(model, path: str | os.PathLike) -> Path:
    """Write a cgt_viz GPT as a transformers GPT-2 folder (config.json + model.safetensors, written by
    transformers' own GPT2LMHeadModel.save_pretrained) that AutoModelForCausalLM.from_pretrained opens with the
    same logits. The folder may hold no artefact of another kind (a cgt_viz model, a PEFT adapter); the files are
    written beside it first and moved in, config.json last. Returns the folder."""
    check_exportable(model)
    _check_gpt2_folder(path)
    path = model_folder(path, "hf", "export_hf", "a transformers GPT-2 model")
    lm = to_transformers(model)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        lm.save_pretrained(str(staging))
        names = sorted((p.name for p in staging.iterdir()), key=lambda n: n == _WRITTEN_LAST)
        for name in names:
            os.replace(staging / name, path / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def gpt2_module(name: str) -> str:
    """A cgt_viz GPT map's name ("blocks.2.attn.c_attn.weight" or without ".weight") -> its GPT2LMHeadModel
    module ("transformer.h.2.attn.c_attn")."""
    name = name.removesuffix(".weight")
    return "transformer.h." + name[len("blocks."):]


@torch.no_grad()
@checked(cgt=Model(), path=Folder(new=True))
def export_hf_peft(cgt, prompt: torch.Tensor, path: str | os.PathLike) -> Path:
    """A from-scratch CGT's compiled prompt as a PEFT LoRA adapter folder (adapter_config.json +
    adapter_model.safetensors) over the GPT-2 that export_hf writes for cgt.x_only() (GPT-2's Conv1D maps:
    fan_in_fan_out): `PeftModel.from_pretrained(base, path)` then gives cgt.specialize(prompt)'s logits, as
    CGTLM.export_peft does for a pretrained LM. The CGT is not modified. Returns the folder."""
    import peft

    from ..io import check_artefact_folder, save_tensors
    check_exportable(cgt.gpt, "cgt's x stream")
    path = Path(path)
    check_artefact_folder(path, "peft", "export_hf_peft", "a PEFT adapter")
    ybar = cgt.prompt_summary(prompt)
    tensors, modules = {}, []
    for name, (lora_a, lora_b) in cgt.lora_factors(ybar).items():
        module = gpt2_module(name)
        modules.append(module)
        tensors[f"base_model.model.{module}.lora_A.weight"] = lora_a
        tensors[f"base_model.model.{module}.lora_B.weight"] = lora_b
    rank = cgt.config.n_templates * cgt.config.template_rank
    # the modules by their full names: attn.c_proj and mlp.c_proj share a last name, and only the sites'
    # maps of the modulated layers carry the prompt
    config = peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, bias="none", target_modules=modules,
                             fan_in_fan_out=True, task_type="CAUSAL_LM")
    path.mkdir(parents=True, exist_ok=True)
    save_tensors(path / "adapter_model.safetensors", tensors, metadata={"format": "pt"})
    config.save_pretrained(str(path))
    return path
