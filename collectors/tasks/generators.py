"""RULER-style input generators (docs/COLLECTION.md; PAGE §4 "Setup"), written from RULER's task definitions.

Each generator is built for one input (a seed) and maps a haystack size to the user message:
``build(n, m) -> Body`` where ``n`` counts the task's haystack *units* (noise or essay words,
distractor needles, list words, documents) and ``m`` the words of an optional partial unit that
lets coarse haystacks (needle lines, documents) land within 2 % of the target length. Everything
that defines the question (keys, values, chains, word lists) is drawn *before* anything that
depends on ``n``, so every size asks the same question and the length search only changes the
amount of haystack.

Tasks (RULER ``synthetic.yaml``): niah_single_1 (noise haystack, word key, number value);
niah_multikey_1 (4 keys, essay→noise); niah_multikey_2 (needle haystack); niah_multikey_3
(needle haystack, UUID keys and values); niah_multivalue (4 values for one key, essay→noise);
niah_multiquery (4 keys asked at once, essay→noise); vt (one 4-hop chain, noise, one in-context
example); cwe (10 common words); fwe (Zipf α=2 coded words). qa_1/qa_2 live in
:mod:`collectors.tasks.qa`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from collectors.tasks import haystack as hs
from collectors.tasks import templates as tp
from collectors.tasks import words as wd


@dataclass(frozen=True)
class Body:
    """The user message of one input and its answers, before the chat template.

    ``question`` is the end of ``text`` that follows the task's context (RULER's template after
    ``{context}``): what a query-agnostic run appends after the context has been prefilled and evicted.
    """

    text: str
    answer_prefix: str
    references: list[str]
    question: str
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.question or not self.text.endswith(self.question):
            raise ValueError("Body.question must be a non-empty suffix of Body.text")


def after_context(template: str, **fields) -> str:
    """The part of a RULER ``template`` after its ``{context}`` field, formatted: the question."""
    return template.split("{context}", 1)[1].format(**fields)


@dataclass(frozen=True)
class Generator:
    """``build(n, m)`` with ``n ≥ n_min`` haystack units and ``0 ≤ m ≤ partial_max`` filler words.

    ``whole_units``: the haystack grows by whole units only and no filler (RULER's needle haystack),
    so the prompt lands within one unit below the target rather than within 2 %.
    """

    build: Callable[[int, int], Body]
    n_min: int
    partial_max: int
    unit: str
    haystack: str
    whole_units: bool = False


def _and_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


def niah(task: str, seed: int, *, haystack_file=None) -> Generator:
    """Needle-in-a-haystack variants (RULER ``niah.py``).

    Tasks whose RULER haystack is an essay read ``haystack_file``; without one niah_single_2 and
    niah_single_3 are refused (on noise they would be niah_single_1 with other values) and the
    others use the noise haystack. Tasks whose RULER haystack is noise or needles ignore it. The
    needle haystack holds only needles, as RULER's: it grows by whole distractor needles, so the
    prompt lands within one needle below the target (``whole_units``).
    """
    cfg = tp.NIAH_CONFIGS[task]
    kind = cfg["haystack"]
    if kind == "essay":
        if haystack_file is not None:
            essay = hs.essay_words(haystack_file)
        elif task in ("niah_single_2", "niah_single_3"):
            raise ValueError(f"{task} needs RULER's essay haystack: give a haystack file (RULER's Paul Graham "
                             "essays as plain text)")
        else:
            kind = "noise"
    type_k, type_v = cfg["type_k"], cfg["type_v"]
    one = cfg["num_q"] * cfg["num_v"] == 1
    type_name = type_v[:-1] if one else type_v
    template, prefix = (tp.NIAH_TEMPLATE_ONE, tp.NIAH_PREFIX_ONE) if one else (tp.NIAH_TEMPLATE, tp.NIAH_PREFIX)
    num_k = max(cfg["num_k"], cfg["num_q"])

    def build(n: int, m: int) -> Body:
        rng = np.random.default_rng(seed)
        keys = wd.distinct(type_k, num_k, rng)
        values = [wd.distinct(type_v, cfg["num_v"], rng) for _ in keys]
        needles = [tp.NEEDLE.format(type_v=type_v, key=k, value=v) for k, vs in zip(keys, values) for v in vs]
        needles = [needles[i] for i in rng.permutation(len(needles))]
        asked = sorted(rng.choice(num_k, size=cfg["num_q"], replace=False).tolist())
        queries = [keys[i] for i in asked]
        answers = [v for i in asked for v in values[i]]
        if kind == "noise":
            context = "\n".join(hs.insert_lines(hs.noise_lines(n), needles, rng))
        elif kind == "essay":
            context = hs.essay_with_needles(essay, n, needles, rng)
        else:  # needle haystack: n distractor needles with other keys and values
            all_values = [v for vs in values for v in vs]
            d_keys = wd.distinct(type_k, n, rng, exclude=keys)
            d_values = wd.distinct(type_v, n, rng, exclude=all_values)
            lines = [tp.NEEDLE.format(type_v=type_v, key=k, value=v) for k, v in zip(d_keys, d_values)]
            context = "\n".join(hs.insert_lines(lines, needles, rng))
        query = _and_list(queries)
        return Body(
            text=template.format(type_v=type_name, context=context, query=query),
            answer_prefix=prefix.format(type_v=type_name, query=query),
            references=answers,
            question=after_context(template, type_v=type_name, query=query),
            metadata={"keys": queries},
        )

    unit = "distractor needles" if kind == "needle" else "words"
    return Generator(build, n_min=0, partial_max=0, unit=unit, haystack=kind, whole_units=kind == "needle")


def vt(seed: int, *, context_length: int, count: Callable[[str], int]) -> Generator:
    """Variable tracking (RULER ``variable_tracking.py``): one chain ``VAR X1 = value``,
    ``VAR X2 = VAR X1`` … of ``num_hops`` hops hidden in the noise haystack, after one worked
    example and a blank line, as RULER.

    The example's noise is RULER's: the most sentence groups, a multiple of 5, that keep the example
    (with its answer) within 500 − 30 tokens of ``count`` (the model's tokenizer). Below 2048 tokens
    that example would leave the task no room, so its budget is ``context_length // 4`` there
    (docs/COLLECTION.md, "Deviations from RULER").
    """
    hops = tp.VT_CONFIG["num_hops"]
    budget = tp.VT_ICL_TOKENS if context_length >= 2048 else context_length // 4
    budget -= tp.VT_ICL_RULER_GENERATE

    def chain(names: list[str], value: int) -> list[str]:
        return [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(hops)]

    def example(groups: int, rng_state) -> str:
        rng = np.random.default_rng(rng_state)
        ex_names = wd.uppercase_names(hops + 1, 3, rng)
        ex_value = int(rng.integers(10000, 99999))
        ex_context = "\n".join(hs.insert_lines([tp.NOISE] * groups, chain(ex_names, ex_value), rng))
        return (tp.VT_TEMPLATE.format(context=ex_context, query=ex_value)
                + tp.VT_PREFIX.format(num_v=hops + 1, query=ex_value) + " ".join(ex_names))

    ex_seed = [seed, 2]
    groups = 0
    while count(example(groups + tp.VT_ICL_INCREMENT, ex_seed)) <= budget:
        groups += tp.VT_ICL_INCREMENT
    icl = example(groups, ex_seed)

    def build(n: int, m: int) -> Body:
        rng = np.random.default_rng(seed)
        names = wd.uppercase_names(hops + 1, 5, rng)
        value = int(rng.integers(10000, 99999))
        context = "\n".join(hs.insert_lines(hs.noise_lines(n), chain(names, value), rng))
        return Body(
            text=icl + "\n\n" + tp.VT_TEMPLATE.format(context=context, query=value),
            answer_prefix=tp.VT_PREFIX.format(num_v=hops + 1, query=value),
            references=names,
            question=after_context(tp.VT_TEMPLATE, query=value),
            metadata={"value": value, "icl_noise_groups": groups},
        )

    return Generator(build, n_min=0, partial_max=0, unit="words", haystack="noise")


def _numbered(items: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))


def cwe(seed: int, *, context_length: int) -> Generator:
    """Common words extraction (RULER ``common_words_extraction.py``): a numbered list in which
    10 words repeat ``freq_cw`` times and the rest ``freq_ucw`` times (6 and 1 below 4096 tokens),
    after one worked example (at every length, as RULER); the answer is the 10 common words.
    ``n`` = distinct words."""
    c = tp.CWE_CONFIG
    short = context_length < c["short_below"]
    rep_c, rep_u = (c["short_freq_cw"], c["short_freq_ucw"]) if short else (c["freq_cw"], c["freq_ucw"])
    ex_n, ex_c, ex_u = (20, 3, 1) if short else (40, 10, 3)
    num_cw = c["num_cw"]

    def word_list(pool, n, rc, ru, rng):
        common, uncommon = list(pool[:num_cw]), list(pool[num_cw:n])
        items = common * rc + uncommon * ru
        return [items[i] for i in rng.permutation(len(items))], common

    def build(n: int, m: int) -> Body:
        rng = np.random.default_rng(seed)
        vocab = list(wd.vocabulary())
        pool = [vocab[i] for i in rng.permutation(len(vocab))]
        if n > len(pool):  # very long contexts: extend with adjective-noun compounds
            pool += wd.distinct("words", n - len(pool), np.random.default_rng([seed, 1]), exclude=pool)
        ex_pool = [vocab[i] for i in rng.permutation(len(vocab))[:ex_n]]
        ex_list, ex_common = word_list(ex_pool, ex_n, ex_c, ex_u, rng)
        items, common = word_list(pool, n, rep_c, rep_u, rng)
        example = tp.CWE_TEMPLATE.format(context=_numbered(ex_list)) + tp.CWE_PREFIX + " " + _numbered(ex_common)
        task_text = tp.CWE_TEMPLATE.format(context=_numbered(items))
        return Body(
            text=example + "\n" + task_text,
            answer_prefix=tp.CWE_PREFIX,
            references=common,
            question=after_context(tp.CWE_TEMPLATE),
            metadata={"freq_cw": rep_c, "freq_ucw": rep_u},
        )

    return Generator(build, n_min=num_cw, partial_max=0, unit="distinct words", haystack="word list")


def fwe_counts(n: int, vocab_size: int, alpha: float) -> np.ndarray:
    """Occurrences of the rank-k coded word: ⌊n · k^{-α} / ζ(α)⌋, k = 1..vocab_size (RULER fwe)."""
    from scipy.special import zeta

    k = np.arange(1, vocab_size + 1, dtype=np.float64)
    return np.floor(n * k**-alpha / zeta(alpha)).astype(np.int64)


def fwe(seed: int, *, context_length: int) -> Generator:
    """Frequent words extraction (RULER ``freq_words_extraction.py``): coded words with Zipf
    (α = 2) counts, the most frequent one replaced by ``...`` (noise); the answer is ranks 2–4.
    Vocabulary size ``context_length // 50`` as RULER (``max_seq_length // 50``), at least 10. The
    counts move in steps of up to one word per rank as ``n`` grows, so ``m`` extra noise words
    ``...`` (rank 1, never an answer) fill the last tokens up to the target."""
    alpha, wordlen = tp.FWE_CONFIG["alpha"], tp.FWE_CONFIG["coded_wordlen"]
    vocab_size = max(10, context_length // 50)

    def build(n: int, m: int) -> Body:
        rng = np.random.default_rng(seed)
        vocab = wd.coded_words(vocab_size, wordlen, rng)
        vocab[0] = "..."
        counts = fwe_counts(n, vocab_size, alpha)
        items = [w for w, c in zip(vocab, counts) for _ in range(int(c))] + ["..."] * m
        items = [items[i] for i in rng.permutation(len(items))]
        return Body(
            text=tp.FWE_TEMPLATE.format(context=" ".join(items)),
            answer_prefix=tp.FWE_PREFIX,
            references=vocab[1:4],
            question=after_context(tp.FWE_TEMPLATE),
            metadata={"vocab_size": vocab_size, "alpha": alpha},
        )

    # n_min: ranks 2..4 strictly more frequent than rank 5 at α = 2 (n·(1/16 − 1/25)/ζ(2) ≥ 1 ⇒ n ≥ 74)
    return Generator(build, n_min=100, partial_max=40, unit="zipf scale", haystack="coded words")
