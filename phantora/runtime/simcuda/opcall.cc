// Runs an aten op for the compiled per-op path (_fastop.c) as `OpOverload._op(*args, **kwargs)` runs it, without
// torch's Python binding of the operator in between.
//
// That binding (torch/csrc/jit/python/init.cpp's `_get_operation_overload`, then pybind_utils'
// `_get_operation_for_overload_or_packet` and `invokeOperatorFromPython`) does, per call: collect the arguments that
// override `__torch_function__` and hand the call to them or to an active torch function mode; otherwise build the
// operator's argument stack from the Python arguments against its schema (numbers accepted for tensors where the op
// allows it: `ToIValueAllowNumbersAsTensors`), release the GIL, run the operator (a dispatcher operator's boxed call)
// and convert the stack back to Python (one value, a tuple, or None). Here the operator's handle is looked up in the
// dispatcher once per OpOverload and kept; the stack is built and converted by the same torch functions (built here
// when it holds only plain tensors and defaults: what those functions build) and errors are raised as torch's
// bindings raise them. A call this does not take (nothing raised, the caller calls `_op`):
// an op the dispatcher does not hold (a JIT-only operator), an active torch function mode, or an argument that could
// override `__torch_function__` (anything but a plain torch.Tensor, None, a bool, int, float, complex, str, dtype,
// device, layout, memory format, or a list or tuple of numbers).
//
// An op whose schema is one of three common forms, `(Tensor) -> Tensor`, `(Tensor, Tensor) -> Tensor` and
// `(Tensor, Tensor, *, Scalar alpha=<default>) -> Tensor` (nothing written in place: add, sub, mul, div, mm, bmm, the
// unary pointwise ops, t ...), called with its plain strided tensors only, is called typed (`TypedOperatorHandle::call`,
// what `at::_ops::X::call` does) rather than boxed: the dispatcher picks the same kernels from the same dispatch keys,
// without putting the arguments on a stack and taking them off it for each unboxed kernel; the result is converted by
// `createPyObjectForStack` as the boxed call's is.
#include <ATen/core/dispatch/Dispatcher.h>
#include <Python.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/python_arg_parser.h>

#include <optional>
#include <string>
#include <unordered_map>

namespace {

using Unary = at::Tensor(const at::Tensor &);
using Binary = at::Tensor(const at::Tensor &, const at::Tensor &);
using BinaryAlpha = at::Tensor(const at::Tensor &, const at::Tensor &, const c10::Scalar &);

struct Op {
  std::optional<c10::OperatorHandle> handle;  // none: not a dispatcher operator, every call goes to `_op`
  bool numbers_as_tensors = false;            // as `opAllowsNumbersAsTensors` of the op's symbol
  long calls = 0;                             // calls taken here
  // the typed handle of the op's form, if it has one of the three (at most one is set)
  std::optional<c10::TypedOperatorHandle<Unary>> unary;
  std::optional<c10::TypedOperatorHandle<Binary>> binary;
  std::optional<c10::TypedOperatorHandle<BinaryAlpha>> binary_alpha;
  c10::Scalar alpha;  // binary_alpha's default
  long typed_calls = 0;
};

std::unordered_map<PyObject *, Op> ops;  // by OpOverload (kept alive: a reference is held, so the key is not reused)

bool plain_scalar(PyObject *x) {
  return x == Py_None || PyBool_Check(x) || PyLong_CheckExact(x) || PyFloat_CheckExact(x) ||
         PyComplex_CheckExact(x) || PyUnicode_CheckExact(x);
}

// Whether `x` cannot override __torch_function__ (an exact type that does not define it).
bool plain(PyObject *x) {
  if (plain_scalar(x) || Py_TYPE(x) == reinterpret_cast<PyTypeObject *>(THPVariableClass)) return true;
  PyTypeObject *t = Py_TYPE(x);
  if (t == &THPDtypeType || t == &THPDeviceType || t == &THPLayoutType || t == &THPMemoryFormatType) return true;
  if (PyTuple_CheckExact(x) || PyList_CheckExact(x)) {
    PyObject *seq = x;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++)
      if (!plain_scalar(items[i])) return false;
    return true;
  }
  return false;
}

// A tensor argument of a typed form: a Tensor (not optional, not a list), positional, not written in place.
bool tensor_param(const c10::Argument &a) {
  return a.real_type()->kind() == c10::TypeKind::TensorType && !a.kwarg_only() &&
         !(a.alias_info() && a.alias_info()->isWrite());
}

// The typed handle of `op`'s form, if its schema has one of the three; none otherwise (or if the dispatcher's own
// check of the C++ signature refuses it).
void find_form(Op &op) {
  const c10::FunctionSchema &s = op.handle->schema();
  if (s.is_mutable() || s.is_vararg() || s.is_varret() || s.returns().size() != 1) return;
  const c10::Argument &r = s.returns()[0];
  if (r.real_type()->kind() != c10::TypeKind::TensorType || (r.alias_info() && r.alias_info()->isWrite())) return;
  const std::vector<c10::Argument> &a = s.arguments();
  try {
    if (a.size() == 1 && tensor_param(a[0])) {
      op.unary = op.handle->typed<Unary>();
    } else if (a.size() == 2 && tensor_param(a[0]) && tensor_param(a[1])) {
      op.binary = op.handle->typed<Binary>();
    } else if (a.size() == 3 && tensor_param(a[0]) && tensor_param(a[1]) &&
               a[2].real_type()->kind() == c10::TypeKind::NumberType && a[2].kwarg_only() && a[2].default_value() &&
               a[2].default_value()->isScalar()) {
      op.alpha = a[2].default_value()->toScalar();
      op.binary_alpha = op.handle->typed<BinaryAlpha>();
    }
  } catch (...) {  // another C++ signature than the schema's codegen gives: boxed
    op.unary.reset();
    op.binary.reset();
    op.binary_alpha.reset();
  }
}

// The entry of `func` (an OpOverload), found in the dispatcher on its first call. NULL with an error set.
Op *lookup(PyObject *func) {
  auto it = ops.find(func);
  if (it != ops.end()) return &it->second;
  Op op;
  PyObject *schema = PyObject_GetAttrString(func, "_schema");
  PyObject *name = schema ? PyObject_GetAttrString(schema, "name") : nullptr;
  PyObject *overload = name ? PyObject_GetAttrString(schema, "overload_name") : nullptr;
  const char *n = name ? PyUnicode_AsUTF8(name) : nullptr;
  const char *o = n && overload ? PyUnicode_AsUTF8(overload) : nullptr;
  if (o) {
    op.handle = c10::Dispatcher::singleton().findSchema({n, o});
    if (op.handle) find_form(op);
    const c10::Symbol symbol = c10::Symbol::fromQualString(n);
    op.numbers_as_tensors = symbol.is_prims() || symbol.is_nvprims() ||
                            (symbol.is_aten() && torch::should_allow_numbers_as_tensors(symbol.toUnqualString()));
  }
  Py_XDECREF(schema);
  Py_XDECREF(name);
  Py_XDECREF(overload);
  if (!o) return nullptr;
  Py_INCREF(func);
  return &ops.emplace(func, std::move(op)).first->second;
}

// The stack createStackForSchema builds when every argument is positional and a plain tensor where the schema takes a
// Tensor, the rest left to their defaults: torch's conversion of such a tensor is the tensor itself (a sparse one
// may be warned about there: left to it). False: build it with createStackForSchema.
bool tensor_stack(const c10::FunctionSchema &schema, PyObject *args, torch::jit::Stack &stack) {
  const std::vector<c10::Argument> &params = schema.arguments();
  const size_t n = static_cast<size_t>(PyTuple_GET_SIZE(args));
  if (n > params.size()) return false;
  for (size_t i = 0; i < params.size(); i++) {
    const c10::Argument &param = params[i];
    if (i >= n) {
      if (!param.default_value()) return false;
      continue;
    }
    PyObject *x = PyTuple_GET_ITEM(args, i);
    if (param.kwarg_only() || Py_TYPE(x) != reinterpret_cast<PyTypeObject *>(THPVariableClass) ||
        param.real_type()->kind() != c10::TypeKind::TensorType)
      return false;
    const at::Tensor &t = THPVariable_Unpack(x);
    if (t.layout() != c10::kStrided) return false;
  }
  stack.reserve(params.size());
  for (size_t i = 0; i < n; i++) stack.emplace_back(THPVariable_Unpack(PyTuple_GET_ITEM(args, i)));
  for (size_t i = n; i < params.size(); i++) stack.push_back(*params[i].default_value());
  return true;
}

// The call's tensors if it is one of `op`'s typed form's (its plain strided tensors, positional, nothing else).
bool typed_args(const Op &op, PyObject *args, const at::Tensor *(&t)[2]) {
  const Py_ssize_t want = op.unary ? 1 : (op.binary || op.binary_alpha) ? 2 : 0;
  if (!want || PyTuple_GET_SIZE(args) != want) return false;
  for (Py_ssize_t i = 0; i < want; i++) {
    PyObject *x = PyTuple_GET_ITEM(args, i);
    if (Py_TYPE(x) != reinterpret_cast<PyTypeObject *>(THPVariableClass)) return false;
    t[i] = &THPVariable_Unpack(x);
    if (t[i]->layout() != c10::kStrided) return false;
  }
  return true;
}

struct ReleaseGil {  // as pybind11::gil_scoped_release, which invokeOperatorFromPython holds around the op
  PyThreadState *state = PyEval_SaveThread();
  ~ReleaseGil() { PyEval_RestoreThread(state); }
};

}  // namespace

extern "C" {

// `func(*args, **kwargs)` as `func._op` runs it: 1 with `*out` its result (a new reference) or NULL with the error
// torch raises; 0 if not taken here (nothing raised). `args` a tuple, `kwargs` a dict or NULL.
int phantora_call_op(PyObject *func, PyObject *args, PyObject *kwargs, PyObject **out) {
  *out = nullptr;
  if (at::impl::torch_function_mode_enabled()) return 0;
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  for (Py_ssize_t i = 0; i < n; i++)
    if (!plain(PyTuple_GET_ITEM(args, i))) return 0;
  if (kwargs) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(kwargs, &pos, &k, &v))
      if (!plain(v)) return 0;
  }
  Op *op = nullptr;
  try {
    op = lookup(func);
  } catch (...) {  // a name the dispatcher's symbols refuse: left to `_op`
  }
  if (!op) PyErr_Clear();
  if (!op || !op->handle) return 0;
  op->calls++;
  try {
    const bool keywords = kwargs && PyDict_GET_SIZE(kwargs) > 0;  // an empty dict: none
    const at::Tensor *t[2] = {nullptr, nullptr};
    if (!keywords && typed_args(*op, args, t)) {
      op->typed_calls++;
      at::Tensor result;
      {
        ReleaseGil released;
        if (op->unary) result = op->unary->call(*t[0]);
        else if (op->binary) result = op->binary->call(*t[0], *t[1]);
        else result = op->binary_alpha->call(*t[0], *t[1], op->alpha);
      }
      torch::jit::Stack stack;
      stack.emplace_back(std::move(result));
      *out = torch::jit::createPyObjectForStack(std::move(stack)).release().ptr();
      return 1;
    }
    torch::jit::ToIValueAllowNumbersAsTensors numbers(op->numbers_as_tensors);
    torch::jit::Stack stack;
    if (keywords || !tensor_stack(op->handle->schema(), args, stack)) {
      const py::kwargs kw = kwargs ? py::reinterpret_borrow<py::kwargs>(kwargs) : py::kwargs();
      stack = torch::jit::createStackForSchema(
          op->handle->schema(), torch::jit::tuple_slice(py::reinterpret_borrow<py::tuple>(args)), kw, std::nullopt);
    }
    {
      ReleaseGil released;
      op->handle->callBoxed(stack);
    }
    *out = torch::jit::createPyObjectForStack(std::move(stack)).release().ptr();
  } catch (...) {  // as torch's Python bindings translate it
    torch::translate_exception_to_python(std::current_exception());
  }
  return 1;
}

// How many calls of `func` this took (0 for an op it never saw or does not take).
long phantora_op_calls(PyObject *func) {
  auto it = ops.find(func);
  return it == ops.end() ? 0 : it->second.calls;
}

// How many of those were typed calls.
long phantora_typed_calls(PyObject *func) {
  auto it = ops.find(func);
  return it == ops.end() ? 0 : it->second.typed_calls;
}

}  // extern "C"
