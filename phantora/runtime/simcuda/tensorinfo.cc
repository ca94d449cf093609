// The metadata of a Python torch.Tensor, read from the C++ tensor behind it, for the compiled per-op path (_fastop.c).
//
// Each of these read through torch's Python bindings is a call (an attribute's getter, a method parsed by torch's
// argument parser, a new Python object for the storage); here it is a field of the TensorImpl. The answers are the
// ones those bindings give: `is_meta`, `requires_grad`, `layout is torch.strided`, `storage_offset()`, whether
// `stride()` equals the strides torch gives a contiguous tensor of the same shape (a dimension of size 0 or 1 counts
// as 1, as tensor._contiguous_strides), and `untyped_storage()`'s `nbytes()` and `_cdata` (its StorageImpl). A tensor
// whose sizes, strides, offset or storage size are symbolic, or that has no storage, is not answered (-1): the caller
// reads it through Python as before. Built and cached like the device guard (simcuda/native.py).
//
// It also makes the wrapper of an op's output (`phantora_wrap_contiguous`) as `torch.Tensor._make_wrapper_subclass(cls,
// shape, dtype=..., device=cuda:i)` makes it, without parsing those arguments: a TensorImpl with the size-only
// storage torch gives a wrapper subclass (no data, the meta allocator, the storage size of a contiguous tensor of that
// shape and dtype), the dispatch key of a dense cuda tensor, the sizes with contiguous strides and no gradient, then
// the Python object of type `cls` made by torch's own `THPVariable_Wrap(tensor, type)`, then the Python dispatch keys
// that torch adds for a class with __torch_dispatch__ (THPVariable_NewWithVar's `set_python_dispatch(true)`).
#include <ATen/EmptyTensor.h>
#include <Python.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <exception>

extern "C" {

struct phantora_tensor_info {
  int64_t nbytes;          // the storage's size in bytes
  void *storage;           // its StorageImpl (UntypedStorage._cdata)
  int64_t storage_offset;  // in elements
  int is_meta;
  int requires_grad;
  int strided;     // layout is torch.strided
  int contiguous;  // strides are the contiguous ones for the sizes
};

// `obj` must be an instance of torch.Tensor (the caller checks). 0 with `out` filled, or -1 (nothing raised).
int phantora_tensor_info(PyObject *obj, phantora_tensor_info *out) {
  try {
    const at::Tensor &t = THPVariable_Unpack(obj);
    if (!t.defined()) return -1;
    c10::TensorImpl *impl = t.unsafeGetTensorImpl();
    out->strided = impl->layout() == c10::kStrided;
    out->is_meta = impl->is_meta();
    out->requires_grad = impl->requires_grad();
    if (!out->strided || impl->has_symbolic_sizes_strides() || !impl->has_storage()) return -1;
    const c10::Storage &st = impl->storage();
    c10::StorageImpl *si = st.unsafeGetStorageImpl();
    if (!si) return -1;
    out->nbytes = static_cast<int64_t>(si->nbytes());  // throws (caught: -1) if symbolic
    out->storage = si;
    out->storage_offset = impl->storage_offset();
    c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
    int64_t step = 1;
    int contiguous = 1;
    for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; i--) {
      if (strides[i] != step) {
        contiguous = 0;
        break;
      }
      step *= sizes[i] > 1 ? sizes[i] : 1;
    }
    out->contiguous = contiguous;
    return 0;
  } catch (...) {
    return -1;
  }
}

// The wrapper of type `cls` (a tensor subclass with __torch_dispatch__; the caller passes SimCudaTensor) for `elem`,
// on cuda:`index`: its sizes and dtype, contiguous strides, no storage offset, no gradient (the caller checks `elem`
// is such a tensor: tensorinfo's `contiguous`, `strided`, no offset, no requires_grad). A new reference, or NULL with
// an error set.
PyObject *phantora_wrap_contiguous(PyObject *cls, PyObject *elem, int64_t index) {
  try {
    const at::Tensor &e = THPVariable_Unpack(elem);
    c10::TensorImpl *src = e.unsafeGetTensorImpl();
    if (src->has_symbolic_sizes_strides()) {
      PyErr_SetString(PyExc_RuntimeError, "phantora_wrap_contiguous: symbolic sizes");
      return nullptr;
    }
    c10::IntArrayRef sizes = src->sizes();
    const caffe2::TypeMeta dtype = src->dtype();
    const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
    at::Tensor tensor;
    {
      at::AutoDispatchBelowADInplaceOrView guard{};  // as torch's make_tensor_for_subclass_helper
      size_t nbytes = at::detail::computeStorageNbytesContiguous(sizes, dtype.itemsize(), 0);
      c10::Storage storage{c10::Storage::use_byte_size_t{}, static_cast<int64_t>(nbytes),
                           at::DataPtr{nullptr, device}, c10::GetAllocator(c10::kMeta), /*resizable=*/true};
      const auto keys = c10::DispatchKeySet(c10::TensorOptions().dtype(dtype).device(device).computeDispatchKey());
      tensor = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, dtype);
      tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
    }
    PyObject *obj = THPVariable_Wrap(tensor, reinterpret_cast<PyTypeObject *>(cls));
    if (obj) tensor.unsafeGetTensorImpl()->set_python_dispatch(true);  // what torch does for a __torch_dispatch__ class
    return obj;
  } catch (python_error &err) {
    err.restore();
    return nullptr;
  } catch (const std::exception &err) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  } catch (...) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "phantora_wrap_contiguous failed");
    return nullptr;
  }
}

}  // extern "C"
