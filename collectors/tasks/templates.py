"""RULER's prompt templates, answer prefixes and generation lengths (docs/COLLECTION.md).

The wording is RULER's (Hsieh et al., 2024, "RULER: What's the real context size of your
long-context language models?"; NVIDIA/RULER ``scripts/data/synthetic/constants.py`` and
``scripts/synthetic.yaml``), reproduced because the paper's tasks are RULER's tasks (PAGE §4
"Setup"): the task instruction with ``{context}`` and the question, then an *answer prefix* that
is appended after the model's chat template so that generation continues the answer.

Notes
-----
RULER's answer prefixes begin with a space because they follow the template text directly; when
a chat template is applied the prefix starts the assistant turn and its leading space is dropped
(:func:`collectors.tasks.prompt.render`).
"""

from __future__ import annotations

#: Tokens to generate per RULER task family (RULER ``constants.py``; docs/COLLECTION.md), except vt:
#: RULER's 30 does not hold the five variable names and a short preamble in every tokenizer
#: (SmolLM2: 5 × 3–5 tokens joined, 19–29, plus :data:`collectors.tasks.PREAMBLE_MARGIN`), so vt
#: gets 64. :func:`collectors.tasks.check_decode_budget` checks each input against its limit.
NIAH_TOKENS, VT_TOKENS, CWE_TOKENS, FWE_TOKENS, QA_TOKENS = 128, 64, 120, 50, 32
#: vt's worked example: RULER builds it at 500 tokens (its 30 tokens to generate included), adding noise
#: sentence groups 5 at a time (``variable_tracking.py``, ``max_seq_length=500, incremental=5``).
VT_ICL_TOKENS, VT_ICL_RULER_GENERATE, VT_ICL_INCREMENT = 500, 30, 5

NIAH_TEMPLATE = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_v} afterwards.\n{context}\n"
    "What are all the special magic {type_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX = " The special magic {type_v} for {query} mentioned in the provided text are"
#: RULER's singular wording, used when exactly one value is asked for (one query, one value).
NIAH_TEMPLATE_ONE = (
    "A special magic {type_v} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_v} afterwards.\n{context}\n"
    "What is the special magic {type_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX_ONE = " The special magic {type_v} for {query} mentioned in the provided text is"
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."

VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
    "are assigned the value {query}, they are: "
)

CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\n"
    "Question: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"

FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please "
    "ignore the dots '....'. What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"

QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any "
    "other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on "
    "the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
)
QA_PREFIX = " Answer:"
QA_DOCUMENT = "Document {i}:\n{document}"

#: RULER's "noise" haystack sentence group (``niah.py`` / ``variable_tracking.py``).
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

#: Per-task configuration, as in RULER's ``synthetic.yaml``. ``haystack`` is RULER's haystack
#: type; "essay" tasks read a user-supplied haystack file; without one, niah_single_2/3 are refused and the
#: others use the noise haystack (docs/COLLECTION.md, "Deviations from RULER").
NIAH_CONFIGS: dict[str, dict] = {
    "niah_single_1": dict(haystack="noise", type_k="words", type_v="numbers", num_k=1, num_v=1, num_q=1),
    "niah_single_2": dict(haystack="essay", type_k="words", type_v="numbers", num_k=1, num_v=1, num_q=1),
    "niah_single_3": dict(haystack="essay", type_k="words", type_v="uuids", num_k=1, num_v=1, num_q=1),
    "niah_multikey_1": dict(haystack="essay", type_k="words", type_v="numbers", num_k=4, num_v=1, num_q=1),
    "niah_multikey_2": dict(haystack="needle", type_k="words", type_v="numbers", num_k=1, num_v=1, num_q=1),
    "niah_multikey_3": dict(haystack="needle", type_k="uuids", type_v="uuids", num_k=1, num_v=1, num_q=1),
    "niah_multivalue": dict(haystack="essay", type_k="words", type_v="numbers", num_k=1, num_v=4, num_q=1),
    "niah_multiquery": dict(haystack="essay", type_k="words", type_v="numbers", num_k=4, num_v=1, num_q=4),
}
#: vt: one chain of four hops (five variables) in the noise haystack, one in-context example.
VT_CONFIG = dict(haystack="noise", num_chains=1, num_hops=4)
#: cwe: 10 common words repeated 30× and the others 3× (6× / 1× below 4096 tokens, as RULER does).
CWE_CONFIG = dict(num_cw=10, freq_cw=30, freq_ucw=3, short_freq_cw=6, short_freq_ucw=1, short_below=4096)
#: fwe: Zipf-distributed coded words, α = 2, coded word length 6.
FWE_CONFIG = dict(alpha=2.0, coded_wordlen=6)
#: qa_1 reads SQuAD, qa_2 HotpotQA (user-supplied files).
QA_CONFIGS = {"qa_1": dict(dataset="squad"), "qa_2": dict(dataset="hotpotqa")}
