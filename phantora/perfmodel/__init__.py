"""Calibrated GPU compute model: op classes, features, efficiency curves, measured tables, fitting.

Entry points:
- `predict_ns(op, shapes, dtypes, gpu, extra=None) -> int`: GPU time of one aten op (shipped curves);
- `ComputeModel(gpu, curves=None, table=None)`: the same with your curves and a measured table;
- `compute_features(make_call(op, shapes, dtypes, extra)) -> OpFeatures`: class, FLOPs, bytes;
- `read_table`, `write_table`, `TimingTable`: measured tables (phantora's CSV and perfdb's);
- `split_rows`, `fit_curves`, `predict_rows`, `class_errors`: calibration and its honest error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phantora.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from phantora.perfmodel.curves import Curves
    from phantora.perfmodel.evaluate import class_errors, predict_rows
    from phantora.perfmodel.features import OpCall, OpFeatures, compute_features, make_call
    from phantora.perfmodel.fit import fit_curves, split_rows
    from phantora.perfmodel.gpus import GPUS, GpuSpec, get_gpu
    from phantora.perfmodel.model import ComputeModel, load_curves, predict_ns, save_curves
    from phantora.perfmodel.ops import op_class
    from phantora.perfmodel.table import MeasuredRow, TimingTable, read_table, write_table

# The names above load on first use, so importing one submodule (phantora.perfmodel.throttle, which `netsim`
# needs) does not import numpy and the fitting code with it.
_SOURCE = {
    "Curves": "curves",
    "class_errors": "evaluate",
    "predict_rows": "evaluate",
    "OpCall": "features",
    "OpFeatures": "features",
    "compute_features": "features",
    "make_call": "features",
    "fit_curves": "fit",
    "split_rows": "fit",
    "GPUS": "gpus",
    "GpuSpec": "gpus",
    "get_gpu": "gpus",
    "ComputeModel": "model",
    "load_curves": "model",
    "predict_ns": "model",
    "save_curves": "model",
    "op_class": "ops",
    "MeasuredRow": "table",
    "TimingTable": "table",
    "read_table": "table",
    "write_table": "table",
}


__getattr__ = lazy_getattr(__name__, _SOURCE)


__all__ = [
    "GPUS",
    "ComputeModel",
    "Curves",
    "GpuSpec",
    "MeasuredRow",
    "OpCall",
    "OpFeatures",
    "TimingTable",
    "class_errors",
    "compute_features",
    "fit_curves",
    "get_gpu",
    "load_curves",
    "make_call",
    "op_class",
    "predict_ns",
    "predict_rows",
    "read_table",
    "save_curves",
    "split_rows",
    "write_table",
]
