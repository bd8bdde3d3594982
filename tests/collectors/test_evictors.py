"""Evictors and the budget rule against brute-force references written here (PAGE §4, App. A.2.3)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from collectors.evictors import EVICTORS, capture_options, n_kept, parse, parse_all
from collectors.evictors.base import kv_group_mean
from collectors.evictors.snapkv import pyramid_weights

#: The built-in evictors (every registered name but the kvpress family).
BUILT_IN = tuple(name for name, cls in EVICTORS.items() if not cls.in_prefill)

N_SINK, N_RECENT = 4, 32


def fake_prefill(n_layers=3, n_heads=4, n_tokens=200, seed=0, accumulate=True, n_kv_heads=2):
    gen = torch.Generator().manual_seed(seed)
    window = torch.rand((n_layers, n_heads, n_tokens), generator=gen)
    acc = torch.rand((n_layers, n_heads, n_tokens), generator=gen) if accumulate else None
    return SimpleNamespace(
        input_ids=torch.zeros((1, n_tokens), dtype=torch.long),
        window_attention=window,
        accumulated_attention=acc,
        n_kv_heads=n_kv_heads,
    )


def brute_top(score, n_tokens, count, n_sink=N_SINK, n_recent=N_RECENT):
    """Protected positions + best unprotected by (score desc, position asc), by a plain loop."""
    protected = {t for t in range(n_tokens) if t < n_sink or t >= n_tokens - n_recent}
    free = [t for t in range(n_tokens) if t not in protected]
    free.sort(key=lambda t: (-float(score[t]), t))
    return sorted(protected | set(free[: count - len(protected)]))


def brute_mean_score(att):
    L, H, T = att.shape
    return [sum(float(att[l, h, t]) for l in range(L) for h in range(H)) / (L * H) for t in range(T)]


@pytest.mark.parametrize(
    "T,b,expected",
    [(1000, 0.0625, 62), (1000, 0.875, 875), (100, 0.0625, 36), (100, 0.375, 37), (20, 0.5, 20),
     (36, 0.0625, 36), (4096, 1.0, 4096), (4097, 0.125, 512)],
)
def test_n_kept_closed_form(T, b, expected):
    assert n_kept(T, b) == expected == min(T, max(math.floor(b * T), N_SINK + N_RECENT))


@pytest.mark.parametrize(
    "T,b,expected",
    [(1000, 0.0625, 62), (500, 0.0625, 40), (100, 0.375, 40), (100, 0.41, 41), (39, 0.5, 39), (4096, 1.0, 4096)],
)
def test_n_kept_page_floor_is_the_authors_max_40(T, b, expected):
    """The authors' runner keeps max(40, ⌊T·b⌋) = max(n_sink + n_recent + 4, int(T·b)) (typed from it)."""
    assert n_kept(T, b, budget_floor="page") == expected == min(T, max(40, math.floor(T * b)))


@pytest.mark.parametrize("bad", [dict(n_tokens=0, budget=0.5), dict(n_tokens=10, budget=0.0),
                                 dict(n_tokens=10, budget=0.5, budget_floor="paper"),
                                 dict(n_tokens=10, budget=1.5), dict(n_tokens=10, budget=0.5, n_sink=-1)])
def test_n_kept_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        n_kept(**bad)


@pytest.mark.parametrize("evictor", BUILT_IN)
@pytest.mark.parametrize("budget", [0.0625, 0.125, 0.25, 0.5, 0.875, 1.0])
def test_kept_positions_invariants(evictor, budget):
    pf = fake_prefill()
    T = 200
    kept = parse(evictor).kept(pf, budget)
    rows = kept.reshape(-1, kept.shape[-1])
    assert kept.dtype == torch.long
    if evictor == "snapkv-perlayer":
        assert kept.shape[0] == 3
    if evictor in ("snapkv-perhead", "h2o-perhead"):
        assert tuple(kept.shape[:2]) == (3, 2)
    expected = n_kept(T, budget)
    if evictor == "streamingllm-fixed" and budget < 1.0:
        expected = N_SINK + N_RECENT
    for row in rows.tolist():
        assert len(row) == expected
        assert row == sorted(set(row))  # sorted and unique
        assert set(range(N_SINK)) <= set(row)
        assert set(range(T - N_RECENT, T)) <= set(row)
        assert 0 <= row[0] and row[-1] < T


@pytest.mark.parametrize("budget", [0.0625, 0.25, 0.5, 0.875])
def test_snapkv_h2o_pyramidkv_match_brute_force(budget):
    pf = fake_prefill(seed=3)
    T, L = 200, 3
    count = n_kept(T, budget)
    snap = brute_mean_score(pf.window_attention)
    h2o = brute_mean_score(pf.accumulated_attention)
    weights = [(L - l) for l in range(L)]
    pyr = [
        sum(weights[l] / sum(weights) * sum(float(pf.window_attention[l, h, t]) for h in range(4)) / 4
            for l in range(L))
        for t in range(T)
    ]
    assert parse("snapkv").kept(pf, budget).tolist() == brute_top(snap, T, count)
    assert parse("h2o").kept(pf, budget).tolist() == brute_top(h2o, T, count)
    assert parse("pyramidkv").kept(pf, budget).tolist() == brute_top(pyr, T, count)
    per_layer = parse("snapkv-perlayer").kept(pf, budget)
    for l in range(L):
        score = [sum(float(pf.window_attention[l, h, t]) for h in range(4)) / 4 for t in range(T)]
        assert per_layer[l].tolist() == brute_top(score, T, count)


@pytest.mark.parametrize("budget", [0.0625, 0.25, 0.5, 0.875])
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_perhead_evictors_match_brute_force(budget, n_kv_heads):
    """Each (layer, KV head) keeps its own top set of the mean over the query heads sharing that KV
    head (query head h → KV head h // (H / H_kv)), the same count everywhere."""
    pf = fake_prefill(seed=4, n_kv_heads=n_kv_heads)
    L, H, T = 3, 4, 200
    group = H // n_kv_heads
    count = n_kept(T, budget)
    for evictor, att in (("snapkv-perhead", pf.window_attention), ("h2o-perhead", pf.accumulated_attention)):
        kept = parse(evictor).kept(pf, budget)
        assert tuple(kept.shape) == (L, n_kv_heads, count)
        for l in range(L):
            for j in range(n_kv_heads):
                heads = [h for h in range(H) if h // group == j]
                score = [sum(float(att[l, h, t]) for h in heads) / len(heads) for t in range(T)]
                assert kept[l, j].tolist() == brute_top(score, T, count)


def test_perhead_scores_from_a_separate_snapkv_window():
    pf = fake_prefill(seed=6)
    pf.snapkv_attention = torch.rand(pf.window_attention.shape, generator=torch.Generator().manual_seed(9))
    expected = kv_group_mean(pf.snapkv_attention, 2)
    assert torch.equal(parse("snapkv-perhead").score(pf), expected)
    assert torch.allclose(parse("snapkv").score(pf), pf.snapkv_attention.mean(dim=(0, 1)), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="grouped"):
        kv_group_mean(pf.window_attention, 3)


def test_snapkv_pooling_matches_brute_force():
    pf = fake_prefill(seed=5)
    T = 200
    base = brute_mean_score(pf.window_attention)
    pooled = []
    for t in range(T):
        neigh = [base[j] for j in range(t - 2, t + 3) if 0 <= j < T]
        pooled.append(sum(neigh) / len(neigh))
    got = parse("snapkv").kept(pf, 0.25, pool_kernel=5).tolist()
    assert got == brute_top(pooled, T, n_kept(T, 0.25))
    # per head: pool each (layer, KV head) row of the group-mean scores
    perhead = parse("snapkv-perhead").kept(pf, 0.25, pool_kernel=3)
    for l in range(3):
        for j in range(2):
            row = [(float(pf.window_attention[l, 2 * j, t]) + float(pf.window_attention[l, 2 * j + 1, t])) / 2
                   for t in range(T)]
            pooled = [sum(row[max(0, t - 1): t + 2]) / len(row[max(0, t - 1): t + 2]) for t in range(T)]
            assert perhead[l, j].tolist() == brute_top(pooled, T, n_kept(T, 0.25))
    with pytest.raises(ValueError):
        parse("snapkv").kept(pf, 0.25, pool_kernel=4)


@pytest.mark.parametrize("budget", [0.0625, 0.25, 0.75])
def test_streamingllm_keeps_sinks_and_most_recent(budget):
    pf = fake_prefill()
    T = 200
    count = n_kept(T, budget)
    assert parse("streamingllm").kept(pf, budget).tolist() == list(range(4)) + list(
        range(T - (count - 4), T)
    )
    fixed = parse("streamingllm-fixed").kept(pf, budget).tolist()
    assert fixed == list(range(4)) + list(range(T - 32, T)) and len(fixed) == 36


def test_budget_one_keeps_everything_for_every_evictor():
    pf = fake_prefill()
    for evictor in BUILT_IN:
        kept = parse(evictor).kept(pf, 1.0)
        rows = kept.reshape(-1, kept.shape[-1])
        for row in rows.tolist():
            assert row == list(range(200))


def test_ties_go_to_lower_positions():
    pf = fake_prefill()
    pf.window_attention = torch.ones_like(pf.window_attention)
    count = n_kept(200, 0.5)  # 100: 36 protected + 64 free
    got = parse("snapkv").kept(pf, 0.5).tolist()
    assert got == list(range(4)) + list(range(4, 4 + 64)) + list(range(168, 200))
    assert len(got) == count


def test_short_prompt_keeps_all():
    pf = fake_prefill(n_tokens=30)
    for evictor in BUILT_IN:
        kept = parse(evictor).kept(pf, 0.0625)
        assert kept.shape[-1] == 30


def test_errors():
    pf = fake_prefill(accumulate=False)
    with pytest.raises(ValueError, match="accumulated_attention"):
        parse("h2o").kept(pf, 0.5)
    with pytest.raises(ValueError, match="accumulated_attention"):
        parse("h2o-perhead").kept(pf, 0.5)
    with pytest.raises(ValueError, match="unknown evictor"):
        parse("uniform")
    bad = fake_prefill()
    bad.window_attention = bad.window_attention[:, :, :100]
    with pytest.raises(ValueError, match="positions"):
        parse("snapkv").kept(bad, 0.5)
    nan = fake_prefill()
    nan.window_attention[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        parse("snapkv").kept(nan, 0.5)


def test_registry_parses_every_name_once_and_refuses_others():
    """Each CLI name parses to its class; a built-in name with parameters, an unknown name, a repeated
    name and a name handed to the sweep unparsed are refused in one line."""
    assert BUILT_IN == ("snapkv", "h2o", "streamingllm", "streamingllm-fixed", "pyramidkv", "snapkv-perlayer",
                        "snapkv-perhead", "h2o-perhead", "random")
    for name in BUILT_IN:
        evictor = parse(name)
        assert type(evictor) is EVICTORS[name] and evictor.name == name
    assert {n for n in BUILT_IN if parse(n).accumulated} == {"h2o", "h2o-perhead"}
    assert {n for n in BUILT_IN if parse(n).granularity == "head"} == {"snapkv-perhead", "h2o-perhead"}
    for bad, message in (("snapkv:pool=3", "takes no parameters"), ("SnapKV", "unknown evictor"),
                         ("", "unknown evictor"), (None, "unknown evictor")):
        with pytest.raises(ValueError, match=message) as err:
            parse(bad)
        assert "\n" not in str(err.value)
    assert "kvpress:<Press>" in str(pytest.raises(ValueError, parse, "nope").value)
    with pytest.raises(ValueError, match="must not repeat"):
        parse_all(("snapkv", "h2o", "snapkv"))
    options = capture_options(parse_all(("snapkv", "h2o-perhead")))
    assert options == {"accumulate": True, "presses": []}
    assert capture_options(parse_all(("snapkv", "random"))) == {"accumulate": False, "presses": []}


def test_every_registered_evictor_has_a_row_in_the_usage_table():
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "USAGE.md").read_text()
    table = text[text.index("## Base evictors"):]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {name for line in rows for name in line.split("|")[1].replace("`", "").replace(" ", "").split(",")}
    assert {cls.usage for cls in EVICTORS.values()} <= named


def test_sweep_takes_parsed_evictors_only():
    from collectors.sweep import run_sweep

    with pytest.raises(ValueError, match="collectors.evictors.parse"):
        run_sweep(None, None, fake_prefill(), evictors=("snapkv",), budgets=(0.5,), max_new_tokens=1)


def test_pyramid_weights_decrease_with_depth():
    w = pyramid_weights(4)
    assert torch.allclose(w, torch.tensor([4, 3, 2, 1], dtype=torch.float32) / 10)


def _prompt(seed, n_tokens=100):
    return torch.randint(0, 50_000, (1, n_tokens), generator=torch.Generator().manual_seed(seed))


def test_random_control_matches_brute_force_and_is_seeded_by_the_prompt():
    """Table 31's control: i.i.d. U(0, 1) scores from a generator seeded by CRC-32(token ids) + 31,
    then the shared keep rule; the same prompt keeps the same positions, another prompt others,
    and the kept set at a smaller budget lies inside the larger one."""
    import zlib

    ids = _prompt(3)
    seed = zlib.crc32(ids.reshape(-1).to(torch.int64).numpy().tobytes()) + 31
    score = torch.rand(100, generator=torch.Generator().manual_seed(seed))
    pf = SimpleNamespace(input_ids=ids)  # no attention: the control needs none
    for b in (0.0625, 0.5, 0.875):
        assert parse("random").kept(pf, b).tolist() == brute_top(score, 100, n_kept(100, b))
    assert parse("random").kept(pf, 0.5).tolist() == parse("random").kept(SimpleNamespace(input_ids=ids.clone()), 0.5).tolist()
    assert parse("random").kept(pf, 0.5).tolist() != parse("random").kept(SimpleNamespace(input_ids=_prompt(4)), 0.5).tolist()
    assert set(parse("random").kept(pf, 0.5).tolist()) <= set(parse("random").kept(pf, 0.875).tolist())


def test_random_control_keeps_a_uniform_subset():
    """Over 3,000 prompts each unprotected position is kept equally often (chi-square against the
    uniform count (n_kept − 36) / 64 per prompt at T = 100, b = 0.5), and the protected ones always."""
    import numpy as np
    from scipy import stats

    counts = np.zeros(100)
    for seed in range(3000):
        counts[parse("random").kept(SimpleNamespace(input_ids=_prompt(seed)), 0.5).numpy()] += 1
    free = counts[N_SINK:100 - N_RECENT]
    assert (counts[:N_SINK] == 3000).all() and (counts[100 - N_RECENT:] == 3000).all()
    assert free.sum() == 3000 * (n_kept(100, 0.5) - N_SINK - N_RECENT)
    assert stats.chisquare(free).pvalue > 1e-3
    biased = free.copy()
    biased[:8] *= 1.15  # a 15 % preference for early positions is detected at this size
    assert stats.chisquare(biased, biased.sum() / 64 * np.ones(64)).pvalue < 1e-3
