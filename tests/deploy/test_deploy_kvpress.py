"""GatedPress, the PAGE gate as a kvpress press (collectors.deploy; issue 24), against kvpress itself,
eager attention and the collector's logged arms. Runs where kvpress is installed (`make test` runs
this file in .venv-kvpress).

* tau = −1 opens the gate on every input (D ≥ −1 always): the output is the base press's, token for
  token; tau = +1 closes it (D ≤ 1 always): the output is the uncompressed model's.
* press.last.drop is D computed here from eager ``output_attentions`` by brute force (sets, not the
  collector's kernels).
* For prompts the collector ran, the deployed output equals the logged arm (open) or the logged
  full-KV answer (closed), and the press's D equals the logged D.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import warnings

import numpy as np
import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from collectors import cli as collect_cli  # noqa: E402
from collectors import deploy  # noqa: E402
from collectors.deploy import GatedPress, ShortPromptWarning  # noqa: E402
from pagestats.deploy.gatefile import Gate  # noqa: E402

PEAKED = dict(initializer_range=0.2)  # peaked attention: presses keep different sets, D is not 0


def ids_of(n, seed):
    return torch.randint(3, 512, (1, n), generator=torch.Generator().manual_seed(seed))


def generate(model, ids, press, n=10):
    with (press(model) if press is not None else contextlib.nullcontext()), torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_open_gate_is_the_base_press_and_closed_gate_is_no_press(make_tiny_model, family, ratio):
    model = make_tiny_model(family, **PEAKED)
    ids = ids_of(160, 3)
    snap = generate(model, ids, kvpress.SnapKVPress(compression_ratio=ratio))
    plain = generate(model, ids, None)
    assert snap != plain  # the comparison can fail
    opened = GatedPress(kvpress.SnapKVPress(compression_ratio=ratio), tau=-1)
    assert generate(model, ids, opened) == snap
    assert opened.last.gate_open and opened.last.reason == "open"
    n = kvpress.utils.compute_n_kept(160, ratio)
    assert opened.last.n_kept == n and opened.realized_compression_ratio == pytest.approx(1 - n / 160)
    assert opened.compression_ratio == ratio  # the base press's nominal ratio, as kvpress's wrappers report it
    closed = GatedPress(kvpress.SnapKVPress(compression_ratio=ratio), tau=1)
    assert generate(model, ids, closed) == plain
    assert not closed.last.gate_open and closed.last.n_kept == 160 and closed.realized_compression_ratio == 0.0
    assert opened.last.drop == closed.last.drop


@pytest.mark.parametrize("press", [
    lambda: kvpress.KnormPress(compression_ratio=0.5),
    lambda: kvpress.TOVAPress(compression_ratio=0.5),
    lambda: kvpress.ComposedPress([kvpress.KnormPress(compression_ratio=0.3), kvpress.SnapKVPress(compression_ratio=0.3)]),
    lambda: kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=0.5)),
    lambda: kvpress.DMSPress(kvpress.KnormPress(), threshold=-3.0, sliding_window_size=16),
], ids=["knorm", "tova", "composed", "adakv", "dms"])
def test_forward_hook_presses_are_held_and_applied(make_tiny_model, press):
    """Presses that write the cache (Composed) or module.masked_key_indices (AdaKV, DMS) in their
    forward_hook: the gate captures the writes, so open = the press alone, closed = no press.
    (Llama: on the tiny Qwen2, kvpress's own DMSPress fails to find its fake keys, without the gate.)"""
    model = make_tiny_model("llama", **PEAKED)
    ids = ids_of(160, 4)
    alone, plain = generate(model, ids, press()), generate(model, ids, None)
    assert alone != plain
    opened = GatedPress(press(), tau=-1)
    assert generate(model, ids, opened) == alone
    assert 0.0 < opened.realized_compression_ratio < 1.0
    assert generate(model, ids, GatedPress(press(), tau=1)) == plain


def test_observed_attention_under_eager(make_tiny_model):
    model = make_tiny_model("llama", attn_impl="eager", **PEAKED)
    ids = ids_of(120, 5)
    alone = generate(model, ids, kvpress.ObservedAttentionPress(compression_ratio=0.5))
    assert generate(model, ids, GatedPress(kvpress.ObservedAttentionPress(compression_ratio=0.5), tau=-1)) == alone
    assert model.config._attn_implementation == "eager"  # restored


def brute_force_drop(model, ids, window=32, k=32):
    """D from eager output_attentions: ā = mean of the last w rows, top-k sets by sorting, Jaccard of
    sets, a_ℓ = mean over head pairs, early = [0, ⌊L/3⌋), late = [L − ⌊L/3⌋, L) (Eq. 3, App. F)."""
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    agreement = []
    for att in out.attentions:  # (1, H, T, T)
        a = att[0, :, -window:, :].double().mean(dim=1)  # (H, T)
        sets = [set(np.argsort(-row.numpy(), kind="stable")[:k].tolist()) for row in a]
        agreement.append(np.mean([len(x & y) / len(x | y) for x, y in itertools.combinations(sets, 2)]))
    n = len(agreement) // 3
    return float(np.mean(agreement[:n]) - np.mean(agreement[-n:])), np.array(agreement)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [6, 7])
def test_drop_equals_eager_output_attentions(make_tiny_model, family, seed):
    model = make_tiny_model(family, attn_impl="eager", num_hidden_layers=6, **PEAKED)
    ids = ids_of(200, seed)
    expected, agreement = brute_force_drop(model, ids)
    press = GatedPress(kvpress.SnapKVPress(compression_ratio=0.5), tau=0.0)
    generate(model, ids, press, n=2)
    assert abs(press.last.drop - expected) < 1e-5
    assert np.allclose(press.last.agreement, agreement, atol=1e-6)
    assert abs(expected) > 1e-3  # a nonzero D, so the check can fail
    # sdpa gives the same D (the capture computes the same softmax)
    sdpa = make_tiny_model(family, num_hidden_layers=6, **PEAKED)
    press_sdpa = GatedPress(kvpress.SnapKVPress(compression_ratio=0.5), tau=0.0)
    generate(sdpa, ids, press_sdpa, n=2)
    assert abs(press_sdpa.last.drop - expected) < 1e-5


def test_twenty_token_prompt_keeps_the_full_cache_and_says_so(make_tiny_model):
    model = make_tiny_model("llama", **PEAKED)
    ids = ids_of(20, 8)
    press = GatedPress(kvpress.SnapKVPress(compression_ratio=0.5), tau=-1)
    with pytest.warns(ShortPromptWarning, match="20 tokens is shorter than the gate's window w=32"):
        out = generate(model, ids, press)
    assert out == generate(model, ids, None)
    assert press.last.reason == "short-prompt" and not press.last.gate_open and press.last.n_tokens == 20
    assert press.last.n_kept == 20 and press.realized_compression_ratio == 0.0


def test_second_prompt_in_one_context_gets_its_own_decision(make_tiny_model):
    model = make_tiny_model("qwen2", **PEAKED)
    a, b = ids_of(150, 9), ids_of(90, 10)
    press = GatedPress(kvpress.SnapKVPress(compression_ratio=0.5), tau=-1)
    with press(model), torch.no_grad():
        model.generate(a, do_sample=False, max_new_tokens=2)
        first = press.last
        out = model.generate(b, do_sample=False, max_new_tokens=6, min_new_tokens=6)[0, 90:].tolist()
    assert press.last.n_tokens == 90 and first.n_tokens == 150
    assert out == generate(model, b, kvpress.SnapKVPress(compression_ratio=0.5), n=6)
    assert press.last.drop == pytest.approx(brute_force_drop(
        _eager_copy(model), b)[0], abs=1e-5)


def _eager_copy(model):
    import copy

    m = copy.deepcopy(model)
    m.set_attn_implementation("eager")
    return m


def test_pipeline_press_equals_base_press(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok, device="cpu")
    context = "The quick brown fox jumps over the lazy dog. " * 6
    question = " What jumps?"
    base = pipe(context, question=question, press=kvpress.KnormPress(compression_ratio=0.5), max_new_tokens=8)
    plain = pipe(context, question=question, press=None, max_new_tokens=8)
    gated = GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=-1)
    assert pipe(context, question=question, press=gated, max_new_tokens=8) == base
    assert gated.last.gate_open and gated.last.n_tokens > 32
    assert pipe(context, question=question, press=GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=1),
                max_new_tokens=8) == plain
    # several questions on one compressed context: the pipeline prefills once under the press
    questions = [" What jumps?", " Over what?"]
    base = pipe(context, questions=questions, press=kvpress.KnormPress(compression_ratio=0.5), max_new_tokens=8)
    gated = GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=-1)
    assert pipe(context, questions=questions, press=gated, max_new_tokens=8) == base and len(base["answers"]) == 2


def count_forwards(model):
    """A list that grows by one at every forward of the model's embeddings: 0 means no compute ran."""
    calls = []
    model.model.embed_tokens.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls


def test_batch_above_one_is_refused_in_one_line_before_any_compute(make_tiny_model):
    model = make_tiny_model("llama")
    calls = count_forwards(model)
    ids = torch.cat([ids_of(64, 1), ids_of(64, 2)])
    with pytest.raises(ValueError, match="batch size 1") as err:
        generate(model, ids, GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=0.0))
    assert "\n" not in str(err.value) and calls == []


@pytest.mark.parametrize("outer", [
    lambda gated: kvpress.ComposedPress([gated]),
    lambda gated: kvpress.PrefillDecodingPress(prefilling_press=gated),
], ids=["composed", "prefill-decoding"])
def test_a_nested_gate_is_refused_in_one_line_before_any_compute(make_tiny_model, outer):
    """kvpress's wrappers call the inner press's forward_hook without its context; the gate refuses when
    the outer press is applied (post_init_from_model), before the prefill (kvpress's own was a TypeError)."""
    model = make_tiny_model("llama")
    calls = count_forwards(model)
    gated = GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=0.0)
    with pytest.raises(ValueError) as err:
        generate(model, ids_of(64, 3), outer(gated))
    assert str(err.value).startswith("GatedPress must be the outermost press") and "\n" not in str(err.value)
    assert calls == []
    generate(model, ids_of(64, 3), gated, n=1)  # used directly, the same press works
    assert gated.last is not None


def test_attribute_probes_never_raise_and_the_ratio_is_the_base_presss():
    press = GatedPress(kvpress.SnapKVPress(compression_ratio=0.5), tau=0.0)
    assert hasattr(press, "compression_ratio") and press.compression_ratio == 0.5  # before any prefill
    assert press.last is None and press.realized_compression_ratio is None
    for name in (*press.__dataclass_fields__, "realized_compression_ratio"):
        getattr(press, name)
    press.compression_ratio = 0.25  # a ratio sweep sets it on the press it was handed
    assert press.press.compression_ratio == 0.25 and press.compression_ratio == 0.25
    think = GatedPress(kvpress.ThinKPress(key_channel_compression_ratio=0.5), tau=0.0)
    assert think.compression_ratio == kvpress.ThinKPress(key_channel_compression_ratio=0.5).compression_ratio
    with pytest.raises(AttributeError, match="^ThinKPress's compression_ratio is computed from its other parameters "
                                             "and cannot be set$"):
        think.compression_ratio = 0.5
    # kvpress's SimLayerKVPress and DMSPress raise when asked before a forward pass; the gate's probe does not
    for base in (kvpress.SimLayerKVPress(lazy_threshold=0.5), kvpress.DMSPress(kvpress.KnormPress(), threshold=-3.0)):
        with pytest.raises((ValueError, AssertionError)):
            base.compression_ratio
        gated = GatedPress(base, tau=0.0)
        assert hasattr(gated, "compression_ratio") and gated.compression_ratio is None


def test_a_ratio_sweep_through_the_gate_equals_the_base_press_at_each_ratio(make_tiny_model):
    model = make_tiny_model("llama", **PEAKED)
    ids = ids_of(160, 12)
    press = GatedPress(kvpress.SnapKVPress(compression_ratio=0.1), tau=-1)
    outs = {}
    for ratio in (0.25, 0.75):
        press.compression_ratio = ratio
        outs[ratio] = generate(model, ids, press)
        assert outs[ratio] == generate(model, ids, kvpress.SnapKVPress(compression_ratio=ratio))
        assert press.last.n_kept == kvpress.utils.compute_n_kept(160, ratio)
    assert outs[0.25] != outs[0.75]


def test_a_gate_of_the_other_mode_is_refused_in_one_line_unless_overridden(tmp_path, make_tiny_model):
    path = tmp_path / "gate.json"
    Gate(tau=-1.0, policy="fixed", model="tiny", n_layers=4, mode="query-aware").write(path)
    with pytest.raises(ValueError) as err:
        GatedPress.from_file(path, kvpress.KnormPress(compression_ratio=0.5), mode="query-agnostic")
    message = str(err.value)
    assert "\n" not in message and "calibrated in query-aware mode, deployed in query-agnostic mode" in message
    assert "allow_mode_mismatch=True" in message
    press = GatedPress.from_file(path, kvpress.KnormPress(compression_ratio=0.5), mode="query-agnostic",
                                 allow_mode_mismatch=True, model_name="tiny")
    model = make_tiny_model("llama", **PEAKED)
    ids = ids_of(100, 13)
    assert generate(model, ids, press) == generate(model, ids, kvpress.KnormPress(compression_ratio=0.5))
    assert GatedPress.from_file(path, kvpress.KnormPress(compression_ratio=0.5)).mode == "query-aware"


def test_from_file_refuses_another_model_or_statistic(tmp_path, make_tiny_model):
    path = tmp_path / "gate.json"
    Gate(tau=-1.0, policy="fixed", model="tiny-llama", window=32, k=16, n_layers=4).write(path)
    press = GatedPress.from_file(path, kvpress.KnormPress(compression_ratio=0.5), model_name="tiny-llama")
    assert (press.tau, press.k, press.window) == (-1.0, 16, 32)
    model = make_tiny_model("llama", **PEAKED)
    ids = ids_of(100, 11)
    assert generate(model, ids, press) == generate(model, ids, kvpress.KnormPress(compression_ratio=0.5))
    with pytest.raises(ValueError, match="calibrated with k=16, asked for k=32"):
        GatedPress.from_file(path, kvpress.KnormPress(compression_ratio=0.5), k=32)
    other = GatedPress.from_file(path, kvpress.KnormPress(compression_ratio=0.5), model_name="tiny-qwen")
    with pytest.raises(ValueError, match="calibrated on model 'tiny-llama', deployed on 'tiny-qwen'.*"
                                         "pass model_name='tiny-llama'$"):
        generate(model, ids, other)
    deeper = GatedPress.from_file(path, kvpress.KnormPress(compression_ratio=0.5), model_name="tiny-llama")
    with pytest.raises(ValueError, match="4-layer model, deployed on 6 layers"):
        generate(make_tiny_model("llama", num_hidden_layers=6), ids, deeper)
    with pytest.raises(ValueError, match="exactly one of tau"):
        GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=0.1, gate=path)


def test_log_dir_appends_one_row_per_prefill_and_monitor_reads_it(make_tiny_model, tmp_path):
    """GatedPress(log_dir=) logs each prefill's decision (two prompts in one context: two rows); the
    log is a deployment run whose numbers monitor reports as counted here from press.last."""
    from scipy.stats import ks_2samp

    from pagestats.cli import main as pagestats_main
    from pagestats.io.deployment import read_deployment
    from pagestats.deploy.monitor import monitor

    model = make_tiny_model("llama", **PEAKED)
    probe = GatedPress(kvpress.SnapKVPress(compression_ratio=0.5), tau=-1)
    pilot = []
    for seed in range(20, 30):
        generate(model, ids_of(120, seed), probe, n=1)
        pilot.append(probe.last.drop)
    tau = float(np.median(pilot))
    path = tmp_path / "gate.json"
    gate = Gate(tau=tau, policy="fixed", model="tiny", n_layers=4,
                pilot={"drops": pilot, "p_open": float(np.mean(np.asarray(pilot) >= tau))})
    gate.write(path)
    log = tmp_path / "log"
    press = GatedPress.from_file(path, kvpress.SnapKVPress(compression_ratio=0.5), model_name="tiny", log_dir=log)
    decisions = []
    for seed in range(6):
        generate(model, ids_of(100 + 10 * seed, seed), press, n=3)
        decisions.append(press.last)
    with press(model), torch.no_grad():  # two prefills in one context: two rows
        for seed in (6, 7):
            model.generate(ids_of(110, seed), do_sample=False, max_new_tokens=2)
            decisions.append(press.last)
    deploy.close_log(log)
    rows = read_deployment(log).rows
    assert rows["input_id"].to_list() == list(range(8))
    assert rows["drop"].to_list() == [d.drop for d in decisions]
    assert rows["kept_fraction"].to_list() == [d.kept_fraction for d in decisions]
    assert rows["n_kept"].to_list() == [d.n_kept for d in decisions]
    assert rows["reason"].to_list() == [d.reason for d in decisions] and set(rows["gate_open"]) == {True, False}
    assert rows["prediction"].null_count() == rows["n_generated"].null_count() == 8  # the press sees no decode
    manifest = json.loads((log / "manifest.json").read_text())
    assert manifest["kind"] == "deployment" and manifest["gate"]["sha256"] == gate.sha256()
    assert manifest["deployment"] == {"entry": "GatedPress", "evictor": repr(kvpress.SnapKVPress(compression_ratio=0.5)),
                                      "budget": None, "log_text": False}
    report = monitor(log, path)
    n_open = sum(d.gate_open for d in decisions)
    assert (report.n_inputs, report.n_open, int(report.p_open.n)) == (8, n_open, 8)
    assert report.compression == pytest.approx(1 / np.mean([d.kept_fraction for d in decisions]), abs=1e-12)
    expected = ks_2samp([d.drop for d in decisions], pilot)
    assert (report.ks_statistic, report.ks_pvalue) == (float(expected.statistic), float(expected.pvalue))
    assert pagestats_main(["validate", str(log)]) == 0


def test_pipeline_with_log_dir_logs_each_call(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from pagestats.io.deployment import read_deployment

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok, device="cpu")
    press = GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=-1, model_name="tiny", log_dir=tmp_path / "log")
    drops = []
    for context in ("The quick brown fox jumps over the lazy dog. " * 6, "A bird in the hand is worth two. " * 8):
        pipe(context, question=" What?", press=press, max_new_tokens=4)
        drops.append(press.last.drop)
    deploy.close_log(tmp_path / "log")
    assert read_deployment(tmp_path / "log").rows["drop"].to_list() == drops


# --------------------------------------------------------------------------- equal to the collector's logs

PRESS_EVICTORS = {
    "kvpress:SnapKVPress:window_size=16": lambda r: kvpress.SnapKVPress(compression_ratio=r, window_size=16),
    "kvpress:KnormPress": lambda r: kvpress.KnormPress(compression_ratio=r),
    "kvpress:TOVAPress": lambda r: kvpress.TOVAPress(compression_ratio=r),
    "kvpress:ObservedAttentionPress": lambda r: kvpress.ObservedAttentionPress(compression_ratio=r),
}


def _family_dir(model_dir, tmp_path_factory, family):
    """A saved tiny model of ``family`` whose vocabulary is the tokenizer's (every id decodes to text, so
    the logged predictions differ between arms), peaked attention, beside model_dir's tokenizer."""
    from transformers import AutoTokenizer

    from tinymodels import make_tiny_model as _make_tiny_model

    tok = AutoTokenizer.from_pretrained(model_dir)
    d = tmp_path_factory.mktemp(f"tiny_{family}")
    _make_tiny_model(family, vocab_size=len(tok), **PEAKED).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def collected(request, model_dir, tmp_path_factory):
    """A collector run (eager, so ObservedAttention scores) over the four presses at b = 0.5."""
    import polars as pl

    d = _family_dir(model_dir, tmp_path_factory, request.param)
    out = tmp_path_factory.mktemp("run") / "run"
    args = ["--model", str(d), "--out", str(out), "--tasks", "niah_single_1", "--context-length", "640", "--n", "2",
            "--budgets", "0.5,1.0", "--max-new-tokens", "8", "--allow-cut-answers", "--no-progress",
            "--attn-impl", "eager", "--evictors", ",".join(PRESS_EVICTORS)]
    assert collect_cli.main(args) == 0
    inputs = pl.read_parquet(out / "inputs" / "*.parquet")
    outcomes = pl.read_parquet(out / "outcomes" / "*.parquet")
    return d, json.loads((out / "manifest.json").read_text()), inputs, outcomes


def test_deployed_press_equals_the_collectors_logged_arm(collected):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collectors.tasks import tokenize_prompt

    d, manifest, inputs, outcomes = collected
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(d)
    checked = 0
    for row in inputs.iter_rows(named=True):
        ids = torch.tensor([tokenize_prompt(tok, row["prompt"])])
        arms = outcomes.filter((outcomes["task"] == row["task"]) & (outcomes["input_id"] == row["input_id"])
                               & (outcomes["budget"] == 0.5))
        for arm in arms.iter_rows(named=True):
            make = PRESS_EVICTORS[arm["evictor"]]
            opened = GatedPress(make(0.5), tau=-1)
            text = tok.decode(generate_until_eos(model, ids, opened, arm["n_generated"]), skip_special_tokens=True)
            assert text == arm["prediction"], (arm["evictor"], row["task"], row["input_id"])
            assert opened.last.drop == row["drop"]
            assert opened.last.n_kept == arm["n_kept"]
            checked += 1
        closed = GatedPress(PRESS_EVICTORS["kvpress:KnormPress"](0.5), tau=1)
        text = tok.decode(generate_until_eos(model, ids, closed, row["full_n_generated"]), skip_special_tokens=True)
        assert text == row["full_prediction"] and closed.last.drop == row["drop"]
    assert checked == len(PRESS_EVICTORS) * len(inputs)
    # the logged predictions differ between arms somewhere, so the comparison can fail
    assert outcomes.filter(outcomes["budget"] == 0.5)["prediction"].n_unique() > 1


def generate_until_eos(model, ids, press, n):
    with press(model), torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=n)
    return out[0, ids.shape[1]:].tolist()


def test_gate_at_the_logged_drop_opens(collected):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collectors.tasks import tokenize_prompt

    d, _, inputs, _ = collected
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(d)
    row = inputs.row(0, named=True)
    ids = torch.tensor([tokenize_prompt(tok, row["prompt"])])
    at = GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=row["drop"])
    above = GatedPress(kvpress.KnormPress(compression_ratio=0.5), tau=float(np.nextafter(row["drop"], np.inf)))
    generate(model, ids, at, n=1)
    generate(model, ids, above, n=1)
    assert at.last.gate_open and not above.last.gate_open
