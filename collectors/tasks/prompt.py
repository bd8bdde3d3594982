"""The prompt around a task's text: two styles, tokenisation, and the context/question split.

Two prompt styles (:data:`pagestats.core.defaults.PROMPT_STYLES`; docs/COLLECTION.md, "Prompt styles"):

``page``
    The authors' runner (the paper's repository, ``experiments/scripts/gated_eviction.py``), on
    whose D the paper's τ = 0.07 was set (§3 "Calibration"). RULER's input is split as kvpress's
    RULER dataset splits it — *context* up to the last question, *question* up to the answer
    prefix, the *answer prefix* — and the chat template gets a system turn
    :data:`pagestats.core.defaults.PAGE_SYSTEM_PROMPT` and one user turn
    ``context + "\\n\\n" + question + "\\n" + answer_prefix``, with the generation prompt. The
    text is tokenised without added special tokens, so the template's own BOS is the only one.
``ruler``
    RULER's input as one user turn, the generation prompt, then RULER's answer prefix (its
    leading space dropped), as the assistant's first words.

A tokenizer without a chat template gets RULER's plain ``text + answer_prefix`` (style ``ruler``
only; ``page`` needs a template) with the tokenizer's own special tokens.
"""

from __future__ import annotations

from pagestats.core import defaults


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def check_style(prompt_style: str) -> str:
    if prompt_style not in defaults.PROMPT_STYLES:
        raise ValueError(f"unknown prompt style {prompt_style!r}; expected one of {', '.join(defaults.PROMPT_STYLES)}")
    return prompt_style


def page_parts(text: str, question: str, answer_prefix: str) -> tuple[str, str, str]:
    """(context, question, answer prefix) of RULER's input ``text + answer_prefix``, cut where kvpress's
    RULER dataset cuts it: the question starts at its first non-blank character (the blank before it
    stays in the context) and runs up to the answer prefix's first non-blank character."""
    q = question.lstrip()
    q0 = len(text) - len(q)
    full = text + answer_prefix
    a0 = len(text) + len(answer_prefix) - len(answer_prefix.lstrip())
    return full[:q0], full[q0:a0], full[a0:]


def render(tokenizer, text: str, question: str, answer_prefix: str, prompt_style: str) -> tuple[str, int]:
    """The prompt of one task input in ``prompt_style`` and the character offset where its question starts.

    ``question`` is the end of ``text`` after the task's context (:class:`collectors.tasks.generators.Body`).

    Raises
    ------
    ValueError
        An unknown style, ``page`` with a tokenizer that has no chat template, or a chat template
        that does not hold the user turn verbatim.
    """
    check_style(prompt_style)
    if prompt_style == "page":
        if not has_chat_template(tokenizer):
            raise ValueError("prompt style 'page' needs a chat template (the authors' prompt is a system and a "
                             "user turn); this tokenizer has none, so use prompt style 'ruler'")
        context, quest, prefix = page_parts(text, question, answer_prefix)
        user = context + "\n\n" + quest + ("\n" + prefix if prefix else "")
        messages = [{"role": "system", "content": defaults.PAGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        start = prompt.rfind(user)
        if start < 0:
            raise ValueError("the chat template changed the user message; cannot locate the question")
        return prompt, start + len(context) + 2
    if has_chat_template(tokenizer):
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
        prompt = chat + answer_prefix.lstrip()
    else:
        prompt = text + answer_prefix
    start = prompt.rfind(text)
    if start < 0:
        raise ValueError("the chat template changed the user message; cannot locate the question")
    return prompt, start + len(text) - len(question)


def tokenize_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of ``prompt``: the chat template already holds the special tokens, so none are
    added then; without a chat template the tokenizer's own (e.g. BOS) are added."""
    return list(tokenizer(prompt, add_special_tokens=not has_chat_template(tokenizer))["input_ids"])


def split_prompt(tokenizer, task_input) -> tuple[list[int], int]:
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
