"""Compile and compare: per-position loss of the prompted model, the specialized one (ȳ frozen at the
split s, prompt dropped) and the model with no context, with the topic boundary marked.

    cmp = CompileCompare(model, task_or_batch, split=32)      # the slider moves s
    cmp = CompileCompare(model, batch, lora={"icl": lora_baseline.compare_methods(model, cases)})   # + LoRA plot
"""
from __future__ import annotations

import ipywidgets as W
import numpy as np

from .. import analysis as A
from .._checks import Height, check_int, checked, refuse
from ..contracts import Model, check_targets
from ..figures import compare_figure, lora_compile_figure, token_text_figure
from ..lora_baseline import check_lora_results
from ._base import boundary_of, figure_widget, html_status, replace_figure, sequences_of
from ._static import StaticForm

ALL = "all"   # the sequence picker's value for "mean over all sequences" (None means the same when constructing)


class CompileCompare(StaticForm, W.VBox):
    """A split slider, a sequence picker (one or the mean of all), and `compare_figure`."""

    static_slots = 3          # the comparison, one sequence's tokens, the LoRA plot

    @checked(model=Model(), height=Height())
    def __init__(self, model, data, labels=None, *, split: int | None = None, sequence: int | str | None = None,
                 boundary=None, height: int = 420, lora=None, **prepare_kw):
        """split: s, the prefix length (default: half the median excerpt boundary, else t // 2);
        sequence: one row to show, or None / "all" for the mean over all rows; lora: results of
        `lora_baseline.compare_methods` (or {task name: results}) drawn below as quality against update time."""
        self.model, self.height = model, height
        self.seqs = sequences_of(model, data, labels, boundary, **prepare_kw)
        t = self.seqs.t
        if t < 2:
            raise refuse("data", "sequences of at least 2 positions to split", f"t = {t}", verb="have")
        self.targets, self.loss_mask = self.seqs.scoring(model.config.mode)
        # checked once here: every split and sequence below scores these rows unchecked
        check_targets(model.config, self.seqs.inputs, self.targets, self.loss_mask, inputs_name="data")
        self.loss_mask = None if self.loss_mask is None else self.loss_mask.bool()
        self.no_context = model.x_only()          # T = I, no prompt: made once, reused for every split
        self._cache: dict[tuple[int, int], dict] = {}
        if split is None:
            bounds = [b for b in (boundary_of(self.seqs, i) for i in range(self.seqs.n)) if b is not None]
            split = max(1, int(np.median(bounds)) // 2) if bounds else t // 2
        self.split = self._check_split(split)
        self.sequence = ALL if sequence is None else self._check_sequence(sequence)
        self.figure = figure_widget(self.figure_for())
        self.slider = W.IntSlider(value=self.split, min=1, max=t - 1, description="split s", continuous_update=False,
                                  layout=W.Layout(width="420px"))
        options = [("all sequences (mean)", ALL)] + [(f"sequence {i}", i) for i in range(self.seqs.n)]
        self.picker = W.Dropdown(options=options, value=self.sequence, description="show",
                                 layout=W.Layout(width="260px"))
        self.status = W.HTML(html_status("prompted: full CGT with the prefix in context · specialized: ȳ of the "
                                         "prefix frozen into the weights, suffix alone · no-context: x-only, suffix alone"))
        self.slider.observe(lambda ch: self.show(split=ch["new"]), names="value")
        self.picker.observe(lambda ch: self.show(sequence=ch["new"]), names="value")
        # quality against update time of the compile and its alternatives: fixed data, so drawn once
        self._lora_fig = None if lora is None else lora_compile_figure(check_lora_results(lora))
        self.lora_figure = None if lora is None else figure_widget(self._lora_fig)
        super().__init__([W.HBox([self.slider, self.picker]), self.status, self.figure]
                         + ([] if self.lora_figure is None else [self.lora_figure]))

    def _check_split(self, split) -> int:
        return check_int("split", split, 1, self.seqs.t - 1, hint=" (prefix and suffix non-empty)")

    def _check_sequence(self, sequence) -> int | str:
        if isinstance(sequence, str) and sequence == ALL:
            return ALL
        return check_int("sequence", sequence, 0, self.seqs.n - 1, hint=f" (or {ALL!r} for the mean of all)")

    def losses(self, split: int | None = None, sequence: int | str | None = None) -> dict:
        """analysis.compare_losses for one split over all sequences (sequence="all") or one; cached.
        None keeps the current split / sequence."""
        split = self.split if split is None else self._check_split(split)
        seq = self.sequence if sequence is None else self._check_sequence(sequence)
        key = (split, seq)
        if key not in self._cache:
            rows = slice(None) if seq == ALL else slice(seq, seq + 1)
            self._cache[key] = A._compare_losses(self.model, self.seqs.inputs[rows], self.targets[rows], split,
                                                 None if self.loss_mask is None else self.loss_mask[rows],
                                                 self.no_context)
        return self._cache[key]

    def figure_for(self, split: int | None = None, sequence: int | str | None = None):
        """The comparison as a static `go.Figure`."""
        split = self.split if split is None else self._check_split(split)
        seq = self.sequence if sequence is None else self._check_sequence(sequence)
        if seq == ALL:
            bounds = [b for b in (boundary_of(self.seqs, i) for i in range(self.seqs.n)) if b is not None]
            boundary = float(np.median(bounds)) if bounds else None
            what = f"mean of {self.seqs.n} sequences" + (" (median boundary)" if bounds and len(set(bounds)) > 1 else "")
        else:
            boundary, what = boundary_of(self.seqs, seq), f"sequence {seq}"
        ylabel = "cross-entropy (nats/token)" if self.model.config.mode == "tokens" else "MSE"
        return compare_figure(self.losses(split, seq), boundary=boundary, split=split, ylabel=ylabel,
                              height=self.height, title=f"Compile and compare · {what} · split s = {split}")

    def token_figure_for(self, sequence: int, split: int | None = None):
        """One sequence's suffix, each token coloured by its loss prompted − specialized (red: compiling the
        prefix lost more than the prompt did; blue: compiling did better)."""
        seq = check_int("sequence", sequence, 0, self.seqs.n - 1)
        split = self.split if split is None else self._check_split(split)
        res = self.losses(split, seq)
        tokens = self.seqs.token_text[seq][split:split + len(res["position"])]
        diff = np.asarray(res["specialized"]) - np.asarray(res["prompted"])
        return token_text_figure(tokens, diff[:len(tokens)], value_name="L_spec − L_prompt", start=split, signed=True,
                                 title=f"Sequence {seq} after s = {split}: loss specialized − prompted per token")

    def static_figures(self) -> list:
        figs = [self.figure_for()]
        if self.sequence != ALL:
            figs.append(self.token_figure_for(self.sequence))
        if self._lora_fig is not None:
            figs.append(self._lora_fig)
        return figs

    def static_text(self) -> str:
        return f"compile and compare: split s = {self.split}, {self.sequence if self.sequence == ALL else f'sequence {self.sequence}'}"

    def show(self, split: int | None = None, sequence: int | str | None = None) -> None:
        """Redraw for another split and/or sequence ("all": the mean over all; None keeps the current)."""
        if split is not None:
            self.split = self._check_split(split)
        if sequence is not None:
            self.sequence = self._check_sequence(sequence)
        replace_figure(self.figure, self.figure_for())
        if self.slider.value != self.split:
            self.slider.value = self.split
        if self.picker.value != self.sequence:
            self.picker.value = self.sequence
