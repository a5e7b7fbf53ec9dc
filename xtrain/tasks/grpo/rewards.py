"""GRPO's reward functions: the built-ins and the user's own, found, checked and called.

A reward function has TRL's signature: ``f(prompts, completions, **columns) -> list[float | None]``
(one number per completion; None: no reward from this function for that completion), called with
the prompts and completions as lists (text, or turns for conversational rows: TRL's shapes) and
every other column of the rows as a keyword list, so a TRL reward function works unchanged.

``grpo.rewards`` names them: a built-in (``exact_match``, ``format``, ``length``), or the user's
``path/to/rewards.py:function`` (a path from the config file's folder, as data files are, else from
the current folder) or ``package.module:function``. Their metrics are named by function, as TRL
names them (``rewards/correct_number``; ``label``).
They are imported when the config is checked (``resolve``, before any model loads, in every
process): a missing file or function, a non-callable or a signature that cannot take
``(prompts=, completions=)`` is one line, exit 2, at ``xtrain train --dry-run``. A function that
raises, returns the wrong number of rewards or a NaN in training is one line naming the function,
the step and the row (``call``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.config.loading import MODEL_REWARD
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from xtrain.config.schema import GrpoConfig

RewardFn = Callable[..., Sequence[float | None]]
BUILTINS = ("exact_match", "format", "length", "tool_call")
HINT = (
    "grpo.rewards takes exact_match, format, length, tool_call, path/to/file.py:function, "
    "package.module:function or model:PATH (a reward model's run)"
)


class RewardError(XtrainError):
    """A reward function that failed in training (one line: function, step, row)."""


@dataclass(frozen=True)
class Reward:
    name: str  # as grpo.rewards names it (its one-line errors say it)
    fn: RewardFn
    weight: float
    label: str = ""  # its metrics' name: the function's (``labels``)

    @property
    def metric(self) -> str:
        return self.label or self.name


def completion_text(completion: Any) -> str:
    """A completion's text: itself, or the content of its (last) assistant turn."""
    if isinstance(completion, list):
        return str(completion[-1].get("content", "")) if completion else ""
    return str(completion)


def exact_match(column: str, pattern: str | None) -> RewardFn:
    """1.0 when the completion (its stripped text, or ``pattern``'s first group found in it) equals
    the row's ``column``, else 0.0."""
    compiled = re.compile(pattern) if pattern else None

    def reward(prompts: list[Any], completions: list[Any], **columns: list[Any]) -> list[float]:
        if column not in columns:
            raise KeyError(f"exact_match reads column '{column}' (grpo.answer_column), the rows have none")
        out = []
        for completion, answer in zip(completions, columns[column], strict=True):
            text = completion_text(completion)
            if compiled is not None:
                found = compiled.search(text)
                text = (found.group(1) if found.groups() else found.group(0)) if found else ""
            out.append(1.0 if text.strip() == str(answer).strip() else 0.0)
        return out

    return reward


def format_match(pattern: str) -> RewardFn:
    """1.0 when the whole completion matches ``pattern`` (a regex; DOTALL), else 0.0."""
    compiled = re.compile(pattern, re.DOTALL)

    def reward(prompts: list[Any], completions: list[Any], **columns: list[Any]) -> list[float]:
        return [1.0 if compiled.fullmatch(completion_text(c).strip()) else 0.0 for c in completions]

    return reward


def length_penalty(target: int) -> RewardFn:
    """0 up to ``target`` characters, then minus the excess over ``target`` (at most -1)."""

    def reward(prompts: list[Any], completions: list[Any], **columns: list[Any]) -> list[float]:
        return [-min(1.0, max(0, len(completion_text(c)) - target) / target) for c in completions]

    return reward


def tool_call(schemas: list[dict[str, Any]]) -> RewardFn:
    """1.0 for an episode that called tools and named a declared one with a JSON object of its
    arguments in every call (the required ones, none it does not declare), else 0.0."""
    declared = {s["function"]["name"]: s["function"].get("parameters") or {} for s in schemas}

    def valid(call: dict[str, Any]) -> bool:
        params, args = declared.get(call.get("name")), call.get("arguments")
        if params is None or not isinstance(args, dict):
            return False
        known = params.get("properties")
        return set(params.get("required") or ()) <= set(args) and (known is None or set(args) <= set(known))

    def reward(prompts: list[Any], completions: list[Any], **columns: list[Any]) -> list[float]:
        if "tool_calls" not in columns:
            raise KeyError("tool_call reads the episodes' tool calls: set grpo.tools")
        return [1.0 if calls and all(valid(c) for c in calls) else 0.0 for calls in columns["tool_calls"]]

    return reward


@dataclass
class ModelReward:
    """``grpo.rewards: model:PATH``: each completion scored by the reward run at ``path`` after its
    prompt, rendered as that model trained (``xtrain.tasks.reward.scoring``: the scorer ``xtrain
    predict`` runs too). Checked when the config is (the run's files alone: a folder that is not a
    reward run is one line); loaded on first use on the device ``place`` names (the run's), frozen."""

    path: str
    device: str = "cpu"
    scorer: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from xtrain.tasks.reward.scoring import reward_start

        reward_start(self.path, f"grpo.rewards: {MODEL_REWARD}{self.path}")

    def place(self, device: str) -> None:
        self.device = device

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        from xtrain.tasks.reward import scoring

        if self.scorer is None:
            self.scorer = scoring.load(self.path, self.device, f"grpo.rewards: {MODEL_REWARD}{self.path}")
        items = [(p, completion_text(c)) for p, c in zip(prompts, completions, strict=True)]
        return self.scorer.scores(items, "completion")


@cache
def _module_of(file: str) -> Any:
    """The module of a Python file (its resolved path), imported once per process: a file that
    holds reward functions and tools is one module."""
    name = f"xtrain_functions_{abs(hash(file))}"
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling and dataclasses inside it find their module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load_file(path: str, key: str = "grpo.rewards", what: str = "reward") -> Any:
    file = Path(path).expanduser()
    if not file.is_file():
        raise XtrainError(
            f"{key}: {what} file {path} not found",
            "give a path from the config file's folder or from the current folder",
        )
    try:
        return _module_of(str(file.resolve()))
    except Exception as e:
        raise XtrainError(f"{key}: importing {path} failed: {type(e).__name__}: {e}") from None


def _load_module(name: str, key: str, hint: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as e:
        raise XtrainError(f"{key}: module {name} cannot be imported: {type(e).__name__}: {e}", hint) from None


def find_function(
    spec: str, key: str = "grpo.rewards", hint: str = HINT, what: str = "reward"
) -> Callable[..., Any]:
    """``file.py:function`` or ``module:function`` -> the callable (one line naming ``key`` when
    there is none): the user's reward functions and tools (``what``) alike."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise XtrainError(f"{key}: unknown {what} function '{spec}'", hint)
    module = _load_file(where, key, what) if where.endswith(".py") else _load_module(where, key, hint)
    fn = getattr(module, attr, None)
    if fn is None:
        raise XtrainError(f"{key}: {where} has no function '{attr}'", hint)
    if not callable(fn):
        raise XtrainError(f"{key}: {spec} is a {type(fn).__name__}, not a function")
    return fn


def load_user(spec: str) -> RewardFn:
    """A reward function by its spec, found (``find_function``) and its signature checked."""
    fn = find_function(spec)
    try:
        inspect.signature(fn).bind_partial(prompts=[], completions=[])
    except TypeError:
        raise XtrainError(
            f"grpo.rewards: {spec} cannot take prompts= and completions= as keywords",
            "give it TRL's signature: def f(prompts, completions, **kwargs) -> list[float]",
        ) from None
    except ValueError:  # a builtin without a signature: it is called as it is
        pass
    return fn


def named_weights(g: GrpoConfig) -> list[tuple[str, float]]:
    """``grpo.rewards`` (one name or a list) with ``grpo.reward_weights`` (one number, a list, or
    None: 1 each), one pair per function; a count that differs is one line."""
    names = [g.rewards] if isinstance(g.rewards, str) else list(g.rewards)
    if not names:
        raise XtrainError("grpo.rewards is empty: GRPO needs at least one reward function", HINT)
    given = g.reward_weights
    weights = [1.0] * len(names) if given is None else [given] if isinstance(given, (int, float)) else given
    if len(weights) != len(names):
        raise XtrainError(
            f"grpo.reward_weights has {len(weights)} numbers for {len(names)} reward functions",
            "give one weight per entry of grpo.rewards, in the same order",
        )
    return [(n, float(w)) for n, w in zip(names, weights, strict=True)]


def labels(names: list[str]) -> list[str]:
    """The metric name of each ``grpo.rewards`` entry: a built-in's own, a user function's name
    (``path/to/rewards.py:correct_number`` -> ``correct_number``, TRL's); a name two entries share
    keeps its file's or module's name in front (``rewards.score``, ``other.score``)."""
    short = [_model_label(n) if n.startswith(MODEL_REWARD) else n.rpartition(":")[2] for n in names]
    twice = {s for s in short if short.count(s) > 1}

    def whole(name: str) -> str:
        if name.startswith(MODEL_REWARD):  # two reward models of one name: their paths
            return name
        where, _, attr = name.rpartition(":")
        return f"{Path(where).stem if where.endswith('.py') else where}.{attr}"

    return [whole(n) if s in twice and ":" in n else s for n, s in zip(names, short, strict=True)]


def _model_label(name: str) -> str:
    """A reward model's metric name: its run folder's name (``model:runs/rm`` -> ``rm``)."""
    folder = Path(name[len(MODEL_REWARD) :]).expanduser()
    return (folder.parent if folder.name in ("adapter", "best", "model") else folder).resolve().name


def resolve(g: GrpoConfig, tools: list[dict[str, Any]] | None = None) -> list[Reward]:
    """``grpo.rewards`` with their weights, each found and checked; ``tools``: the schemas of
    ``grpo.tools`` (the ``tool_call`` reward's)."""
    out = []
    pairs = named_weights(g)
    tags = labels([n for n, _ in pairs])
    for (name, weight), label in zip(pairs, tags, strict=True):
        if name == "exact_match":
            fn = exact_match(g.answer_column, g.answer_pattern)
        elif name == "format":
            if not g.format_pattern:
                raise XtrainError("grpo.rewards: format needs grpo.format_pattern (a regex)")
            fn = format_match(g.format_pattern)
        elif name == "length":
            fn = length_penalty(g.length_target)
        elif name == "tool_call":
            if not tools:
                raise XtrainError("grpo.rewards: tool_call scores the calls of episodes: it needs grpo.tools")
            fn = tool_call(tools)
        elif name.startswith(MODEL_REWARD):  # a reward model's run (its files checked, loaded on use)
            fn = ModelReward(name[len(MODEL_REWARD) :])
        else:
            fn = load_user(name)
        out.append(Reward(name, fn, float(weight), label))
    return out


def place(rewards: list[Reward], device: str) -> None:
    """Reward functions that hold a model (``model:PATH``) compute on the run's ``device``."""
    for r in rewards:
        if callable(getattr(r.fn, "place", None)):
            r.fn.place(device)


def _accepted(fn: RewardFn, columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The columns ``fn`` takes: all with ``**kwargs``, else the ones it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except ValueError:
        return columns
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return columns
    named = {p.name for p in params}
    return {k: v for k, v in columns.items() if k in named}


def call(
    reward: Reward,
    prompts: list[Any],
    completions: list[Any],
    columns: dict[str, list[Any]],
    step: int,
    rows: list[int],
) -> list[float]:
    """``reward`` on a batch -> one float per completion (None: NaN); its failures one line naming
    the function, the ``step`` and the data row (``rows``: the data set's row of each completion)."""
    where = f"reward function {reward.name} at step {step}"
    try:
        values = list(reward.fn(prompts=prompts, completions=completions, **_accepted(reward.fn, columns)))
    except Exception as e:
        raise RewardError(
            f"{where} raised {type(e).__name__}: {e} (on the completions of rows {sorted(set(rows))})",
            "fix the function; the run resumes from its last checkpoint with the same command",
        ) from None
    if len(values) != len(completions):
        raise RewardError(
            f"{where} returned {len(values)} rewards for {len(completions)} completions "
            f"(rows {sorted(set(rows))})",
            "return one float (or None) per completion",
        )
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(math.nan)
            continue
        try:
            number = float(v)
        except (TypeError, ValueError):
            number = math.nan
            v = f"{v!r} (not a number)"
        if not math.isfinite(number):
            raise RewardError(
                f"{where} returned {v} for row {rows[i]} (completion {i} of the batch)",
                "return a finite float, or None for no reward",
            )
        out.append(number)
    return out
