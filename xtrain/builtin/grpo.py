"""``builtin:tiny-llama-grpo``'s purpose: the GRPO quickstart's start and its reward.

``builtin:tiny-llama-grpo`` is the tiny llama after a short SFT by xtrain's own SFT stage
(``jobs/sft-tiny-llama-grpo.yaml``, on ``builtin:preference-sft-curt``: the built-in preference
prompts answered in the whole-sentence style a fifth of the time, else curtly): greedy decoding
starts curt (the quickstart's regex reward, a whole sentence, near 0), while sampling still draws
whole sentences now and then: the signal GRPO's group-relative advantages learn from. The
quickstart's rows are ``builtin:preference-pairs`` (its ``prompt`` column; the other columns go
to the reward functions unused).
"""

from __future__ import annotations

# the quickstart's reward (grpo.format_pattern): a whole sentence naming who, as the friendly
# answers of builtin:preference-pairs are; the curt ones ("park. no idea.") do not match
FORMAT_PATTERN = r"[a-z]+ (played with|found) .+, and .+\."
