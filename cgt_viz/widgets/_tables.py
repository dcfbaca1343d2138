"""The explorer's tables: the HTML of the neighbours listed under the map, the text of the selection line,
and the CSV export made safe for spreadsheets. Every user string (token, label) is escaped here."""
from __future__ import annotations

import html

import numpy as np

from ..figures import plural

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")   # what makes a spreadsheet read a cell as a formula


def neighbours_html(df, point: int, token, contexts=None) -> str:
    """The neighbours of drawn point `point` (token `token`), `Explorer.neighbors`' DataFrame, as a table.
    contexts: per row, the token in its text ("…before <b>[token]</b> after…", HTML-escaped by
    `analysis.points_at`, the hover text's snippet): a BPE fragment alone says little."""
    cells = [""] * len(df) if contexts is None else [f"<td>{c}</td>" for c in contexts]
    rows = "".join(f"<tr><td>{int(r.point)}</td><td>{int(r.sequence)}</td><td>{int(r.position)}</td>"
                   f"<td><code>{html.escape(str(r.token))}</code></td>{cell}<td>{html.escape(str(r.label))}</td>"
                   f"<td>{r.cosine:.3f}</td></tr>" for r, cell in zip(df.itertuples(), cells))
    context_head = "" if contexts is None else "<th>in context</th>"
    return (f"<div style='font-size:12px'><b>nearest in ȳ (cosine) to point {point}</b> "
            f"<code>{html.escape(str(token))}</code> — <code>explorer.neighbors({point})</code> gives them as a "
            f"DataFrame<table style='font-size:12px'><tr><th>point</th><th>seq</th><th>pos</th><th>token</th>"
            f"{context_head}<th>label</th><th>cos</th></tr>{rows}</table></div>")


def selection_text(seq: np.ndarray, label: np.ndarray | None) -> str:
    """'N points selected from M sequences (a: 3, b: 1)' for the selected points' sequences and labels
    (the six commonest labels); plain text, for `html_status` to escape."""
    text = f"{plural(len(seq), 'point')} selected from {plural(len(np.unique(seq)), 'sequence')}"
    if label is not None:
        labs, counts = np.unique(label.astype(str), return_counts=True)
        top = ", ".join(f"{lab}: {c}" for lab, c in sorted(zip(labs, counts), key=lambda p: -p[1])[:6])
        text += f" ({top})"
    return text


def csv_safe(df):
    """df with every text cell that a spreadsheet would run as a formula prefixed with a single quote."""
    from pandas.api.types import is_object_dtype, is_string_dtype
    df = df.copy()
    for col in df.columns:
        if is_object_dtype(df[col]) or is_string_dtype(df[col]):     # pandas 3 stores text as "str"
            df[col] = df[col].map(lambda v: "'" + v if isinstance(v, str) and v.startswith(FORMULA_START) else v)
    return df
