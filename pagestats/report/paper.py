"""The paper's own values of the numbers the report leads with, each with where the paper gives it.

The report prints them beside its own (the headline sentences and a "paper" row under the
headline table) so that a reader sees at once where these logs agree with the paper and where
they do not. The paper's values come from its models (Qwen2.5-1.5B/3B/14B, Mistral-7B) at 4K and
16K tokens with SnapKV; the logs shipped here are another model and other lengths, so they are a
reference, not a target. One table, written once (PAGE paper: the sections and tables named).
"""

from __future__ import annotations

#: headline column → (the paper's value as the report prints it, where the paper gives it).
PAPER_VALUES: dict[str, tuple[str, str]] = {
    "harm_plain": ("75%", "§4 and Table 27: NIAH-MK3, b = 1/16, SnapKV, 7 cells pooled"),
    "harm_gated": ("2.6%", "§4 and Table 27: NIAH-MK3, b = 1/16, SnapKV, 7 cells pooled"),
    "harm_reduction": ("+72.4 pp (29× fewer)", "§4 and Table 27"),
    "matched_ci": ("+3 to +19 pp above ≈1/3 kept KV, negative below", "§4.1 \"Accuracy-Memory Frontier\", Fig. 4"),
    "delta_ci": ("+22.9 pp grand mean (+4.5 pp without NIAH-MK3)", "§4 and Table 2"),
    "p_open": ("0.49 at the lowest (Qwen2.5-3B)", "App. A.6.2, Table 22"),
    "compression": ("1.8–3.4× (mean 2.9×)", "App. A.6.2, Table 22: b = 1/16"),
    "compression_batch": ("decays toward 1×", "App. A.6.2, Table 23"),
    "slope": ("0.34", "App. A.6.4, Table 25 and Fig. 9: through-origin slope on the dilution-prone rows"),
}


def paper_value(column: str) -> str:
    """\"VALUE (WHERE)\" of the paper for a headline column, or "–" where the paper gives none."""
    if column not in PAPER_VALUES:
        return "–"
    value, where = PAPER_VALUES[column]
    return f"{value} ({where})"
