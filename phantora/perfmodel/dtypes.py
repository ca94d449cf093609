"""Canonical dtype names, their sizes, aliases (PyTorch, perfdb, short forms) and type promotion."""

from __future__ import annotations

from phantora.errors import InputError

# canonical name -> (bytes per element, promotion category: 0 bool, 1 integer, 2 floating, 3 complex)
DTYPES: dict[str, tuple[int, int]] = {
    "bool": (1, 0),
    "uint8": (1, 1),
    "int8": (1, 1),
    "int16": (2, 1),
    "int32": (4, 1),
    "int64": (8, 1),
    "uint16": (2, 1),
    "uint32": (4, 1),
    "uint64": (8, 1),
    "float8_e4m3fn": (1, 2),
    "float8_e5m2": (1, 2),
    "float16": (2, 2),
    "bfloat16": (2, 2),
    "float32": (4, 2),
    "float64": (8, 2),
    "complex64": (8, 3),
    "complex128": (16, 3),
}

_ALIASES = {
    # perfdb (c10 ScalarType names)
    "bool": "bool",
    "byte": "uint8",
    "char": "int8",
    "short": "int16",
    "int": "int32",
    "long": "int64",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "complexfloat": "complex64",
    "complexdouble": "complex128",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    # short forms used across phantora
    "fp8": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "fp16": "float16",
    "bf16": "bfloat16",
    "tf32": "float32",
    "fp32": "float32",
    "fp64": "float64",
    "i64": "int64",
    "i32": "int32",
    "u8": "uint8",
}


def normalize_dtype(name: str, *, field: str = "dtype") -> str:
    """'BFloat16', 'torch.bfloat16', 'bf16' -> 'bfloat16'. Raises InputError for unknown names."""
    key = str(name).strip().lower().removeprefix("torch.")
    if key in DTYPES:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise InputError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})", field=field)


def dtype_bytes(name: str) -> int:
    """Bytes per element of a canonical dtype."""
    return DTYPES[name][0]


# The short names of collectives and the wire (bridge messages, workload files): canonical -> short.
_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "float8_e4m3fn": "fp8"}
_SHORT["float8_e5m2"] = "fp8"
COLLECTIVE_DTYPES = ("fp8", "int8", "uint8", "bool", "bf16", "fp16", "int16", "fp32", "int32", "fp64", "int64")


def short_dtype(name: object) -> str:
    """The collective dtype name of a dtype in any spelling ('torch.bfloat16', 'BFloat16', 'float' ...).

    fp8 variants are 'fp8'; a dtype collectives do not know (complex, wide unsigned) counts as bytes:
    'uint8'.
    """
    if "float8" in str(name).lower():  # every fp8 variant (e4m3fn, e5m2, the fnuz ones)
        return "fp8"
    try:
        canon = normalize_dtype(str(name))
    except InputError:
        return "uint8"
    short = _SHORT.get(canon, canon)
    return short if short in COLLECTIVE_DTYPES else "uint8"


def promote(dtypes: list[str], ndims: list[int]) -> str:
    """Result dtype of an elementwise op, following PyTorch's rules closely enough for byte counts.

    Dimensioned tensors decide the result; 0-dim tensors only count when they are of a higher
    category (e.g. an int tensor times a float scalar gives the default float, float32).
    """
    if not dtypes:
        return "float32"
    dims = [d for d, n in zip(dtypes, ndims, strict=True) if n > 0] or list(dtypes)
    best = _promote_group(dims)
    zero = [d for d, n in zip(dtypes, ndims, strict=True) if n == 0]
    if zero:
        top = _promote_group(zero)
        if DTYPES[top][1] > DTYPES[best][1]:
            best = {2: "float32", 3: "complex64"}.get(DTYPES[top][1], top)
    return best


def _promote_group(group: list[str]) -> str:
    best = group[0]
    for d in group[1:]:
        cb, cd = DTYPES[best][1], DTYPES[d][1]
        if cd > cb or (cd == cb and DTYPES[d][0] > DTYPES[best][0]):
            best = d
        elif cd == cb and DTYPES[d][0] == DTYPES[best][0] and d != best:
            best = {2: "float32", 1: "int32"}.get(cd, best)  # bf16 with fp16 -> fp32
    return best
