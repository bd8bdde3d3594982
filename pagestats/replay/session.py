"""One replay of the gate: the logs, a policy and a profile spec on one DuckDB connection, with D
and the decisions computed once (§3, Eq. 2 and Eq. 3).

References
----------
PAGE paper, §3 (Eq. 2 gate rule, Eq. 3 D; "Calibration"); App. A.3.4–A.3.5 (the what-ifs).
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import polars as pl

from pagestats.io.logs import INPUT_COLUMNS, LogTables
from pagestats.core import formulas
from pagestats.replay import relations
from pagestats.replay.frames import gated_from_decisions
from pagestats.replay.calibration import keep_pilots
from pagestats.replay.policies import FixedTau, Policy
from pagestats.replay.spec import ProfileSpec, profile_drop, profile_drop_by_draw
from pagestats.core.schema import INPUT_KEY

#: Rows of head-pair draws calibrated at once by :func:`decisions_by_draw` (bounds its memory: Table 9 at
#: 1M inputs 1.05 GiB above the loaded logs with 2M, 1.34 with 4M, the time alike; docs/PERFORMANCE.md).
DRAW_BLOCK_ROWS = 2_000_000
#: The columns of :meth:`Replay.pilot_composition`.
PILOT_COLUMNS = ("model", "context_length", "run_id", "task", "n_pilot", "held_out", "tau")


class Replay:
    """The gate replayed on ``logs`` under ``policy`` and ``profile``, computed once.

    Parameters
    ----------
    logs : pagestats.io.LogTables
        In-memory logs or a database of views over the parquet files (out of core).
    policy : Policy
        How τ is chosen (default fixed τ = 0.07).
    profile : ProfileSpec
        How D is recomputed (default: the logged D).

    Notes
    -----
    D, the decisions and the connection are made on first use and kept. The connection
    (:attr:`con`) holds these relations, the contract of the queries that read it:

    ``inputs``, ``outcomes``
        The logs' tables: :data:`pagestats.io.logs.INPUT_COLUMNS` (and ``draw`` when logged)
        and :data:`pagestats.io.logs.OUTCOME_COLUMNS`.
    ``drops`` (after :meth:`drops_relation`)
        One row per input (and head-pair draw ``pair_draw``): the input columns and D under
        ``profile``.
    ``decisions`` (after :meth:`decisions_relation`)
        :data:`pagestats.replay.relations.DECISION_COLUMNS`: ``drops`` with ``tau`` and
        ``gate_open``, the evaluated inputs only.
    ``held_out`` (after :meth:`decisions_relation`)
        ``run_id, task, input_id`` of the inputs a held-out pilot used to set τ, left out of
        every evaluated number (empty without one).
    ``gated`` (after :meth:`gated`)
        The gated outcomes of the evaluated inputs (Eq. 2): the rows of :meth:`gated_outcomes`.

    Relations named ``_*`` are the engine's own; a query that adds its own names them ``_*`` too.
    """

    def __init__(self, logs: LogTables, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec()):
        if not isinstance(profile, ProfileSpec):
            raise TypeError(f"profile must be a ProfileSpec, got {type(profile).__name__}")
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be one of pagestats.replay's policies (a Policy), got {policy!r}")
        self.logs, self.policy, self.profile = logs, policy, profile
        self._con = None
        self._done: dict[str, object] = {}

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the relations go with it; the polars frames are kept)."""
        if self._con is not None:
            self._con.close()
            self._con = None
            self._done = {k: v for k, v in self._done.items() if k in ("frames", "drop_frame", "decision_frame")}

    def _once(self, name: str, compute):
        if name not in self._done:
            self._done[name] = compute()
        return self._done[name]

    def _connection(self):
        """The connection with ``inputs`` only: the outcome rows are related when a query asks for
        them (:attr:`con`), so that the pilot composition of in-memory logs copies none."""
        if self._con is None:
            self._con = self.logs.cursor()
        return self._con

    @property
    def con(self):
        """The session's DuckDB connection, with the relations of the class docstring."""
        con = self._connection()
        self._once("outcomes", lambda: self.logs.relate_outcomes(con))
        return con

    def frames(self):
        """The per-input rows with the per-layer lists the profile spec reads."""
        return self._once("frames", lambda: self.logs.per_input(relations.profile_lists(self.profile),
                                                                topk=self.profile.k is not None))

    def drop_frame(self) -> pl.DataFrame:
        """D per input (and head-pair draw) under the profile spec (:func:`pagestats.replay.profile_drop`)."""
        return self._once("drop_frame", lambda: profile_drop(self.frames(), self.profile))

    def drops_relation(self) -> list[str]:
        """Create the relation ``drops``; return its draw columns (``["pair_draw"]`` or ``[]``).

        The default profile reads the logged D in SQL; any other spec joins :meth:`drop_frame` back,
        as does a policy that reads the a_ℓ list (``"agreement"`` in its ``reads``), with the list.
        """
        def make():
            if self.profile == ProfileSpec() and "agreement" not in self.policy.reads:
                return relations.logged_drops(self._connection())
            return self.register_drops(self.drop_frame())

        return self._once("drops", make)

    def register_drops(self, frame: pl.DataFrame) -> list[str]:
        """Make ``frame`` (a :func:`profile_drop` frame) the relation ``drops``, with the a_ℓ list when the
        policy reads it; return its draw columns."""
        if "agreement" in self.policy.reads:
            frame = frame.join(self.frames().inputs.select(*INPUT_KEY, "agreement"), on=INPUT_KEY, how="left",
                               maintain_order="left")
        return relations.register_drops(self._connection(), frame)

    def decision_frame(self) -> pl.DataFrame:
        """Every input's decision, a held-out pilot included (``held_out`` marks the inputs that set
        τ), in input (and draw) order, names typed as the logs hold them; not refused where the gate
        cannot decide (:meth:`decisions_relation` is)."""
        def make():
            draw_columns, held = self._calibrated()
            return self.logs.typed_names(relations.decision_frame(self._connection(), draw_columns, held))

        return self._once("decision_frame", make)

    def _calibrated(self) -> tuple[list[str], str]:
        """``_calibrated`` made once (:func:`~pagestats.replay.relations.create_calibrated`); its draw
        columns and the SQL condition of a held-out row."""
        def make():
            draw_columns = self.drops_relation()
            return draw_columns, relations.create_calibrated(self._connection(), self.policy)

        return self._once("calibrated", make)

    def decisions_relation(self) -> list[str]:
        """Create the relations ``decisions`` and ``held_out``, refused (:class:`UnknownFullError`) where an
        input has no D or the gate closes on an input without its full-KV outcome; return their draw columns."""
        return self._once("decisions", lambda: self._decisions(*self._calibrated()))

    def decide(self, policy: Policy) -> list[str]:
        """Create ``decisions`` and ``held_out`` as :meth:`decisions_relation` does, for ``policy`` on this
        replay's D (computed once): the policies of a comparison decided in turn (Table N1's pilot
        definitions). They replace the session's own relations, which are made again when next asked for."""
        for name in ("calibrated", "decisions", "gated"):
            self._done.pop(name, None)
        return self._decisions(self.drops_relation(), relations.create_calibrated(self._connection(), policy))

    def _decisions(self, draw_columns: list[str], held: str) -> list[str]:
        con = self._connection()
        relations.create_decisions(con, draw_columns, held)
        _refuse_no_drop(con.sql("SELECT run_id, count(DISTINCT (task, input_id)) FROM decisions WHERE gate_open "
                                "IS NULL GROUP BY run_id ORDER BY run_id").fetchall())
        _refuse_unknown_full(con.sql("SELECT run_id, count(DISTINCT (task, input_id)) FROM decisions WHERE NOT "
                                     "gate_open AND full_score IS NULL GROUP BY run_id ORDER BY run_id").fetchall())
        return draw_columns

    def gated_relation(self) -> list[str]:
        """Create the relation ``gated``; return its draw columns."""
        def make():
            draw_columns = self.decisions_relation()
            self.con.execute(f"CREATE OR REPLACE TEMP VIEW gated AS {relations.gated_query(draw_columns)}")
            return draw_columns

        return self._once("gated", make)

    def gated_outcomes(self, *, evictor: str | None = None, columns=None) -> pl.DataFrame:
        """:func:`gated_outcomes` of this replay."""
        self.decisions_relation()  # the refusals
        return gated_from_decisions(self.logs.outcome_rows(evictor), self.decision_frame(), columns)

    def pilot_composition(self) -> pl.DataFrame:
        """:func:`pilot_composition` of this replay: only the pilot's rows reach polars."""
        draw_columns = self.decisions_relation()
        con = self._connection()
        pilot = relations.pilot_rows(con, draw_columns) if self.policy.has_pilot else relations.no_pilot_rows(con)
        cols = list(PILOT_COLUMNS[:4])
        draw_columns = [c for c in ("pair_draw",) if c in pilot.columns]
        tau = formulas.expr(formulas.group_tau()).alias("tau")  # per group and draw, then over the draws
        taus = pilot.group_by([*cols, *draw_columns]).agg(tau)
        out = pilot.group_by(cols).agg(pl.struct(INPUT_KEY).n_unique().cast(pl.Int64).alias("n_pilot")).join(
            taus.group_by(cols).agg(tau), on=cols, how="left", nulls_equal=True)
        return out.with_columns(pl.lit(self.policy.held_out).alias("held_out")).select(
            *PILOT_COLUMNS).sort(cols)


class UnknownFullError(ValueError):
    """A replay whose gate closes on inputs whose full-KV outcome the logs do not hold (Eq. 2 needs it)."""


def _refuse_unknown_full(missing: list[tuple[str, int]]) -> None:
    """Refuse a replay that closes the gate on inputs with no full-KV outcome (an imported file without
    b = 1 rows records it only for the inputs its own gate closed on; docs/IMPORT.md): one line that says
    how many inputs of which run lack it."""
    if missing:
        runs = "; ".join(f"{n} input{'s' if n != 1 else ''} of {run}" for run, n in missing)
        raise UnknownFullError(f"the gate closes on {runs} whose full-KV outcome the logs do not record (a release "
                               "without b = 1 rows has it only where its own gate closed): use a threshold at or "
                               "below the one the file ran at (manifest imported.sources[].tau_run)")


def _refuse_no_drop(missing: list[tuple[str, int]]) -> None:
    """Refuse a replay over inputs without D (an imported RULER sweep: the plain arm alone), in one line."""
    if missing:
        runs = "; ".join(f"{n} input{'s' if n != 1 else ''} of {run}" for run, n in missing)
        raise UnknownFullError(f"the gate cannot decide {runs}: they have no D (a RULER sweep logs the plain arm "
                               "alone); leave the run out (its ρ is in the report)")


def gate(logs: LogTables, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec()) -> pl.DataFrame:
    """Gate decision per input under ``policy``: open (evict) iff D ≥ τ (§3, Eq. 2).

    A policy whose pilot is held out (``pilot_split="held-out"``, the z-scored default) sets τ
    on its pilot inputs and leaves them out of the frame, so no evaluated number is
    computed on the inputs that set the threshold.

    Returns
    -------
    polars.DataFrame
        ``run_id, task, input_id, [pair_draw], model, context_length, task_class, n_tokens,
        full_score, drop, tau, gate_open`` in input (and draw) order; ``tau`` is null for
        threshold-free policies.
    """
    with Replay(logs, policy, profile) as session:
        decided = session.decision_frame()
    return decided.filter(~pl.col("held_out")).drop("held_out")


def decisions_by_draw(logs: LogTables, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec()
                      ) -> Iterator[duckdb.DuckDBPyRelation]:
    """The evaluated decisions (the relation ``decisions``: :data:`~pagestats.replay.relations.DECISION_COLUMNS`,
    a held-out pilot left out) a block of head-pair draws at a time, for the metrics to aggregate
    (:mod:`pagestats.metrics`, ``pair_draw`` in their ``by``); without head-pair draws, every
    decision, once.

    A policy's pilot is the same inputs in every draw and its τ is set per draw (the draw is one of
    its calibration groups), so draws can be calibrated apart, about :data:`DRAW_BLOCK_ROWS` rows at
    a time (Table 9 holds 20 draws of every input otherwise). A block is a relation on the replay's
    connection (a view: each query over it reads the block's D, which carries the input columns, and
    joins the pilot's τ again), in no particular row order, replaced by the next: aggregate it before
    asking for the next. A policy that may pool draws (not ``per_draw``: a
    :class:`~pagestats.replay.policies.CustomPolicy`) is refused.
    """
    if not policy.per_draw and profile.has_draws:
        raise TypeError(f"decisions_by_draw: the policy {policy.name!r} sees every head-pair draw at once (a "
                        "CustomPolicy may pool them); use gate()")
    with Replay(logs, policy, profile) as session:
        con, frames = session._connection(), session.frames()
        per_block = max(1, DRAW_BLOCK_ROWS // max(1, frames.inputs.height))
        keep_pilots(con)  # every block holds every input: its pilot is drawn once
        # the input columns ride beside D (no join of every block back to the inputs on their text keys)
        carried = [c for c in INPUT_COLUMNS if c not in (*INPUT_KEY, "drop") and c in frames.inputs.columns]
        if "reference_drop" in policy.reads:
            carried.append(pl.col("drop").cast(pl.Float64).alias("reference_drop"))

        def decisions(block):
            draw_columns = session.register_drops(pl.concat(block))
            relations.create_decisions(con, draw_columns, relations.create_calibrated(con, policy))
            return con.view("decisions")

        block: list[pl.DataFrame] = []
        for prof in profile_drop_by_draw(frames, profile, columns=carried):
            block.append(prof)
            if len(block) == per_block:
                yield decisions(block)
                block = []
        if block:
            yield decisions(block)


def gated_outcomes(logs, policy: Policy = FixedTau(), profile: ProfileSpec = ProfileSpec(), *,
                   evictor: str | None = None, columns=None) -> pl.DataFrame:
    """Per (input, evictor, budget): plain, full and gated outcomes under ``policy`` (Eq. 2).

    The gated outcome is the plain outcome where the gate opens, else the full-KV outcome
    (``full_score``) with ``n_kept_gated = n_tokens``.

    Parameters
    ----------
    logs : pagestats.io.Logs or pagestats.io.LogDB
    evictor : str, optional
        Only this evictor's outcome rows (a table of one evictor need not gate the others).
    columns : sequence of str, optional
        Only these of :data:`~pagestats.replay.frames.GATED_OUTCOME_COLUMNS` (a table that reads
        a few holds narrow rows).

    Returns
    -------
    polars.DataFrame
        Columns :data:`~pagestats.replay.frames.GATED_OUTCOME_COLUMNS` (``pair_draw`` only with
        head-pair draws; only ``columns`` when given), sorted by input key, [pair_draw],
        evictor, budget.
    """
    with Replay(logs, policy, profile) as session:
        return session.gated_outcomes(evictor=evictor, columns=columns)


def pilot_composition(logs, policy: Policy, profile: ProfileSpec = ProfileSpec()) -> pl.DataFrame:
    """The calibration pilot of ``policy``: how many inputs per (model, context_length,
    run_id, task), whether they are held out, and the τ they set (§3 "Calibration").

    Returns
    -------
    polars.DataFrame
        :data:`PILOT_COLUMNS`: ``model, context_length, run_id, task, n_pilot, held_out, tau``
        (τ of the group's pilot inputs; the mean over head-pair draws); empty for a policy
        without a pilot.
    """
    with Replay(logs, policy, profile) as session:
        return session.pilot_composition()
