"""Tools for examples/grpo-tools.yaml: plain Python functions an episode may call (docs/grpo.md,
"Agents"). xtrain reads each one's JSON schema from its type hints and docstring (one ``Args:``
line per argument, transformers' ``get_json_schema``), runs a call in a thread of the training
process with a time limit (``grpo.tool_timeout``) and gives the model what it returns: text as it
is, anything else as JSON. An exception becomes the call's result (``error: ValueError: ...``),
as an agent would see it. Keep tools deterministic: then 1 and 2 processes, and a resumed run,
train on the same episodes."""


def square(n: int) -> int:
    """The square of a whole number.

    Args:
        n: the number to square
    """
    return n**2


def cube(n: int) -> int:
    """The cube of a whole number.

    Args:
        n: the number to cube
    """
    return n**3
