"""Names from the logs, escaped for the format they are written into: the one helper of every writer.

A model, task, evictor or run name is whatever a log holds: ``<img src=x onerror=alert(1)>``, a
carriage return, an ANSI escape, a NUL, a bidirectional override. Each writer passes such text
through one function of this module:

* :func:`terminal` — a message line on a terminal (stderr, ``validate``'s stdout, the ``whatif``
  table): control, format (bidi), surrogate (undecodable bytes of a file name) and line/paragraph
  separator characters are written as Python escapes (``\\r``, ``\\x1b``, ``\\u202e``, ``\\udcff``),
  so a name can neither forge a line nor restyle the terminal.
* :func:`csv_field` — a CSV cell (``whatif --format csv``, ``-o FILE.csv``, the report's
  ``tables/*.csv``): the same escapes, so that no cell holds a raw CR, ESC, NUL or bidi control
  (quoting is the CSV writer's).
* :func:`markdown` — text in ``index.md`` and ``tables/*.md``: the same escapes, then ``&``, ``<`` and
  ``>`` as HTML entities (Markdown viewers, notebooks among them, render raw HTML) and the
  characters of Markdown's inline syntax and of pipe tables (``\\ ` * [ ] | ~``, and ``_`` at a
  word's edge) behind a backslash, so a name is shown as written and never becomes markup, a link or a new table cell.

HTML output escapes with :func:`html.escape` (great_tables and :mod:`pagestats.report.html`);
matplotlib text with :func:`pagestats.figures` ``$`` escaping.
"""

from __future__ import annotations

import re
import unicodedata

import polars as pl

#: Unicode categories escaped in every format: control, format, surrogate, line and paragraph separators.
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
#: The same characters as a regular expression of polars (Rust regex classes; a polars string holds no surrogate).
_ESCAPED_RE = r"[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]"
_MARKDOWN_PUNCT = re.compile(r"([\\`*\[\]|~])")
#: ``_`` opens or closes emphasis only at a word's edge: ``niah_multikey_3`` stays as it is.
_MARKDOWN_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def terminal(text) -> str:
    """``text`` with every control, format, surrogate and line/paragraph-separator character escaped."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in ESCAPED_CATEGORIES else ch
        for ch in str(text)
    )


def csv_field(text) -> str:
    """A CSV cell's text: :func:`terminal`'s escapes (the CSV writer quotes commas and quotes)."""
    return terminal(text)


def markdown(text) -> str:
    """Text shown literally in Markdown: :func:`terminal`'s escapes, HTML's ``& < >`` as entities,
    Markdown's inline and table punctuation behind a backslash."""
    text = terminal(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_UNDERSCORE.sub(r"\\_", _MARKDOWN_PUNCT.sub(r"\\\1", text))


def csv_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with :func:`csv_field` applied to its string columns (only where a cell needs it)."""
    fixes = []
    for name, dtype in frame.schema.items():
        if dtype == pl.String and frame[name].str.contains(_ESCAPED_RE).fill_null(False).any():
            fixes.append(pl.col(name).map_elements(csv_field, return_dtype=pl.String))
    return frame.with_columns(fixes) if fixes else frame
