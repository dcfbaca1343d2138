"""Context distillation: the KL term, its top-k cache form, both families' aux objective, the feature cache."""
import json

import pytest
import torch

import cgt_viz
from cgt_viz.config import ADDED_FIELDS, CGTConfig
from cgt_viz.distill import aux_objective, distillation_loss, full_kl, teacher_topk, topk_kl
from helpers import ByteTokenizer, make_inputs, randomize_templates


def _logits(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


# ---------------------------------------------------------------------------------------------- the KL term
@pytest.mark.parametrize("k", [None, 11, 40])
def test_topk_plus_rest_equals_the_full_kl_when_k_covers_the_vocabulary(k):
    student, teacher = _logits((3, 5, 11), 0), _logits((3, 5, 11), 1)
    ids, logp = teacher_topk(teacher, k)
    assert ids.shape[-1] == 11 and logp.shape[-1] == 12
    torch.testing.assert_close(topk_kl(student, ids, logp), full_kl(student, teacher), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_topk_kl_is_a_lower_bound_of_the_full_kl_and_its_buckets_sum_to_one(k):
    student, teacher = _logits((4, 6, 13), 2), _logits((4, 6, 13), 3)
    ids, logp = teacher_topk(teacher, k)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(4, 6))
    part, full = topk_kl(student, ids, logp), full_kl(student, teacher)
    assert (part <= full + 1e-5).all() and (part > 0).all()


@pytest.mark.parametrize("k", [None, 2, 13])
def test_kl_is_zero_when_the_student_is_the_teacher_and_positive_otherwise(k):
    teacher = _logits((2, 4, 13), 4)
    assert distillation_loss("tokens", teacher.clone(), teacher, k).abs().max() < 1e-5
    # a constant shift of the logits is the same distribution
    assert distillation_loss("tokens", teacher + 7.0, teacher, k).abs().max() < 1e-4
    other = teacher.scatter_add(-1, teacher.argmax(-1, keepdim=True), torch.full((2, 4, 1), -2.0))  # the top token
    assert (distillation_loss("tokens", other, teacher, k) > 1e-4).all()


def test_vectors_distillation_is_the_gaussian_kl():
    s, t = _logits((2, 3, 4), 5), _logits((2, 3, 4), 6)
    torch.testing.assert_close(distillation_loss("vectors", s, t), 0.5 * (s - t).pow(2).sum(-1))


def test_the_teacher_gets_no_gradient():
    s, t = _logits((2, 3, 9), 7).requires_grad_(), _logits((2, 3, 9), 8).requires_grad_()
    distillation_loss("tokens", s, t, 4).sum().backward()
    assert t.grad is None and s.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- config
def test_aux_fields_migrate_and_refuse_an_aux_term_that_scores_nothing():
    assert {"aux_ce": 1.0, "aux_kl": 0.0, "aux_kl_top_k": None}.items() <= ADDED_FIELDS.items()
    with pytest.raises(ValueError, match="aux_ce and aux_kl must not both be 0"):
        CGTConfig(vocab_size=10, aux_ce=0.0, aux_kl=0.0)


# ---------------------------------------------------------------------------------------------- from-scratch CGT
def _cgt(**kw):
    torch.manual_seed(0)
    cfg = CGTConfig(vocab_size=23, block_size=16, n_layer=3, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=1, **kw)
    return randomize_templates(cgt_viz.CGT(cfg))


def test_cgt_aux_with_only_cross_entropy_is_unchanged_by_the_new_fields():
    a, b = _cgt(), _cgt(aux_ce=1.0, aux_kl=0.0, aux_kl_top_k=5)
    idx = make_inputs(a.config, b=4, t=16)
    la, lb = a.loss(idx, idx, split=7), b.loss(idx, idx, split=7)
    torch.testing.assert_close(la["aux"], lb["aux"])


def test_cgt_aux_kl_against_its_own_prompted_pass():
    """aux_kl alone: the KL of the specialised model on the suffix to the full mode at the same positions."""
    model = _cgt(aux_ce=0.0, aux_kl=1.0)
    model.eval()
    idx = make_inputs(model.config, b=3, t=16)
    aux = model.loss(idx, idx, split=6)["aux"]
    with torch.no_grad():
        teacher = model(idx)[:, 6:]
        student = model.aux_logits(idx, 6)
    torch.testing.assert_close(aux, full_kl(student, teacher).mean(), rtol=1e-4, atol=1e-6)
    mixed = _cgt(aux_ce=0.5, aux_kl=2.0)
    mixed.eval()
    ce = _cgt().eval().loss(idx, idx, split=6)["aux"]
    torch.testing.assert_close(mixed.loss(idx, idx, split=6)["aux"], 0.5 * ce + 2.0 * aux, rtol=1e-4, atol=1e-6)


def test_aux_objective_needs_a_teacher_when_it_distils():
    cfg = CGTConfig(vocab_size=10, aux_kl=1.0)
    with pytest.raises(ValueError, match="needs a teacher"):
        aux_objective(cfg, torch.zeros(3), torch.zeros(3, 10))


# ---------------------------------------------------------------------------------------------- the LM family
transformers = pytest.importorskip("transformers")
from cgt_viz import hf  # noqa: E402
from cgt_viz.hf import distill as hfd  # noqa: E402


@pytest.fixture(scope="module")
def lm():
    return hf.tiny_llama(seed=0)


def _head(lm, **kw):
    torch.manual_seed(0)
    kw = {"pooled_only": True, "aux_kl": 1.0, "aux_ce": 0.5, "aux_kl_top_k": 7, **kw}
    model = hf.CGTLM(lm, y_layer=2, d_y=8, n_head_y=2, n_templates=3, template_rank=2, **kw)
    return randomize_templates(model)


def _windows(n=6, length=6 + 8 + 1, seed=0, vocab=96):
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))


def test_pooled_only_head_has_no_y_blocks_and_the_cheap_summary_is_its_ybar(lm):
    model = _head(lm)
    assert len(model.y_blocks) == 0 and "y.1" not in model.cache_names()
    idx = _windows()[:, :9]
    torch.testing.assert_close(model.summary_of_pooled(model.pooled_readout(idx)), model.context(idx)[:, -1])


def test_the_short_pass_over_cached_states_is_the_specialised_lm(lm):
    model = _head(lm)
    idx = _windows()
    ybar = model.context(idx[:, :6])[:, -1]
    short = model._upper_hidden(model.x_at_layer(idx[:, 6:]), model._fixed_coeffs(ybar))
    full = model._hidden(idx[:, 6:], model._fixed_coeffs(ybar))[0]
    torch.testing.assert_close(short, full)
    assert len(model.lm.model.layers) == lm.config.num_hidden_layers   # the LM is whole again


def test_training_from_the_cache_and_without_it_give_the_same_gradients(lm, tmp_path):
    model = _head(lm)
    tokens = _windows()
    cache = hfd.build_feature_cache(model, tokens, 6, top_k=7, root=tmp_path, store_dtype="float32", progress=False)
    params = hfd.trainable_parameters(model)
    cached = cache_loss = hfd.cached_loss(model, cache.batch(torch.arange(len(tokens))))["aux"]
    direct = hfd.uncached_loss(model, tokens, 6, top_k=7)["aux"]
    torch.testing.assert_close(cache_loss, direct, rtol=1e-5, atol=1e-6)
    for g_c, g_d in zip(torch.autograd.grad(cached, params), torch.autograd.grad(direct, params)):
        torch.testing.assert_close(g_c, g_d, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in torch.autograd.grad(hfd.cached_loss(model, cache.batch(torch.arange(2)))["aux"],
                                                               params))


def test_a_whole_vocabulary_cache_stores_no_ids_and_gives_the_full_kl_gradients(lm, tmp_path):
    model = _head(lm, aux_kl_top_k=None)
    tokens = _windows()
    cache = hfd.build_feature_cache(model, tokens, 6, top_k=None, root=tmp_path, store_dtype="float32", progress=False)
    assert cache.tensors["teacher_ids"].shape == (6, 8, 0) and cache.tensors["teacher_logp"].shape == (6, 8, 97)
    params = hfd.trainable_parameters(model)
    cached = hfd.cached_loss(model, cache.batch(torch.arange(len(tokens))))["aux"]
    direct = hfd.uncached_loss(model, tokens, 6, top_k=None)["aux"]           # top-k with k = v: arange ids
    torch.testing.assert_close(cached, direct, rtol=1e-5, atol=1e-6)
    for g_c, g_d in zip(torch.autograd.grad(cached, params), torch.autograd.grad(direct, params)):
        torch.testing.assert_close(g_c, g_d, rtol=1e-4, atol=1e-6)
    # the model's config decides the objective: a top-7 head reads the whole-vocabulary cache as its top 7
    top7 = _head(lm)
    torch.testing.assert_close(hfd.cached_loss(top7, cache.batch(torch.arange(6)))["aux"],
                               hfd.uncached_loss(top7, tokens, 6, top_k=7)["aux"], rtol=1e-5, atol=1e-6)
    with torch.no_grad():    # the same head (seeded): the top-7 objective is a lower bound of the full one
        assert float(hfd.cached_loss(top7, cache.batch(torch.arange(6)))["aux"]) < float(
            hfd.cached_loss(_head(lm, aux_kl_top_k=None), cache.batch(torch.arange(6)))["aux"])


def test_cgtlm_loss_distils_to_the_lm_with_the_prefix_in_context(lm):
    """CGTLM.loss's aux term with aux_kl: the same objective as the cache path's, on the same split."""
    model = _head(lm, aux_ce=1.0, aux_kl=1.0, aux_kl_top_k=None, aux_min_prefix=6)
    model.eval()
    tokens = _windows(n=3)
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    aux = model.loss(idx, targets, split=6)["aux"]
    ref = hfd.uncached_loss(model, tokens, 6, top_k=None)["aux"]
    torch.testing.assert_close(aux, ref, rtol=1e-4, atol=1e-6)


def test_the_feature_cache_round_trips_and_a_changed_setting_builds_another(lm, tmp_path):
    model = _head(lm)
    tokens = _windows()
    topics, docs = torch.tensor([0, 0, 1, 1, 2, 2]), torch.arange(6)
    first = hfd.build_feature_cache(model, tokens, 6, top_k=7, topics=topics, docs=docs, root=tmp_path, progress=False)
    again = hfd.load_feature_cache(first.path)
    assert set(again.tensors) == set(first.tensors)
    for name, t in first.tensors.items():
        assert torch.equal(again.tensors[name], t), name
    assert torch.equal(again.tensors["topic"], topics) and again.tensors["suffix_x"].dtype == torch.float16
    same = hfd.build_feature_cache(model, tokens, 6, top_k=7, topics=topics, docs=docs, root=tmp_path, progress=False)
    assert same.path == first.path
    for change in ({"top_k": 5}, {"prefix_len": 5}):
        kw = {"top_k": 7, **change}
        other = hfd.build_feature_cache(model, tokens, kw.pop("prefix_len", 6), root=tmp_path, progress=False, **kw)
        assert other.path != first.path
    assert hfd.build_feature_cache(model, _windows(seed=1), 6, top_k=7, root=tmp_path, progress=False).path != first.path
    model2 = _head(hf.tiny_llama(seed=1))          # another LM's weights
    assert hfd.build_feature_cache(model2, tokens, 6, top_k=7, root=tmp_path, progress=False).path != first.path


def test_a_damaged_feature_cache_is_refused_by_name(lm, tmp_path):
    model = _head(lm)
    cache = hfd.build_feature_cache(model, _windows(), 6, top_k=7, root=tmp_path, progress=False)
    file = cache.path / hfd.FEATURES_NAME
    data = bytearray(file.read_bytes())
    data[-5] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged"):
        hfd.load_feature_cache(cache.path)
    file.write_bytes(bytes(data[:100]))
    with pytest.raises(ValueError, match="damaged"):
        hfd.build_feature_cache(model, _windows(), 6, top_k=7, root=tmp_path, progress=False)
    manifest = json.loads((cache.path / hfd.MANIFEST_NAME).read_text())
    (cache.path / hfd.MANIFEST_NAME).write_text(json.dumps({**manifest, "format": "pickle"}))
    with pytest.raises(ValueError, match="not a cgt_viz feature cache"):
        hfd.load_feature_cache(cache.path)


def test_training_on_the_cache_lowers_the_objective_and_the_head_round_trips(lm, tmp_path):
    model = _head(lm, aux_ce=1.0, aux_kl=1.0)
    cache = hfd.build_feature_cache(model, _windows(n=8), 6, top_k=7, root=tmp_path, progress=False)
    before = hfd.evaluate_cache(model, cache)["aux"]
    hist = hfd.train_head(model, cache, steps=30, batch_size=8, lr=1e-2, warmup=1, progress=False)
    after = hfd.evaluate_cache(model, cache)["aux"]
    assert after < before and hist["steps"] == 30
    model.save_pretrained(tmp_path / "head")
    back = hf.CGTLM.from_pretrained(tmp_path / "head", lm)
    assert back.pooled_only and back.config.aux_kl == 1.0 and back.config.aux_kl_top_k == 7
    assert hfd.evaluate_cache(back, cache)["aux"] == pytest.approx(after, rel=1e-5)


def test_window_losses_controls_use_other_documents(lm):
    from cgt_viz.hf.measure import summarize_comparison, window_losses
    model = _head(lm)
    tokens = _windows(n=8)
    topics, docs = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    losses = window_losses(model, tokens, 6, topics, docs, topic_means=torch.zeros(2, 8), batch_size=3)
    for name in ("prompted", "compiled", "other_doc", "same_topic", "other_topic", "topic_mean", "no_context"):
        assert losses[name].shape == (8,) and torch.isfinite(losses[name]).all(), name
    # compiled is the specialised model with the window's own ȳ
    ybar = model.context(tokens[:1, :6])[:, -1]
    with torch.no_grad():
        own = model.forward_specialized(tokens[:1, 6:14], ybar)
    ce = torch.nn.functional.cross_entropy(own[0], tokens[0, 7:])
    assert float(losses["compiled"][0]) == pytest.approx(float(ce), rel=1e-5)
    res = summarize_comparison(losses, docs, n_boot=50)
    assert res["n_documents"] == 4 and res["G"]["ci95"][0] <= res["G"]["ci95"][1]


def test_a_test_part_leaves_the_validation_documents_as_they_were():
    from cgt_viz.hf.data import document_parts
    from cgt_viz.tasks.text import is_validation_document
    names = [f"{i:03d}.txt" for i in range(40)]
    val = is_validation_document("tech", names, 0.2)
    parts = document_parts("tech", names, 0.2, 0.1)
    assert [p == "val" for p in parts] == val
    assert parts.count("test") == 4 and parts.count("train") == 28
    assert document_parts("tech", names, 0.2, 0.0) == ["val" if v else "train" for v in val]
    assert document_parts("tech", names[:3], 0.2, 0.5).count("train") >= 1   # at least one stays for training



def test_a_heads_task_keeps_its_parts_where_another_block_size_moves_them(tmp_path):
    from cgt_viz.hf.data import BBCTokens
    for t in range(2):                              # documents of 20..59 bytes: the block size decides which are kept
        (tmp_path / f"topic{t}").mkdir()
        for d in range(40):
            (tmp_path / f"topic{t}" / f"d{d:02d}.txt").write_text("x" * (20 + d))
    settings = {"eval_prompts": [16], "prefix": 8, "suffix": 8, "val_fraction": 0.2, "test_fraction": 0.2}
    head = BBCTokens.for_head(ByteTokenizer(), settings, source=tmp_path)
    assert head.block_size == 16 + 8 + 1
    same = BBCTokens(ByteTokenizer(), block_size=25, source=tmp_path, val_fraction=0.2, test_fraction=0.2)
    assert same.doc_part == head.doc_part and same.doc_names == head.doc_names
    shorter = BBCTokens(ByteTokenizer(), block_size=17, source=tmp_path, val_fraction=0.2, test_fraction=0.2)
    part_of = dict(zip(shorter.doc_names, shorter.doc_part))
    moved = [n for n, p in zip(head.doc_names, head.doc_part) if part_of[n] != p]
    assert moved                                            # why a head's task must be built with for_head

def test_an_interrupted_head_training_resumes_to_the_uninterrupted_weights(lm, tmp_path):
    tokens = _windows(n=8)
    straight = _head(lm, aux_ce=1.0, aux_kl=1.0)
    cache = hfd.build_feature_cache(straight, tokens, 6, top_k=7, root=tmp_path, progress=False)
    hfd.train_head(straight, cache, steps=6, batch_size=3, warmup=2, progress=False)

    def stop_at_3(step, out):
        if step == 3:
            raise KeyboardInterrupt

    again = _head(lm, aux_ce=1.0, aux_kl=1.0)
    hist = hfd.train_head(again, cache, steps=6, batch_size=3, warmup=2, checkpoint_dir=tmp_path / "ckpt",
                          checkpoint_every=100, callback=stop_at_3, progress=False)
    assert hist["interrupted"] and hist["steps"] == 3
    fresh = _head(lm, aux_ce=1.0, aux_kl=1.0)
    hist = hfd.train_head(fresh, cache, steps=6, batch_size=3, warmup=2, checkpoint_dir=tmp_path / "ckpt",
                          resume=True, progress=False)
    assert hist["steps"] == 6 and not hist["interrupted"] and len(hist["aux"]) == 6
    for (name, a), b in zip(straight.state_dict().items(), fresh.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_prompt_token_positions_are_the_targets_the_prompt_holds_and_the_continuation_has_not_shown():
    from cgt_viz.hf.measure import prompt_token_positions
    #              prompt      | continuation: inputs 5 9 7 1, targets 9 7 1 2
    tokens = torch.tensor([[1, 2, 3, 4, 5, 9, 7, 1, 2],
                           [1, 2, 3, 4, 5, 5, 1, 1, 6]])
    mask = prompt_token_positions(tokens, 4)
    # row 0: 9 new, 7 new, 1 in the prompt and unseen, 2 in the prompt and unseen
    # row 1: 5 in the prompt but already read as the first continuation input, 1 unseen, 1 now seen, 6 new
    assert mask.tolist() == [[False, False, True, True], [False, True, False, False]]
    with pytest.raises(ValueError, match="prefix_len"):
        prompt_token_positions(tokens, 8)


def test_g_split_by_prompt_token_positions_is_the_hand_computed_one():
    from cgt_viz.hf.measure import by_position, losses_at, summarize_comparison
    docs = torch.tensor([0, 1])
    mask = torch.tensor([[True, False, False, True], [False, True, False, False]])
    none = torch.full((2, 4), 4.0)
    prompted = torch.tensor([[1.0, 3.0, 3.0, 2.0], [3.5, 2.0, 3.0, 3.0]])
    compiled = torch.tensor([[2.5, 3.5, 3.5, 3.5], [4.0, 3.0, 3.5, 3.5]])
    losses = {"no_context": none, "prompted": prompted, "compiled": compiled}
    split = by_position(losses, mask, docs, n_boot=20)
    # prompt tokens: doc 0 mean of positions 0, 3; doc 1 position 1
    gap = ((4 - 1.5) + (4 - 2.0)) / 2
    own = ((4 - 3.0) + (4 - 3.0)) / 2
    assert split["prompt_token"]["G"]["value"] == pytest.approx(own / gap)
    rest_gap = ((4 - 3.0) + (4 - (3.5 + 3 + 3) / 3)) / 2
    rest_own = ((4 - 3.5) + (4 - (4.0 + 3.5 + 3.5) / 3)) / 2
    assert split["rest"]["G"]["value"] == pytest.approx(rest_own / rest_gap)
    assert split["fraction_prompt_token"] == pytest.approx(3 / 8)
    gain = (4 - prompted)
    assert split["gain_share_prompt_token"] == pytest.approx(float((gain * mask).sum() / gain.sum()))
    # a window without a prompt-token position counts as missing, not as zero
    assert torch.isnan(losses_at(losses, torch.zeros(2, 4, dtype=torch.bool))["compiled"]).all()
    # the positions' split and the whole agree when the mask holds everywhere
    whole = summarize_comparison({c: v.mean(1) for c, v in losses.items()}, docs, n_boot=20)
    everywhere = by_position(losses, torch.ones(2, 4, dtype=torch.bool), docs, n_boot=20)["prompt_token"]
    assert everywhere["G"]["value"] == pytest.approx(whole["G"]["value"])


def test_per_position_window_losses_average_to_the_window_losses(lm):
    from cgt_viz.hf.measure import window_losses
    model = _head(lm)
    tokens = _windows(n=4)
    topics, docs = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2, 3])
    whole = window_losses(model, tokens, 6, topics, docs, batch_size=3)
    per = window_losses(model, tokens, 6, topics, docs, batch_size=3, per_position=True)
    for name, v in whole.items():
        assert per[name].shape == (4, 8)
        torch.testing.assert_close(per[name].mean(1), v, equal_nan=True, msg=name)


def test_the_verdict_reads_the_interval_and_the_figure_shows_every_condition():
    from cgt_viz.hf.measure import (CONDITIONS, comparison_figure, comparison_verdict, paired_differences_figure,
                                    summarize_comparison)
    docs = torch.arange(6).repeat_interleave(2)
    base = torch.linspace(3.0, 3.5, 12)
    losses = {"prompted": base - 1, "no_context": base, "compiled": base - 0.5, "other_doc": base - 0.2,
              "same_topic": base - 0.3, "other_topic": base - 0.1, "topic_mean": base - 0.25}
    res = summarize_comparison(losses, docs, n_boot=200)
    assert res["G"]["value"] == pytest.approx(0.5) and res["G_other_doc"]["value"] == pytest.approx(0.2)
    line = comparison_verdict(res)
    assert line.startswith("the compiled prompt is specific to its document: it beats its topic's mean ȳ; "
                           "own − other = -0.300")
    assert "own − topic mean = -0.250" in line and "own − same-topic document = -0.200" in line
    losses_topic = {**losses, "topic_mean": losses["compiled"] + torch.tensor([0.02, -0.02] * 6)}
    assert comparison_verdict(summarize_comparison(losses_topic, docs, n_boot=200)).startswith(
        "the compiled prompt carries its topic: it beats another document, not its topic's mean ȳ")
    worse = {**losses, "other_doc": losses["compiled"] - 0.1}
    assert comparison_verdict(summarize_comparison(worse, docs, n_boot=200)).startswith(
        "the compiled prompt is worse than another document's")
    losses["compiled"] = losses["other_doc"] + torch.tensor([0.05, -0.05] * 6)
    assert comparison_verdict(summarize_comparison(losses, docs, n_boot=200)).startswith(
        "the compiled prompt is not shown to carry its prompt")
    res = summarize_comparison({**losses, "compiled": base - 0.5}, docs, n_boot=200)
    paired = paired_differences_figure({"p=64": res, "p=128": res})
    assert len(paired.data) == 2 and list(paired.data[0].y) == pytest.approx([-0.3, -0.2, -0.25])
    assert paired.data[0].error_y.array is not None
    fig = comparison_figure({"p=64": res})
    assert len(fig.data) == 1 and len(fig.data[0].x) == len(CONDITIONS)
    assert fig.layout.yaxis.title.text and fig.data[0].error_y.array is not None


def test_a_control_without_candidates_is_named_not_a_nan_warning():
    import warnings
    from cgt_viz.hf.measure import comparison_markdown, summarize_comparison
    docs = torch.arange(3)
    losses = {"prompted": torch.ones(3), "no_context": torch.full((3,), 3.0), "compiled": torch.full((3,), 2.0),
              "other_doc": torch.full((3,), 2.5), "same_topic": torch.full((3,), float("nan")),
              "other_topic": torch.full((3,), 2.6), "topic_mean": torch.full((3,), 2.4)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = summarize_comparison(losses, docs, n_boot=20)
    assert res["conditions_without_data"] == ["same_topic"] and "G_same_topic" not in res
    assert "| — |" in comparison_markdown({"p=8": res})
