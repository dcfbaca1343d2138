"""The κ-template inspector: what the K low-rank templates of one site do along a sequence.

    insp = TemplateInspector(model, data, site="3.attn_in", sequence=0, token=40)
    insp.ablate()          # Δ loss per template on a batch (on demand: one forward pass per template)
"""
from __future__ import annotations

import html
import time

import ipywidgets as W
import numpy as np

from .. import analysis as A
from .._checks import Height, Int, check_index, checked
from ..contracts import Model
from ..figures import natural_key, template_figure, token_text_figure
from ._base import Controls, boundary_of, check_view_ybar, figure_widget, html_status, replace_figure, sequences_of
from ._static import StaticForm


class TemplateInspector(Controls, StaticForm, W.VBox):
    """Site picker, sequence picker, token slider, coefficient heatmap, mean |c_k| per label, singular
    values of ΔW(ȳ) at the chosen token, and template ablation Δloss (button)."""

    static_slots = 2          # the inspector and its token text

    @checked(model=Model(), site=A.Site(none=True), ablation_sequences=Int(1), height=Height())
    def __init__(self, model, data, labels=None, *, site=None, sequence: int = 0, token: int | None = None,
                 boundary=None, ybar: np.ndarray | None = None, ablation_sequences: int = 32, height: int = 620,
                 **prepare_kw):
        self.model, self.height, self.ablation_sequences = model, height, ablation_sequences
        self.sites = [f"{layer}.{name}" for layer, name in model.template_sites]
        self.site = "{}.{}".format(*(site or model.template_sites[0]))
        self._ablation: dict[str, np.ndarray] = {}
        self._set_data(sequences_of(model, data, labels, boundary, **prepare_kw), ybar, redraw=False)
        self.sequence = check_index("sequence", sequence, self.seqs.n)
        self.token = self._check_token(token)

        self.template: int | None = None      # the template k of the token view (None: the largest mean |c_k|)
        self.figure = figure_widget(self.figure_for())
        self.tokens_figure = figure_widget(self.token_figure_for())
        self.site_picker = W.Dropdown(options=self.sites, value=self.site, description="site κ",
                                      layout=W.Layout(width="200px"))
        self.seq_picker = W.BoundedIntText(value=self.sequence, min=0, max=self.seqs.n - 1, description="sequence",
                                           layout=W.Layout(width="170px"))
        self.token_slider = W.IntSlider(value=self.token, min=0, max=max(int(self.seqs.lengths[self.sequence]) - 1, 0),
                                        description="token", continuous_update=False, layout=W.Layout(width="320px"))
        self.ablate_button = W.Button(description="Δ loss: ablate each template", layout=W.Layout(width="240px"),
                                      tooltip=f"one forward pass per template on {self.ablation_sequences} sequences")
        self.status = W.HTML(html_status("Ablation is computed on demand."))
        self.on_user(self.site_picker, lambda site: self.show(site=site))
        self.on_user(self.seq_picker, lambda sequence: self.show(sequence=sequence))
        self.on_user(self.token_slider, lambda token: self.show(token=token))
        self.ablate_button.on_click(lambda _b: self.ablate())
        super().__init__([W.HBox([self.site_picker, self.seq_picker, self.token_slider]),
                          W.HBox([self.ablate_button, self.status]), self.figure, self.tokens_figure])

    # ------------------------------------------------------------------ data
    def set_data(self, seqs: A.Sequences, ybar: np.ndarray | None = None, redraw: bool = True) -> None:
        """Replace the sequences (and their ȳ); cached per-label means and ablations are dropped."""
        self._set_data(sequences_of(self.model, seqs, name="seqs"), ybar, redraw)

    def _set_data(self, seqs: A.Sequences, ybar: np.ndarray | None, redraw: bool = True) -> None:
        """set_data for sequences checked for the model (at the door, or the explorer's own)."""
        self.seqs = seqs
        self.ybar = A._collect_ybar(self.model, seqs.inputs) if ybar is None else check_view_ybar(ybar, seqs, self.model)
        self._means: dict[str, tuple[list, np.ndarray]] = {}
        self._ablation.clear()
        if redraw:
            self.seq_picker.max = seqs.n - 1
            self.show()

    def _check_token(self, token) -> int:
        length = int(self.seqs.lengths[self.sequence])
        if token is None:
            return length - 1
        return check_index("token", token, length)

    def _mean_abs(self, site: str) -> tuple[list, np.ndarray]:
        """mean |c_k| per label over every real token of every sequence (cached per site)."""
        if site not in self._means:
            seqs = self.seqs
            valid = np.arange(seqs.t)[None, :] < seqs.lengths[:, None]                   # (n, t)
            coeffs = A._site_coefficients(self.model, self.ybar[valid], self._key(site))  # (N, K)
            if seqs.token_labels is not None:
                labels = seqs.token_labels[valid].astype(str)
            elif seqs.boundary is not None:
                pos = np.broadcast_to(np.arange(seqs.t), valid.shape)[valid]
                bound = np.broadcast_to(seqs.boundary[:, None], valid.shape)[valid]
                labels = np.where((bound >= 0) & (pos >= bound), "second excerpt", "first excerpt")
            else:
                labels = np.full(len(coeffs), "all tokens")
            names, table = A.mean_abs_by_label(coeffs, labels)
            order = sorted(range(len(names)), key=lambda j: natural_key(names[j]))   # "2" before "10"
            self._means[site] = [names[j] for j in order], table[order]
        return self._means[site]

    # ------------------------------------------------------------------ drawing
    def figure_for(self, site: str | None = None, sequence: int | None = None, token: int | None = None):
        """The inspector's figure as a static `go.Figure` (defaults: the current site, sequence, token)."""
        site = self.site if site is None else "{}.{}".format(*A.parse_site(self.model, site))
        i = self.sequence if sequence is None else check_index("sequence", sequence, self.seqs.n)
        length = int(self.seqs.lengths[i])
        tok = self.token if token is None else check_index("token", token, length)
        tok = min(tok, length - 1)
        coeffs = A._site_coefficients(self.model, self.ybar[i, :length], self._key(site))   # (t, K)
        names, means = self._mean_abs(site)
        sv = A._delta_w_singular_values(self.model, self.ybar[i, tok], self._key(site))
        return template_figure(coeffs, self.seqs.token_text[i], site=site, boundary=boundary_of(self.seqs, i),
                               highlight=tok, label_names=names, mean_abs=means, singular_values=sv,
                               ablation=self._ablation.get(site), height=self.height,
                               label_title=self.seqs.label_name if self.seqs.token_labels is not None else "tokens",
                               loss_unit="nats/token" if self.model.config.mode == "tokens" else "MSE",
                               title=f"κ-template inspector · site {site} · sequence {i} · token {tok} "
                                     f"({html.escape(repr(self.seqs.token_text[i][tok]), quote=False)})")

    def token_figure_for(self, template: int | None = None):
        """The current sequence's text, each token coloured by c_k(ȳ_t) of one template k of the current
        site (default: `self.template`, else the template with the largest mean |c_k| on this sequence)."""
        i, site = self.sequence, self.site
        length = int(self.seqs.lengths[i])
        coeffs = A._site_coefficients(self.model, self.ybar[i, :length], self._key(site))   # (t, K)
        k = self.template if template is None else template
        k = int(np.abs(coeffs).mean(0).argmax()) if k is None else check_index("template", k, coeffs.shape[1])
        return token_text_figure(self.seqs.token_text[i], coeffs[:, k], value_name=f"c_{k}", highlight=self.token, signed=True,
                                 title=f"Sequence {i}, each token coloured by c_{k}(ȳ_t) at site {site}")

    @staticmethod
    def _key(site: str) -> tuple[int, str]:
        """A site the inspector holds ("ν.name", checked) as the (ν, name) the analysis takes."""
        layer, _, name = site.partition(".")
        return int(layer), name

    def static_figures(self) -> list:
        return [self.figure_for(), self.token_figure_for()]

    def static_text(self) -> str:
        return f"κ-template inspector: site {self.site}, sequence {self.sequence}, token {self.token}"

    def show(self, sequence: int | None = None, token: int | None = None, site: str | None = None,
             template: int | None = None) -> None:
        """Redraw for another sequence / token / site / token-view template k (None keeps the current one)."""
        if template is not None:
            self.template = check_index("template", template, self.model.config.n_templates)
        if site is not None:
            self.site = "{}.{}".format(*A.parse_site(self.model, site))
        if sequence is not None:
            self.sequence = check_index("sequence", sequence, self.seqs.n)
            if token is None:
                token = int(self.seqs.lengths[self.sequence]) - 1
        if token is not None or sequence is not None:
            self.token = self._check_token(token)
        self.token = min(self.token, int(self.seqs.lengths[self.sequence]) - 1)
        replace_figure(self.figure, self.figure_for())
        replace_figure(self.tokens_figure, self.token_figure_for())
        with self.quietly():
            self.site_picker.value = self.site
            self.seq_picker.value = self.sequence
            self.token_slider.max = int(self.seqs.lengths[self.sequence]) - 1
            self.token_slider.value = self.token

    # ------------------------------------------------------------------ ablation
    def ablate(self, site: str | None = None) -> dict:
        """Δ main loss when each template of `site` is ablated, on the first `ablation_sequences` sequences;
        the result is drawn and returned ({"base", "templates", "delta"})."""
        site = self.site if site is None else "{}.{}".format(*A.parse_site(self.model, site))
        rows = slice(0, self.ablation_sequences)
        self.status.value = html_status(f"ablating the templates of {site} …", "busy")
        t0 = time.perf_counter()
        try:
            targets, mask = self.seqs.scoring(self.model.config.mode)
            result = A.template_ablation(self.model, self.seqs.inputs[rows], targets[rows], site,
                                         None if mask is None else mask[rows])
        except Exception as exc:
            self.status.value = html_status(f"ablation failed: {type(exc).__name__}: {exc}", "error")
            raise
        self._ablation[site] = result["delta"]
        self.status.value = html_status(f"{site}: base loss {result['base']:.4f}; largest Δ "
                                        f"{result['delta'].max():+.4f} (k{int(result['delta'].argmax())}) — "
                                        f"{time.perf_counter() - t0:.1f} s", "ok")
        if site == self.site:
            replace_figure(self.figure, self.figure_for())
        return result
