"""The training config, below every layer that reads it: ``schema.py`` (the dataclasses, one a
YAML section), ``values.py`` (one value typed and checked: choices, spellings, ranges),
``foreign.py`` (other trainers' names for xtrain's keys), ``loading.py`` (YAML and ``key=value``
overrides read into a ``TrainConfig``; the dict round-trip). The checks of a whole config against
its task, and so ``load_config``, are ``xtrain.tasks.validation``'s: the task registry sits above."""
