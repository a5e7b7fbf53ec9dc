"""Preference tuning: ``preference`` (DPO, IPO, ORPO, SimPO, KTO on a causal LM) and
``vision-preference`` (the same with images), their losses, forward and reference, evaluation
and the precomputed reference."""
