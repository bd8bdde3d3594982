"""RULER-style long-context tasks: generators, prompt rendering, length fitting and scoring.

Public API (docs/ARCHITECTURE.md, collector contract)::

    TaskInput                      one rendered input (prompt with chat template + answer prefix)
    make_input(task, *, tokenizer, context_length, input_id, draw, haystack="noise", **files)
    score(task, prediction, references) -> float      RULER string_match_all / string_match_part
    TASK_NAMES, TASK_TOKENS_TO_GENERATE
    render_prompt(tokenizer, text, answer_prefix), tokenize_prompt(tokenizer, prompt)

Inputs are deterministic functions of ``(task, draw, input_id)`` and the tokenizer: the seed of
every random choice is derived from those three by SHA-256 (:func:`input_seed`).

The prompt is the whole RULER input — instruction, context and question inside the chat template,
then the answer prefix. Query-aware runs prefill all of it (as RULER runs; docs/COLLECTION.md); query-agnostic
runs prefill the tokens before ``TaskInput.question_start`` (instruction and context), evict there, and
append the rest (question, end of the chat turn, answer prefix) afterwards (:func:`split_prompt`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pagestats import defaults

from collectors.tasks import generators as _gen
from collectors.tasks import templates as _tp
from collectors.tasks.haystack import file_sha256
from collectors.tasks.length import TOLERANCE, fit_length
from collectors.tasks.scoring import metric_name, postprocess, score, string_match_all, string_match_part

TASK_NAMES: tuple[str, ...] = tuple(defaults.RULER_TASKS)
TASK_TOKENS_TO_GENERATE: dict[str, int] = {
    **{t: _tp.NIAH_TOKENS for t in _tp.NIAH_CONFIGS},
    "vt": _tp.VT_TOKENS,
    "cwe": _tp.CWE_TOKENS,
    "fwe": _tp.FWE_TOKENS,
    "qa_1": _tp.QA_TOKENS,
    "qa_2": _tp.QA_TOKENS,
}
HAYSTACKS = ("noise", "essay")
#: Tokens an instruct model may write before (and between) the reference values — "The special magic
#: number is:", a list marker, a newline — that the decode limit must leave room for
#: (:func:`check_decode_budget`).
PREAMBLE_MARGIN = 16


def answer_tokens(task: str, references, tokenizer) -> int:
    """Tokens of the shortest complete answer to an input, in the model's own tokenizer.

    ``string_match_all`` tasks (every reference must appear) need every reference, written as
    ``", "``-joined values; ``string_match_part`` tasks (QA: one reference suffices) need the
    longest single reference.
    """
    refs = [str(r) for r in references]
    if not refs:
        return 0
    texts = [", ".join(refs)] if metric_name(task) == "string_match_all" else refs
    return max(len(tokenizer(" " + t, add_special_tokens=False)["input_ids"]) for t in texts)


def check_decode_budget(task: str, references, tokenizer, max_new_tokens: int) -> None:
    """Refuse a decode limit that could cut the answer itself.

    The limit must hold :func:`answer_tokens` plus :data:`PREAMBLE_MARGIN`: a greedy decode that
    writes the complete answer after a short preamble must end before the limit does, so that a
    ``stop_reason = "length"`` (docs/SCHEMA.md) never stands for an answer the limit cut.

    Raises
    ------
    ValueError
        One line naming the task, the tokens needed and the limit, and the limit that would hold them.
    """
    need = answer_tokens(task, references, tokenizer) + PREAMBLE_MARGIN
    if int(max_new_tokens) < need:
        raise DecodeLimitError(task, int(max_new_tokens), need)


class DecodeLimitError(ValueError):
    """A decode limit (``max_new_tokens``) of ``task`` below ``need``, the least limit that holds its
    answer and a preamble (:func:`check_decode_budget`)."""

    def __init__(self, task: str, limit: int, need: int):
        self.task, self.limit, self.need = task, limit, need
        super().__init__(f"{task}: max_new_tokens {limit} cannot hold the answer ({need - PREAMBLE_MARGIN} tokens for "
                         f"the references, {PREAMBLE_MARGIN} for a preamble); raise max_new_tokens to at least {need}")

__all__ = [
    "TaskInput", "make_input", "split_prompt", "score", "postprocess", "string_match_all", "string_match_part", "metric_name",
    "TASK_NAMES", "TASK_TOKENS_TO_GENERATE", "PREAMBLE_MARGIN", "answer_tokens", "check_decode_budget", "DecodeLimitError", "render_prompt", "tokenize_prompt", "input_seed", "TOLERANCE",
]


@dataclass
class TaskInput:
    """One input of a task, ready to prefill.

    Attributes
    ----------
    prompt : str
        Exact text given to the tokenizer: chat template applied to the RULER input, then the answer
        prefix (schema v1 ``inputs.prompt``).
    references : list[str]
        Reference answers for :func:`score`.
    n_tokens : int
        Prompt length in tokens (:func:`tokenize_prompt`), within 2 % below ``context_length``.
    metadata : dict
        JSON-serialisable details: ``haystack`` (noise / essay file / needles / …), haystack size
        ``n`` and ``unit``, filler words ``m``, ``chat_template``, the metric, file hashes.
    question_start : int
        Character offset in ``prompt`` where the question (RULER's template after the context)
        begins; everything before it is instruction and context.
    """

    task: str
    input_id: int
    draw: int
    prompt: str
    references: list[str]
    max_new_tokens: int
    n_tokens: int
    metadata: dict = field(default_factory=dict)
    question_start: int | None = None


def input_seed(task: str, draw: int, input_id: int) -> int:
    """64-bit seed of every random choice of input ``(task, draw, input_id)``."""
    digest = hashlib.sha256(f"{task}|{int(draw)}|{int(input_id)}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer, text: str, answer_prefix: str) -> str:
    """The chat template (one user turn, generation prompt added) around ``text``, then the answer
    prefix without RULER's leading space. Tokenizers without a chat template get RULER's plain
    ``text + answer_prefix``."""
    if has_chat_template(tokenizer):
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return chat + answer_prefix.lstrip()
    return text + answer_prefix


def tokenize_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of ``prompt``: the chat template already holds the special tokens, so none are
    added then; without a chat template the tokenizer's own (e.g. BOS) are added."""
    return list(tokenizer(prompt, add_special_tokens=not has_chat_template(tokenizer))["input_ids"])


def split_prompt(tokenizer, task_input: TaskInput) -> tuple[list[int], int]:
    """Token ids of the prompt and how many of them precede the question (the context part).

    The ids are exactly :func:`tokenize_prompt`'s; the context part is the longest prefix of tokens
    that end at or before ``task_input.question_start`` (a token straddling the boundary belongs to
    the question), so the two parts concatenate to the query-aware prompt.

    Raises
    ------
    ValueError
        When the tokenizer cannot report character offsets (a slow tokenizer), or the split would
        leave either part empty.
    """
    if task_input.question_start is None:
        raise ValueError(f"{task_input.task}/{task_input.input_id}: the input does not know where its question starts")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("query-agnostic mode needs a fast tokenizer (character offsets of the tokens)")
    enc = tokenizer(task_input.prompt, add_special_tokens=not has_chat_template(tokenizer), return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    if ids != tokenize_prompt(tokenizer, task_input.prompt):
        raise RuntimeError("tokenizer gave different ids with offsets than without")
    ends = [end for _, end in enc["offset_mapping"]]
    n_context = next((i for i, end in enumerate(ends) if end > task_input.question_start), len(ids))
    if not 0 < n_context < len(ids):
        raise ValueError(f"{task_input.task}/{task_input.input_id}: cannot split the prompt at its question "
                         f"({n_context} of {len(ids)} tokens before it)")
    return ids, n_context


def _generator(task, seed, *, context_length, input_id, draw, haystack, essay_file, qa_file):
    if task in _tp.NIAH_CONFIGS:
        return _gen.niah(task, seed, haystack=haystack, essay_file=essay_file)
    if task == "vt":
        return _gen.vt(seed, context_length=context_length)
    if task == "cwe":
        return _gen.cwe(seed, context_length=context_length)
    if task == "fwe":
        return _gen.fwe(seed, context_length=context_length)
    if task in _tp.QA_CONFIGS:
        from collectors.tasks.qa import qa

        return qa(task, seed, draw_seed=input_seed(task, draw, -1), input_id=input_id, qa_file=qa_file)
    raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASK_NAMES)}")


def make_input(
    task: str,
    *,
    tokenizer,
    context_length: int,
    input_id: int,
    draw: int,
    haystack: str = "noise",
    max_new_tokens: int | None = None,
    essay_file=None,
    qa_file=None,
    allow_cut_answers: bool = False,
) -> TaskInput:
    """Generate input ``input_id`` of ``task`` at ``context_length`` tokens for ``tokenizer``.

    Parameters
    ----------
    haystack : {"noise", "essay"}
        Haystack of the tasks whose RULER haystack is an essay (niah_multikey_1, niah_multivalue,
        niah_multiquery): "essay" reads ``essay_file``; other tasks use RULER's own haystack.
    max_new_tokens : int, optional
        Overrides the task's tokens to generate (:data:`TASK_TOKENS_TO_GENERATE`); either must hold
        the answer (:func:`check_decode_budget`).
    essay_file, qa_file : path, optional
        User-supplied essay text / SQuAD (qa_1) or HotpotQA (qa_2) json.
    allow_cut_answers : bool
        Skip :func:`check_decode_budget` (smoke tests with a few new tokens: their decodes stop by
        ``length`` and ``pagestats validate`` flags them).

    Raises
    ------
    ValueError
        Unknown task or haystack, missing file, a context too short for the task, or a decode
        limit that cannot hold the answer.
    """
    if task not in TASK_NAMES:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASK_NAMES)}")
    if haystack not in HAYSTACKS:
        raise ValueError(f"unknown haystack {haystack!r}; expected one of {HAYSTACKS}")
    if int(context_length) <= 0:
        raise ValueError(f"context_length must be positive, got {context_length}")
    if int(input_id) < 0:
        raise ValueError(f"input_id must be ≥ 0, got {input_id}")
    seed = input_seed(task, draw, input_id)
    gen = _generator(task, seed, context_length=int(context_length), input_id=int(input_id), draw=int(draw),
                     haystack=haystack, essay_file=essay_file, qa_file=qa_file)
    fit = fit_length(
        gen,
        lambda body: render_prompt(tokenizer, body.text, body.answer_prefix),
        lambda prompt: len(tokenize_prompt(tokenizer, prompt)),
        int(context_length),
    )
    haystack_used = gen.haystack
    metadata = {
        "haystack": haystack_used,
        "unit": gen.unit,
        "n": fit.n,
        "m": fit.m,
        "chat_template": has_chat_template(tokenizer),
        "metric": metric_name(task),
        "fill": fit.n_tokens / int(context_length),
        "within_tolerance": fit.n_tokens >= (1 - TOLERANCE) * int(context_length),
        **fit.body.metadata,
    }
    if not metadata["within_tolerance"]:
        import warnings

        warnings.warn(
            f"{task}/{input_id}: prompt has {fit.n_tokens} tokens, more than {TOLERANCE:.0%} below the target "
            f"{context_length} (the haystack is too coarse here)",
            stacklevel=2,
        )
    if haystack_used == "essay":
        metadata["essay_sha256"] = file_sha256(essay_file)
    limit = int(max_new_tokens) if max_new_tokens is not None else TASK_TOKENS_TO_GENERATE[task]
    if not allow_cut_answers:
        check_decode_budget(task, fit.body.references, tokenizer, limit)
    body_start = fit.prompt.rfind(fit.body.text)
    if body_start < 0:
        raise ValueError(f"{task}/{input_id}: the chat template changed the user message; cannot locate the question")
    return TaskInput(
        question_start=body_start + len(fit.body.text) - len(fit.body.question),
        task=task,
        input_id=int(input_id),
        draw=int(draw),
        prompt=fit.prompt,
        references=list(fit.body.references),
        max_new_tokens=limit,
        n_tokens=fit.n_tokens,
        metadata=metadata,
    )
