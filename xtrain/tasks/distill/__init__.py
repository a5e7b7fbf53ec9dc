"""The distillation family: a student learns from a teacher model's next-token distributions.

- ``distill``: the task (on-policy distillation, GKD), its build, checks and built-in job;
- ``rows``: prompts and the data's answers, encoded once;
- ``teacher``: the teacher loaded frozen (a trained result's adapters too, 4-bit allowed), its
  tokenizer checked against the student's;
- ``losses``: the per-token reverse KL of sampled tokens and the generalized JSD, as pure
  functions, and their sums over the trained tokens in chunks;
- ``step``: the step on the loop's hooks (the completions, the step's token count, the forward);
- ``evaluation``: greedy answers of both, the student's agreement with the teacher, the KL.
"""
