"""CGT over a frozen pretrained Hugging Face LM (needs the hf extra: pip install "cgt_viz[hf]").

    from cgt_viz import hf
    lm, tok = hf.smollm2()                                   # offline; a safetensors cache after the first call
    model = hf.CGTLM(lm, y_layer=8, d_y=64, n_head_y=4, n_templates=8, template_rank=2)
    spec = model.specialize(prompt_ids)                      # a LlamaForCausalLM with the prompt compiled in
    model.export_peft(prompt_ids, "adapter/")                # the same as a PEFT LoRA adapter
    export_hf(gpt, "gpt2/")                                  # a from-scratch cgt_viz GPT as a transformers GPT-2
    residual_departures(base, compiled, prompt, rest)        # nnsight-wrapped models: where the compiled prompt acts
"""
from .source import HF_EXTRA, cache_root, convert_gguf, load_local, smollm2, smollm2_gguf

__all__ = ["CGTLM", "BBCTokens", "tiny_llama", "tiny_qwen2", "tiny_gpt2", "smollm2", "load_local", "convert_gguf", "cache_root",
           "smollm2_gguf", "HF_EXTRA", "chunked_cross_entropy", "export_hf", "export_hf_peft", "to_transformers",
           "residual_stream", "residual_departures", "departure_figure"]


def __getattr__(name):
    # transformers is imported only when a model is asked for, so `from cgt_viz import hf` is cheap
    if name in ("CGTLM", "chunked_cross_entropy", "SITE_MODULES", "SUPPORTED_MODEL_TYPES", "check_lm", "lm_facts"):
        from . import model
        return getattr(model, name)
    if name in ("export_hf", "export_hf_peft", "to_transformers"):
        from . import export
        return getattr(export, name)
    if name in ("residual_stream", "residual_departures", "departure_figure"):
        from . import interp
        return getattr(interp, name)
    if name == "BBCTokens":
        from .data import BBCTokens
        return BBCTokens
    if name in ("tiny_llama", "tiny_qwen2", "tiny_gpt2"):
        from . import tiny
        return getattr(tiny, name)
    raise AttributeError(f"module 'cgt_viz.hf' has no attribute {name!r}")
