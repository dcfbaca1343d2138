"""The README's results-at-a-glance table and the site's results page, written from the result files.

    python benchmarks/results_pages.py            # rewrite both sections in place (make docs runs it)
    python benchmarks/results_pages.py --check    # exit 1 when README.md or docs/results.md differ from the files

Every number in those two sections is read here from a JSON file that a measuring script wrote
(benchmarks/results/*.json, data/models/*/metrics.json); nothing is typed by hand, so a table cannot drift
from its file. Each table is headed by the command that wrote the file, its date, torch version and machine
where the file records them ("not recorded" where it does not). The sections sit between the markers the
benchmark scripts already use (common.replace_readme_section).
"""
from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTION = "results"
NOT_RECORDED = "not recorded"
TASKS = "benchmarks/results/tasks.json"
TASKS_KL = "benchmarks/results/tasks_kl.json"
LEVERS = ("benchmarks/results/levers_regression16.json", "benchmarks/results/levers_affine.json",
          "benchmarks/results/levers_c.json", "benchmarks/results/levers_d.json",
          "benchmarks/results/levers_e.json", "benchmarks/results/levers_f.json", "benchmarks/results/levers_g.json",
          "benchmarks/results/levers_h.json", "benchmarks/results/levers_i.json")
HF_KNN = "benchmarks/results/hf_topic_knn.json"
LORA = "benchmarks/results/lora_vs_compile.json"
HEAD_RUN = "benchmarks/results/smollm2_head.json"
HEAD_METRICS = "data/models/smollm2-bbc-head/metrics.json"
HF_ORACLE = "benchmarks/results/hf_oracle.json"
MEMORY_ORACLE = "benchmarks/results/oracle_smollm2_memory_head.json"
NOTEBOOK01 = "benchmarks/results/notebook01.json"
SCRATCH_ORACLE = "benchmarks/results/oracle_regression16.json"
MEMORY_HEAD = "benchmarks/results/smollm2_head_memory.json"
NEEDLE = "benchmarks/results/needle_smollm2.json"
# each SmolLM2 head's update space against its cost: (its run record with the speeds and, but for the shipped head,
# compare_heads' "paired" against it; its capacity oracle). The shipped head's test numbers are its metrics.json's.
SPACES = ((HEAD_RUN, HF_ORACLE), (MEMORY_HEAD, MEMORY_ORACLE),
          ("benchmarks/results/smollm2_head_big.json", "benchmarks/results/oracle_smollm2_big_head.json"))
SPACE_COSTS = "benchmarks/results/head_spaces_cost.json"
TEXT_METRICS = "data/models/text-bbc5/metrics.json"


# ---------------------------------------------------------------------------------------------- quoting
# Every string of a result file is data: it reaches README.md and docs/results.md only through `text` (prose and
# table cells) or `code` (a command), so a backtick cannot close a code span, a pipe cannot split a row, HTML
# (a <script> in a CPU model name) is shown as text, and no string can carry the section markers.
MARKERS = (f"<!-- {SECTION}:begin -->", f"<!-- {SECTION}:end -->")
CODE_PLAIN = set(" .,/=-:+()@%#")      # kept as they are inside <code>; everything else not alphanumeric is an entity


def text(value) -> str:
    """A value from a result file as markdown text: HTML-escaped, then the characters that would end a code span,
    split a table row, escape our own escapes or start an inline link are backslash-escaped; one line."""
    s = html.escape(" ".join(str(value).splitlines()), quote=False)
    for ch in ("\\", "`", "|"):
        s = s.replace(ch, "\\" + ch)
    return s.replace("](", "]\\(")


def code(value) -> str:
    """A command from a result file as inline code: a plain backtick span when it holds nothing a code span or a
    table cell would read (backtick, pipe, angle brackets, ampersand, backslash), else <code> with those characters
    as numeric entities, which neither the markdown nor the HTML around it can read as markup."""
    s = " ".join(str(value).splitlines())
    if not any(c in s for c in "`|<>&\\"):
        return f"`{s}`"
    return "<code>" + "".join(c if c.isalnum() or c in CODE_PLAIN else f"&#{ord(c)};" for c in s) + "</code>"


def table(blob: str) -> str:
    """A markdown table a measuring script stored in its JSON, each cell through `text` with its spacing and the
    row structure kept; a line that is not a table row is quoted as text."""
    lines = []
    for line in blob.strip().splitlines():
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line)
            lines.append("|".join(re.sub(r"^(\s*)(.*?)(\s*)$", lambda m: m[1] + text(m[2]) + m[3], c)
                                  for c in cells))
        else:
            lines.append(text(line))
    return "\n".join(lines)


class ResultFileError(ValueError):
    """A result file that is not what the results pages read: named, with the field (the pages are not built)."""


_LAST = [None]      # (file, field) of the last value read from a result file: where a TypeError came from


class _Fields(dict):
    """A result file's JSON object that names the file and the field when a field is missing."""

    def __init__(self, data: dict, file: Path, where: str):
        super().__init__({k: _wrap(v, file, f"{where}[{k!r}]") for k, v in data.items()})
        self._file, self._where = file, where

    def __getitem__(self, key):
        if not dict.__contains__(self, key):
            raise ResultFileError(f"{str(self._file)!r} has no field {self._where}[{key!r}] (the results pages read "
                                  f"it); rewrite the file with the script that makes it, or remove it")
        _LAST[0] = (self._file, f"{self._where}[{key!r}]")
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        _LAST[0] = (self._file, f"{self._where}[{key!r}]")
        return dict.get(self, key, default)


class _Items(list):
    """A result file's JSON array that names the file and the position when an index is out of range."""

    def __init__(self, data: list, file: Path, where: str):
        super().__init__(_wrap(v, file, f"{where}[{i}]") for i, v in enumerate(data))
        self._file, self._where = file, where

    def __getitem__(self, index):
        try:
            return list.__getitem__(self, index)
        except IndexError:
            raise ResultFileError(f"{str(self._file)!r}: {self._where} has {len(self)} entries, no [{index}] (the "
                                  f"results pages read it); rewrite the file with the script that makes it") from None
        finally:
            _LAST[0] = (self._file, f"{self._where}[{index}]")


def _wrap(value, file: Path, where: str):
    if isinstance(value, dict):
        return _Fields(value, file, where)
    if isinstance(value, list):
        return _Items(value, file, where)
    return value


def load(rel: str, root: Path = ROOT) -> dict | None:
    """A result file's JSON (None when it is not there), whose missing fields are named with the file."""
    path = root / rel
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ResultFileError(f"{str(path)!r} is not a JSON result file ({err}); rewrite it with the script that "
                              f"makes it, or remove it") from None
    if not isinstance(data, dict):
        raise ResultFileError(f"{str(path)!r} holds a JSON {type(data).__name__}, not the object of a result file")
    _LAST[0] = (path, "")
    return _wrap(data, path, "")


def f3(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def f2(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def seconds(x) -> str:
    if x is None:
        return "—"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def ci(block: dict | None, fmt=f2, signed: bool = False) -> str:
    """`value [lo, hi]` from a {"value", "ci95"} block."""
    if not block:
        return "—"
    form = (lambda x: f"{x:+.3f}") if signed else fmt
    lo_hi = block.get("ci95")
    return form(block["value"]) + (f" [{form(lo_hi[0])}, {form(lo_hi[1])}]" if lo_hi else "")


# ---------------------------------------------------------------------------------------------- provenance
def _machine(env: dict) -> str:
    parts = [env.get("cpu_model"), f"{env['cpu_count']} cores" if env.get("cpu_count") else None,
             env.get("cuda_device"), env.get("device"), f"{env['threads']} thread(s)" if env.get("threads") else None]
    return ", ".join(p for p in parts if p) or NOT_RECORDED


def provenance(command: str, source: str, env: dict | None = None, date: str | None = None,
               torch: str | None = None, machine: str | None = None) -> str:
    """The line above each table: command, file, date, torch version, machine."""
    env = env or {}
    date = date or env.get("time_utc") or NOT_RECORDED
    torch = torch or env.get("torch") or NOT_RECORDED
    machine = machine or (_machine(env) if env else NOT_RECORDED)
    return (f"{code(command)} → {code(source)}  \n"
            f"date: {text(date)} · torch: {text(torch)} · machine: {text(machine)}")


def tasks_command(data: dict) -> str:
    """The command(s) whose rows a tasks_results file holds: with --redo or --resume, each in turn."""
    def one(argv) -> str:
        argv = [argv] if isinstance(argv, str) else list(argv or [])
        if len(argv) == 1 and argv[0].startswith("("):      # the JSON records that it was assembled from several runs
            return f"python benchmarks/tasks_results.py {argv[0]}"
        return " ".join(["python benchmarks/tasks_results.py", *argv])
    history = data.get("history")
    return "; then ".join(one(h.get("argv")) for h in history) if history else one(data.get("argv"))


def table_cell(table: str, run: str, column: str) -> str | None:
    """One cell of a markdown table the measuring script stored in its JSON (row by its first cell)."""
    lines = [ln for ln in table.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if cells[0] == run and column in header:
            return cells[header.index(column)]
    return None


def held_out_at(tasks: dict, run: str, k: int, columns: tuple[str, ...]) -> str | None:
    """`mean ± 95 %` over a run's seeds at prompt size k, per column ("; " between columns)."""
    from cgt_viz.evaluate import mean_ci
    rows = [r for r in tasks["rows"] if r.get("run") == run]
    picked = [[b[c] for r in rows for b in r.get("by_k", []) if b.get("k") == k and isinstance(b.get(c), (int, float))]
              for c in columns]
    if not rows or not all(picked):
        return None
    cells = []
    for vals in picked:
        m, h = mean_ci(vals)
        cells.append(f"{m:.3f} ± {h:.3f}" if len(vals) > 1 else f"{m:.3f}")
    return "; ".join(cells) + f" ({len(rows)} seed{'s' if len(rows) > 1 else ''})"


def task_command(data: dict, task: str) -> str:
    """The command of the run that measured this task (the benchmark merges runs of single tasks into one file)."""
    return data["tasks"].get(task, {}).get("run", {}).get("command") or data["command"]


def lora_row(data: dict, task: str, method: str, steps=None) -> dict | None:
    for row in data["tasks"].get(task, {}).get("summary", []):
        if row["method"] == method and row.get("steps") == steps:
            return row
    return None


# ---------------------------------------------------------------------------------------------- README
def glance(root: Path = ROOT) -> str:
    """The README's one table: what was measured, the value, the command and the file it came from."""
    rows = []
    tasks = load(TASKS, root)
    if tasks:
        cmd = "python benchmarks/tasks_results.py"
        for run, what in (("icl (k = 8, acc)", "Synthetic ICL (notebook 01's recipe), held-out seeds: gap closed G"),
                          ("regression (k = 8, loss)", "In-context regression, dim 4, held-out seeds: gap closed G")):
            rows.append((what, table_cell(tasks["table"], run, "gap closed G"), cmd, TASKS))
        for run, k, what in (("icl-value-affine", 8, "Value-answer affine ICL (its recipe), held-out seeds, k = 8: "
                                                     "prompted accuracy; gap closed G"),
                             ("regression-dim16", 16, "In-context regression, dim 16 (its recipe), held-out seeds, "
                                                      "k = 16: gap closed G")):
            value = held_out_at(tasks, run, k, ("acc_prompted", "gap_closed") if run.startswith("icl") else
                                ("gap_closed",))
            if value:
                rows.append((what, value, f"{cmd} --runs {run}", TASKS))
    nb = load(NOTEBOOK01, root)
    if nb and not nb.get("steps_override") and nb.get("conditions"):
        conds = nb["conditions"]
        minutes = " / ".join(f"{conds[c]['total_s'] / 60:.1f} min" for c in ("quiet", "second-job") if c in conds)
        g8 = "; ".join(sorted({f3(c.get("G_k8")) for c in conds.values()}))
        env = nb.get("environment", {})
        rows.append((f"Notebook 01 at its defaults, top to bottom on a {env.get('cpu_count', '?')}-core "
                     f"{env.get('cpu_model', 'CPU')} (the notebook's one thread): wall time quiet / beside a second "
                     "job; its gap closed G at k = 8",
                     f"{minutes}; {g8}", "python benchmarks/bench_notebook01.py", NOTEBOOK01))
    ref = load(TEXT_METRICS, root)
    if ref:
        cmd = "python benchmarks/ship.py text-bbc5 --measure-only"
        rows.append(("Reference text model (BBC): topic kNN of ȳ at excerpt ends (chance / TF-IDF)",
                     f"{f3(ref['knn_ybar'])} ({f2(ref['knn_chance'])} / {f2(ref['knn_tfidf'])})", cmd, TEXT_METRICS))
        rows.append(("Reference text model: frozen ȳ minus no context, before / after the topic switch (nats)",
                     f"{ref['frozen_spec_minus_none_before']:+.3f} / {ref['frozen_spec_minus_none_after']:+.3f}",
                     cmd, TEXT_METRICS))
    knn = load(HF_KNN, root)
    if knn:
        longest = max(knn["by_length"], key=lambda r: r["length"])
        rows.append((f"ȳ over frozen SmolLM2-135M: topic kNN, {longest['length']}-token excerpts, calibrated (TF-IDF)",
                     f"{f3(longest['ybar_calibrated'])} ({f3(longest['tfidf'])})", "python benchmarks/hf_topic_knn.py", HF_KNN))
    head = load(HEAD_METRICS, root)
    if head and "test" in head:
        for p in sorted(head["test"], key=lambda k: int(k.split("=")[1])):
            part = head["test"][p]
            rows.append((f"Shipped SmolLM2 head, test documents, prompt {p}: G [95 %]; own − other document (nats)",
                         f"{ci(part.get('G'))}; {part['own_minus_other']['value']:+.3f}",
                         "python benchmarks/ship.py smollm2-bbc-head", HEAD_METRICS))
    memory = load(MEMORY_HEAD, root)
    prompts = {p: v for p, v in (memory or {}).get("paired", {}).items() if p.startswith("p=")}
    for p, paired in sorted(prompts.items(), key=lambda kv: int(kv[0].split("=")[1])):
        d = paired["new_minus_base"]
        rows.append((f"SmolLM2 head with a token memory minus the shipped head, same test windows, prompt {p}, paired "
                     f"per document: G; own − topic mean (nats) [95 %]",
                     f"{ci(d['G'], signed=True)}; {ci(d['own_minus_topic_mean'], fmt=f3, signed=True)}",
                     "python benchmarks/compare_heads.py --new data/models/smollm2-bbc-memory-head", MEMORY_HEAD))
    lora = load(LORA, root)
    if lora:
        for task, label in (("icl", "ICL"), ("text", "text"), ("smollm2", "SmolLM2 head")):
            comp = lora_row(lora, task, "compile")
            steps = max((r["steps"] for r in lora["tasks"].get(task, {}).get("summary", [])
                         if r["method"] == "lora" and r.get("steps")), default=None)
            tuned = lora_row(lora, task, "lora", steps)
            if comp and tuned:
                rows.append((f"{label}: compiling a prompt vs a per-prompt LoRA ({steps} steps): G, update time",
                             f"{f3(comp['G'])} in {seconds(comp['update_seconds'])} vs "
                             f"{f3(tuned['G'])} in {seconds(tuned['update_seconds'])}", task_command(lora, task), LORA))
    lines = ["| measured | value | command | file |", "|---|---|---|---|"]
    lines += [f"| {text(what)} | {text(value or '—')} | {code(cmd)} | [`{src}`]({src}) |" for what, value, cmd, src in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- results page
def page(root: Path = ROOT) -> str:
    """Every table of the results page, each headed by its provenance."""
    out: list[str] = []
    tasks = load(TASKS, root)
    if tasks:
        out += ["## Synthetic tasks on held-out seeds", "",
                provenance(tasks_command(tasks), TASKS, tasks.get("environment")), "",
                "The library recipes (`cgt_viz/recipes.py`: what the notebooks train and the CLI's defaults) on seeds "
                f"none of which was used while tuning (tuning seeds: {', '.join(map(text, tasks.get('tuning_seeds', [])))}); "
                "mean ± 95 % t-interval over the seeds.", "", table(tasks["table"]), ""]
    kl = load(TASKS_KL, root)
    if kl:
        out += ["## Context distillation on the synthetic rows that do not compile yet", "",
                provenance(tasks_command(kl), TASKS_KL, kl.get("environment")), "",
                "The same recipes with `aux_kl=1` (see [Distillation](DISTILLATION.md)); one seed each: a hint, not a result.",
                "", table(kl["table"]), ""]
    out += scratch_oracle_section(root)
    out += levers(root)
    ref = load(TEXT_METRICS, root)
    if ref:
        out += ["## The reference text model (`data/models/text-bbc5`)", "",
                provenance(ref.get("command", "python benchmarks/train_text_reference.py"), TEXT_METRICS,
                           torch=ref.get("torch"),
                           machine=f"{ref.get('device', NOT_RECORDED)}, {ref.get('threads', '?')} thread(s)"), "",
                "Re-measured by `python benchmarks/ship.py text-bbc5 --measure-only`.", "",
                "| measurement | value |", "|---|---|",
                f"| steps, validation-side kNN rows | {text(ref['steps'])}, {text(ref['knn_n'])} excerpts |",
                f"| ȳ topic kNN at excerpt end (k = 10, cosine, 5 folds by document) | {f3(ref['knn_ybar'])} (chance {f2(ref['knn_chance'])}) |",
                f"| … first excerpts / second excerpts | {f3(ref['knn_ybar_first'])} / {f3(ref['knn_ybar_second'])} |",
                f"| TF-IDF over the same excerpts' tokens | {f3(ref['knn_tfidf'])} |",
                f"| mean of LN(x₀ … x₄) over each excerpt | {' / '.join(f3(ref.get(f'knn_mean_ln_x{i}')) for i in range(5))} |",
                f"| ȳ kNN along training | {' / '.join(f2(v.get('knn_ybar') if isinstance(v, dict) else v) for v in ref.get('knn_along_training', []))} |",
                f"| frozen ȳ − no context, before the switch (should be < 0) | {ref['frozen_spec_minus_none_before']:+.3f} ± {ref['frozen_spec_minus_none_before_ci95']:.3f} nats |",
                f"| the same after the switch (should be > 0) | {ref['frozen_spec_minus_none_after']:+.3f} ± {ref['frozen_spec_minus_none_after_ci95']:.3f} nats |",
                f"| smoothness: step after the switch / elsewhere (no-switch control rows) | {f2(ref['smooth_ratio'])} ({f2(ref['smooth_ratio_no_switch'])}) |",
                f"| top template's ablation effect | {ref['ablation_max_delta']:.3f} nats ({text(ref['ablation_site'])}, template {text(ref['ablation_template'])}) |",
                ""]
    knn = load(HF_KNN, root)
    if knn:
        args = knn.get("args", {})
        cmd = "python benchmarks/hf_topic_knn.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in args.items() if k in ("lengths", "half_lives", "per_topic"))
        out += ["## ȳ of a CGT over frozen SmolLM2-135M: topic kNN", "",
                provenance(cmd.strip(), HF_KNN, knn.get("environment")), "",
                "One excerpt per held-out document; k = 10 cosine kNN, 5 folds.", "",
                "| excerpt tokens | TF-IDF | mean LN(x_ℓ) | ȳ, random projection | ȳ, calibrated |", "|---|---|---|---|---|"]
        out += [f"| {text(r['length'])} | {f3(r['tfidf'])} | {f3(r['mean_ln_x'])} | {f3(r['ybar_random'])} | {f3(r['ybar_calibrated'])} |"
                for r in sorted(knn["by_length"], key=lambda r: r["length"])]
        mix = knn.get("mixture")
        if mix:
            out += ["", f"Rows of two {text(mix['length'])}-token excerpts of different topics ({text(mix['rows'])} rows), ȳ at each excerpt's end:",
                    "", "| read-out | both ends | first excerpt | second excerpt |", "|---|---|---|---|",
                    f"| TF-IDF of each excerpt's own tokens | {f3(mix['knn_tfidf'])} | {f3(mix['knn_tfidf_first'])} | {f3(mix['knn_tfidf_second'])} |",
                    f"| mean of LN(x_ℓ) over each excerpt | {f3(mix['knn_mean_ln_x'])} | {f3(mix['knn_mean_ln_x_first'])} | {f3(mix['knn_mean_ln_x_second'])} |"]
            out += [f"| ȳ, {text(name.replace('_', ' '))} | {f3(r['knn_ybar'])} | {f3(r['knn_ybar_first'])} | {f3(r['knn_ybar_second'])} |"
                    for name, r in mix.get("readouts", {}).items()]
        out += [""]
    head, run = load(HEAD_METRICS, root), load(HEAD_RUN, root)
    if head:
        out += ["## The shipped SmolLM2 head (context distillation)", "",
                provenance("python benchmarks/ship.py smollm2-bbc-head", HEAD_METRICS, torch=head.get("torch_version"),
                           machine=(run or {}).get("machine")), "",
                "Cross-entropy in nats per token on the 64 tokens after a p-token prompt; 95 % bootstrap intervals over "
                "documents; *val* was looked at while choosing settings, *test* is measured once.", ""]
        cols = [("prompted", "loss_prompted"), ("compiled", "loss_compiled"), ("other doc", "loss_other_doc"),
                ("same topic", "loss_same_topic"), ("topic mean", "loss_topic_mean"), ("no context", "loss_no_context")]
        for part in ("test", "val"):
            if part not in head:
                continue
            out += [f"**{part} part**", "",
                    "| prompt | docs / windows | " + " | ".join(c for c, _ in cols) + " | G [95 %] | own − other [95 %] | "
                    "own − topic mean [95 %] | G at prompt tokens [95 %] | G elsewhere |",
                    "|---" * (len(cols) + 7) + "|"]
            for p in sorted(head[part], key=lambda k: -int(k.split("=")[1])):
                r = head[part][p]
                out.append(f"| {text(p)} | {text(r['n_documents'])} / {text(r['n_windows'])} | "
                           + " | ".join(f3(r[k]["value"]) for _, k in cols)
                           + f" | {ci(r.get('G'))} | {ci(r.get('own_minus_other'), signed=True)} | "
                             f"{ci(r.get('own_minus_topic_mean'), signed=True)} | "
                             f"{ci(r.get('by_position', {}).get('prompt_token', {}).get('G'))} | "
                             f"{f2(r.get('by_position', {}).get('rest', {}).get('G', {}).get('value'))} |")
            out += [""]
            split = [(p, head[part][p]["by_position"]) for p in head[part] if "by_position" in head[part][p]]
            if split:
                out += ["Prompt-token positions (the target occurs in the prompt and not yet in the continuation): "
                        + "; ".join(f"{text(p)}: {b['fraction_prompt_token']:.1%} of positions, "
                                    f"{b['gain_share_prompt_token']:.1%} of the prompted LM's gain, own − topic mean "
                                    f"there {ci(b['prompt_token'].get('own_minus_topic_mean'), signed=True)}"
                                    for p, b in sorted(split, key=lambda x: -int(x[0].split('=')[1]))), ""]
        if run:
            out += [f"Training: {run.get('head_training_tokens_per_second', 0):.0f} training tokens/s, "
                    f"{f2(run.get('ratio_training_to_lm_forward'))}× the frozen LM's own no-grad forward; a feature cache of "
                    f"{text(run.get('cache_windows'))} windows (`{HEAD_RUN}`).", ""]
    out += oracle_section(root)
    out += spaces_section(root)
    out += needle_section(root)
    lora = load(LORA, root)
    if lora:
        out += ["## Compiling against a per-prompt LoRA", "",
                "The method is in [Why not just train a LoRA?](LORA_VS_COMPILE.md). Each task was measured by its own "
                "run:", ""]
        for task, block in lora["tasks"].items():
            run = block.get("run", {})
            out += [f"**{text(task)}**: " + provenance(task_command(lora, task), LORA, run.get("environment", lora.get("environment"))), ""]
        out += ["| task | method | steps | G | update time (median) | break-even vs KV-cache prompting (tokens) |",
                "|---|---|---|---|---|---|"]
        for task, block in lora["tasks"].items():
            for r in block.get("summary", []):
                if r["method"] in ("prompted", "prompted_kv"):
                    continue
                out.append(f"| {text(task)} | {text(r['method'])} | {text(r.get('steps') or '')} | {f3(r['G'])} | "
                           f"{seconds(r.get('update_seconds'))} | {text(r.get('break_even_tokens') or 'never')} |")
        out += [""]
    return "\n".join(out).rstrip()


ORACLE_LABELS = {"ybar": "best ȳ (a perfect reader of the templates)",
                 "coeffs": "best coefficients (the whole fixed template space)",
                 "lora": "compiled + free rank-r update at the same maps",
                 "memory": "best factors of the token memory (its whole space: any update of its rank at its maps)"}


def oracle_section(root: Path = ROOT) -> list[str]:
    """The ceiling of each SmolLM2 head's update space (`benchmarks/hf_oracle.py`), beside the head: the shipped
    head and, where measured, the head with a token memory."""
    measured = [(src, res) for src in (HF_ORACLE, MEMORY_ORACLE) if (res := load(src, root)) and not res.get("smoke")]
    if not measured:
        return []
    out = ["## The ceiling of the head's update space (oracle)", ""]
    for src, res in measured:
        st = res["settings"]
        cmd = ("python benchmarks/hf_oracle.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in st.items() if k in ("per_topic", "steps", "rank", "prefix")))
        if src == MEMORY_ORACLE:
            cmd += f" --head {res['head']} --targets {','.join(res['targets'])} --kinds {','.join(st['kinds'])}"
        out += [f"**{text(head_name(res['head']))}**: " + provenance(cmd, src, res.get("environment")), ""]
    st = measured[0][1]["settings"]
    out += [f"Per prompt ({text(st['prefix'])} tokens; {text(st['suffix'])} scored), one part of the head's output "
            f"optimised by {text(st['steps'])} Adam steps, everything else frozen. *capacity*: KL to the prompted LM on "
            "the scored text (its own next tokens are never used): an upper bound of what the space can express of "
            f"the prompt. *fair*: the head's own objective on {text(st.get('samples'))} continuations sampled from the "
            "prompted LM, the scored text unseen; with so few samples and no held-out stop it overfits them, so its "
            "rows measure per-prompt fitting, not a ceiling. compiled − oracle is paired per document (above 0: the "
            "oracle is better).", "",
            "| head | target | docs / windows | head G [95 %] | oracle | oracle G [95 %] | compiled − oracle [95 %] | "
            "oracle G at prompt tokens | oracle own − topic mean [95 %] |", "|---|---|---|---|---|---|---|---|---|"]
    for src, res in measured:
        st = res["settings"]
        for target, r in res["targets"].items():
            for kind in r["oracle"]["kinds"]:
                tok = r.get("by_position", {}).get("prompt_token", {}).get(f"G_oracle_{kind}")
                label = text(ORACLE_LABELS.get(kind, kind)) + (f" (r = {text(st['rank'])})" if kind == "lora" else "")
                out.append(f"| {text(head_name(res['head']))} | {text(target)} | {text(r['n_documents'])} / "
                           f"{text(r['n_windows'])} | {ci(r.get('G'))} | {label} | "
                           f"{ci(r.get(f'G_oracle_{kind}'))} | "
                           f"{ci(r.get(f'compiled_minus_oracle_{kind}'), signed=True)} | {f2((tok or {}).get('value'))} | "
                           f"{ci(r.get(f'oracle_{kind}_minus_topic_mean'), signed=True)} |")
    return out + [""]


def space_label(settings: dict) -> str:
    """A head's update space from its run's settings: templates × rank at its sites above ℓ, and its memory."""
    label = (f"{settings['templates']} × rank {settings['rank']} at {', '.join(settings['sites'])}, "
             f"layers above {settings['y_layer']}")
    if settings.get("memory_layers"):
        label += f"; token memory at the top {settings['memory_layers']} (rank {settings['memory_rank']} keys)"
    return label


def spaces_section(root: Path = ROOT) -> list[str]:
    """Each head's update space against its training cost: the head's test G at p = 64, paired against the shipped
    head where compare_heads ran, and the capacity oracle of its fixed template space (and memory)."""
    rows = []
    base_metrics = load(HEAD_METRICS, root) or {}
    for run_src, oracle_src in SPACES:
        run, oracle = load(run_src, root), load(oracle_src, root)
        if not run or "settings" not in run:
            continue
        paired = run.get("paired", {}).get("p=64")
        if paired:
            own, diff = paired["new"], paired["new_minus_base"]
        else:             # a head measured alone: its own test part (the shipped head's is its metrics.json's)
            own, diff = (run.get("test") or base_metrics.get("test", {})).get("p=64", {}), {}
        g = own.get("G")
        cap = ((oracle or {}).get("targets") or {}).get("capacity") or {}
        ceil = "; ".join(f"{text(kind)} {ci(cap.get(f'G_oracle_{kind}'))}" for kind in cap.get("oracle", {}).get("kinds", []))
        if ceil:
            ceil += f" ({text(cap.get('n_documents'))} docs)"
        budget = (f"{text(run['settings']['steps'])} steps" if run["settings"].get("steps")
                  else f"{text(run['settings']['minutes'])} min")
        start = " from " + text(head_name(run["settings"]["init_from"])) if run["settings"].get("init_from") else ""
        rows.append(f"| {text(space_label(run['settings']))} | {text(run.get('cache_windows'))} windows, "
                    f"{(run.get('cache_file_bytes') or 0) / 2**20:.0f} MiB | "
                    f"{run.get('head_training_tokens_per_second', 0):.0f} ({f2(run.get('ratio_training_to_lm_forward'))}×) | "
                    f"{budget}{start} | {ci(g)} | {ci(own.get('own_minus_topic_mean'), signed=True)} | "
                    f"{ci(diff.get('G'), signed=True)} | "
                    f"{ci(diff.get('own_minus_topic_mean'), signed=True)} | {ceil or '—'} |")
    if len(rows) < 2:
        return []
    return ["## Update spaces against their cost", "",
            "Each head's space, what its feature cache and training cost on this machine (one thread; tokens/s and "
            "the ratio to the frozen LM's own no-grad forward), its G on the test part at p = 64, the paired "
            "difference to the shipped head on the same windows (`benchmarks/compare_heads.py`), and the capacity "
            "oracle of its space (`benchmarks/hf_oracle.py --head ... --targets capacity`, test documents): "
            "*coeffs*, the best coefficients of its trained templates; *memory*, the best factors of its memory; "
            "*lora*, its compiled update plus a free rank-8 update at the same maps.", "",
            "| space | feature cache | training tokens/s (× LM forward) | training | test G, p = 64 [95 %] | "
            "own − topic mean [95 %] | G − shipped head [95 %] | own − topic mean − shipped head's [95 %] | "
            "capacity oracle G [95 %] |",
            "|---|---|---|---|---|---|---|---|---|", *rows, ""] + _space_costs(root)


def _space_costs(root: Path) -> list[str]:
    """The cost of each space's training step and cache, measured in one interleaved run (bench_head_spaces)."""
    res = load(SPACE_COSTS, root)
    if not res or res.get("lm") != "SmolLM2-135M-Instruct":
        return []
    return [provenance(res["command"], SPACE_COSTS, res.get("environment")), "",
            "The training tokens/s above come from runs that may have shared the machine; these ratios come from "
            "one run, the spaces alternating (a training step on the same windows; the cached bytes a window).", "",
            "| space | modulated layers | trainable parameters | step time × shipped | cache bytes × shipped |",
            "|---|---|---|---|---|"] + [
        f"| {text(name)} | {text(r['modulated_layers'])} | {text(r['trainable_parameters'])} | "
        f"{f2(r['step_time_vs_shipped'])} | {f2(r['cache_bytes_vs_shipped'])} |" for name, r in res["spaces"].items()] + [""]


def needle_section(root: Path = ROOT) -> list[str]:
    """The needle probe (`benchmarks/hf_needle.py`): a proper noun of the prompt renamed to an invented word in the
    whole window, scored at its first mention in the continuation; both heads, paired."""
    res = load(NEEDLE, root)
    if not res:
        return []
    out = ["## A needle only the prompt holds", "", provenance(res["command"], NEEDLE, res.get("environment")), "",
           f"{text(res['n_windows'])} test windows ({text(res['n_documents'])} documents; prompt "
           f"{text(res['settings'].get('prompt'))} tokens): a proper noun of the prompt that the continuation "
           "names again is replaced, everywhere in the window, by an invented word with the same number of tokens that "
           "no document of the corpus contains. Nothing but this prompt can tell a model that word. *first*: its first "
           "token at the continuation's first mention (what must be recalled); *all*: every token of that mention; "
           "*real word*: the same positions with the original word. 95 % intervals over documents.", "",
           "| positions | prompted LM's gain (nats) | shipped head G | memory head G | memory − shipped G | "
           "own − topic mean, shipped | own − topic mean, memory |", "|---|---|---|---|---|---|---|"]
    rows = [("first", "first", None), ("all", "all", None), ("first, real word", "first", "original")]
    for label, key, variant in rows:
        base = res["base"].get(variant, {}).get(key) if variant else res["base"].get(key)
        mem = res["memory"].get(variant, {}).get(key) if variant else res["memory"].get(key)
        diff = None if variant else res.get("memory_minus_base", {}).get(key)
        if not base or not mem:
            continue
        out.append(f"| {text(label)} | {ci(base.get('prompted_gain'))} | {ci(base.get('G'))} | {ci(mem.get('G'))} | "
                   f"{ci((diff or {}).get('G'), signed=True) if diff else '–'} | "
                   f"{ci(base.get('own_minus_topic_mean'), signed=True)} | {ci(mem.get('own_minus_topic_mean'), signed=True)} |")
    return out + [""]


def head_name(path: str) -> str:
    """A head folder as the page names it: its last part (the results files hold the path it was read from)."""
    return Path(str(path)).name


def scratch_oracle_section(root: Path = ROOT) -> list[str]:
    """The from-scratch oracle on the rows that do not compile (`tasks_results.py --oracle K`): reader or templates."""
    data = load(SCRATCH_ORACLE, root)
    if not data:
        return []
    out = ["## Reader or templates: the oracle on regression with 16 numbers", "",
           provenance(tasks_command(data), SCRATCH_ORACLE, data.get("environment")), "",
           "The recipe trained on held-out seeds, then per prompt (`cgt_viz.oracle`) one part of the compiled model "
           "optimised on fresh queries of the prompt's own w, everything else frozen, and scored on the held-out "
           "query: the best ȳ (a perfect reader of today's coefficient map), the best coefficients of every template "
           "(the whole fixed template space), the compile plus a free low-rank update at the same sites, and the best "
           "*linear reader of w* (coefficients = L·w + c fitted to the best coefficients of the other half of the "
           "prompts). G as everywhere: (L_no context − L) / (L_no context − L_prompted); above 1 beats prompting.", "",
           "| seed | k | prompts | prompted | compiled G | best ȳ G | best coefficients G | linear reader of w G | "
           "free update G (rank) | probe R² |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        o = r.get("oracle")
        if not o:
            continue
        out.append(f"| {text(r['seed'])} | {text(o['k'])} | {text(o['n_prompts'])} | {f3(o.get('loss_prompted'))} | "
                   f"{f2(o.get('gap_closed'))} | {f2(o.get('G_oracle_ybar'))} | {f2(o.get('G_oracle_coeffs'))} | "
                   f"{f2(o.get('G_reader'))} | {f2(o.get('G_oracle_lora'))} ({text(o['oracle']['rank'])}) | "
                   f"{f2(r.get('probe'))} |")
    return out + [""]


def _lever_curve(row: dict, points: int = 5) -> str:
    """G at its run's largest k at `points` evenly spaced evaluations along training: "step: G → …"."""
    curve = [e for e in row.get("gap_curve", [])]
    if not curve:
        return "—"
    picks = [curve[min(len(curve) - 1, round(i * (len(curve) - 1) / (points - 1)))] for i in range(points)]
    return " → ".join(f"{text(e['step'])}: {f2(e.get('gap_closed'))}" for e in picks)


def levers(root: Path = ROOT) -> list[str]:
    """Issue 29's levers: one tuning seed per run, each with G along training (a hint of why, not a result)."""
    files = [(rel, load(rel, root)) for rel in LEVERS]
    files = [(rel, data) for rel, data in files if data]
    if not files:
        return []
    out = ["## Levers on the rows that do not compile yet", "",
           "Each run is its recipe with one change (`RUNS` and `LEVER_TRAIN` in `benchmarks/tasks_results.py`), "
           "trained on a tuning seed (some also on held-out seeds); G is measured at the run's largest k on held-out prompts, and along training "
           "on two fixed batches (— where the prompt does not help yet). Accuracy for icl, MSE for regression.", ""]
    for rel, data in files:
        out += [provenance(tasks_command(data), rel, data.get("environment")), "",
                "| run | seed | change | steps | prompted | compiled | no context | G | probe | G along training (step: G) |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in data["rows"]:
            metric = "acc" if r["task"] == "icl" else "loss"
            change = ", ".join(f"{k}={v}" for k, v in {**r.get("model_changes", {}), **r.get("lever", {})}.items())
            task_extra = {k: v for k, v in r.get("task_args", {}).items() if k in ("aux_min_pairs", "aux_min_points",
                                                                                    "novel_split", "shift_fraction")
                          and v not in (0, 0.0, 1, False)}
            change = ", ".join(filter(None, [change, ", ".join(f"{k}={v}" for k, v in task_extra.items())])) or "none"
            held_out = "" if r["seed"] in data.get("tuning_seeds", [r["seed"]]) else " (held out)"
            out.append(f"| {text(r['run'])} | {text(r['seed'])}{held_out} | {text(change)} | {text(r['steps'])} | "
                       f"{f3(r.get(f'{metric}_prompted'))} | "
                       f"{f3(r.get(f'{metric}_specialized'))} | {f3(r.get(f'{metric}_no_context'))} | "
                       f"{f2(r.get('gap_closed'))} | {f2(r.get('probe'))} | {_lever_curve(r)} |")
        out.append("")
    return out


def sections(root: Path = ROOT) -> dict[Path, str]:
    out = {root / "README.md": glance(root), root / "docs" / "results.md": page(root)}
    for path, body in out.items():   # `text` and `code` make this impossible; a new table that forgot them is not
        if "<!--" in body:
            raise ValueError(f"the results section for {str(path)!r} holds an HTML comment (a string of a result "
                             f"file that was not quoted with text() or code()); nothing was written")
    return out


def _section(content: str) -> tuple[int, int] | None:
    """(start, end) of the one results section in a file, from its begin marker to the end of its end marker;
    None when the markers are missing, out of order or not exactly one pair (a section duplicated by a marker
    that a result file once carried)."""
    begin, end = MARKERS
    if content.count(begin) != 1 or content.count(end) != 1 or content.index(begin) > content.index(end):
        return None
    return content.index(begin), content.index(end) + len(end)


def stale(root: Path = ROOT) -> list[Path]:
    """The files whose results section differs from what the result files say now, or is not one section."""
    out = []
    for path, body in sections(root).items():
        content = path.read_text() if path.exists() else ""
        span = _section(content)
        if span is None or content[span[0]:span[1]] != f"{MARKERS[0]}\n{body.rstrip()}\n{MARKERS[1]}":
            out.append(path)
    return out


def write(root: Path = ROOT) -> None:
    """Rewrite each file's results section; a file with more than one pair of markers (debris of a marker a result
    file once carried) gets one section from its first begin marker to its last end marker."""
    from common import replace_readme_section
    from cgt_viz.io import atomic_write
    begin, end = MARKERS
    for path, body in sections(root).items():
        content = path.read_text() if path.exists() else ""
        if begin in content and end in content and _section(content) is None:
            first, last = content.index(begin), content.rindex(end) + len(end)
            if first < last:
                fixed = content[:first] + f"{begin}\n{body.rstrip()}\n{end}" + content[last:]
                atomic_write(path, lambda tmp, fixed=fixed: Path(tmp).write_text(fixed))
                continue
        replace_readme_section(path, SECTION, body)


def main(argv=None, root: Path = ROOT) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only say which files are out of date (exit 1 if any)")
    args = p.parse_args(argv)
    _LAST[0] = None
    try:
        if args.check:
            bad = stale(root)
            for path in bad:
                print(f"{path.relative_to(root)}: results section out of date; run python benchmarks/results_pages.py")
            return 1 if bad else 0
        write(root)
    except ResultFileError as err:     # one line naming the file and the field; nothing was written
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as err:
        where = (f"{str(_LAST[0][0])!r} (last read: {_LAST[0][1] or 'the file'})" if _LAST[0] else "a result file")
        print(f"error: {where} is not what the results pages read: {type(err).__name__}: {err}; nothing was "
              f"written", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
