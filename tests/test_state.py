"""The loop's plain data (``xtrain.train.state``): what a finished step calls for (``Due``) and the
run's history a checkpoint saves and a resume restores (``RunState``). In-process, no torch work."""

from __future__ import annotations

from types import SimpleNamespace

from xtrain.data.sampler import DataOrder
from xtrain.train.checkpoint import TrainState
from xtrain.train.state import Due, RunState


def test_what_a_step_calls_for() -> None:
    run = SimpleNamespace(log_every=4, eval_every=6, save_every=5)
    due = {done: Due.after(done, 12, run, None) for done in range(1, 13)}
    assert [d for d, x in due.items() if x.log] == [4, 8, 12]  # and the last step
    assert [d for d, x in due.items() if x.eval] == [6]  # the last step's evaluation is finish()'s
    assert [d for d, x in due.items() if x.save] == [5, 10]
    assert [d for d, x in due.items() if x.anything] == [4, 5, 6, 8, 10, 12]
    stopped = Due.after(3, 12, run, 15)
    assert stopped.anything and stopped.stop == 15 and not (stopped.log or stopped.eval or stopped.save)
    never = SimpleNamespace(log_every=0, eval_every=None, save_every=None)  # log_every 0: every step
    assert all(Due.after(d, 3, never, None).log for d in (1, 2, 3))
    assert not any(Due.after(d, 3, never, None).eval or Due.after(d, 3, never, None).save for d in (1, 2, 3))


def test_the_state_a_checkpoint_saves_is_the_state_a_resume_restores(tmp_path) -> None:
    order = DataOrder(20, 4, 2, 2, 7)  # 5 steps an epoch
    settings = SimpleNamespace(global_batch=4, per_device=2, accumulation=1)
    state = RunState([[2, 1.5], [4, 1.25]], [{"step": 4, "eval_loss": 1.0}], skipped_steps=1)
    saved = state.saved_at(7, order, settings, 2, 10, 7, {"run": {"seed": 7}}, [])
    assert (saved.step, saved.epoch, saved.step_in_epoch, saved.samples_seen) == (7, 1, 2, 28)
    assert (saved.world_size, saved.num_samples, saved.total_steps, saved.skipped_steps) == (2, 20, 10, 1)
    (tmp_path / "state.json").write_text(saved.to_json(), encoding="utf-8")
    back = RunState.resumed(TrainState.from_file(tmp_path / "state.json"))
    assert back == RunState(state.losses, state.eval_history, 1, last_saved=7)
