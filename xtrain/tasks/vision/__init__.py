"""Image tasks: ``image-to-text``, ``image-classification`` and ``vision-language`` (with its
data check and processor)."""
