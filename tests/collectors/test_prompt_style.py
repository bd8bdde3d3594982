"""Prompt styles (collectors.tasks.prompt): the authors' ``page`` prompt and RULER's ``ruler`` prompt,
checked against strings built by hand for chat templates with and without a default system prompt and
with and without a BOS, and the context/question/answer-prefix cut against a regex cut written here from
RULER's question phrases (the cut kvpress's RULER dataset makes, which the authors' runner reads)."""

import re

import pytest

from collectors.tasks import generators as gen
from collectors.tasks import make_input, tokenize_prompt
from collectors.tasks.prompt import page_parts, render
from tinymodels import byte_tokenizer

#: A Qwen2-style template: a default system turn when the conversation has none.
DEFAULT_SYSTEM = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n"
                  "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: A Llama-3-style template that writes the BOS itself.
WITH_BOS = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]\n{{ m['content'] }}[end]{% endfor %}"
            "{% if add_generation_prompt %}[assistant]\n{% endif %}")
#: No default system prompt, no BOS.
PLAIN = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
         "{% if add_generation_prompt %}<assistant>{% endif %}")

TEXT = "Find the number.\nnoise noise\nOne of the special magic numbers for k is: 7.\nnoise\n" \
       "What is the special magic number for k mentioned in the provided text?"
QUESTION = "\nWhat is the special magic number for k mentioned in the provided text?"
PREFIX = " The special magic number for k mentioned in the provided text is"
CONTEXT = "Find the number.\nnoise noise\nOne of the special magic numbers for k is: 7.\nnoise\n"
USER_PAGE = (CONTEXT + "\n\n" + "What is the special magic number for k mentioned in the provided text? "
             + "\n" + "The special magic number for k mentioned in the provided text is")


def tokenizer(template, bos_processor=False):
    tok = byte_tokenizer()
    tok.chat_template = template
    if bos_processor:  # a tokenizer that adds BOS itself when asked for special tokens (Llama's)
        from tokenizers.processors import TemplateProcessing

        tok.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


EXPECTED = {
    "default-system": (DEFAULT_SYSTEM,
                       "<|im_start|>system\nAnswer the question concisely.<|im_end|>\n<|im_start|>user\n" + USER_PAGE
                       + "<|im_end|>\n<|im_start|>assistant\n",
                       "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + TEXT
                       + "<|im_end|>\n<|im_start|>assistant\n" + PREFIX[1:]),
    "bos": (WITH_BOS,
            "<s>[system]\nAnswer the question concisely.[end][user]\n" + USER_PAGE + "[end][assistant]\n",
            "<s>[user]\n" + TEXT + "[end][assistant]\n" + PREFIX[1:]),
    "plain": (PLAIN,
              "<system>Answer the question concisely.</system><user>" + USER_PAGE + "</user><assistant>",
              "<user>" + TEXT + "</user><assistant>" + PREFIX[1:]),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_page_and_ruler_prompts_equal_hand_built_strings(name):
    template, page, ruler = EXPECTED[name]
    tok = tokenizer(template)
    prompt, start = render(tok, TEXT, QUESTION, PREFIX, "page")
    assert prompt == page
    assert prompt[start:].startswith("What is the special magic number") and prompt[:start].endswith("noise\n\n\n")
    prompt, start = render(tok, TEXT, QUESTION, PREFIX, "ruler")
    assert prompt == ruler
    assert prompt[start:].startswith(QUESTION)


def test_the_template_bos_is_the_only_bos():
    """The authors tokenise with add_special_tokens=False: a tokenizer that adds BOS itself adds none."""
    tok = tokenizer(WITH_BOS, bos_processor=True)
    assert tok("x")["input_ids"][0] == 1  # the tokenizer would add one
    prompt, _ = render(tok, TEXT, QUESTION, PREFIX, "page")
    ids = tokenize_prompt(tok, prompt)
    assert ids.count(1) == 1 and ids[0] == 1
    assert ids == tok(prompt, add_special_tokens=False)["input_ids"]


def test_page_needs_a_chat_template():
    tok = byte_tokenizer()
    with pytest.raises(ValueError, match="^prompt style 'page' needs a chat template .* use prompt style 'ruler'$"):
        render(tok, TEXT, QUESTION, PREFIX, "page")
    prompt, start = render(tok, TEXT, QUESTION, PREFIX, "ruler")
    assert prompt == TEXT + PREFIX and start == len(TEXT) - len(QUESTION)


#: Where RULER's question begins (the last match) and where its answer prefix begins, per task family;
#: written from RULER's templates (collectors.tasks.templates) as the kvpress RULER dataset cuts them.
QUESTION_AT = {"niah": r"What (?:is|are all) the special magic", "vt": r"Question: Find all variables",
               "cwe": r"Question: What are the 10 most common", "fwe": r"Question: Do not provide"}
ANSWER_AT = {"niah": r"The special magic", "vt": r"Answer:", "cwe": r"Answer:", "fwe": r"Answer:"}


def regex_cut(family, full):
    q0 = [m.start() for m in re.finditer(QUESTION_AT[family], full)][-1]
    a0 = q0 + re.search(ANSWER_AT[family], full[q0:]).start()
    return full[:q0], full[q0:a0], full[a0:]


@pytest.mark.parametrize("family, generator", [
    ("niah", lambda: gen.niah("niah_multikey_2", 5)), ("niah", lambda: gen.niah("niah_multiquery", 5)),
    ("vt", lambda: gen.vt(5, context_length=4096, count=lambda t: len(t.split()))),
    ("cwe", lambda: gen.cwe(5, context_length=4096)), ("fwe", lambda: gen.fwe(5, context_length=1024)),
])
def test_page_parts_cut_where_the_ruler_dataset_cuts(family, generator):
    g = generator()
    body = g.build(g.n_min + 20, 0)
    assert page_parts(body.text, body.question, body.answer_prefix) == regex_cut(family, body.text + body.answer_prefix)


def test_make_input_defaults_to_page_and_records_the_style():
    tok = tokenizer(DEFAULT_SYSTEM)
    x = make_input("niah_single_1", tokenizer=tok, context_length=700, input_id=0, draw=0)
    assert x.metadata["prompt_style"] == "page" and x.prompt.startswith("<|im_start|>system\nAnswer the question "
                                                                         "concisely.<|im_end|>")
    y = make_input("niah_single_1", tokenizer=tok, context_length=700, input_id=0, draw=0, prompt_style="ruler")
    assert y.metadata["prompt_style"] == "ruler" and "You are a helpful assistant." in y.prompt
    assert x.references == y.references


def test_smollm2s_own_template_gives_the_hand_built_page_prompt(smollm2):
    """The embedded SmolLM2's real chat template (it has a default system prompt, which page replaces);
    its tokenizer as the GGUF load gave it (saved by the conftest's session fixture)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2))
    prompt, _ = render(tok, TEXT, QUESTION, PREFIX, "page")
    assert prompt == ("<|im_start|>system\nAnswer the question concisely.<|im_end|>\n<|im_start|>user\n" + USER_PAGE
                      + "<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenize_prompt(tok, prompt)
    assert ids == tok(prompt, add_special_tokens=False)["input_ids"]
    ruler, _ = render(tok, TEXT, QUESTION, PREFIX, "ruler")
    assert ruler.startswith("<|im_start|>system\n") and "Answer the question concisely." not in ruler
