"""The results page's table of update spaces reads each head's run record and oracle file, escapes what they say,
and stays away while fewer than two heads are measured."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_pages  # noqa: E402


def _copy(tmp_path, *rels):
    for rel in rels:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)


def test_each_measured_head_is_a_row_with_its_own_numbers_escaped(tmp_path):
    rp = results_pages
    _copy(tmp_path, rp.HEAD_RUN, rp.HF_ORACLE, rp.HEAD_METRICS, rp.MEMORY_HEAD, rp.MEMORY_ORACLE)
    oracle = json.loads((tmp_path / rp.MEMORY_ORACLE).read_text())
    oracle["targets"]["capacity"]["G_oracle_coeffs"] = {"value": 0.777, "ci95": [0.701, 0.802]}
    (tmp_path / rp.MEMORY_ORACLE).write_text(json.dumps(oracle))
    run = json.loads((tmp_path / rp.MEMORY_HEAD).read_text())
    run["settings"]["sites"] = ["attn_in", "<script>x</script>"]
    (tmp_path / rp.MEMORY_HEAD).write_text(json.dumps(run))
    section = "\n".join(rp.spaces_section(tmp_path))
    rows = [line for line in section.splitlines() if line.startswith("| 16 ")]
    assert len(rows) == 2
    assert "coeffs 0.78 [0.70, 0.80]" in rows[1] and "<script>" not in section and "&lt;script&gt;" in section
    paired = run["paired"]["p=64"]["new_minus_base"]["G"]
    assert f"{paired['value']:+.3f}" in rows[1]                   # the paired difference, from compare_heads
    shipped_g = json.loads((ROOT / rp.HEAD_METRICS).read_text())["test"]["p=64"]["G"]["value"]
    assert rows[0].split(" | ")[4].startswith(f"{shipped_g:.2f}")  # the shipped head's G from its metrics.json


def test_one_measured_head_is_no_table(tmp_path):
    _copy(tmp_path, results_pages.HEAD_RUN, results_pages.HF_ORACLE)
    assert results_pages.spaces_section(tmp_path) == []
