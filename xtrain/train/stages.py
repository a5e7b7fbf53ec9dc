"""A recipe: several configs trained in order, each stage starting from the one before.

``xtrain train sft.yaml dpo.yaml grpo.yaml`` runs three stages. A stage whose
``model.name_or_path`` is ``previous`` starts from the result of the stage before it (that
stage's ``run.output_dir``: base, its adapters, its tokenizer); any other value is a start of its
own (a model, or a result of an earlier run). Overrides on the command line apply to every stage;
``N:section.key=value`` to stage N alone.

Everything here is decided before anything trains: each config read and checked, ``previous``
resolved, the stages' output folders told apart, each follower's task checked against the model
class of the stage it follows, and where each stage stands (``StageState``: to train, to resume
from a checkpoint, finished): a re-run after a kill skips the finished stages and resumes the one
that was running. Nothing is loaded or written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain import tasks
from xtrain.config import examples
from xtrain.config.loading import config_to_dict
from xtrain.errors import XtrainError, shown
from xtrain.tasks.validation import load_config
from xtrain.train.checkpoint.resume import resume_point

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig

PREVIOUS = "previous"  # model.name_or_path: the result of the stage before
_STAGE_OVERRIDE = re.compile(r"^(\d+):(.+)$")  # 2:optim.lr=1e-4
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Stage:
    """One stage: its config file, the overrides it runs with (``previous`` resolved to the stage
    before's output folder), the checked config, and whether it starts from the stage before."""

    number: int  # 1-based
    path: Path
    overrides: tuple[str, ...]
    cfg: TrainConfig
    follows: bool

    @property
    def name(self) -> str:
        return f"stage {self.number} ({self.path.name})"

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.run.output_dir).expanduser()


@dataclass(frozen=True)
class StageState:
    """Where a stage stands: ``finished`` (its run ended with this config's length: skipped),
    ``resume_step`` (a checkpoint to go on from), else new."""

    finished: bool = False
    resume_step: int | None = None

    def describe(self) -> str:
        if self.finished:
            return "finished: skipped"
        if self.resume_step is not None:
            return f"resumes at step {self.resume_step}"
        return "trains from the start"


def split_args(args: list[str]) -> tuple[list[Path], list[str]]:
    """``xtrain train``'s arguments -> (config files, overrides): ``section.key=value`` (or
    ``N:section.key=value``) is an override, an existing file or a name ending in .yaml/.yml/.json
    a config; anything else is an override (``parse_override`` then says how one looks)."""
    configs: list[Path] = []
    overrides: list[str] = []
    for arg in args:
        path = Path(arg).expanduser()
        if "=" not in arg and (path.is_file() or path.suffix.lower() in _CONFIG_SUFFIXES or path.is_dir()):
            if overrides:
                raise XtrainError(
                    f"config {shown(arg)} comes after an override",
                    "name every config first, then the key=value overrides",
                )
            configs.append(path)
        else:
            overrides.append(arg)
    return configs, overrides


def overrides_for(number: int, count: int, overrides: list[str]) -> list[str]:
    """The overrides stage ``number`` of ``count`` runs with: the plain ones, then its own
    (``N:key=value``). A stage number outside the recipe is refused."""
    own = []
    for text in overrides:
        found = _STAGE_OVERRIDE.match(text)
        if found is None:
            own.append(text)
            continue
        n = int(found.group(1))
        if not 1 <= n <= count:
            raise XtrainError(
                f"override {shown(text)} names stage {n}, but there {'is' if count == 1 else 'are'} "
                f"{count} stage{'s' if count != 1 else ''}",
                f"number the stages 1 to {count}, in the order the configs are given",
            )
        if n == number:
            own.append(found.group(2))
    return own


def load_stages(configs: list[Path], overrides: list[str]) -> list[Stage]:
    """Every stage's config read and checked (one line naming the stage for a mistake),
    ``previous`` resolved to the stage before's output folder, the output folders told apart,
    and each follower's model class the one of the stage it follows."""
    stages: list[Stage] = []
    for number, path in enumerate(configs, start=1):
        if not path.is_file():
            raise XtrainError(f"config {path} not found", examples.missing_hint(path))
        own = overrides_for(number, len(configs), overrides)
        cfg = _load(path, own, number, len(configs))
        follows = cfg.model.name_or_path == PREVIOUS
        if follows:
            if not stages:
                raise XtrainError(
                    f"{path.name}: model.name_or_path is 'previous', but it is the first stage",
                    "name a model or a trained result to start from, or list the stage it follows first",
                )
            start = str(stages[-1].output_dir.resolve())
            own = [*own, f"model.name_or_path={start}"]
            cfg = _load(path, own, number, len(configs))
            _check_follows(stages[-1], cfg, path)
        stages.append(Stage(number, path, tuple(own), cfg, follows))
    _check_outputs(stages)
    return stages


def _load(path: Path, overrides: list[str], number: int, count: int) -> TrainConfig:
    try:
        return load_config(str(path), overrides)
    except XtrainError as e:
        if count == 1:
            raise
        raise XtrainError(f"stage {number} ({path.name}): {e.message}", e.hint, e.exit_code) from None


def _check_follows(before: Stage, cfg: TrainConfig, path: Path) -> None:
    """A stage trains the model class of the stage it follows (SFT -> preference -> GRPO: causal
    LMs; vision-language -> vision-preference): another class or head is refused here."""
    first, then = tasks.get(before.cfg.model.task), tasks.get(cfg.model.task)
    if first.model_class != then.model_class or first.model_class is None:
        raise XtrainError(
            f"{path.name} ({then.name}) cannot start from {before.name} ({first.name}): "
            f"it trains {then.model_class or 'a model of its own'}, "
            f"that stage {first.model_class or 'a model of its own'}",
            "start it from a model of its own class, or chain stages that train the same model",
        )


def _check_outputs(stages: list[Stage]) -> None:
    """Each stage writes its own folder: two stages in one would resume into each other."""
    seen: dict[Path, Stage] = {}
    for stage in stages:
        where = stage.output_dir.resolve()
        if where in seen:
            raise XtrainError(
                f"{seen[where].name} and {stage.name} both write to "
                f"run.output_dir {stage.cfg.run.output_dir}",
                "give each stage its own run.output_dir (e.g. runs/sft, runs/dpo, runs/grpo)",
            )
        seen[where] = stage


def stage_state(stage: Stage) -> StageState:
    """Where ``stage`` stands in its output folder (``resume_point``: run.resume's rules, a
    checkpoint of another training refused in one line naming the stage); nothing is loaded."""
    cfg = stage.cfg
    try:
        point = resume_point(cfg.run.output_dir, cfg.run.resume, config_to_dict(cfg))
    except XtrainError as e:
        raise XtrainError(f"{stage.name}: {e.message}", e.hint, e.exit_code) from None
    if point.finished is not None:
        return StageState(finished=True)
    return StageState(resume_step=point.saved.step if point.saved is not None else None)


def check_states(stages: list[Stage], states: list[StageState]) -> None:
    """What a stage holds rests on the stage it follows: while that one is not finished (it
    trains now, from the start or on from a checkpoint), the follower must hold nothing yet (what
    it holds started from an earlier result); once it is finished, a finished follower's record
    names the adapter it holds now (``lineage``). One line naming the stage and its folder."""
    from xtrain.model.start import start_of

    for stage, state in zip(stages, states, strict=True):
        if not stage.follows:
            continue
        before, earlier = stages[stage.number - 2], states[stage.number - 2]
        holds = state.finished or state.resume_step is not None
        stale = holds and not earlier.finished
        if state.finished and earlier.finished:
            mine = start_of(str(stage.output_dir)).lineage
            theirs = start_of(str(before.output_dir)).lineage
            stale = len(mine) < 2 or not theirs or mine[-2] != theirs[-1]
        if stale:
            if earlier.finished:
                what = f"another result of {before.name} than the one it holds now"
            else:
                what = f"an earlier result of {before.name}, which trains on now"
            raise XtrainError(
                f"{stage.name}: {stage.cfg.run.output_dir} holds a training started from {what}",
                f"remove {stage.cfg.run.output_dir}, or give the stage a new run.output_dir, so it starts "
                "from that result",
            )


def planned_start(stages: list[Stage], stage: Stage, done: set[int]) -> tuple[str, str | None]:
    """(start, chat template) to check ``stage`` with: its own start, unless it follows a stage
    not finished yet (``done``: the finished stages' numbers): then the start that stage is
    checked with (recursively: the recipe's first model), with that stage's chat template where
    this one sets none (a stage's result carries the tokenizer it trained with)."""
    template = stage.cfg.data.chat_template
    if not stage.follows or stage.number - 1 in done:
        return stage.cfg.model.name_or_path, template
    start, before = planned_start(stages, stages[stage.number - 2], done)
    return start, template if template is not None else before


def planned_config(stages: list[Stage], stage: Stage, done: set[int]) -> TrainConfig:
    """``stage``'s config as it is checked before the stage it follows has trained
    (``planned_start``): a copy, the start and chat template put in."""
    import copy

    start, template = planned_start(stages, stage, done)
    cfg = copy.deepcopy(stage.cfg)  # the keys the user wrote (schema.given_keys) come along
    cfg.model.name_or_path, cfg.data.chat_template = start, template
    return cfg
