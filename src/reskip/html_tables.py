"""HTML tables for the report: every cell escaped, floats to four significant digits."""

from __future__ import annotations

import html


def html_table(rows: list[dict], cols: list[str]) -> str:
    # a long column name may break after its underscores, so a wide table still fits the page
    head = "".join(f"<th>{html.escape(c).replace('_', '_<wbr>')}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(fmt(x) for x in v[:12]) + (" ..." if len(v) > 12 else "")
    return "-" if v is None else str(v)


def markdown_table(lines: list[str]) -> str:
    """A results.md table (its header, separator and rows as markdown lines) as an HTML table."""
    cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in lines]
    head, rows = cells[0], cells[2:]
    return html_table([dict(zip(head, r)) for r in rows], head)
