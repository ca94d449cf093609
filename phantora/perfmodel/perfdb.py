"""Adapter for the perfdb tables (Phantora's recorded timings): perfdb op + JSON key -> OpCall.

compute.csv rows are `op,key,nanos` with key `{"<op>": <args>}`; tensors are `{"shape": [...], "dtype": D}`.
memcpy.csv rows are `kind,size_bytes,nanos`. See /work/shared/perfdb/README.md.
"""

from __future__ import annotations

from typing import Any

from phantora.errors import InputError
from phantora.perfmodel.dtypes import normalize_dtype
from phantora.perfmodel.features import OpCall, make_call
from phantora.perfmodel.ops import MEMCPY_KINDS, PERFDB_OPS


def _is_tensor(v: Any) -> bool:
    return isinstance(v, dict) and "shape" in v and "dtype" in v


def _walk(v: Any, tensors: list[dict], scalars: list[Any]) -> None:
    """Collect tensors (depth first, in order) and scalars of a perfdb argument record."""
    if _is_tensor(v):
        tensors.append(v)
    elif isinstance(v, list):
        for x in v:
            _walk(x, tensors, scalars)
    elif isinstance(v, dict):
        for x in v.values():
            _walk(x, tensors, scalars)
    elif v is not None:
        scalars.append(v)


def perfdb_call(op: str, args: Any) -> OpCall:
    """The OpCall a perfdb row measured. Raises InputError (field 'op' or 'key') when it cannot be read."""
    if op not in PERFDB_OPS:
        raise InputError(f"unknown perfdb op {op!r}", field="op")
    aten = PERFDB_OPS[op]
    tensors: list[dict] = []
    scalars: list[Any] = []
    _walk(args, tensors, scalars)
    if not tensors:
        raise InputError(f"perfdb {op} key has no tensors", field="key")
    try:
        shapes = [list(t["shape"]) for t in tensors]
        dtypes = [normalize_dtype(t["dtype"], field="key") for t in tensors]
    except TypeError:
        raise InputError(f"perfdb {op} key has a malformed tensor", field="key") from None
    extra: dict[str, Any] = {}
    if op in ("SDPA", "SDPABackward"):
        extra["causal"] = bool(args.get("causal", False))
    elif op in ("Softmax", "SoftmaxBackward") and scalars:
        extra["dim"] = int(scalars[0])
    elif op == "Dropout":
        p = scalars[0] / 1e6 if scalars else 0.5
        train = bool(scalars[1]) if len(scalars) > 1 else True
        if p == 0 or not train:
            aten = "alias"  # F.dropout returns its input: no kernel
        else:
            extra.update(p=p, train=train)
    elif op == "NativeDropoutBackward" and scalars:
        extra["scale"] = scalars[0] / 1e6
    elif op == "ConvDType":
        if not scalars or not isinstance(scalars[0], str):
            raise InputError("perfdb ConvDType key needs a target dtype", field="key")
        to = normalize_dtype(scalars[0], field="key")
        if to == dtypes[0]:
            aten = "alias"  # .to(same dtype) returns self: no kernel
        else:
            extra["dtype"] = to
    elif op.startswith("Foreach"):
        lists = [x for x in args if isinstance(x, list)] if isinstance(args, list) else []
        extra["list_len"] = len(lists[0]) if lists else len(tensors)
    return make_call(aten, shapes, dtypes, extra)


def memcpy_call(kind: str, size: int) -> OpCall:
    """The OpCall of a memcpy.csv row: a copy of `size` bytes."""
    if kind not in MEMCPY_KINDS:
        raise InputError(f"unknown memcpy kind {kind!r} (known: {', '.join(MEMCPY_KINDS)})", field="kind")
    return make_call(MEMCPY_KINDS[kind], [[size]], ["uint8"])
