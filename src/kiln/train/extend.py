"""Extending a finished run: the saved state a longer (or re-annealed) run of it goes on from.

A finished wsd run is extended, not started over, when the new recipe differs from it only in
the length of the run and the shape of its decay (EXTENDABLE: `--set train.steps=N`, a new
decay_fraction or floor) and reads the same data. The new run goes on from the newest saved
state that lies in the stable phase of both schedules: the old run's lr was still the peak
there, and the new schedule's next step is at the peak too (its warmup over, its decay not yet
begun). The trainer always keeps a state at the last stable step of a wsd run (kiln.train.loop),
so a finished run can always be extended from the start of its decay. The steps up to that state
stand as the finished run took them (its warmup length and mixture progress included), and the
new manifest names the run and step it went on from.
A cosine or linear schedule decays from its first step after warmup, so its runs are started
over (the finished one is kept beside the new one; kiln.train.run says where).
Not handled here: copying the state into the new attempt, or moving the finished run aside
(kiln.train.run).
"""

from __future__ import annotations

from pathlib import Path

from kiln.core.errors import KilnError
from kiln.train.config import TrainConfig
from kiln.train.resume import complete_states, state_step

# The settings an extension may change ("key:" starts each changed setting's description).
EXTENDABLE = ("train.steps", "train.schedule.decay_fraction", "train.schedule.min_lr_ratio")


def stable_at(cfg: TrainConfig, step: int) -> bool:
    """Whether optimizer step `step` of this run is in its wsd stable phase (after warmup, before the decay)."""
    last = cfg.stable_until
    return last is not None and cfg.warmup_steps <= step <= last


def extension_state(
    changes: list[str], old: TrainConfig, new: TrainConfig, states_dir: Path, from_step: int | None = None
) -> tuple[Path | None, str]:
    """The saved state under `states_dir` (a finished run's) the new config goes on from (or from_step's),
    and why; None with the reason when the new config cannot extend that run."""
    other = [c for c in changes if not c.startswith(tuple(f"{key}:" for key in EXTENDABLE))]
    if not changes or other:
        return None, f"it differs in more than the run's length and decay ({'; '.join(other[:3]) or 'nothing changed'})"
    if old.schedule.kind != "wsd" or new.schedule.kind != "wsd":
        return (
            None,
            (
                f"a {new.schedule.kind if new.schedule.kind != 'wsd' else old.schedule.kind} schedule decays from the "
                "end of its warmup on; only a wsd run is extended (train.schedule.kind: wsd)"
            ),
        )
    states = [s for s in complete_states(states_dir) if from_step is None or state_step(s) == from_step]
    if from_step is not None and not states:
        return (
            None,
            (
                f"it kept no state after step {from_step} (it kept "
                f"{', '.join(str(state_step(s)) for s in complete_states(states_dir)) or 'none'})"
            ),
        )
    # The old run was at its peak until the state; the new one is at the peak for the step after it,
    # and would have drawn the same rows up to it (a seq_len_schedule's phases move with the length).
    differs = first_other_rows(old, new, max((state_step(s) for s in states), default=0))
    fits = [
        s
        for s in states
        if stable_at(old, state_step(s)) and stable_at(new, state_step(s) + 1) and state_step(s) < differs
    ]
    if not fits:
        kept = ", ".join(str(state_step(s)) for s in states) or "none"
        return None, (
            f"no state it kept (steps {kept}) lies in the stable phase of both schedules (steps "
            f"{old.warmup_steps}..{old.stable_until} of the "
            f"finished run, {new.warmup_steps}..{new.stable_until} of this one)"
        )
    return fits[-1], f"goes on from its state after step {state_step(fits[-1])}, in the stable phase of both schedules"


def first_other_rows(old: TrainConfig, new: TrainConfig, last: int) -> int:
    """The first step up to `last` whose rows (length, count, RoPE base) differ between the two runs; last + 1 if
    none."""
    if not old.seq_len_schedule and not new.seq_len_schedule:
        return last + 1  # the rows of a step do not depend on the run's length
    for step in range(1, last + 1):
        a, b = old.geometry(step), new.geometry(step)
        if (a.seq_len, a.rows_per_rank, a.micro_rows, a.rope_theta) != (
            b.seq_len,
            b.rows_per_rank,
            b.micro_rows,
            b.rope_theta,
        ):
            return step
    return last + 1


def old_config(dump: dict, new: TrainConfig) -> TrainConfig | None:
    """The finished run's train section, validated for this launch's data ranks; None when it no longer validates."""
    try:
        return TrainConfig.model_validate(dump, context={"data_ranks": new.data_ranks})
    except (ValueError, KilnError):
        return None
