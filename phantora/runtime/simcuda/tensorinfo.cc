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
//
// And it tells the memory tracker when a storage it counted dies (`phantora_hook_storage`), without the storage's
// Python object and a weak reference on it: the storage's DataPtr is replaced by one with the same data and device
// whose context holds the original DataPtr and a weak reference to the StorageImpl. A DataPtr is destroyed when its
// storage dies (StorageImpl::release_resources, or its destructor) or when the storage's data is replaced
// (set_data_ptr_noswap: a CPU resize_, share_memory_, ...). The deleter tells them apart by the StorageImpl's strong
// count (0: it died): a death calls the tracker's free callback with the entry; a replacement is no free (a resize is
// counted as one when an op's output shows it), so the entry is handed to the tracker's `lost` callback with the
// storage's Python object, which counts it from then on by a weak reference on that object as before. A storage whose
// DataPtr is copy-on-write (its deleter is read by torch) or guarded (data access throws) is not hooked (-1).
#include <ATen/EmptyTensor.h>
#include <Python.h>
#include <c10/core/impl/COW.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Storage.h>
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

namespace {

// The context of a hooked storage's DataPtr.
struct StorageHook {
  at::DataPtr inner;                                   // the storage's own DataPtr (its data's deleter)
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // alive: the DataPtr was replaced, not the storage freed
  PyObject *entry;                                     // the tracker's entry (new references, all three)
  PyObject *on_free;                                   // on_free(entry): the storage died
  PyObject *on_lost;                                   // on_lost(entry, storage): its data was replaced
};

void call_or_report(PyObject *fn, PyObject *a, PyObject *b) {
  PyObject *r = b ? PyObject_CallFunctionObjArgs(fn, a, b, nullptr) : PyObject_CallOneArg(fn, a);
  if (r) Py_DECREF(r);
  else PyErr_WriteUnraisable(fn);  // as a weak reference's callback that raises
}

void storage_hook_deleter(void *ctx) {
  auto *hook = static_cast<StorageHook *>(ctx);
  if (Py_IsInitialized() && !_Py_IsFinalizing()) {
    // most storages die on the Python thread, holding the GIL; elsewhere (the autograd engine, an op run with the GIL
    // released) it is taken here
    PyThreadState *mine = PyGILState_GetThisThreadState();
    const bool held = mine != nullptr && mine == _PyThreadState_UncheckedGet();
    PyGILState_STATE gil = held ? PyGILState_UNLOCKED : PyGILState_Ensure();
    PyObject *saved_type, *saved_value, *saved_tb;  // an error being raised (an op that failed) stays raised
    PyErr_Fetch(&saved_type, &saved_value, &saved_tb);
    if (hook->storage.expired()) {
      call_or_report(hook->on_free, hook->entry, nullptr);
    } else {
      c10::intrusive_ptr<c10::StorageImpl> alive = hook->storage.lock();
      PyObject *st = alive ? THPStorage_Wrap(c10::Storage(std::move(alive))) : nullptr;
      if (st) {
        call_or_report(hook->on_lost, hook->entry, st);
        Py_DECREF(st);
      } else if (PyErr_Occurred()) {
        PyErr_WriteUnraisable(hook->on_lost);
      } else {  // it died meanwhile (another thread)
        call_or_report(hook->on_free, hook->entry, nullptr);
      }
    }
    Py_DECREF(hook->entry);
    Py_DECREF(hook->on_free);
    Py_DECREF(hook->on_lost);
    PyErr_Restore(saved_type, saved_value, saved_tb);
    if (!held) PyGILState_Release(gil);
  }  // at interpreter exit the references are left: Python's objects are gone or going
  delete hook;  // the original DataPtr frees the data now
}

}  // namespace

extern "C" {

// Hook the storage of `tensor` (a plain torch.Tensor, the caller checks) for the tracker's `entry`: 0, or -1 if it is
// not hooked (no storage, copy-on-write or guarded data; nothing raised). Holds the GIL (the caller's).
int phantora_hook_storage(PyObject *tensor, PyObject *entry, PyObject *on_free, PyObject *on_lost) {
  try {
    const at::Tensor &t = THPVariable_Unpack(tensor);
    if (!t.defined() || !t.unsafeGetTensorImpl()->has_storage()) return -1;
    const c10::Storage &st = t.unsafeGetTensorImpl()->storage();
    c10::StorageImpl *si = st.unsafeGetStorageImpl();
    if (!si) return -1;
    const at::DataPtr &old = si->data_ptr();  // throws (caught: -1) for a guarded storage
    if (c10::impl::cow::is_cow_data_ptr(old) || old.get_deleter() == &storage_hook_deleter) return -1;
    auto *hook = new StorageHook{std::move(si->_mutable_data_ptr_no_checks()), st.getWeakStorageImpl(),
                                 Py_NewRef(entry), Py_NewRef(on_free), Py_NewRef(on_lost)};
    // the moved-from DataPtr is empty: replacing it runs no deleter
    si->set_data_ptr_noswap(at::DataPtr(hook->inner.get(), hook, &storage_hook_deleter, hook->inner.device()));
    return 0;
  } catch (...) {
    return -1;
  }
}

// Undo `phantora_hook_storage` on the storage of `tensor` (a plain torch.Tensor): its own DataPtr back, the entry
// handed to the tracker's `lost` callback (a weak reference from then on). For an op that reads the DataPtr's deleter
// (torch._lazy_clone makes the storage copy-on-write only from a plain one). 0, or 1 if it was not hooked, or -1 if it
// has no storage (nothing raised). Holds the GIL.
int phantora_unhook_storage(PyObject *tensor) {
  try {
    const at::Tensor &t = THPVariable_Unpack(tensor);
    if (!t.defined() || !t.unsafeGetTensorImpl()->has_storage()) return -1;
    c10::StorageImpl *si = t.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
    if (!si) return -1;
    at::DataPtr &now = si->_mutable_data_ptr_no_checks();
    if (now.get_deleter() != &storage_hook_deleter) return 1;
    at::DataPtr inner = std::move(static_cast<StorageHook *>(now.get_context())->inner);
    si->set_data_ptr_noswap(std::move(inner));  // the hook's deleter runs: the storage lives, so `lost`
    return 0;
  } catch (...) {
    return -1;
  }
}

}  // extern "C"
