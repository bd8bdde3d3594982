"""qa_1 / qa_2: RULER's question answering over many documents (RULER ``qa.py``).

The data are user-supplied (nothing is downloaded): a SQuAD-format json (``{"data": [{
"paragraphs": [{"context", "qas": [{"question", "answers": [{"text"}], "is_impossible"?}]}]}]}``)
for qa_1, a HotpotQA-format json (``[{"question", "answer", "context": [[title, [sentences]]]}]``)
for qa_2. The gold documents of the question are placed among distractors — first the other
paragraphs of the same SQuAD article, then any other documents, cycling through the collection when
the context needs more — shuffled and numbered ``Document i:``. ``n`` counts documents; ``m`` words
of one more distractor document (cut short) let the prompt land within 2 % of the target length.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib
from dataclasses import dataclass

import numpy as np

from collectors.tasks import templates as tp
from collectors.tasks.generators import Body, Generator, after_context


@dataclass(frozen=True)
class QAItem:
    query: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]  # document indices
    related: tuple[int, ...]  # same-article documents (SQuAD)


@dataclass(frozen=True)
class QAData:
    dataset: str
    items: tuple[QAItem, ...]
    docs: tuple[str, ...]
    sha256: str


def _fail(path, why):
    raise ValueError(f"QA file {path}: {why}")


def _read_squad(data, path) -> tuple[list[QAItem], list[str]]:
    try:
        articles = data["data"]
        docs = sorted({p["context"] for a in articles for p in a["paragraphs"]})
    except (KeyError, TypeError) as err:
        _fail(path, f"not SQuAD format (missing {err})")
    index = {d: i for i, d in enumerate(docs)}
    items = []
    for a in articles:
        article_docs = [index[p["context"]] for p in a["paragraphs"]]
        for p in a["paragraphs"]:
            me = index[p["context"]]
            for q in p.get("qas", []):
                answers = tuple(x["text"] for x in q.get("answers", []))
                if q.get("is_impossible", False) or not answers:
                    continue
                items.append(QAItem(q["question"], answers, (me,), tuple(i for i in article_docs if i != me)))
    return items, docs


def _read_hotpotqa(data, path) -> tuple[list[QAItem], list[str]]:
    if not isinstance(data, list):
        _fail(path, "not HotpotQA format (expected a list of questions)")
    try:
        def doc(title, sentences):
            return f"{title}\n{''.join(sentences)}"

        docs = sorted({doc(t, s) for d in data for t, s in d["context"]})
        index = {d: i for i, d in enumerate(docs)}
        items = [
            QAItem(d["question"], (d["answer"],), tuple(index[doc(t, s)] for t, s in d["context"]), ())
            for d in data
        ]
    except (KeyError, TypeError, ValueError) as err:
        _fail(path, f"not HotpotQA format ({err!r})")
    return items, docs


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime: float, dataset: str) -> QAData:
    raw = pathlib.Path(path).read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        _fail(path, f"invalid json ({err})")
    items, docs = (_read_squad if dataset == "squad" else _read_hotpotqa)(data, path)
    if not items:
        _fail(path, f"no answerable {dataset} questions")
    return QAData(dataset, tuple(items), tuple(docs), hashlib.sha256(raw).hexdigest())


def load_qa(path, dataset: str) -> QAData:
    """Read a SQuAD (``dataset="squad"``) or HotpotQA (``"hotpotqa"``) json file, cached."""
    if dataset not in ("squad", "hotpotqa"):
        raise ValueError(f"unknown QA dataset {dataset!r}; expected 'squad' or 'hotpotqa'")
    p = pathlib.Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"QA file not found: {p}")
    return _load(str(p.resolve()), p.stat().st_mtime, dataset)


def detect_dataset(path) -> str:
    """"squad" for a json object with ``data``, "hotpotqa" for a json list."""
    data = json.loads(pathlib.Path(path).read_bytes())
    if isinstance(data, dict) and "data" in data:
        return "squad"
    if isinstance(data, list):
        return "hotpotqa"
    _fail(path, "neither SQuAD (object with 'data') nor HotpotQA (list) format")


def qa(task: str, seed: int, *, draw_seed: int, input_id: int, qa_file) -> Generator:
    """Generator for qa_1 (SQuAD) / qa_2 (HotpotQA); the question is the ``input_id``-th of a
    permutation of the answerable questions drawn from ``draw_seed`` (cycling when exhausted)."""
    if qa_file is None:
        raise ValueError(f"{task} needs a {tp.QA_CONFIGS[task]['dataset']} json file (qa_file)")
    data = load_qa(qa_file, tp.QA_CONFIGS[task]["dataset"])
    order = np.random.default_rng(draw_seed).permutation(len(data.items))
    item = data.items[int(order[input_id % len(data.items)])]
    n_docs = len(data.docs)

    def build(n: int, m: int) -> Body:
        rng = np.random.default_rng(seed)
        related = [item.related[i] for i in rng.permutation(len(item.related))]
        taken = set(item.gold) | set(related)
        others = [i for i in rng.permutation(n_docs).tolist() if i not in taken]
        need = n - len(item.gold) + (1 if m else 0)
        pool = related + others
        while len(pool) < need:  # small collections: cycle through every document again
            pool += rng.permutation(n_docs).tolist()
        chosen = [data.docs[i] for i in list(item.gold) + pool[: n - len(item.gold)]]
        if m:
            chosen.append(" ".join(data.docs[pool[n - len(item.gold)]].split()[:m]))
        chosen = [chosen[i] for i in rng.permutation(len(chosen))]
        context = "\n\n".join(tp.QA_DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(chosen))
        return Body(
            text=tp.QA_TEMPLATE.format(context=context, query=item.query),
            answer_prefix=tp.QA_PREFIX,
            references=list(item.answers),
            question=after_context(tp.QA_TEMPLATE, query=item.query),
            metadata={"dataset": data.dataset, "qa_sha256": data.sha256, "question": item.query},
        )

    longest = max(len(d.split()) for d in data.docs)
    return Generator(build, n_min=len(item.gold), partial_max=min(longest, 400), unit="documents",
                     haystack=f"{data.dataset} file")
