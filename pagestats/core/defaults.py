"""Every default that encodes a choice of the PAGE paper, in one place.

Each constant cites where the paper fixes it. Outputs (manifests, report indexes)
record the values they were computed with, so change them here and nowhere else.
"""

from __future__ import annotations

#: Observation window: the last ``w`` prompt rows are averaged (§3, "Head-Agreement Drop D").
WINDOW = 32
#: Top-k key set size used by the agreement a_ℓ (§3, Eq. 3; App. A.3.1).
TOP_K = 32
#: Top-k indices stored per (layer, head) so any k ≤ k_max replays offline (docs/SCHEMA.md).
K_MAX = 128
#: Fraction of layers in each of the early/late bins (§3: "binning the L layers into thirds").
BIN_FRACTION = 1.0 / 3.0
#: Bin convention: "deployed" = equal-size bins early=[0,⌊fL⌋), late=[L−⌊fL⌋, L) (App. F);
#: "strict" = strict thirds, late=[⌊(1−f)L⌋, L) (Table 24).
BIN_CONVENTION = "deployed"
#: Fixed gate threshold (§3 "Calibration", Table 8).
TAU = 0.07
#: z-scored gate: τ_M = μ_M + θ_z σ_M (App. A.3.4, "Architecture-normalized variant").
THETA_Z = -0.69
#: Unlabelled pilot size per model for the z-scored gate (§3 "Calibration": ~100 inputs).
PILOT_N = 100
#: How the z-scored pilot is drawn: a seeded hash of the input identity, the pilot inputs held
#: out of every evaluated number (§4.1 notes the pilot is undefined in the paper; pinned here).
PILOT_SPLIT = "held-out"
#: Inputs per class for the 40-input midpoint recipe (App. A.3.4, Eq. 5).
MIDPOINT_N = 20
#: Tasks of the paper's midpoint pilot (App. A.3.4: "20 inputs from a known capacity-bound task
#: (NIAH-MK3)" and 20 from VT; Table 7): capacity-bound, then dilution-prone.
MIDPOINT_TASKS = ("niah_multikey_3", "vt")
#: Fig. 6's recipe (App. A.3.4 "Threshold sensitivity"): its budgets, and the tasks its false-positive
#: rate (the gate opens on the capacity-bound anchor) and false-negative rate (the gate stays closed on
#: the dilution-prone tasks) are read on.
FIG6_BUDGETS = (0.5, 0.25, 0.125, 0.0625)
FIG6_FP_TASKS = ("niah_multikey_3",)
FIG6_FN_TASKS = ("vt", "fwe", "qa_1")
#: Pre-registered dilution-prone threshold on ρ (§3, Eq. 1).
RHO_THRESHOLD = 0.05
#: Rows the scaling slope is fitted on (§5, Fig. 9: the dilution-prone task class; "rho": ρ ≥ 0.05).
DILUTION_RULE = "task-class"
#: Nominal budgets (§4 "Setup", Table 2; 1.0 is the full-cache audit arm).
BUDGETS = (0.0625, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
#: Protected positions: first n_sink and last n_recent prompt tokens (§3 "Algorithm", App. F).
N_SINK = 4
N_RECENT = 32
#: Base evictors of the headline matrix (§4, Table 2).
EVICTORS = ("snapkv", "h2o", "streamingllm", "pyramidkv")
#: SnapKV scoring window: the last w = 32 prompt queries (§4 "Setup"; the same w as the gate's window).
SNAPKV_WINDOW = 32
#: Collection modes: "query-aware" prefills the whole prompt before eviction (the paper's setting, §4
#: "Setup"); "query-agnostic" prefills and evicts the context, then appends the question.
MODES = ("query-aware", "query-agnostic")
MODE = "query-aware"
#: Prompt styles of the collector (docs/COLLECTION.md, "Prompt styles"; docs/decisions.md): "page" is
#: the authors' runner, on whose D the paper's τ = 0.07 was set (§3 "Calibration"): a system turn
#: PAGE_SYSTEM_PROMPT, then one user turn "context\n\nquestion\nanswer prefix", the chat template's
#: generation prompt, no special tokens added; "ruler" is RULER's input as one user turn with the answer
#: prefix after the generation prompt. A manifest or gate file without one is "ruler" (collected before).
PROMPT_STYLES = ("page", "ruler")
PROMPT_STYLE = "page"
PAGE_SYSTEM_PROMPT = "Answer the question concisely."
#: Budget floors (docs/decisions.md): "page" keeps max(n_sink + n_recent + PAGE_FLOOR_EXTRA, ⌊b·T⌋)
#: = max(40, ⌊b·T⌋), the authors' runner; "protected" keeps max(⌊b·T⌋, n_sink + n_recent) = 36
#: (App. A.2.3). A manifest without one is "protected" (collected before).
BUDGET_FLOORS = ("page", "protected")
BUDGET_FLOOR = "page"
PAGE_FLOOR_EXTRA = 4
#: SnapKV score pooling width; 1 = none, as the paper describes its scoring (§4 "Setup").
SNAPKV_POOL_KERNEL = 1
#: The evictor of the single-evictor tables and figures (§4 "Setup": "Eviction is SnapKV-style by default").
HEADLINE_EVICTOR = "snapkv"
#: Control arms, not base evictors (Table 31's uniform-random scoring): a run that logs one is a control
#: run, set apart from every other entry of the report and read by Table 31 alone.
CONTROL_EVICTORS = ("random",)
#: Statistics (App. A.7.2, Table 28).
CONFIDENCE_LEVEL = 0.95
N_BOOTSTRAP = 10_000
FDR_Q = 0.05
#: Task classes are data; these are only the defaults (§4 "The partition", Table 3).
CAPACITY_BOUND = "capacity-bound"
DILUTION_PRONE = "dilution-prone"
DEFAULT_CAPACITY_BOUND_TASKS = ("niah_multikey_3", "niah_multiquery")
#: The capacity-bound anchor the paper's tables read the capacity-bound side on: NIAH-MK3 alone
#: (Table 1's pooled 2/526, Table 2's "excluding NIAH-MK3", Tables 5–6, 9–10, 12, 14, 27, 29–30,
#: Fig. 7's Δ_MK3). niah_multiquery, the class's second member (Table 3), is in none of them. The
#: tables take it as ``anchor=``; ``None`` reads the capacity-bound class of the task → class mapping.
ANCHOR_TASKS = ("niah_multikey_3",)
RULER_TASKS = (
    "niah_single_1",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
    "qa_1",
    "qa_2",
)


#: Random head-pair draws averaged by a head-pair subsampling replay (App. A.3.5, Table 9).
PAIR_DRAWS = 20
#: Head-pair fractions of Table 9 (1.0 = every pair, the reference row).
PAIR_FRACTIONS = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Top-k set sizes of the k sweep (App. A.3.1: k ∈ {8, 16, 32, 64, 128}; those ≤ the logged k_max run).
K_SWEEP = (8, 16, 32, 64, 128)
#: Pilot sizes of the pilot-sensitivity table (§3 "Calibration": the pilot is "~100 inputs").
PILOT_SIZES = (25, 50, 100)
#: Batch sizes of the static-batching table (App. A.6.2, Table 23).
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
#: The budget of the headline's harm and compression: b = 1/16, 16× nominal compression (Tables 22, 23, 27).
HEADLINE_BUDGET = 0.0625
#: The batch size of the headline's batched compression (Table 23's B = 8).
HEADLINE_BATCH = 8
#: τ sweep of the threshold-sensitivity figure: (start, stop, step), stop inclusive (App. A.3.4, Fig. 6).
TAU_GRID = (-0.05, 0.25, 0.0025)
#: Operational plateau of Fig. 6 (App. A.3.4): Δ within this of Δ(τ0) ("Δ varies by under 1 pp") ...
PLATEAU_DELTA_TOLERANCE = 0.01
#: ... and FP + FN rates at most this (both "at or below 9%" on the paper's plateau).
PLATEAU_ERROR_BUDGET = 0.10
#: Seed of the report's cluster bootstrap (Tables 28–29), recorded so a report is reproducible.
BOOTSTRAP_SEED = 0


def default_task_class(task: str) -> str:
    """Class of ``task`` under the default partition (capacity-bound or dilution-prone)."""
    return CAPACITY_BOUND if task in DEFAULT_CAPACITY_BOUND_TASKS else DILUTION_PRONE


def as_dict() -> dict:
    """The defaults as a plain dict, for recording in manifests and report indexes."""
    return {
        name.lower(): value
        for name, value in globals().items()
        if name.isupper() and isinstance(value, (int, float, str, tuple))
    }
