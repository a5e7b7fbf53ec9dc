"""What xtrain needs of bitsandbytes (``model.quantization``, the 8-bit optimizers) and which
native backends an installed build has, told from its file names alone.

bitsandbytes 0.50 ships one native library per backend inside the package folder:
``libbitsandbytes_cpu``, ``libbitsandbytes_cuda126`` (one per CUDA toolkit: cuda118 ... cuda132),
``libbitsandbytes_rocm64``, ``libbitsandbytes_xpu2025``, with ``.so``/``.dll``/``.dylib`` by platform
(``bitsandbytes/consts.py``). At import it loads the CUDA library that matches
``torch.version.cuda``: the same version, else the newest older one of the same major, else the
oldest newer one of the same major, never another major (``cextension.py``,
``get_cuda_bnb_library_path``; ``BNB_CUDA_VERSION`` overrides it). Importing bitsandbytes costs
seconds (it imports torch and loads the library), so the doctor lists the files instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# the lowest bitsandbytes xtrain supports: transformers 5.x's own floor (BITSANDBYTES_MIN_VERSION);
# pyproject.toml's `quantization` extra pins the same
# (tests/test_facts_bitsandbytes.py checks that they agree)
MIN_BITSANDBYTES = "0.46.1"
PACKAGE = "bitsandbytes"
_LIBRARY = re.compile(r"^libbitsandbytes_([a-z]+\d*)\.(?:so|dll|dylib)$")


def library_backends(file_names: Iterable[str]) -> list[str]:
    """The backends of a build from its files' names: ``cpu``, ``cuda126``, ``rocm64``, ...,
    sorted; other files are ignored."""
    found = {m.group(1) for m in (_LIBRARY.match(name) for name in file_names) if m}
    return sorted(found)


def _cuda_version(backend: str) -> tuple[int, int] | None:
    """``cuda126`` -> (12, 6), ``cuda130`` -> (13, 0) (the major is always two digits)."""
    digits = backend.removeprefix("cuda")
    if not backend.startswith("cuda") or len(digits) < 3 or not digits.isdigit():
        return None
    return int(digits[:2]), int(digits[2:])


def cuda_library_for(torch_cuda: str, backends: Iterable[str]) -> str | None:
    """The CUDA backend bitsandbytes loads for a torch built with CUDA ``torch_cuda`` ("12.6"),
    by its own rule (the module docstring); None when it has none of that CUDA major."""
    want = tuple(int(x) for x in re.findall(r"\d+", torch_cuda)[:2])
    if len(want) != 2:
        return None
    same_major = {v: b for b in backends if (v := _cuda_version(b)) is not None and v[0] == want[0]}
    if want in same_major:
        return same_major[want]  # type: ignore[index]
    lower = [v for v in same_major if v < want]
    if lower:
        return same_major[max(lower)]
    return same_major[min(same_major)] if same_major else None
