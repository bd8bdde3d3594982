"""RULER-style generators: answers in the prompt, length within 2 % below the target with the REAL
SmolLM2 tokenizer and chat template, determinism, and each task's structure checked by brute force."""

import json
import re
from collections import Counter

import pytest

from collectors.tasks import ESSAY_TASKS, TASK_NAMES, TASK_TOKENS_TO_GENERATE, make_input, score
from collectors.tasks.templates import NIAH_CONFIGS

SYNTHETIC = [t for t in TASK_NAMES if not t.startswith("qa") and t not in ESSAY_TASKS]
NEEDLE_HAYSTACK = [t for t, c in NIAH_CONFIGS.items() if c["haystack"] == "needle"]


@pytest.fixture(scope="module")
def tok(smollm2):
    """SmolLM2's tokenizer, as the GGUF load gave it (saved by the conftest's session fixture)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2))


def n_tokens(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


def check_common(tok, x, L):
    assert x.n_tokens == n_tokens(tok, x.prompt)
    if x.task in NEEDLE_HAYSTACK:  # RULER's needle haystack: whole needles only, within one needle below L
        needle = max(n_tokens(tok, line + "\n") for line in NEEDLE_RE_LINE.findall(x.prompt))
        assert L - needle < x.n_tokens <= L, (x.task, x.n_tokens, L)
    else:
        assert 0.98 * L <= x.n_tokens <= L, (x.task, x.n_tokens, L)
    assert x.prompt.startswith("<|im_start|>system")
    assert "<|im_start|>user\n" in x.prompt and x.prompt.count("<|im_start|>assistant\n") == 1
    for ref in x.references:
        assert ref in x.prompt, (x.task, ref)
    assert score(x.task, " ".join(x.references), x.references) == 1.0


@pytest.mark.parametrize("L", [512, 1500])
@pytest.mark.parametrize("task", SYNTHETIC)
def test_synthetic_tasks_fit_length_and_contain_answers(tok, task, L):
    if task == "cwe" and L == 512:  # RULER's worked example and 10 words × 6 do not fit in 512 SmolLM2 tokens
        with pytest.raises(ValueError, match="context_length 512 is too short"):
            make_input(task, tokenizer=tok, context_length=L, input_id=1, draw=0)
        return
    x = make_input(task, tokenizer=tok, context_length=L, input_id=1, draw=0)
    check_common(tok, x, L)
    assert x.max_new_tokens == TASK_TOKENS_TO_GENERATE[task]
    assert x.metadata["haystack"] in ("noise", "needle", "word list", "coded words")


def test_tokens_to_generate_are_rulers_but_vt():
    """RULER's tokens to generate, except vt: RULER's 30 cannot hold five variable names and a preamble."""
    assert {t: TASK_TOKENS_TO_GENERATE[t] for t in ("niah_single_1", "vt", "cwe", "fwe", "qa_1")} == {
        "niah_single_1": 128, "vt": 64, "cwe": 120, "fwe": 50, "qa_1": 32}


def test_deterministic_in_task_draw_input_id(tok):
    a = make_input("niah_multikey_2", tokenizer=tok, context_length=600, input_id=3, draw=7)
    b = make_input("niah_multikey_2", tokenizer=tok, context_length=600, input_id=3, draw=7)
    assert (a.prompt, a.references) == (b.prompt, b.references)
    assert make_input("niah_multikey_2", tokenizer=tok, context_length=600, input_id=4, draw=7).prompt != a.prompt
    assert make_input("niah_multikey_2", tokenizer=tok, context_length=600, input_id=3, draw=8).prompt != a.prompt
    c = make_input("niah_single_1", tokenizer=tok, context_length=600, input_id=3, draw=7, max_new_tokens=40)
    assert c.max_new_tokens == 40 and c.draw == 7 and c.input_id == 3


def test_a_decode_limit_that_cannot_hold_the_answer_is_refused(tok):
    """The limit must hold the references (joined, in the model's tokens) plus the preamble margin."""
    from collectors.tasks import PREAMBLE_MARGIN, answer_tokens

    x = make_input("niah_multivalue", tokenizer=tok, context_length=600, input_id=0, draw=0)
    need = len(tok(" " + ", ".join(x.references), add_special_tokens=False)["input_ids"])
    assert answer_tokens("niah_multivalue", x.references, tok) == need > 4 * 7  # four 7-digit numbers, joined
    kw = dict(tokenizer=tok, context_length=600, input_id=0, draw=0)
    with pytest.raises(ValueError, match=rf"niah_multivalue: max_new_tokens {need + PREAMBLE_MARGIN - 1} cannot hold"):
        make_input("niah_multivalue", max_new_tokens=need + PREAMBLE_MARGIN - 1, **kw)
    assert make_input("niah_multivalue", max_new_tokens=need + PREAMBLE_MARGIN, **kw).max_new_tokens == need + 16
    short = make_input("niah_multivalue", max_new_tokens=4, allow_cut_answers=True, **kw)
    assert short.max_new_tokens == 4 and short.prompt == x.prompt


NEEDLE_RE = re.compile(r"One of the special magic (?:numbers|uuids) for (\S+) is: (\S+)\.")
NEEDLE_RE_LINE = re.compile(r"One of the special magic (?:numbers|uuids) for \S+ is: \S+\.")


@pytest.mark.parametrize("task", NEEDLE_HAYSTACK)
def test_needle_haystack_holds_only_needles(tok, task):
    """RULER's needle haystack is needles and nothing else: no filler an evictor could drop for free."""
    x = make_input(task, tokenizer=tok, context_length=700, input_id=0, draw=0, prompt_style="ruler")
    start = x.prompt.index("afterwards.\n") + len("afterwards.\n")
    end = x.prompt.index("\nWhat is the special magic")
    lines = x.prompt[start:end].split("\n")
    assert len(lines) > 5 and all(NEEDLE_RE_LINE.fullmatch(line) for line in lines), lines[:3]


@pytest.mark.parametrize("task", [t for t in NIAH_CONFIGS if t not in ESSAY_TASKS])
def test_niah_needles(tok, task):
    cfg = NIAH_CONFIGS[task]
    x = make_input(task, tokenizer=tok, context_length=900, input_id=0, draw=1)
    needles = NEEDLE_RE.findall(x.prompt)
    by_key = {}
    for key, value in needles:
        by_key.setdefault(key, []).append(value)
    asked = x.metadata["keys"]
    assert len(asked) == cfg["num_q"]
    expected = [v for k in asked for v in by_key[k]]
    assert sorted(expected) == sorted(x.references)
    assert len(x.references) == cfg["num_q"] * cfg["num_v"]
    if cfg["haystack"] == "needle":
        assert len(needles) > 5 and all(len(by_key[k]) == 1 for k in asked)  # distractors, keys unique
    else:
        assert len(needles) == max(cfg["num_k"], cfg["num_q"]) * cfg["num_v"]
        assert "The grass is green." in x.prompt
    if cfg["type_v"] == "uuids":
        assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", r)
                   for r in x.references)
    else:
        assert all(re.fullmatch(r"\d{7}", r) for r in x.references)
    one = cfg["num_q"] * cfg["num_v"] == 1
    assert x.prompt.endswith(f"provided text {'is' if one else 'are'}<|im_end|>\n<|im_start|>assistant\n")


def test_vt_chain_in_order(tok):
    x = make_input("vt", tokenizer=tok, context_length=1200, input_id=2, draw=0)
    main = x.prompt[x.prompt.rindex("Memorize and track"):]
    value = x.metadata["value"]
    names = x.references
    assert len(names) == 5
    pos = [main.index(f"VAR {names[0]} = {value}")]
    pos += [main.index(f"VAR {names[j + 1]} = VAR {names[j]}") for j in range(4)]
    assert pos == sorted(pos)
    assert f"5 variables are assigned the value {value}" in x.prompt


def test_vt_worked_example_is_rulers_500_tokens(tok):
    """RULER's vt example: the most noise groups, 5 at a time, within 500 − 30 tokens; then a blank line."""
    x = make_input("vt", tokenizer=tok, context_length=4096, input_id=0, draw=0, prompt_style="ruler")
    user = x.prompt[x.prompt.index("<|im_start|>user\n") + len("<|im_start|>user\n"):]
    example = user[:user.rindex("\n\nMemorize and track")]
    groups = example.count("The grass is green. The sky is blue.")
    assert groups == x.metadata["icl_noise_groups"] > 0 and groups % 5 == 0
    assert n_tokens(tok, example) <= 470 < n_tokens(tok, example) + 5 * n_tokens(tok, "\nThe grass is green. The sky "
                                                                                  "is blue. The sun is yellow. Here we "
                                                                                  "go. There and back again.")


@pytest.mark.parametrize("L, freq", [(800, (6, 1)), (4200, (30, 3))])
def test_cwe_counts(tok, L, freq):
    x = make_input("cwe", tokenizer=tok, context_length=L, input_id=0, draw=0)
    assert x.prompt.count("Below is a numbered list") == 2  # RULER's worked example at every length
    main = x.prompt[x.prompt.rindex("Below is a numbered list"):x.prompt.rindex("Question:")]
    words = re.findall(r"\d+\. (\S+)", main)
    counts = Counter(words)
    assert len(x.references) == 10
    assert all(counts[w] == freq[0] for w in x.references)
    assert all(c == freq[1] for w, c in counts.items() if w not in x.references)
    numbers = [int(n) for n in re.findall(r"(\d+)\. \S+", main)]
    assert numbers == list(range(1, len(numbers) + 1))


def test_fwe_answers_are_ranks_two_to_four(tok):
    x = make_input("fwe", tokenizer=tok, context_length=1500, input_id=0, draw=0)
    text = x.prompt[x.prompt.index("coded words. ") + len("coded words. "):x.prompt.index("\nQuestion:")]
    counts = Counter(text.split())
    ranked = [w for w, _ in counts.most_common()]
    assert ranked[0] == "..."
    assert sorted(ranked[1:4]) == sorted(x.references)
    assert counts[ranked[3]] > counts[ranked[4]]
    assert x.metadata["vocab_size"] == 1500 // 50 >= len(counts)  # RULER: max_seq_length // 50


SQUAD = {"data": [
    {"paragraphs": [
        {"context": "The Eiffel Tower stands in Paris and was finished in 1889.",
         "qas": [{"question": "In which city is the Eiffel Tower?", "answers": [{"text": "Paris"}, {"text": "Paris, France"}]},
                 {"question": "Unanswerable?", "answers": [], "is_impossible": True}]},
        {"context": "Gustave Eiffel's company designed and built the tower.",
         "qas": [{"question": "Whose company built the tower?", "answers": [{"text": "Gustave Eiffel"}]}]}]},
    {"paragraphs": [{"context": "Mount Fuji is the highest mountain in Japan, at 3776 metres.",
                     "qas": [{"question": "How high is Mount Fuji?", "answers": [{"text": "3776 metres"}]}]}]},
    {"paragraphs": [{"context": "Water boils at 100 degrees Celsius at sea level.", "qas": []}]},
]}
HOTPOT = [
    {"question": "Which river flows through the capital of Austria?", "answer": "Danube",
     "context": [["Vienna", ["Vienna is the capital of Austria. ", "It lies on the Danube."]],
                 ["Austria", ["Austria is a country in Central Europe."]]]},
    {"question": "Who wrote Hamlet?", "answer": "William Shakespeare",
     "context": [["Hamlet", ["Hamlet is a tragedy by William Shakespeare."]],
                 ["Globe", ["The Globe Theatre was in London."]]]},
]


@pytest.fixture(scope="module")
def qa_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qa")
    (d / "squad.json").write_text(json.dumps(SQUAD))
    (d / "hotpot.json").write_text(json.dumps(HOTPOT))
    return d / "squad.json", d / "hotpot.json"


@pytest.mark.parametrize("task, which", [("qa_1", 0), ("qa_2", 1)])
@pytest.mark.parametrize("input_id", [0, 1])
def test_qa_from_user_files(tok, qa_files, task, which, input_id):
    x = make_input(task, tokenizer=tok, context_length=700, input_id=input_id, draw=0, qa_file=qa_files[which])
    check_common(tok, x, 700)
    data = SQUAD if which == 0 else HOTPOT
    if which == 0:
        gold = {q["question"]: (p["context"], [a["text"] for a in q["answers"]])
                for a in data["data"] for p in a["paragraphs"] for q in p["qas"] if q["answers"]}
    else:
        gold = {d["question"]: ("\n".join([d["context"][0][0], "".join(d["context"][0][1])]), [d["answer"]]) for d in data}
    question = x.metadata["question"]
    context, answers = gold[question]
    assert x.references == answers
    assert context in x.prompt and f"Question: {question}" in x.prompt
    assert re.search(r"Document 1:\n", x.prompt)
    assert x.max_new_tokens == 32
    assert score(task, f"I think {answers[-1].upper()}", x.references) == 1.0


def test_qa_errors(tok, qa_files, tmp_path):
    with pytest.raises(ValueError, match="needs a squad json"):
        make_input("qa_1", tokenizer=tok, context_length=700, input_id=0, draw=0)
    with pytest.raises(ValueError, match="not SQuAD"):
        make_input("qa_1", tokenizer=tok, context_length=700, input_id=0, draw=0, qa_file=qa_files[1])
    with pytest.raises(FileNotFoundError):
        make_input("qa_2", tokenizer=tok, context_length=700, input_id=0, draw=0, qa_file=tmp_path / "nope.json")


ESSAY = ("Writing is thinking made visible. Most of what we call talent is practice. "
         "A good essay starts from a question, not an answer! Does that hold for code as well? ") * 3


def test_essay_haystack_only_where_ruler_uses_essays(tok, tmp_path):
    essay = tmp_path / "essay.txt"
    essay.write_text(ESSAY)
    x = make_input("niah_multikey_1", tokenizer=tok, context_length=800, input_id=0, draw=0, haystack_file=essay)
    check_common(tok, x, 800)
    assert x.metadata["haystack"] == "essay" and len(x.metadata["essay_sha256"]) == 64
    assert "Writing is thinking made visible." in x.prompt and "The grass is green" not in x.prompt
    assert len(NEEDLE_RE.findall(x.prompt)) == 4
    y = make_input("niah_single_1", tokenizer=tok, context_length=800, input_id=0, draw=0, haystack_file=essay)
    assert y.metadata["haystack"] == "noise" and "Writing is thinking" not in y.prompt
    z = make_input("niah_multikey_1", tokenizer=tok, context_length=800, input_id=0, draw=0)
    assert z.metadata["haystack"] == "noise"


@pytest.mark.parametrize("task, value", [("niah_single_2", r"\d{7}"), ("niah_single_3", r"[0-9a-f-]{36}")])
def test_essay_only_tasks_need_the_haystack_file(tok, tmp_path, task, value):
    with pytest.raises(ValueError, match=f"^{task} needs RULER's essay haystack: give a haystack file"):
        make_input(task, tokenizer=tok, context_length=800, input_id=0, draw=0)
    essay = tmp_path / "essay.txt"
    essay.write_text(ESSAY * 4)
    x = make_input(task, tokenizer=tok, context_length=800, input_id=0, draw=0, haystack_file=essay)
    check_common(tok, x, 800)
    assert x.metadata["haystack"] == "essay" and "Writing is thinking made visible." in x.prompt
    (key, found), = NEEDLE_RE.findall(x.prompt)
    assert x.references == [found] and re.fullmatch(value, found) and x.metadata["keys"] == [key]


def test_bad_arguments(tok):
    with pytest.raises(ValueError, match="unknown task"):
        make_input("niah_single_9", tokenizer=tok, context_length=512, input_id=0, draw=0)
    with pytest.raises(ValueError, match="too short"):
        make_input("niah_single_1", tokenizer=tok, context_length=40, input_id=0, draw=0)
    with pytest.raises(ValueError, match="^unknown prompt style 'chat'; expected one of page, ruler$"):
        make_input("niah_single_1", tokenizer=tok, context_length=512, input_id=0, draw=0, prompt_style="chat")
