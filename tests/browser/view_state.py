"""Cells of the view-state test notebook (tests/browser/test_browser.py builds it): every view on a tiny random CGT,
then a later cell that changes each of them (the state the page must show after a reload, a kernel restart
or shutdown, and in an HTML export)."""
CELLS = [
    """import torch, cgt_viz
from cgt_viz import CGT, CGTConfig
from cgt_viz.widgets import SmoothnessStrip, TemplateInspector, TrainingMonitor
torch.manual_seed(0)
cfg = CGTConfig(vocab_size=256, block_size=48, n_layer=3, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=1, n_templates=4)
model = CGT(cfg).eval()
texts = ["The match ended two all.", "Shares fell as profits dropped.", "The minister said the bill would pass."] * 2
ex = cgt_viz.explore(model, texts, labels=["sport", "business", "politics"] * 2, background=None, linked=False)
def feed(monitor, steps):
    for step in steps:
        monitor({"kind": "step", "step": step, "main": 3.0 - 0.04 * step, "aux": 1.0, "smooth": 0.01,
                 "total": 4.0 - 0.04 * step})""",
    """monitor = TrainingMonitor(title="state monitor", min_interval=0)
display(monitor)
feed(monitor, range(1, 31))""",
    """strip = SmoothnessStrip(model, ex.seqs, ybar=ex.ybar_full, sequence=0, highlight=3)
strip""",
    """insp = TemplateInspector(model, ex.seqs, ybar=ex.ybar_full, sequence=0, token=3)
insp""",
    """ex""",
    """feed(monitor, range(31, 61))
monitor({"kind": "end", "step": 60})
strip.show(2, 5)
insp.show(sequence=2, token=7)
ex.set_color("position")
print("CHANGED")""",
]
# what each view's main figure shows at the end (after cells 0-5, then 1 and 5 again): JS predicates on a
# plotly graph div `gd` (its title picks the view)
LATEST = {
    "monitor": ("state monitor", "Math.max(...gd._fullData.map(t => (t.x || []).length)) === 60"),
    "strip": ("Smoothness of ȳ", "String(gd.layout.title.text).includes('sequence 2 · token 5')"),
    "inspector": ("κ-template inspector", "String(gd.layout.title.text).includes('token 7 ')"),
    "explorer": ("ȳ of", "!gd.data.some(t => t.name === 'sport') && JSON.stringify(gd.layout).includes('position')"),
}
