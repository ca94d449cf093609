// The metadata of a Python torch.Tensor, read from the C++ tensor behind it, for the compiled per-op path (_fastop.c).
//
// Each of these read through torch's Python bindings is a call (an attribute's getter, a method parsed by torch's
// argument parser, a new Python object for the storage); here it is a field of the TensorImpl. The answers are the
// ones those bindings give: `is_meta`, `requires_grad`, `layout is torch.strided`, `storage_offset()`, whether
// `stride()` equals the strides torch gives a contiguous tensor of the same shape (a dimension of size 0 or 1 counts
// as 1, as tensor._contiguous_strides), and `untyped_storage()`'s `nbytes()` and `_cdata` (its StorageImpl). A tensor
// whose sizes, strides, offset or storage size are symbolic, or that has no storage, is not answered (-1): the caller
// reads it through Python as before. Built and cached like the device guard (simcuda/native.py).
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

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

}  // extern "C"
