"""RULER-style long-context tasks: generators, prompt rendering, length fitting and scoring.

Public API (docs/ARCHITECTURE.md, collector contract)::

    TaskInput                      one rendered input (prompt with chat template + answer prefix)
    make_input(task, *, tokenizer, context_length, input_id, draw, prompt_style="page", **files)
    score(task, prediction, references) -> float      RULER string_match_all / string_match_part
    TASK_NAMES, TASK_TOKENS_TO_GENERATE
    render(tokenizer, text, question, answer_prefix, prompt_style), tokenize_prompt(tokenizer, prompt)

Inputs are deterministic functions of ``(task, draw, input_id)`` and the tokenizer: the seed of
every random choice is derived from those three by SHA-256 (:func:`input_seed`).

The prompt is the whole RULER input — instruction, context, question and answer prefix — in the chat
template, in one of two prompt styles (:mod:`collectors.tasks.prompt`: the authors' ``page``, RULER's
``ruler``). Query-aware runs prefill all of it (as RULER runs; docs/COLLECTION.md); query-agnostic
runs prefill the tokens before ``TaskInput.question_start`` (instruction and context), evict there, and
append the rest (question, end of the chat turn, answer prefix) afterwards (:func:`split_prompt`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pagestats.core import defaults

from collectors.tasks import generators as _gen
from collectors.tasks import templates as _tp
from collectors.tasks.haystack import file_sha256
from collectors.tasks.length import TOLERANCE, fit_length
from collectors.tasks.prompt import check_style, has_chat_template, render, split_prompt, tokenize_prompt
from collectors.tasks.scoring import metric_name, postprocess, score, string_match_all, string_match_part

#: RULER tasks whose haystack is an essay, available only with a ``haystack_file`` (RULER's essays cannot be
#: downloaded here, and the noise haystack would make them niah_single_1 with other needles).
ESSAY_TASKS: tuple[str, ...] = ("niah_single_2", "niah_single_3")
TASK_NAMES: tuple[str, ...] = (defaults.RULER_TASKS[0], *ESSAY_TASKS, *defaults.RULER_TASKS[1:])
TASK_TOKENS_TO_GENERATE: dict[str, int] = {
    **{t: _tp.NIAH_TOKENS for t in _tp.NIAH_CONFIGS},
    "vt": _tp.VT_TOKENS,
    "cwe": _tp.CWE_TOKENS,
    "fwe": _tp.FWE_TOKENS,
    "qa_1": _tp.QA_TOKENS,
    "qa_2": _tp.QA_TOKENS,
}
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
    "TASK_NAMES", "ESSAY_TASKS", "TASK_TOKENS_TO_GENERATE", "PREAMBLE_MARGIN", "answer_tokens", "check_decode_budget",
    "DecodeLimitError",
    "has_chat_template", "render", "tokenize_prompt", "input_seed", "TOLERANCE",
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


def _generator(task, seed, *, context_length, input_id, draw, haystack_file, qa_file, tokenizer):
    if task in _tp.NIAH_CONFIGS:
        return _gen.niah(task, seed, haystack_file=haystack_file)
    if task == "vt":
        return _gen.vt(seed, context_length=context_length,
                       count=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))
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
    prompt_style: str = defaults.PROMPT_STYLE,
    max_new_tokens: int | None = None,
    haystack_file=None,
    qa_file=None,
    allow_cut_answers: bool = False,
) -> TaskInput:
    """Generate input ``input_id`` of ``task`` at ``context_length`` tokens for ``tokenizer``.

    Parameters
    ----------
    prompt_style : {"page", "ruler"}
        How the task text is put in the chat template (:mod:`collectors.tasks.prompt`; default
        :data:`pagestats.core.defaults.PROMPT_STYLE`, the authors' prompt).
    max_new_tokens : int, optional
        Overrides the task's tokens to generate (:data:`TASK_TOKENS_TO_GENERATE`); either must hold
        the answer (:func:`check_decode_budget`).
    haystack_file : path, optional
        Plain text (RULER's Paul Graham essays) used as the haystack of the tasks whose RULER haystack
        is an essay (niah_single_2, niah_single_3 — which need it —, niah_multikey_1, niah_multivalue,
        niah_multiquery — which use the noise haystack without it); the other tasks ignore it.
    qa_file : path, optional
        SQuAD (qa_1) or HotpotQA (qa_2) json.
    allow_cut_answers : bool
        Skip :func:`check_decode_budget` (smoke tests with a few new tokens: their decodes stop by
        ``length`` and ``pagestats validate`` flags them).

    Raises
    ------
    ValueError
        Unknown task or style, missing file, a context too short for the task, or a decode limit
        that cannot hold the answer.
    """
    if task not in TASK_NAMES:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASK_NAMES)}")
    check_style(prompt_style)
    if int(context_length) <= 0:
        raise ValueError(f"context_length must be positive, got {context_length}")
    if int(input_id) < 0:
        raise ValueError(f"input_id must be ≥ 0, got {input_id}")
    seed = input_seed(task, draw, input_id)
    gen = _generator(task, seed, context_length=int(context_length), input_id=int(input_id), draw=int(draw),
                     haystack_file=haystack_file, qa_file=qa_file, tokenizer=tokenizer)
    rendered = {}

    def render_body(body):
        prompt, start = render(tokenizer, body.text, body.question, body.answer_prefix, prompt_style)
        rendered[prompt] = start
        return prompt

    fit = fit_length(gen, render_body, lambda prompt: len(tokenize_prompt(tokenizer, prompt)), int(context_length))
    haystack_used = gen.haystack
    fill_ok = fit.n_tokens >= (1 - TOLERANCE) * int(context_length)
    metadata = {
        "haystack": haystack_used,
        "unit": gen.unit,
        "n": fit.n,
        "m": fit.m,
        "chat_template": has_chat_template(tokenizer),
        "prompt_style": prompt_style,
        "metric": metric_name(task),
        "fill": fit.n_tokens / int(context_length),
        # a needle haystack grows by whole needles (RULER's rule: the most that fit), so it is within one
        # needle of the target by construction (fit_length: n fits, n + 1 does not)
        "within_tolerance": fill_ok or gen.whole_units,
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
        metadata["essay_sha256"] = file_sha256(haystack_file)
    limit = int(max_new_tokens) if max_new_tokens is not None else TASK_TOKENS_TO_GENERATE[task]
    if not allow_cut_answers:
        check_decode_budget(task, fit.body.references, tokenizer, limit)
    return TaskInput(
        question_start=rendered[fit.prompt],
        task=task,
        input_id=int(input_id),
        draw=int(draw),
        prompt=fit.prompt,
        references=list(fit.body.references),
        max_new_tokens=limit,
        n_tokens=fit.n_tokens,
        metadata=metadata,
    )
