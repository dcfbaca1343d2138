"""Models and inputs on different devices (issue 7: "a model moved between devices").

No GPU is needed for most of this: PyTorch's "meta" device is a real second device (tensors with shapes
and no data), so a model moved there must run every entry point on meta inputs without creating a tensor
on the CPU internally (e.g. a torch.arange without device=). Its refusal of CPU inputs, saying where to
move them, is a block of rows in tests/faults/test_audit.py. The CUDA round trip at the end runs only where CUDA exists.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cgt_viz import CGT, GPT, CGTConfig

META = torch.device("meta")


def small(**kw) -> CGTConfig:
    base = dict(vocab_size=16, block_size=12, n_layer=3, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                n_templates=2, sites=("attn_in", "attn_out", "mlp_in", "mlp_out"))
    return CGTConfig(**{**base, **kw})


@pytest.fixture(params=["post", "pre"])
def meta_cgt(request):
    torch.manual_seed(0)
    return CGT(small(y_reads=request.param, smooth="vae", w_smooth=0.1)).to(META)


def test_every_model_entry_point_runs_on_another_device(meta_cgt):
    model = meta_cgt
    idx = torch.zeros(2, 8, dtype=torch.long, device=META)
    assert model.device == META
    outs = {"forward": model(idx), "context": model.context(idx), "x_only": model.x_only()(idx),
            "aux_logits": model.aux_logits(idx, 3),
            "forward_specialized": model.forward_specialized(idx, torch.zeros(2, 8, device=META))}
    logits, cache = model.run_with_cache(idx)
    outs.update({f"cache {k}": v for k, v in cache.items()})
    model.train()
    outs.update({f"loss {k}": v for k, v in model.loss(idx, idx).items()})           # sampled splits
    outs.update({f"loss@3 {k}": v for k, v in model.loss(idx, idx, split=3).items()})
    model.eval()
    gpt = model.specialize(idx[0, :4])
    outs["specialised"] = gpt(idx)
    outs.update({f"lora {k}": a for k, (a, _) in model.lora_factors(torch.zeros(8, device=META)).items()})
    assert all(v.device == META for v in outs.values()), [k for k, v in outs.items() if v.device != META]
    assert outs["forward"].shape == (2, 8, 16) and outs["context"].shape == (2, 8, 8)
    assert all(p.device == META for p in gpt.parameters())


def test_a_plain_gpt_runs_on_another_device():
    gpt = GPT(small()).to(META)
    assert gpt(torch.zeros(1, 4, dtype=torch.long, device=META)).device == META


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_round_trip_gives_the_cpu_answer():
    torch.manual_seed(0)
    model = CGT(small()).eval()
    idx = torch.randint(0, 16, (2, 8))
    ref = model(idx)
    spec_ref = model.specialize(idx[0, :4])(idx)
    model.cuda()
    torch.testing.assert_close(model(idx.cuda()).cpu(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.specialize(idx[0, :4].cuda())(idx.cuda()).cpu(), spec_ref, atol=1e-4, rtol=1e-4)
    model.cpu()
    torch.testing.assert_close(model(idx), ref, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- views of a model that moved
def viewed_model():
    torch.manual_seed(0)
    cfg = CGTConfig(vocab_size=256, block_size=32, n_layer=3, d_x=16, n_head=2, d_y=8, n_head_y=1, y_layer=1,
                    n_templates=2)
    return CGT(cfg).eval(), torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_views_keep_working_after_the_model_moves_to_another_dtype(dtype):
    from cgt_viz import CompileCompare, TemplateInspector, explore
    from cgt_viz import analysis as A
    model, data = viewed_model()
    explorer, inspector = explore(model, data, background=None), TemplateInspector(model, data)
    ybar32 = A.collect_ybar(model, data)
    coeffs32 = A.site_coefficients(model, ybar32[0], "2.attn_in")
    model.to(dtype)                                   # after the views were built
    explorer.open_point(3)                            # builds the linked strip + inspector on the moved model
    inspector.show(sequence=1, token=2)
    ablation = inspector.ablate()
    CompileCompare(model, data).show(sequence=0)
    explorer.add(data[:1])
    assert explorer.inspector is not None and len(explorer.points) == 4 * 12   # 3 + 1 sequences of 12 tokens
    tol = 1e-5 if dtype == torch.float64 else 5e-2
    np.testing.assert_allclose(A.collect_ybar(model, data), ybar32, atol=tol * 10, rtol=tol * 10)
    np.testing.assert_allclose(A.site_coefficients(model, ybar32[0], "2.attn_in"), coeffs32, atol=tol, rtol=tol)
    assert all(np.isfinite(v).all() for v in ablation.values() if isinstance(v, np.ndarray))


def test_a_model_moved_to_the_meta_device_is_refused_clearly_and_the_view_stays_usable():
    from cgt_viz import explore
    from cgt_viz import analysis as A
    model, data = viewed_model()
    explorer = explore(model, data, background=None)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model.to(META)
    with pytest.raises(ValueError, match="meta device"):
        explorer.open_point(3)
    with pytest.raises(ValueError, match="meta device"):
        A.collect_ybar(model, data)
    assert explorer.strip is None and explorer.inspector is None   # nothing half-built
    model.to_empty(device="cpu").load_state_dict(state)             # back with its weights
    explorer.open_point(3)
    assert explorer.strip is not None and explorer.inspector is not None


# ------------------------------------------------------------------------------- bf16 autocast without a GPU
@pytest.mark.parametrize("shift,readout", [("none", "stream"), ("pair", "ema")])
def test_bf16_autocast_on_cpu_matches_fp32_and_specialises_in_fp32(shift, readout):
    """The dtype mixing of the CUDA bf16 path (fp32 weights, bf16 matmuls), run under CPU autocast: losses
    and gradients match fp32 to bf16 precision, and specialize keeps the merged weights in float32."""
    torch.manual_seed(0)
    model = CGT(small(vocab_size=64, block_size=32, d_x=32, d_y=16, n_head_y=2, n_templates=3, token_shift=shift,
                      y_readout=readout, w_smooth=0.1))
    idx, tgt = (torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(s)) for s in (1, 2))

    def loss_and_grads(amp: bool):
        model.zero_grad()
        torch.manual_seed(5)                              # the same aux splits both times
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            losses = model.loss(idx, tgt)
        losses["total"].backward()
        return {k: float(v.detach()) for k, v in losses.items()}, {n: p.grad.clone() for n, p in model.named_parameters()
                                                          if p.grad is not None}

    (ref, ref_g), (got, got_g) = loss_and_grads(False), loss_and_grads(True)
    assert ref.keys() == got.keys()
    for k in ref:
        assert got[k] == pytest.approx(ref[k], rel=2e-2, abs=2e-2), k
    assert ref_g.keys() == got_g.keys()
    for n, g in ref_g.items():
        assert torch.isfinite(got_g[n]).all(), n
        cos = torch.nn.functional.cosine_similarity(g.flatten(), got_g[n].flatten(), dim=0)
        assert g.norm() < 1e-6 or cos > 0.97, (n, float(cos))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        spec = model.specialize(idx[0, :16])
        compiled = spec(idx[:1, 16:]).float()
        unmerged = model.forward_specialized(idx[:1, 16:], model.context(idx[:1, :16])[0, -1]).float()
    assert all(p.dtype == torch.float32 for p in spec.parameters())
    torch.testing.assert_close(compiled, unmerged, atol=0.1, rtol=0.05)
