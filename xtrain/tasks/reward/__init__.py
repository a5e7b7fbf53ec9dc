"""Reward models: ``reward`` (a sequence-classification head on a causal LM, trained on preference
pairs with the Bradley-Terry loss), its rows, loss and forward, and the trained model as a scorer
(``xtrain predict``, GRPO's ``model:PATH`` rewards)."""
