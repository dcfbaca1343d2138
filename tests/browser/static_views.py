"""Cells of the static-export test notebook (tests/browser/test_browser.py builds it): every view on a tiny CGT."""
CELLS = [
    """import torch, cgt_viz
from cgt_viz import CGT, CGTConfig
from cgt_viz.widgets import SmoothnessStrip, TemplateInspector, CompileCompare, TrainingMonitor
torch.manual_seed(0)
cfg = CGTConfig(vocab_size=256, block_size=64, n_layer=3, d_x=32, n_head=2, d_y=16, n_head_y=2, y_layer=1, n_templates=4)
model = CGT(cfg).eval()
texts = ['The "match" ended two all after a late goal.', "Shares fell as the bank's profits dropped.",
         "The minister said the bill would pass.", "The striker signed a new contract."] * 3
topics = ["sport", "business", "politics", "sport"] * 3""",
    """monitor = TrainingMonitor(title="static-test monitor")
display(monitor)
for step in range(40):
    monitor({"kind": "step", "step": step, "main": 70.0 - step, "aux": 60.0 - step, "smooth": 0.0, "total": 130.0 - 2 * step})""",
    """ex = cgt_viz.explore(model, texts, labels=topics, background=None)
ex""",
    """ex.open_point(3)
ex.select([0, 1, 2])""",
    """SmoothnessStrip(model, ex.seqs, ybar=ex.ybar_full, sequence=1, highlight=5)""",
    """TemplateInspector(model, ex.seqs, ybar=ex.ybar_full, sequence=1, token=5)""",
    """CompileCompare(model, ex.seqs, split=10)""",
]
# the title each view's main figure starts with, in display order
TITLES = ["static-test monitor", "ȳ of", "Smoothness of ȳ", "κ-template inspector", "Compile and compare"]
