"""gated_generate: greedy generation under PAGE's gate, without kvpress.

The gate of :mod:`collectors.deploy.decision` over the built-in evictors of :mod:`collectors.evictors` (or
a ``kvpress:<Press>`` scored in the same prefill), decoded by the sweep's own
:func:`collectors.decode.decode_arms`, so its output is the arm the collector logs: the full-KV
answer when the gate is closed, the evictor's arm at that budget when it is open.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from collectors import capture, evictors
from collectors.decode import decode_arms, eos_token_ids, stop_reason
from collectors.deploy.decision import GateDecision, check_deployment, gate_decision, resolve_gate, warn_short_prompt
from collectors.deploy.log import deployment_manifest, open_log
from collectors.tasks import tokenize_prompt
from pagestats.core import defaults


@dataclass(frozen=True)
class GenerationResult:
    """What :func:`gated_generate` returns: the greedy tokens and text, why the decode stopped, the
    gate's decision, and the kept positions of the open arm (``None`` when the full cache was kept)."""

    token_ids: list
    text: str
    stop_reason: str
    decision: GateDecision
    evictor: str
    budget: float
    kept: torch.Tensor | None = None


def _prompt_ids(tokenizer, prompt) -> torch.LongTensor:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer")
        return torch.tensor([tokenize_prompt(tokenizer, prompt)], dtype=torch.long)
    ids = torch.as_tensor(prompt, dtype=torch.long)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
        raise ValueError(f"prompt ids must have shape (T,) or (1, T) with T ≥ 1 (batch size 1), got {tuple(ids.shape)}")
    return ids


@torch.no_grad()
def gated_generate(model, tokenizer, prompt, *, evictor: str = "snapkv", budget: float = 0.5, tau=None, gate=None,
                   max_new_tokens: int = 64, window=None, k=None, bin_fraction=None, convention=None,
                   n_sink: int = defaults.N_SINK, n_recent: int = defaults.N_RECENT,
                   budget_floor: str = defaults.BUDGET_FLOOR, allow_mode_mismatch: bool = False,
                   snapkv_window: int = defaults.SNAPKV_WINDOW, pool_kernel: int = defaults.SNAPKV_POOL_KERNEL,
                   stop_strings=None, model_name: str | None = None, log_dir=None, log_text: bool = False,
                   log_part_size: int = 1) -> GenerationResult:
    """Greedy generation under PAGE's gate, without kvpress: evict with ``evictor`` at ``budget`` iff
    D ≥ τ (§3, Eq. 2), else keep the full cache.

    Parameters
    ----------
    model, tokenizer
        A causal LM whose attention goes through ``AttentionInterface`` and its tokenizer.
    prompt : str or LongTensor
        Text (tokenised as the collector tokenises a prompt: :func:`collectors.tasks.tokenize_prompt`)
        or ids of shape (T,) / (1, T).
    evictor : str
        A name :func:`collectors.evictors.parse` reads: a built-in evictor or ``kvpress:<Press>[:k=v]``
        (needs kvpress).
    budget : float
        b ∈ (0, 1], the kept fraction when the gate opens (:func:`collectors.evictors.n_kept`).
    tau, gate
        The threshold, or a calibrated :class:`pagestats.deploy.gatefile.Gate` / gate.json path (exactly one).
    max_new_tokens : int
        Greedy tokens at most (EOS stops earlier, as in the collector).
    window, k, bin_fraction, convention
        D's definition (§3, App. F; defaults or the gate's).
    n_sink, n_recent, budget_floor, snapkv_window, pool_kernel
        The evictor's protection, least kept count and window, as in the collector (docs/COLLECTION.md).
    allow_mode_mismatch : bool
        Deploy a gate calibrated on query-agnostic logs anyway (gated_generate prefills the whole
        prompt: query-aware; otherwise refused in one line).
    stop_strings : sequence of str, optional
        Extra stop condition on the text.
    model_name : str, optional
        Checked against the gate's model (default ``model.config._name_or_path``;
        :func:`collectors.deploy.decision.model_matches`).
    log_dir : path, optional
        Append this input's row to the deployment log there (:class:`DeploymentLog`).
    log_text : bool
        Also log the generated text (needs ``log_dir``).
    log_part_size : int
        Rows per part file of the log (default 1: the row is on disk when the call returns).

    Returns
    -------
    GenerationResult

    Notes
    -----
    One prefill (:func:`collectors.capture.prefill`) gives ā, D and the evictor's scores; the decode
    is :func:`collectors.decode.decode_arms` on the full cache or on the evictor's kept positions
    (:meth:`collectors.evictors.Evictor.kept`), so the result equals the collector's logged arm.
    A kept set of all T positions is the full cache, as in the collector's sweep.
    """
    tau, gate, window, k, bin_fraction, convention = resolve_gate(tau, gate, window, k, bin_fraction, convention)
    chosen = evictors.parse(evictor)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (0.0 < float(budget) <= 1.0):
        raise ValueError(f"budget must lie in (0, 1], got {budget!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if log_text and log_dir is None:
        raise ValueError("log_text=True logs the text to a deployment log: give log_dir")
    name = model_name or getattr(model.config, "_name_or_path", None) or None
    check_deployment(gate, model_name=name, n_layers=model.config.num_hidden_layers, mode="query-aware",
                     allow_mode_mismatch=allow_mode_mismatch)
    log = None
    if log_dir is not None:
        manifest = deployment_manifest(model, model_name=name, tau=tau, gate=gate, window=window, k=k,
                                       bin_fraction=bin_fraction, convention=convention, entry="gated_generate",
                                       evictor=evictor, budget=budget, log_text=log_text)
        log = open_log(log_dir, manifest, part_size=log_part_size)
    ids = _prompt_ids(tokenizer, prompt)
    pf = capture.prefill(model, ids, window=window, snapkv_window=snapkv_window,
                         **evictors.capture_options([chosen]))
    n_tokens = pf.n_tokens
    decision = gate_decision(pf.window_attention, tau=tau, window=window, k=k, bin_fraction=bin_fraction,
                             convention=convention)
    kept = None
    if decision.gate_open:
        kept = chosen.kept(pf, float(budget), n_sink=n_sink, n_recent=n_recent, pool_kernel=pool_kernel,
                           budget_floor=budget_floor)
        count = int(kept.shape[-1])
        if count == n_tokens:
            kept = None
        decision = dataclasses.replace(decision, n_kept=count, kept_fraction=count / n_tokens)
    elif decision.reason == "short-prompt":
        warn_short_prompt(n_tokens, window)
    eos_ids = eos_token_ids(model, tokenizer)
    tokens = decode_arms(model, pf, [kept], max_new_tokens=max_new_tokens, eos_ids=eos_ids, tokenizer=tokenizer,
                         stop_strings=stop_strings)[0]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    reason = stop_reason(tokens, max_new_tokens=max_new_tokens, eos_ids=eos_ids, tokenizer=tokenizer,
                         stop_strings=stop_strings)
    result = GenerationResult(token_ids=list(tokens), text=text, stop_reason=reason, decision=decision,
                              evictor=evictor, budget=float(budget), kept=kept)
    if log is not None:
        log.append(decision, text=text if log_text else None, n_generated=len(tokens), stop_reason=reason)
    return result
