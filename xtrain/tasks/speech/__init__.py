"""``speech-to-text``: the task, its data check, its predict and the parts they share."""
