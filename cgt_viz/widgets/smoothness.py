"""The smoothness strip: how far ȳ moves from token to token along one text, with the topic boundary.

    strip = SmoothnessStrip(model, data, sequence=0)                       # one model
    strip = SmoothnessStrip(model, data, other=model_smooth, names=("w_D = 0", "w_D = 0.1"))   # overlay
"""
from __future__ import annotations

import ipywidgets as W
import numpy as np

from .. import analysis as A
from .._checks import Height, Strings, check_index, check_int, checked, refuse
from ..contracts import Model
from ..figures import plural, smoothness_figure, token_text_figure
from ._base import Controls, boundary_of, check_view_ybar, figure_widget, replace_figure, sequences_of
from ._static import StaticForm


class SmoothnessStrip(Controls, StaticForm, W.VBox):
    """‖ȳ_t − ȳ_{t−1}‖, cosine and the ȳ heatmap of one sequence; a sequence picker; optional second model."""

    static_slots = 2          # the strip and its token text

    @checked(model=Model(), other=Model(none=True), names=Strings(2, "(model, other)"), height=Height())
    def __init__(self, model, data, labels=None, *, sequence: int = 0, highlight: int | None = None,
                 other=None, names: tuple[str, str] = ("model", "other"), boundary=None,
                 ybar: np.ndarray | None = None, height: int = 560, **prepare_kw):
        self.model, self.other, self.names, self.height = model, other, names, height
        self.seqs = sequences_of(model, data, labels, boundary, **prepare_kw)
        self.sequence = check_index("sequence", sequence, self.seqs.n)
        self.highlight = self._check_highlight(highlight, self.sequence)
        self._set_data(self.seqs, ybar, redraw=False)
        self.figure = figure_widget(self.figure_for(self.sequence, highlight))
        self.tokens_figure = figure_widget(self.token_figure_for(self.sequence, highlight))
        self.picker = W.BoundedIntText(value=self.sequence, min=0, max=self.seqs.n - 1, description="sequence",
                                       layout=W.Layout(width="180px"))
        self.on_user(self.picker, self.show)
        super().__init__([W.HBox([self.picker, W.HTML(f"<small>{plural(self.seqs.n, 'sequence')}</small>")]), self.figure,
                          self.tokens_figure])

    def set_data(self, seqs: A.Sequences, ybar: np.ndarray | None = None, redraw: bool = True) -> None:
        """Replace the sequences (and their ȳ; the other model's is collected again); the current sequence
        and highlight stay (when the new data has them: sequences may have been added, not removed)."""
        self._set_data(sequences_of(self.model, seqs, name="seqs"), ybar, redraw)

    def _set_data(self, seqs: A.Sequences, ybar: np.ndarray | None, redraw: bool = True) -> None:
        """set_data for sequences checked for the model (at the door, or the explorer's own)."""
        self._check_other(seqs)
        self.seqs = seqs
        self.ybar = A._collect_ybar(self.model, seqs.inputs) if ybar is None else check_view_ybar(ybar, seqs, self.model)
        self.ybar_other = None if self.other is None else A._collect_ybar(self.other, seqs.inputs)
        if redraw:
            self.picker.max = seqs.n - 1
            self.show(self.sequence, self.highlight)

    def _check_other(self, seqs: A.Sequences) -> None:
        """The other model reads the sequences checked for the model: the same inputs, as long."""
        other, mine = self.other, self.model.config
        if other is None:
            return
        theirs = other.config
        differ = [f"{f} {getattr(theirs, f)!r} vs {getattr(mine, f)!r}" for f in ("mode", "vocab_size", "input_dim")
                  if getattr(theirs, f) != getattr(mine, f)]
        differ += [f"block_size {theirs.block_size}"] if theirs.block_size < seqs.t else []
        if differ:
            raise refuse("other", f"the same inputs as model (same mode, vocab_size and input_dim; block_size >= "
                                  f"{seqs.t}, the data's length)", ", ".join(differ), verb="read")

    def _check_highlight(self, highlight, sequence: int) -> int | None:
        """None or a token position of `sequence`."""
        return check_int("highlight", highlight, 0, int(self.seqs.lengths[sequence]) - 1, allow_none=True,
                         hint=f" (a token of sequence {sequence})")

    def _checked_row(self, sequence, highlight) -> tuple[int, int | None, int]:
        """(sequence, highlight, the sequence's length), checked."""
        i = check_index("sequence", sequence, self.seqs.n)
        return i, self._check_highlight(highlight, i), int(self.seqs.lengths[i])

    def figure_for(self, sequence: int, highlight: int | None = None):
        """The strip of one sequence as a static `go.Figure`."""
        i, highlight, length = self._checked_row(sequence, highlight)
        overlay = None if self.ybar_other is None else {self.names[1]: self.ybar_other[i, :length]}
        return smoothness_figure(self.ybar[i, :length], self.seqs.token_text[i], boundary=boundary_of(self.seqs, i),
                                 highlight=highlight, overlay=overlay, name=self.names[0], height=self.height,
                                 title=f"Smoothness of ȳ · sequence {i}"
                                       + (f" · token {highlight}" if highlight is not None else ""))

    def token_figure_for(self, sequence: int, highlight: int | None = None):
        """The text of one sequence, each token coloured by ‖ȳ_t − ȳ_{t−1}‖ (how far ȳ moved on reading it)."""
        i, highlight, length = self._checked_row(sequence, highlight)
        step, _ = A.token_smoothness(self.ybar[i, :length])
        return token_text_figure(self.seqs.token_text[i], step, value_name="‖ȳ_t − ȳ_t−1‖", highlight=highlight, signed=False,
                                 title=f"Sequence {i}, each token coloured by how far ȳ moved on it")

    def static_figures(self) -> list:
        return [self.figure_for(self.sequence, self.highlight), self.token_figure_for(self.sequence, self.highlight)]

    def static_text(self) -> str:
        return f"smoothness strip of ȳ: sequence {self.sequence} of {self.seqs.n}"

    def show(self, sequence: int, highlight: int | None = None) -> None:
        """Draw another sequence (and highlight one of its tokens)."""
        sequence = check_index("sequence", sequence, self.seqs.n)
        self.highlight = self._check_highlight(highlight, sequence)
        self.sequence = sequence
        replace_figure(self.figure, self.figure_for(self.sequence, highlight))
        replace_figure(self.tokens_figure, self.token_figure_for(self.sequence, highlight))
        if self.picker.value != self.sequence:
            with self.quietly():
                self.picker.value = self.sequence
