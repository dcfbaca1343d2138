"""Passes over one CGTLM from two threads: the explorer's background collection beside a cell's specialize."""
import threading
from contextlib import contextmanager

import pytest
import torch

pytest.importorskip("transformers")
from cgt_viz import hf  # noqa: E402
from tests.helpers import randomize_templates  # noqa: E402


def _model():
    torch.manual_seed(0)
    model = hf.CGTLM(hf.tiny_llama(seed=0), y_layer=2, d_y=8, n_head_y=2, n_templates=3, template_rank=2)
    for block in model.y_blocks:          # y blocks that write, so ȳ depends on every lower layer's states
        for p in block.parameters():
            torch.nn.init.normal_(p, 0.0, 0.1)
    return randomize_templates(model).eval()


@contextmanager
def _paused_pass(model, target, name: str):
    """Run target() in a thread called name, stopped inside its pass over model.lm (after decoder layer 1, its
    own hooks registered) until the block ends or 3 s pass; yields the dict target's result lands in ("out")."""
    inside, done, result = threading.Event(), threading.Event(), {}

    def pause(module, args, out):
        if threading.current_thread().name == name and not inside.is_set():
            inside.set()
            done.wait(timeout=3)

    def run():
        with torch.no_grad():
            result["out"] = target()

    handle = model.lm.model.layers[0].register_forward_hook(pause)
    thread = threading.Thread(target=run, name=name)
    try:
        thread.start()
        assert inside.wait(timeout=10)
        yield result
    finally:
        done.set()
        thread.join(timeout=30)
        handle.remove()


def _foreground(model, prompt, inputs):
    with torch.no_grad():
        return model.specialize(prompt)(inputs).logits, model(inputs), model.x_only()(inputs)


def test_a_background_collection_and_a_foreground_specialize_give_the_numbers_of_one_after_the_other():
    model = _model()
    gen = torch.Generator().manual_seed(1)
    background_rows = torch.randint(0, 96, (6, 12), generator=gen)
    prompt, inputs = torch.randint(0, 96, (10,), generator=gen), torch.randint(0, 96, (2, 9), generator=gen)
    with torch.no_grad():
        alone = model.context(background_rows)
    foreground_alone = _foreground(model, prompt, inputs)
    with _paused_pass(model, lambda: model.context(background_rows), "collect") as result:
        foreground = _foreground(model, prompt, inputs)   # waits for the background pass: one pass at a time
    torch.testing.assert_close(result["out"], alone)
    for got, want in zip(foreground, foreground_alone):
        torch.testing.assert_close(got, want)
    assert len(model.lm.model.layers) == 4 and not any(
        m._forward_hooks or m._forward_pre_hooks for m in model.lm.modules())


def test_a_plain_lm_call_in_another_thread_runs_past_a_pass_in_progress():
    model = _model()
    inputs = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = model.lm(input_ids=inputs).logits
    with _paused_pass(model, lambda: model(inputs), "pass"), torch.no_grad():
        mine = model.lm(input_ids=inputs).logits   # the user's own call, outside cgt_viz: no lock, hooks inert
    torch.testing.assert_close(mine, plain)
