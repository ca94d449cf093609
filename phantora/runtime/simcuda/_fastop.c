/* The simulated GPU's per-op fast path in C: the rank's dispatch mode entry, fastpath.device_op's common case,
 * MemoryTracker.on_tensor, RankSession.charge and tensor.wrap_output, as one compiled pass.
 *
 * It is a transcription of those Python functions (simcuda/fastpath.py, memory.py, session.py, simcuda/tensor.py)
 * and keeps their results exactly; every case they treat specially is handed back to them: the op before it runs
 * (fastpath's SLOW, then the mode's general route), or, after it ran, the part that is not the common case (an
 * output that is not one plain tensor, a paused or replaced tracker, a session with a scenario, trace or listeners,
 * a wrapper with a storage offset or requires_grad ...). Attributes of the session, the tracker, its allocator and
 * the clock are read and written in their instance dictionaries (none of the names used is a descriptor of their
 * classes), so each costs a dictionary lookup instead of an attribute lookup. Built by setup.py (an optional
 * extension); without it phantora runs the Python functions (fastpath.py says so once).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

/* A tensor's metadata as simcuda/tensorinfo.cc reads it from the C++ tensor (its struct, field for field); the
 * function's address is given by compiled.py, or none: then every field is read through torch's Python bindings. */
typedef struct {
  int64_t nbytes;  /* untyped_storage().nbytes() */
  void *storage;   /* untyped_storage()._cdata */
  int64_t storage_offset;
  int is_meta, requires_grad, strided, contiguous; /* strided: layout is torch.strided; contiguous: stride() is */
} tensor_info_t;
typedef int (*tensor_info_fn)(PyObject *, tensor_info_t *);
static tensor_info_fn g_info = NULL;
/* tensorinfo.cc's phantora_wrap_contiguous(cls, elem, index): `_make_wrapper_subclass(cls, elem's shape, dtype=elem's
 * dtype, device=cuda:index)` for a contiguous elem, without parsing those arguments; none: that call, from here */
typedef PyObject *(*wrap_fn)(PyObject *, PyObject *, int64_t);
static wrap_fn g_wrap = NULL;
/* opcall.cc's phantora_call_op(func, args, kwargs, &out): runs `func._op(*args, **kwargs)` through the dispatcher from
 * C++ (1: `out` its result, or NULL with torch's error), or leaves it to `_op` (0). Its address is given by
 * compiled.py, or none: then `_op` is called. */
typedef int (*call_op_fn)(PyObject *, PyObject *, PyObject *, PyObject **);
static call_op_fn g_call_op = NULL;
/* tensorinfo.cc's phantora_hook_storage(tensor, entry, on_free, on_lost): the tracker told of the storage's death by a
 * C++ hook on it (0), or not hooked (-1: then a weak reference on its Python object, as MemoryTracker._add). Its
 * address is given by compiled.py, or none: every new entry is a weak reference. */
typedef int (*hook_fn)(PyObject *, PyObject *, PyObject *, PyObject *);
static hook_fn g_hook = NULL;

/* ---- configuration: the Python objects this transcribes against (set once by fastpath.py) ---- */
static PyObject *g_simcuda;       /* SimCudaTensor */
static PyObject *g_tensor;        /* torch.Tensor */
static PyObject *g_param;         /* torch.nn.Parameter */
static PyObject *g_slow;          /* fastpath.SLOW */
static PyObject *g_plans;         /* fastpath._PLANS: id(op) -> name or None */
static PyObject *g_plan;          /* fastpath._plan(func) */
static PyObject *g_phantom_special; /* set of ids */
static PyObject *g_to_copy_id;    /* id(aten._to_copy.default) */
static PyObject *g_casts_to_index; /* kept_values.casts_to_index(kwargs) */
static PyObject *g_sig;           /* compute._sig */
static PyObject *g_precision;     /* the dict of runtime/precision.py */
static PyObject *g_matmul_precision; /* precision.matmul_precision() */
static PyObject *g_tail;          /* fastpath._tail: an output that is not one plain tensor */
static PyObject *g_wrap_output;   /* tensor.wrap_output (the cases not made here) */
static PyObject *g_make_wrapper;  /* torch.Tensor._make_wrapper_subclass */
static PyObject *g_cuda;          /* tuple of torch.device("cuda", i) */
static PyObject *g_contiguous;    /* tensor._CONTIGUOUS: shape -> contiguous strides */
static PyObject *g_contiguous_fn; /* tensor._contiguous_strides(shape) */
static PyObject *g_strided;       /* torch.strided */
static PyObject *g_entry;         /* memory._Entry (a weakref.ref subclass with slots) */
static PyObject *g_hooked;        /* memory._HookedEntry: an entry whose storage is hooked in C++ (slots, no weakref) */
/* the slots' offsets in an _Entry [0] and a _HookedEntry [1] */
static Py_ssize_t g_off_cat[2], g_off_changed[2], g_off_key[2], g_off_site[2], g_off_size[2];
#define KIND(e) (Py_IS_TYPE((e), (PyTypeObject *)g_hooked) ? 1 : 0)
static PyObject *g_tracker_type;  /* memory.MemoryTracker */
static PyObject *g_session_type;  /* session.RankSession */
static PyObject *g_device;        /* the dict of simcuda/device.py (its `_installed`) */
static PyObject *g_tensor_module; /* the dict of simcuda/tensor.py (its `_seen`: a CUDA program's CPU tensors are host data) */
static PyObject *g_plain_tail;    /* fastpath._plain_tail: a plain-tensor op's output that is not one plain tensor */
static PyObject *g_layout_ops;    /* fastpath._LAYOUT_OPS: ids of the matrix products (keyed by operand layout) */
static long long g_layout_grid;   /* compute.VECTOR_BYTES: an operand's offset is keyed modulo this many elements */
static PyObject *g_fastpath;      /* the dict of simcuda/fastpath.py (its `device_op`: replaced, the mode's Python runs) */
static PyObject *g_get_mode;      /* torch._C._get_dispatch_mode */
static PyObject *g_fake_key;      /* torch._C._TorchDispatchModeKey.FAKE */
static long long g_small_size;    /* caching_allocator.SMALL_SIZE */
static PyObject *g_temp;          /* memory.TEMP */
static PyObject *g_trace_op;      /* trace.TraceRecorder.op (the function): its "ops" level is done here */
static long long g_report_check_ops; /* session.REPORT_CHECK_OPS */
/* simcuda/routes.py (optional: a configure without it leaves these NULL and every such op to the Python route) */
static PyObject *g_route_funcs;   /* routes.FUNCS: id(op) -> (op, flags) */
static PyObject *g_route_types;   /* routes.TYPES: tensor type -> kind */
static PyObject *g_func_flags;    /* routes.func_flags(op) */
static PyObject *g_type_kind;     /* routes.type_kind(type) */
static PyObject *g_routes;        /* routes.py's dict */
static PyObject *g_orig_general, *g_orig_charged; /* ChargeMode._general / _charged as dispatch.py defines them */
#define ROUTE_HOST 1  /* routes.HOST */
#define ROUTE_OTHER 2 /* routes.OTHER */
static int g_ready = 0;

static PyObject *s_elem, *s_is_meta, *s_shape, *s_dtype, *s_sim_index, *s_internal, *s_phantom, *s_by_storage,
    *s_join_tensors, *s_op, *s_memory, *s_enabled, *s_model, *s_keyed, *s_cost_keyed, *s_charge, *s_on_tensor,
    *s_on_outputs, *s_untyped_storage, *s_paused, *s_nbytes, *s_cdata, *s_live, *s_size_attr, *s_site, *s_resize,
    *s_limit, *s_oom, *s_free_cb, *s_event, *s_allocator, *s_small_held, *s_small_reserved, *s_grow_small,
    *s_note_reserved, *s_history, *s_free_py, *s_malloc, *s_allocations, *s_by_cat, *s_current, *s_step_peak, *s_program_peak, *s_peak,
    *s_peak_by_cat, *s_peak_event, *s_value, *s_scenario, *s_trace_ops, *s_listeners, *s_ops, *s_flops,
    *s_flops_by_dtype, *s_ns, *s_launch_ns, *s_tier_ns, *s_tier, *s_clock, *s_compute_ns, *s_compute_busy_ns,
    *s_report_in, *s_report_check, *s_requires_grad, *s_layout, *s_storage_offset, *s_stride, *s_device,
    *s_strides, *s_thread, *s_session, *s_installed, *s_general, *s_get, *s_device_op, *s_free, *s_free_c, *s_lost_cb, *s_kw_dd, *s_kw_sdd, *s_seen,
    *s_level, *s_ops_list, *s_ops_level, *s_report_every_ns, *s_last_report, *s_client, *s_advance_clock,
    *s_charged, *s_host, *s_device_depth, *s_pin_memory, *s_python_route, *s_by_layout, *s_turns, *s_holder,
    *s_acquire, *s_release;

static int intern_all(void) {
#define I(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
  I(s_elem, "elem") I(s_is_meta, "is_meta") I(s_shape, "shape") I(s_dtype, "dtype") I(s_sim_index, "_sim_index")
  I(s_internal, "_internal") I(s_phantom, "phantom") I(s_by_storage, "by_storage") I(s_join_tensors, "join_tensors")
  I(s_op, "_op") I(s_memory, "memory") I(s_enabled, "enabled") I(s_model, "model") I(s_keyed, "keyed")
  I(s_cost_keyed, "cost_keyed") I(s_charge, "charge") I(s_on_tensor, "on_tensor") I(s_on_outputs, "on_outputs")
  I(s_untyped_storage, "untyped_storage") I(s_paused, "_paused") I(s_nbytes, "nbytes") I(s_cdata, "_cdata")
  I(s_live, "live") I(s_size_attr, "size") I(s_site, "site") I(s_resize, "_resize") I(s_limit, "_limit")
  I(s_oom, "_oom") I(s_free_cb, "_free_cb") I(s_event, "_event") I(s_allocator, "allocator")
  I(s_small_held, "small_held") I(s_small_reserved, "small_reserved") I(s_grow_small, "grow_small")
  I(s_note_reserved, "_note_reserved") I(s_malloc, "malloc") I(s_allocations, "allocations") I(s_by_cat, "by_cat")
  I(s_current, "current") I(s_step_peak, "step_peak") I(s_program_peak, "program_peak") I(s_peak, "peak")
  I(s_peak_by_cat, "peak_by_cat") I(s_peak_event, "_peak_event") I(s_value, "value") I(s_scenario, "scenario")
  I(s_trace_ops, "_trace_ops") I(s_listeners, "listeners") I(s_ops, "ops") I(s_flops, "flops")
  I(s_flops_by_dtype, "flops_by_dtype") I(s_ns, "ns") I(s_launch_ns, "_launch_ns") I(s_tier_ns, "tier_ns")
  I(s_tier, "tier") I(s_clock, "clock") I(s_compute_ns, "compute_ns") I(s_compute_busy_ns, "compute_busy_ns")
  I(s_report_in, "_report_in") I(s_report_check, "_report_check") I(s_requires_grad, "requires_grad")
  I(s_layout, "layout") I(s_storage_offset, "storage_offset") I(s_stride, "stride") I(s_device, "device")
  I(s_strides, "strides") I(s_thread, "thread") I(s_session, "session") I(s_installed, "_installed")
  I(s_general, "_general") I(s_get, "get") I(s_device_op, "device_op") I(s_free, "free") I(s_free_c, "_free_c")
  I(s_lost_cb, "_lost_cb") I(s_history, "_history") I(s_free_py, "_free") I(s_seen, "_seen")
  I(s_level, "level") I(s_ops_list, "_ops") I(s_ops_level, "ops") I(s_report_every_ns, "report_every_ns")
  I(s_last_report, "_last_report") I(s_client, "client") I(s_advance_clock, "advance_clock")
  I(s_charged, "_charged") I(s_host, "host") I(s_device_depth, "_device_depth") I(s_pin_memory, "pin_memory")
  I(s_python_route, "PYTHON_ROUTE") I(s_by_layout, "by_layout") I(s_turns, "_turns") I(s_holder, "_holder")
  I(s_acquire, "acquire") I(s_release, "release")
#undef I
  if (!(s_kw_dd = PyTuple_Pack(2, s_dtype, s_device))) return -1;
  if (!(s_kw_sdd = PyTuple_Pack(3, s_strides, s_dtype, s_device))) return -1;
  return 0;
}

/* ---- helpers ---- */

/* The instance dictionary of `obj` (new reference), or NULL with an error. */
static PyObject *dict_of(PyObject *obj) { return PyObject_GenericGetDict(obj, NULL); }

/* obj.name, read from its instance dictionary `d` first (new reference). */
static PyObject *dget(PyObject *d, PyObject *obj, PyObject *name) {
  PyObject *v = PyDict_GetItemWithError(d, name);
  if (v) return Py_NewRef(v);
  if (PyErr_Occurred()) return NULL;
  return PyObject_GetAttr(obj, name);
}

/* Its truth value, or -1 with an error. */
static int dtruth(PyObject *d, PyObject *obj, PyObject *name) {
  PyObject *v = dget(d, obj, name);
  if (!v) return -1;
  int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}

/* d[name] = d[name] + delta (both Python ints; `obj`'s attribute if the dict lacks it); the new value (new ref). */
static PyObject *dadd(PyObject *d, PyObject *obj, PyObject *name, PyObject *delta) {
  PyObject *v = dget(d, obj, name);
  if (!v) return NULL;
  PyObject *sum = PyNumber_Add(v, delta);
  Py_DECREF(v);
  if (!sum) return NULL;
  if (PyDict_SetItem(d, name, sum) < 0) {
    Py_DECREF(sum);
    return NULL;
  }
  return sum;
}

static int is_plain(PyObject *x) { return Py_IS_TYPE(x, (PyTypeObject *)g_tensor) || Py_IS_TYPE(x, (PyTypeObject *)g_param); }
static int is_seq(PyObject *x) { return PyList_CheckExact(x) || PyTuple_CheckExact(x); }

/* Whether `t`'s metadata was read into `ti` by tensorinfo.cc: a plain tensor (no subclass's __torch_function__ could
 * answer its attributes differently) whose metadata it answers for. */
static int info(PyObject *t, tensor_info_t *ti) { return g_info && is_plain(t) && g_info(t, ti) == 0; }

/* fastpath._has_tensor */
static int has_tensor(PyObject *seq) {
  PyObject *fast = PySequence_Fast(seq, "");
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject **items = PySequence_Fast_ITEMS(fast);
  int found = 0;
  for (Py_ssize_t i = 0; i < n && !found; i++) {
    int t = PyObject_IsInstance(items[i], g_tensor);
    if (t < 0) {
      Py_DECREF(fast);
      return -1;
    }
    found = t || is_seq(items[i]);
  }
  Py_DECREF(fast);
  return found;
}

/* A slot of an _Entry: set (steals nothing), get (borrowed). */
static void slot_set(PyObject *e, Py_ssize_t off, PyObject *v) {
  PyObject **p = (PyObject **)((char *)e + off);
  Py_XSETREF(*p, Py_NewRef(v));
}
static PyObject *slot_get(PyObject *e, Py_ssize_t off) { return *(PyObject **)((char *)e + off); }

/* ---- MemoryTracker._free: the weak reference's callback when a storage counted here dies ---- */
static PyObject *tracker_free(PyObject *mem, PyObject *e) {
  PyObject *md = dict_of(mem);
  if (!md) return NULL;
  Py_INCREF(e);  /* the weak reference's caller holds none: `live` may hold the last one, and it is deleted below */
  PyObject *live = NULL, *alloc = NULL, *ad = NULL, *bycat = NULL, *r = NULL, *key = slot_get(e, g_off_key[KIND(e)]),
           *size = slot_get(e, g_off_size[KIND(e)]), *cat = slot_get(e, g_off_cat[KIND(e)]);
  if (!key || !size || !cat) {
    PyErr_SetString(PyExc_AttributeError, "_Entry without its key, size or category");
    goto done;
  }
  PyObject *hist = PyDict_GetItemWithError(md, s_history);  /* recording the allocator's history: the Python one */
  if (hist && hist != Py_None) {
    r = PyObject_CallMethodOneArg(mem, s_free_py, e);
    goto done;
  }
  if (PyErr_Occurred()) goto done;
  if (!(live = dget(md, mem, s_live))) goto done;
  PyObject *now = PyDict_GetItemWithError(live, key);
  if (now != e) {
    if (!PyErr_Occurred()) r = Py_NewRef(Py_None);
    goto done;
  }
  if (PyDict_DelItem(live, key) < 0 || !(alloc = dget(md, mem, s_allocator))) goto done;
  long long n = PyLong_AsLongLong(size);
  if (n == -1 && PyErr_Occurred()) goto done;
  if (n <= g_small_size) {  /* `_release_block`, inline */
    if (!(ad = dict_of(alloc))) goto done;
    PyObject *held = dget(ad, alloc, s_small_held);
    PyObject *left = held ? PyNumber_Subtract(held, size) : NULL;
    Py_XDECREF(held);
    int bad = !left || PyDict_SetItem(ad, s_small_held, left) < 0;
    Py_XDECREF(left);
    if (bad) goto done;
  } else {
    PyObject *t = PyObject_CallMethodOneArg(alloc, s_free, key);
    if (!t) goto done;
    Py_DECREF(t);
  }
  if (!(bycat = dget(md, mem, s_by_cat))) goto done;
  PyObject *c = PyObject_GetItem(bycat, cat);
  PyObject *c2 = c ? PyNumber_Subtract(c, size) : NULL;
  Py_XDECREF(c);
  int bad = !c2 || PyObject_SetItem(bycat, cat, c2) < 0;
  Py_XDECREF(c2);
  if (bad) goto done;
  PyObject *cur = dget(md, mem, s_current);
  PyObject *cur2 = cur ? PyNumber_Subtract(cur, size) : NULL;
  Py_XDECREF(cur);
  bad = !cur2 || PyDict_SetItem(md, s_current, cur2) < 0;
  Py_XDECREF(cur2);
  if (!bad) r = Py_NewRef(Py_None);
done:
  Py_DECREF(md); Py_XDECREF(live); Py_XDECREF(alloc); Py_XDECREF(ad); Py_XDECREF(bycat);
  Py_DECREF(e);
  return r;
}

static PyMethodDef free_def = {"_free", (PyCFunction)tracker_free, METH_O, "MemoryTracker._free in C"};

/* The tracker's free callback in C, made once per tracker and kept in its dictionary. */
static PyObject *free_callback(PyObject *md, PyObject *mem) {
  PyObject *cb = PyDict_GetItemWithError(md, s_free_c);
  if (cb) return Py_NewRef(cb);
  if (PyErr_Occurred() || !(cb = PyCFunction_NewEx(&free_def, mem, NULL))) return NULL;
  if (PyDict_SetItem(md, s_free_c, cb) < 0) Py_CLEAR(cb);
  return cb;
}

/* ---- MemoryTracker.on_tensor ---- */
static int on_tensor(PyObject *mem, PyObject *t, PyObject *site, const tensor_info_t *ti) {
  PyObject *md = dict_of(mem);
  if (!md) return -1;
  int ret = -1;
  PyObject *st = NULL, *nb = NULL, *key = NULL, *live = NULL, *sizeo = NULL, *cur = NULL, *limit = NULL, *cb = NULL,
           *e = NULL, *ev = NULL, *alloc = NULL, *ad = NULL, *tmp = NULL, *bycat = NULL;
  if (!Py_IS_TYPE(mem, (PyTypeObject *)g_tracker_type) || PyDict_GetItemWithError(md, s_on_tensor)) {
    if (PyErr_Occurred()) goto done;
    tmp = PyObject_CallMethodObjArgs(mem, s_on_tensor, t, site, NULL);  /* a replaced or subclassed tracker */
    ret = tmp ? 0 : -1;
    goto done;
  }
  /* with `ti`, the storage's Python object is made only for a new entry's weak reference */
  st = ti ? Py_NewRef(Py_None) : PyObject_CallMethodNoArgs(t, s_untyped_storage);
  int paused = st ? dtruth(md, mem, s_paused) : 0;
  if (paused < 0) goto done;
  if (!st || paused) {
    if (!st) {
      if (!PyErr_ExceptionMatches(PyExc_RuntimeError) && !PyErr_ExceptionMatches(PyExc_NotImplementedError) &&
          !PyErr_ExceptionMatches(PyExc_TypeError))
        goto done;
      PyErr_Clear();
    }
    tmp = PyObject_CallMethodObjArgs(mem, s_on_outputs, t, site, NULL);
    ret = tmp ? 0 : -1;
    goto done;
  }
  long long nbytes = ti ? ti->nbytes : -1;
  if (!ti) {
    if (!(nb = PyObject_CallMethodNoArgs(st, s_nbytes))) goto done;
    nbytes = PyLong_AsLongLong(nb);
    if (nbytes == -1 && PyErr_Occurred()) goto done;
  }
  long long size = (nbytes + 511) & ~511LL;
  if (!(sizeo = PyLong_FromLongLong(size))) goto done;
  if (!(key = ti ? PyLong_FromVoidPtr(ti->storage) : PyObject_GetAttr(st, s_cdata))) goto done;
  if (!(live = dget(md, mem, s_live))) goto done;
  PyObject *old = PyDict_GetItemWithError(live, key);
  if (old) {
    PyObject *osize = slot_get(old, g_off_size[KIND(old)]);
    int same = osize ? PyObject_RichCompareBool(osize, sizeo, Py_EQ) : 0;
    if (same < 0) goto done;
    if (!same) {
      Py_INCREF(old);
      if (PyDict_SetItem(md, s_site, site) < 0 ||
          !(tmp = PyObject_CallMethodObjArgs(mem, s_resize, old, sizeo, NULL))) {
        Py_DECREF(old);
        goto done;
      }
      Py_DECREF(old);
    }
    ret = 0;
    goto done;
  }
  if (PyErr_Occurred()) goto done;
  if (!size) {
    ret = 0;
    goto done;
  }
  {
    PyObject *curo = dget(md, mem, s_current);
    if (!curo) goto done;
    cur = PyNumber_Add(curo, sizeo);
    Py_DECREF(curo);
  }
  if (!cur || !(limit = dget(md, mem, s_limit))) goto done;
  int over = PyObject_RichCompareBool(cur, limit, Py_GT);
  if (over < 0) goto done;
  if (over) {
    if (PyDict_SetItem(md, s_site, site) < 0) goto done;
    if (!(tmp = PyObject_CallMethodObjArgs(mem, s_oom, sizeo, NULL))) goto done;  /* it raises the OOM */
    Py_CLEAR(tmp);
  }
  if (!(cb = free_callback(md, mem))) goto done;
  if (ti && g_hook) {  /* the storage hooked in C++: no Python object of it, no weak reference on it */
    PyObject *lost = dget(md, mem, s_lost_cb);
    if (!lost || !(e = ((PyTypeObject *)g_hooked)->tp_alloc((PyTypeObject *)g_hooked, 0))) {  /* slots only */
      Py_XDECREF(lost);
      goto done;
    }
    int hooked = g_hook(t, e, cb, lost) == 0;
    Py_DECREF(lost);
    if (!hooked) Py_CLEAR(e);
  }
  if (!e) {
    if (ti) {
      Py_SETREF(st, PyObject_CallMethodNoArgs(t, s_untyped_storage));
      if (!st) goto done;
    }
    if (!(e = PyObject_CallFunctionObjArgs(g_entry, st, cb, NULL))) goto done;
  }
  slot_set(e, g_off_key[KIND(e)], key);
  slot_set(e, g_off_size[KIND(e)], sizeo);
  slot_set(e, g_off_cat[KIND(e)], g_temp);
  slot_set(e, g_off_site[KIND(e)], site);
  {
    PyObject *one = PyLong_FromLong(1);
    ev = one ? dadd(md, mem, s_event, one) : NULL;
    Py_XDECREF(one);
  }
  if (!ev) goto done;
  slot_set(e, g_off_changed[KIND(e)], ev);
  if (PyDict_SetItem(live, key, e) < 0) goto done;
  if (!(alloc = dget(md, mem, s_allocator))) goto done;
  if (size <= g_small_size) {  /* `_reserve_block`, inline: the small pool counted without a key */
    if (!(ad = dict_of(alloc))) goto done;
    PyObject *held = dadd(ad, alloc, s_small_held, sizeo);
    if (!held) goto done;
    PyObject *reserved = dget(ad, alloc, s_small_reserved);
    int grow = reserved ? PyObject_RichCompareBool(held, reserved, Py_GT) : -1;
    Py_DECREF(held);
    Py_XDECREF(reserved);
    if (grow < 0) goto done;
    if (grow) {
      if (!(tmp = PyObject_CallMethodNoArgs(alloc, s_grow_small))) goto done;
      Py_CLEAR(tmp);
      if (!(tmp = PyObject_CallMethodNoArgs(mem, s_note_reserved))) goto done;
      Py_CLEAR(tmp);
    }
  } else {
    if (!(tmp = PyObject_CallMethodObjArgs(alloc, s_malloc, key, sizeo, NULL))) goto done;
    Py_CLEAR(tmp);
    if (!(tmp = PyObject_CallMethodNoArgs(mem, s_note_reserved))) goto done;
    Py_CLEAR(tmp);
  }
  {
    PyObject *one = PyLong_FromLong(1);
    PyObject *n = one ? dadd(md, mem, s_allocations, one) : NULL;
    Py_XDECREF(one);
    if (!n) goto done;
    Py_DECREF(n);
  }
  if (!(bycat = dget(md, mem, s_by_cat))) goto done;
  {
    PyObject *c = PyObject_GetItem(bycat, g_temp);
    PyObject *c2 = c ? PyNumber_Add(c, sizeo) : NULL;
    Py_XDECREF(c);
    int bad = !c2 || PyObject_SetItem(bycat, g_temp, c2) < 0;
    Py_XDECREF(c2);
    if (bad) goto done;
  }
  if (PyDict_SetItem(md, s_current, cur) < 0) goto done;
  /* `_note_peak()`, inline (the reserved bytes grew above, if at all) */
  PyObject *names[2] = {s_step_peak, s_program_peak};
  for (int i = 0; i < 2; i++) {
    PyObject *p = dget(md, mem, names[i]);
    int gt = p ? PyObject_RichCompareBool(cur, p, Py_GT) : -1;
    Py_XDECREF(p);
    if (gt < 0 || (gt && PyDict_SetItem(md, names[i], cur) < 0)) goto done;
  }
  {
    PyObject *p = dget(md, mem, s_peak);
    int ge = p ? PyObject_RichCompareBool(cur, p, Py_GE) : -1;
    Py_XDECREF(p);
    if (ge < 0) goto done;
    if (ge) {
      PyObject *copy = PySequence_List(bycat);
      if (!copy) goto done;
      int bad = PyDict_SetItem(md, s_peak, cur) < 0 || PyDict_SetItem(md, s_peak_by_cat, copy) < 0;
      Py_DECREF(copy);
      if (bad) goto done;
      PyObject *evn = dget(md, mem, s_event);
      bad = !evn || PyDict_SetItem(md, s_peak_event, evn) < 0;
      Py_XDECREF(evn);
      if (bad) goto done;
    }
  }
  ret = 0;
done:
  Py_XDECREF(md); Py_XDECREF(st); Py_XDECREF(nb); Py_XDECREF(key); Py_XDECREF(live); Py_XDECREF(sizeo);
  Py_XDECREF(cur); Py_XDECREF(limit); Py_XDECREF(cb); Py_XDECREF(e); Py_XDECREF(ev); Py_XDECREF(alloc);
  Py_XDECREF(ad); Py_XDECREF(tmp); Py_XDECREF(bycat);
  return ret;
}

/* ---- RankSession.charge ---- */

/* d[k] = d.get(k, 0) + v for a plain dict d */
static int bump(PyObject *d, PyObject *k, PyObject *v) {
  PyObject *old = PyDict_GetItemWithError(d, k);
  if (!old && PyErr_Occurred()) return -1;
  PyObject *sum = old ? PyNumber_Add(old, v) : Py_NewRef(v);
  if (!sum) return -1;
  int r = PyDict_SetItem(d, k, sum);
  Py_DECREF(sum);
  return r;
}

/* `trace(name, start, end)`, the session's `_trace_ops`: TraceRecorder.op at its "ops" level is done here (the
   tuple appended to the recorder's `_ops`, as the method does); any other level or callable is called. */
static int trace_op(PyObject *trace, PyObject *name, PyObject *start, PyObject *end) {
  if (g_trace_op && PyMethod_Check(trace) && PyMethod_GET_FUNCTION(trace) == g_trace_op) {
    PyObject *rd = dict_of(PyMethod_GET_SELF(trace));
    if (!rd) return -1;
    PyObject *level = PyDict_GetItemWithError(rd, s_level), *ops = NULL;
    int here = level && PyUnicode_CheckExact(level) && PyUnicode_Compare(level, s_ops_level) == 0;
    if (here && (ops = PyDict_GetItemWithError(rd, s_ops_list)) && PyList_CheckExact(ops)) {
      PyObject *ev = PyTuple_Pack(3, name, start, end);
      int r = ev ? PyList_Append(ops, ev) : -1;
      Py_XDECREF(ev);
      Py_DECREF(rd);
      return r;
    }
    Py_DECREF(rd);
    if (PyErr_Occurred()) return -1;
  }
  PyObject *tmp = PyObject_CallFunctionObjArgs(trace, name, start, end, NULL);
  Py_XDECREF(tmp);
  return tmp ? 0 : -1;
}

/* The real clock in ns: time.perf_counter_ns's (CLOCK_MONOTONIC), which `_report_check` reads. */
static long long real_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* RankSession._report_check(end), here: every REPORT_CHECK_OPS ops the real clock is read, and the clock `end` is
   reported to the bridge (`client.advance_clock(end)`) if `report_every_ns` of real time passed since the last. */
static int report_check(PyObject *session, PyObject *sd, PyObject *end) {
  PyObject *every = dget(sd, session, s_report_every_ns), *last = NULL, *n = NULL, *client = NULL, *tmp = NULL;
  int ret = -1;
  if (!every) goto done;
  long long ev = PyLong_AsLongLong(every), wall = real_ns();
  if (ev == -1 && PyErr_Occurred()) goto done;
  if (!(n = PyLong_FromLongLong(ev ? g_report_check_ops : 1)) || PyDict_SetItem(sd, s_report_in, n) < 0) goto done;
  if (!(last = dget(sd, session, s_last_report))) goto done;
  long long lr = PyLong_AsLongLong(last);
  if (lr == -1 && PyErr_Occurred()) goto done;
  if (wall - lr >= ev) {
    Py_CLEAR(n);
    if (!(n = PyLong_FromLongLong(wall)) || PyDict_SetItem(sd, s_last_report, n) < 0) goto done;
    if (!(client = dget(sd, session, s_client))) goto done;
    if (!(tmp = PyObject_CallMethodOneArg(client, s_advance_clock, end))) goto done;
  }
  ret = 0;
done:
  Py_XDECREF(every); Py_XDECREF(last); Py_XDECREF(n); Py_XDECREF(client); Py_XDECREF(tmp);
  return ret;
}

static int charge(PyObject *session, PyObject *sd, PyObject *name, PyObject *cost) {
  PyObject *scenario = NULL, *trace = NULL, *listeners = NULL, *tmp = NULL, *flops = NULL, *ns = NULL,
           *clock = NULL, *cd = NULL, *end = NULL, *ri = NULL, *start = NULL;
  int ret = -1, simple = 0, own_check = 0;
  if (Py_IS_TYPE(session, (PyTypeObject *)g_session_type) && !PyDict_GetItemWithError(sd, s_charge) &&
      !PyErr_Occurred()) {
    own_check = !PyDict_GetItemWithError(sd, s_report_check) && !PyErr_Occurred();  /* not replaced on the session */
    if (!(scenario = dget(sd, session, s_scenario)) || !(trace = dget(sd, session, s_trace_ops)) ||
        !(listeners = dget(sd, session, s_listeners)))
      goto done;
    int any = PyObject_IsTrue(listeners);
    if (any < 0) goto done;
    simple = scenario == Py_None && !any;  /* a trace's recorder is called from here, as the method calls it */
  }
  if (PyErr_Occurred()) goto done;
  if (!simple) {  /* a scenario, listeners, or a replaced charge: the Python method */
    tmp = PyObject_CallMethodObjArgs(session, s_charge, name, cost, NULL);
    ret = tmp ? 0 : -1;
    goto done;
  }
  {
    PyObject *one = PyLong_FromLong(1);
    PyObject *n = one ? dadd(sd, session, s_ops, one) : NULL;
    Py_XDECREF(one);
    if (!n) goto done;
    Py_DECREF(n);
  }
  if (!(flops = PyObject_GetAttr(cost, s_flops))) goto done;
  int f = PyObject_IsTrue(flops);
  if (f < 0) goto done;
  if (f) {
    PyObject *by = dget(sd, session, s_flops_by_dtype);
    PyObject *dt = by ? PyObject_GetAttr(cost, s_dtype) : NULL;
    int bad = !dt || bump(by, dt, flops) < 0;
    Py_XDECREF(by);
    Py_XDECREF(dt);
    if (bad) goto done;
  }
  if (!(ns = PyObject_GetAttr(cost, s_ns))) goto done;
  int nz = PyObject_IsTrue(ns);
  if (nz <= 0) {
    ret = nz;
    goto done;
  }
  {
    PyObject *launch = dget(sd, session, s_launch_ns);
    PyObject *kernel = launch ? PyNumber_Subtract(ns, launch) : NULL;
    Py_XDECREF(launch);
    if (!kernel) goto done;
    PyObject *zero = PyLong_FromLong(0);
    int pos = zero ? PyObject_RichCompareBool(kernel, zero, Py_GT) : -1;
    Py_XDECREF(zero);
    int bad = pos < 0;
    if (pos > 0) {
      PyObject *tiers = dget(sd, session, s_tier_ns);
      PyObject *tier = tiers ? PyObject_GetAttr(cost, s_tier) : NULL;
      bad = !tier || bump(tiers, tier, kernel) < 0;
      Py_XDECREF(tiers);
      Py_XDECREF(tier);
    }
    Py_DECREF(kernel);
    if (bad) goto done;
  }
  if (!(clock = dget(sd, session, s_clock))) goto done;
  int inline_ok = 0;  /* an int > 0 */
  if (PyLong_CheckExact(ns)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(ns, &overflow);
    if (v == -1 && PyErr_Occurred()) goto done;
    inline_ok = overflow > 0 || (!overflow && v > 0);
  }
  if (inline_ok) {  /* `clock.charge(ns)`, inline */
    if (!(cd = dict_of(clock))) goto done;
    if (!(end = dadd(cd, clock, s_compute_ns, ns))) goto done;
    if (!(tmp = dadd(cd, clock, s_compute_busy_ns, ns))) goto done;
    Py_CLEAR(tmp);
    if (trace != Py_None && !(start = PyNumber_Subtract(end, ns))) goto done;
  } else {
    PyObject *se = PyObject_CallMethodObjArgs(clock, s_charge, ns, NULL);
    if (!se) goto done;
    start = PySequence_GetItem(se, 0);
    end = start ? PySequence_GetItem(se, 1) : NULL;
    Py_DECREF(se);
    if (!end) goto done;
  }
  if (trace != Py_None && trace_op(trace, name, start, end) < 0) goto done;  /* `self._trace_ops(name, start, end)` */
  {
    PyObject *minus = PyLong_FromLong(-1);
    ri = minus ? dadd(sd, session, s_report_in, minus) : NULL;
    Py_XDECREF(minus);
    if (!ri) goto done;
    int left = PyObject_IsTrue(ri);
    if (left < 0) goto done;
    if (!left && own_check && report_check(session, sd, end) < 0) goto done;
    if (!left && !own_check && !(tmp = PyObject_CallMethodObjArgs(session, s_report_check, end, NULL))) goto done;
  }
  ret = 0;
done:
  Py_XDECREF(scenario); Py_XDECREF(trace); Py_XDECREF(listeners); Py_XDECREF(tmp); Py_XDECREF(flops);
  Py_XDECREF(ns); Py_XDECREF(clock); Py_XDECREF(cd); Py_XDECREF(end); Py_XDECREF(ri); Py_XDECREF(start);
  return ret;
}

/* ---- tensor.wrap_output ---- */
static PyObject *wrap_output(PyObject *elem, PyObject *index, PyObject *shape, PyObject *dtype,
                             const tensor_info_t *ti) {
  Py_ssize_t i = PyLong_CheckExact(index) ? PyLong_AsSsize_t(index) : -1;
  if (i == -1 && PyErr_Occurred()) PyErr_Clear();
  PyObject *rg = NULL, *layout = NULL, *off = NULL, *strides = NULL, *r = NULL;
  int special = i < 0 || i >= PyTuple_GET_SIZE(g_cuda);
  if (ti && !special) {  /* read by tensorinfo.cc */
    special = ti->requires_grad || !ti->strided || ti->storage_offset != 0;
    if (!special && ti->contiguous) {
      if (g_wrap) {
        r = g_wrap(g_simcuda, elem, (int64_t)i);
      } else {
        PyObject *argv[] = {g_simcuda, shape, dtype, PyTuple_GET_ITEM(g_cuda, i)};
        r = PyObject_Vectorcall(g_make_wrapper, argv, 2, s_kw_dd);
      }
      goto made;
    }
  }
  if (!special) {
    if (!(rg = PyObject_GetAttr(elem, s_requires_grad))) goto done;
    special = rg == Py_True;
  }
  if (!special) {
    if (!(layout = PyObject_GetAttr(elem, s_layout))) goto done;
    special = layout != g_strided;
  }
  if (!special) {
    if (!(off = PyObject_CallMethodNoArgs(elem, s_storage_offset))) goto done;
    int t = PyObject_IsTrue(off);
    if (t < 0) goto done;
    special = t;
  }
  if (special) {
    r = PyObject_CallFunctionObjArgs(g_wrap_output, elem, index, shape, dtype, NULL);
    goto done;
  }
  if (!(strides = PyObject_CallMethodNoArgs(elem, s_stride))) goto done;
  PyObject *contiguous = PyDict_GetItemWithError(g_contiguous, shape);
  if (contiguous) Py_INCREF(contiguous);
  else if (PyErr_Occurred() || !(contiguous = PyObject_CallOneArg(g_contiguous_fn, shape))) goto done;
  int same = PyObject_RichCompareBool(strides, contiguous, Py_EQ);
  Py_DECREF(contiguous);
  if (same < 0) goto done;
  PyObject *dev = PyTuple_GET_ITEM(g_cuda, i);
  if (same) {
    PyObject *argv[] = {g_simcuda, shape, dtype, dev};
    r = PyObject_Vectorcall(g_make_wrapper, argv, 2, s_kw_dd);
  } else {
    PyObject *argv[] = {g_simcuda, shape, strides, dtype, dev};
    r = PyObject_Vectorcall(g_make_wrapper, argv, 2, s_kw_sdd);
  }
made:
  if (r && (PyObject_SetAttr(r, s_elem, elem) < 0 || PyObject_SetAttr(r, s_sim_index, index) < 0)) Py_CLEAR(r);
done:
  Py_XDECREF(rg); Py_XDECREF(layout); Py_XDECREF(off); Py_XDECREF(strides);
  return r;
}

/* ---- fastpath.device_op ---- */

/* compute._sig for a non-tensor argument: ints, bools and None as they are, floats by whether they are 0 */
static PyObject *sig(PyObject *x) {
  if (x == Py_None || PyLong_CheckExact(x) || PyBool_Check(x)) return Py_NewRef(x);
  if (PyFloat_CheckExact(x)) return Py_NewRef(PyFloat_AS_DOUBLE(x) == 0.0 ? Py_True : Py_False);
  return PyObject_CallOneArg(g_sig, x);
}

/* Whether tensor `e` lies as a contiguous tensor of its shape at an offset on the layout grid (1), not (0), or an
   error (-1); `strides` and `offset` are set to its strides (a new reference) and its offset modulo the grid when 0.
   compute.layout_part's test, from tensorinfo.cc's reading where there is one. */
static int plain_layout(PyObject *e, PyObject **strides, long long *offset) {
  tensor_info_t ti;
  int known = info(e, &ti);
  if (known && ti.contiguous && ti.storage_offset % g_layout_grid == 0) return 1;
  if (!(*strides = PyObject_CallMethodNoArgs(e, s_stride))) return -1;
  if (known) {
    *offset = ti.storage_offset % g_layout_grid;
    return 0;
  }
  PyObject *off = PyObject_CallMethodNoArgs(e, s_storage_offset);
  long long o = off ? PyLong_AsLongLong(off) : -1;
  Py_XDECREF(off);
  if (o == -1 && PyErr_Occurred()) goto fail;
  *offset = o % g_layout_grid;
  if (*offset) return 0;
  PyObject *shape = PyObject_GetAttr(e, s_shape);
  PyObject *want = shape ? PyObject_CallOneArg(g_contiguous_fn, shape) : NULL;
  Py_XDECREF(shape);
  int same = want ? PyObject_RichCompareBool(*strides, want, Py_EQ) : -1;
  Py_XDECREF(want);
  if (same < 0) goto fail;
  if (!same) return 0;
  Py_CLEAR(*strides);
  return 1;
fail:
  Py_CLEAR(*strides);
  return -1;
}

/* fastpath._lay_out: a matrix product's key (part i + 1 argument i's (shape, dtype)) with the strides and offset of
   each operand that does not lie plainly folded in, as (shape, dtype, strides, offset); 0, or -1 on an error. */
static int lay_out(PyObject *key, PyObject *unwrapped) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(unwrapped); i++) {
    PyObject *e = PyTuple_GET_ITEM(unwrapped, i);
    int t = PyObject_IsInstance(e, g_tensor);
    if (t < 0) return -1;
    if (!t) continue;
    PyObject *strides = NULL;
    long long offset = 0;
    int plain_lay = plain_layout(e, &strides, &offset);
    if (plain_lay < 0) return -1;
    if (plain_lay) continue;
    PyObject *old = PyTuple_GET_ITEM(key, i + 1), *off = PyLong_FromLongLong(offset);
    PyObject *part = off ? PyTuple_Pack(4, PyTuple_GET_ITEM(old, 0), PyTuple_GET_ITEM(old, 1), strides, off) : NULL;
    Py_XDECREF(off);
    Py_DECREF(strides);
    if (!part) return -1;
    PyTuple_SET_ITEM(key, i + 1, part);  /* the key is this call's own, not yet hashed */
    Py_DECREF(old);
  }
  return 0;
}

/* An op of the simulated GPU on its cuda tensors (`plain` 0), or, with `plain` 1, an op of a program that has made no
   cuda tensor on plain tensors, charged as GPU work (ChargeMode._charged's route): nothing unwrapped or wrapped. */
static PyObject *device_op(PyObject *session, PyObject *func, PyObject *args, PyObject *kwargs, int plain) {
  if (!PyTuple_Check(args) || (kwargs && !PyDict_Check(kwargs))) return Py_NewRef(g_slow);
  PyObject *op = NULL, *name = NULL, *sd = NULL, *unwrapped = NULL, *key = NULL, *last = NULL, *a = NULL,
           *out = NULL, *result = NULL, *mem = NULL, *index = NULL, *opfn = NULL, *shape = NULL, *dtype = NULL,
           *model = NULL, *keyed = NULL, *cost = NULL, *kw = NULL;
  Py_ssize_t nkw = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
  if (!(op = PyLong_FromVoidPtr(func))) goto done;
  name = PyDict_GetItemWithError(g_plans, op);
  if (name) Py_INCREF(name);
  else if (PyErr_Occurred() || !(name = PyObject_CallOneArg(g_plan, func))) goto done;
  if (name == Py_None) goto slow;
  if (!(sd = dict_of(session))) goto done;
  int internal = dtruth(sd, session, s_internal);
  if (internal < 0) goto done;
  if (internal) goto slow;
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  int meta = 0, data = 0, kw_tensor = 0, odd = 0; /* odd: a tensor argument may not lie plainly (plain_layout) */
  if (!(unwrapped = PyTuple_New(n))) goto done;
  if (!(key = PyTuple_New(1 + n + (nkw ? 1 : 0) + 2))) goto done;
  PyTuple_SET_ITEM(key, 0, Py_NewRef(op));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *x = PyTuple_GET_ITEM(args, i);
    if (plain ? is_plain(x) : PyObject_TypeCheck(x, (PyTypeObject *)g_simcuda)) {
      PyObject *e = plain ? Py_NewRef(x) : PyObject_GetAttr(x, s_elem);
      if (!e) goto done;
      PyTuple_SET_ITEM(unwrapped, i, e);
      if (!plain) last = x;
      tensor_info_t ei;
      if (info(e, &ei)) {
        if (ei.is_meta) meta = 1;
        else data = 1;
        if (!ei.contiguous || ei.storage_offset) odd = 1;  /* plain_layout decides, for a matrix product only */
      } else {
        odd = 1;
        PyObject *m = PyObject_GetAttr(e, s_is_meta);
        if (!m) goto done;
        if (m == Py_True) meta = 1;
        else data = 1;
        Py_DECREF(m);
      }
      PyObject *sh = PyObject_GetAttr(e, s_shape);
      PyObject *dt = sh ? PyObject_GetAttr(e, s_dtype) : NULL;
      PyObject *part = dt ? PyTuple_Pack(2, sh, dt) : NULL;
      Py_XDECREF(sh);
      Py_XDECREF(dt);
      if (!part) goto done;
      PyTuple_SET_ITEM(key, i + 1, part);
    } else {
      int t = PyObject_IsInstance(x, g_tensor);
      if (t < 0) goto done;
      if (!t && is_seq(x)) t = has_tensor(x);
      if (t < 0) goto done;
      if (t) goto slow;  /* a host tensor beside cuda ones (a 0-dim scalar), a subclass, or tensors in a list */
      PyTuple_SET_ITEM(unwrapped, i, Py_NewRef(x));
      PyObject *part = sig(x);
      if (!part) goto done;
      PyTuple_SET_ITEM(key, i + 1, part);
    }
  }
  if (nkw) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(kwargs, &pos, &k, &v)) {
      if (plain && is_plain(v)) {  /* a plain op's tensor keyword (out=): its data or meta, as its arguments' */
        PyObject *m = PyObject_GetAttr(v, s_is_meta);
        if (!m) goto done;
        if (m == Py_True) meta = 1;
        else data = 1;
        Py_DECREF(m);
        kw_tensor = 1;
        continue;
      }
      int t = PyObject_IsInstance(v, g_tensor);
      if (t < 0) goto done;
      if (!t && is_seq(v)) t = has_tensor(v);
      if (t < 0) goto done;
      if (t) goto slow;
    }
    PyObject *items = PyDict_Items(kwargs);
    PyObject *tup = items ? PyList_AsTuple(items) : NULL;
    Py_XDECREF(items);
    PyObject *part = tup ? PyObject_CallOneArg(g_sig, tup) : NULL;
    Py_XDECREF(tup);
    if (!part) goto done;
    PyTuple_SET_ITEM(key, n + 1, part);
  }
  int phantom = dtruth(sd, session, s_phantom);
  if (phantom < 0) goto done;
  if (meta && (data || !phantom)) goto slow;  /* phantom data beside real data, or real mode's meta bookkeeping */
  if (!meta && data && phantom) goto slow;  /* values in phantom mode: run_op keeps them only for index-sized outputs */
  if (phantom) {
    int special = PySet_Contains(g_phantom_special, op);
    if (special < 0) goto done;
    if (special) {
      int to_copy = PyObject_RichCompareBool(op, g_to_copy_id, Py_EQ);
      if (to_copy < 0) goto done;
      if (!to_copy) goto slow;
      if (!(kw = kwargs ? Py_NewRef(kwargs) : PyDict_New())) goto done;
      PyObject *c = PyObject_CallOneArg(g_casts_to_index, kw);
      if (!c) goto done;
      int casts = PyObject_IsTrue(c);
      Py_DECREF(c);
      if (casts < 0) goto done;
      if (casts) goto slow;
    }
  }
  {
    int joined = dtruth(sd, session, s_by_storage);
    if (joined < 0) goto done;
    if (joined && kw_tensor) goto slow;  /* the general route joins the keywords' tensors too */
    if (joined) {
      PyObject *elems = PyList_New(0);
      if (!elems) goto done;
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(args, i);
        if ((plain ? is_plain(x) : PyObject_TypeCheck(x, (PyTypeObject *)g_simcuda)) &&
            PyList_Append(elems, PyTuple_GET_ITEM(unwrapped, i)) < 0) {
          Py_DECREF(elems);
          goto done;
        }
      }
      PyObject *r = PyObject_CallMethodObjArgs(session, s_join_tensors, elems, NULL);
      Py_DECREF(elems);
      if (!r) goto done;
      Py_DECREF(r);
    }
  }
  a = unwrapped;  /* borrowed alias: the unwrapped arguments, run */
  if (g_call_op && g_call_op(func, a, nkw ? kwargs : NULL, &out)) {
    if (!out) goto done;
  } else {
    if (!(opfn = PyObject_GetAttr(func, s_op))) goto done;
    if (!(out = PyObject_Call(opfn, a, nkw ? kwargs : NULL))) goto done; /* what OpOverload.__call__ runs */
  }
  if (!(mem = dget(sd, session, s_memory))) goto done;
  if (last) {
    if (!(index = PyObject_GetAttr(last, s_sim_index))) goto done;
  } else if (!(index = PyLong_FromLong(0))) goto done;
  if (!kw && !(kw = kwargs ? Py_NewRef(kwargs) : PyDict_New())) goto done;
  if (!is_plain(out) && plain) {
    result = PyObject_CallFunctionObjArgs(g_plain_tail, session, name, func, a, kw, out, NULL);
    goto done;
  }
  if (!is_plain(out)) {
    result = PyObject_CallFunctionObjArgs(g_tail, session, name, func, a, kw, out, args, index,
                                          phantom ? Py_True : Py_False, NULL);
    goto done;
  }
  tensor_info_t oi;
  const tensor_info_t *known = info(out, &oi) ? &oi : NULL;
  {
    PyObject *md = dict_of(mem);
    int enabled = md ? dtruth(md, mem, s_enabled) : -1;
    Py_XDECREF(md);
    if (enabled < 0 || (enabled && on_tensor(mem, out, func, known) < 0)) goto done;
  }
  if (!(shape = PyObject_GetAttr(out, s_shape)) || !(dtype = PyObject_GetAttr(out, s_dtype))) goto done;
  int charged = phantom;
  if (!charged && known) charged = !known->is_meta;
  else if (!charged) {
    PyObject *m = PyObject_GetAttr(out, s_is_meta);
    if (!m) goto done;
    charged = m != Py_True;
    Py_DECREF(m);
  }
  if (charged) {
    Py_ssize_t at = n + 1 + (nkw ? 1 : 0);
    PyObject *part = PyTuple_Pack(2, shape, dtype);
    if (!part) goto done;
    PyTuple_SET_ITEM(key, at, part);
    PyObject *prec = PyDict_GetItemWithError(g_precision, s_value);  /* the cached value, else torch's */
    if (prec && PyObject_IsTrue(prec) == 1) Py_INCREF(prec);
    else if (PyErr_Occurred() || !(prec = PyObject_CallNoArgs(g_matmul_precision))) goto done;
    PyTuple_SET_ITEM(key, at + 1, prec);
    if (!(model = dget(sd, session, s_model))) goto done;
    if (odd) {  /* a matrix product under a model `by_layout` is keyed by its operands' layout too */
      int lay = PySet_Contains(g_layout_ops, op);
      if (lay > 0) {
        PyObject *by = PyObject_GetAttr(model, s_by_layout);
        lay = by ? PyObject_IsTrue(by) : -1;
        Py_XDECREF(by);
      }
      if (lay < 0 || (lay && lay_out(key, unwrapped) < 0)) goto done;
    }
    if (!(keyed = PyObject_GetAttr(model, s_keyed))) goto done;
    if (PyDict_CheckExact(keyed)) {  /* the model's cache of `cost_keyed`, read here */
      cost = PyDict_GetItemWithError(keyed, key);
      if (cost) Py_INCREF(cost);
      else if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) goto done;  /* an unhashable argument */
        PyErr_Clear();
      }
    }
    if (!cost && !(cost = PyObject_CallMethodObjArgs(model, s_cost_keyed, key, func, a, kw, out, NULL))) goto done;
    if (charge(session, sd, name, cost) < 0) goto done;
  }
  if (plain) {  /* the op's own output (an in-place op's is its input) */
    result = Py_NewRef(out);
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    if (PyTuple_GET_ITEM(unwrapped, i) == out) {  /* an in-place op returns its input */
      result = Py_NewRef(PyTuple_GET_ITEM(args, i));
      goto done;
    }
  }
  result = wrap_output(out, index, shape, dtype, known);
  goto done;
slow:
  result = Py_NewRef(g_slow);
done:
  Py_XDECREF(op); Py_XDECREF(name); Py_XDECREF(sd); Py_XDECREF(unwrapped); Py_XDECREF(key); Py_XDECREF(out);
  Py_XDECREF(mem); Py_XDECREF(index); Py_XDECREF(opfn); Py_XDECREF(shape); Py_XDECREF(dtype);
  Py_XDECREF(model); Py_XDECREF(keyed); Py_XDECREF(cost); Py_XDECREF(kw);
  return result;
}

static PyObject *py_device_op(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
  if (!g_ready) {
    PyErr_SetString(PyExc_RuntimeError, "phantora's _fastop is not configured");
    return NULL;
  }
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "device_op(session, func, args, kwargs)");
    return NULL;
  }
  PyObject *kwargs = argv[3] == Py_None ? NULL : argv[3];
  return device_op(argv[0], argv[1], argv[2], kwargs, 0);
}

static PyObject *py_device_op(PyObject *self, PyObject *const *argv, Py_ssize_t nargs);

/* ---- the dispatch mode's entry: ChargeMode.__torch_dispatch__, bound to its mode ---- */
typedef struct {
  PyObject_HEAD
  PyObject *python;  /* the class's __torch_dispatch__ (a plain function of the mode) */
} Fallback;

static PyObject *mode_dispatch(PyObject *mode, PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames);

static PyMethodDef dispatch_def = {"__torch_dispatch__", (PyCFunction)(void (*)(void))mode_dispatch,
                                   METH_FASTCALL | METH_KEYWORDS, "ChargeMode.__torch_dispatch__ in C"};

static PyObject *g_python_dispatch; /* ChargeMode's Python __torch_dispatch__ (function of mode, func, types, args, kwargs) */

static PyObject *call_python(PyObject *mode, PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames) {
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject *stack[16];
  if (nargs + nkw + 1 > 16) {
    PyErr_SetString(PyExc_TypeError, "__torch_dispatch__: too many arguments");
    return NULL;
  }
  stack[0] = mode;
  for (Py_ssize_t i = 0; i < nargs + nkw; i++) stack[i + 1] = argv[i];
  return PyObject_Vectorcall(g_python_dispatch, stack, nargs + 1, kwnames);
}

/* routes.py's flags for operator `func` (HOST | OTHER), or -1 with an error */
static long route_flags(PyObject *func) {
  PyObject *id = PyLong_FromVoidPtr(func);
  if (!id) return -1;
  PyObject *e = PyDict_GetItemWithError(g_route_funcs, id);
  Py_DECREF(id);
  if (e && PyTuple_CheckExact(e) && PyTuple_GET_SIZE(e) == 2 && PyTuple_GET_ITEM(e, 0) == func)
    return PyLong_AsLong(PyTuple_GET_ITEM(e, 1));
  if (PyErr_Occurred()) return -1;
  PyObject *r = PyObject_CallOneArg(g_func_flags, func);
  if (!r) return -1;
  long f = PyLong_AsLong(r);
  Py_DECREF(r);
  return f;
}

/* routes.py's kind of tensor type `t` (0 plain, 1 another subclass's, 2 the Python route's), or -1 with an error */
static long type_kind(PyObject *t) {
  PyObject *k = PyDict_GetItemWithError(g_route_types, t);
  if (k) return PyLong_AsLong(k);
  if (PyErr_Occurred()) return -1;
  PyObject *r = PyObject_CallOneArg(g_type_kind, t);
  if (!r) return -1;
  long v = PyLong_AsLong(r);
  Py_DECREF(r);
  return v;
}

/* Is the op one the Python route (`__torch_dispatch__`, `_general`, `_charged`) would only run (ROUTE_HOST: a CUDA
   program's host op, as `pinned.host_op` runs it) or answer NotImplemented (ROUTE_OTHER: another subclass's tensors,
   e.g. DTensor)? The same checks (simcuda/routes.py): 1 yes, 0 no (an error in a check is cleared: the Python route
   decides then). */
static int quick_route(PyObject *mode, PyObject *func, PyObject *types, PyObject *kwargs, int route) {
  if (!g_route_funcs) return 0;
  if (!g_orig_general) {  /* the methods quick_route stands for (routes.PYTHON_ROUTE, set as dispatch.py loads) */
    PyObject *pr = PyDict_GetItemWithError(g_routes, s_python_route);
    if (!pr || !PyTuple_CheckExact(pr) || PyTuple_GET_SIZE(pr) != 2) goto no;
    g_orig_general = Py_NewRef(PyTuple_GET_ITEM(pr, 0));
    g_orig_charged = Py_NewRef(PyTuple_GET_ITEM(pr, 1));
  }
  PyTypeObject *mt = Py_TYPE(mode);  /* the class's routes not replaced (a test counting them) */
  if (_PyType_Lookup(mt, s_general) != g_orig_general || _PyType_Lookup(mt, s_charged) != g_orig_charged) return 0;
  PyObject *dop = PyDict_GetItemWithError(g_fastpath, s_device_op);  /* a test or a benchmark replaced it */
  if (!dop || !PyCFunction_Check(dop) || PyCFunction_GET_FUNCTION(dop) != (PyCFunction)(void (*)(void))py_device_op)
    goto no;
  if (kwargs && PyDict_Contains(kwargs, s_device)) goto no;  /* a factory or copy onto the simulated GPU */
  if (kwargs && route == ROUTE_HOST && PyDict_Contains(kwargs, s_pin_memory)) goto no;
  long flags = route_flags(func);
  if (flags < 0 || !(flags & route)) goto no;
  if (route == ROUTE_OTHER) {
    int other = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); i++) {
      long k = type_kind(PyTuple_GET_ITEM(types, i));
      if (k < 0 || k > 1) goto no;
      other |= k == 1;
    }
    if (!other) goto no;
  } else {
    PyObject *installed = PyDict_GetItemWithError(g_device, s_installed);
    PyObject *depth = installed == Py_True ? PyDict_GetItemWithError(g_tensor_module, s_device_depth) : NULL;
    if (!depth || !PyLong_CheckExact(depth) || PyLong_AsLong(depth) != 0) goto no;  /* an op of the GPU */
  }
  PyObject *md = dict_of(mode);
  if (!md) goto no;
  PyObject *thread = PyDict_GetItemWithError(md, s_thread);  /* gloo worker threads inherit the mode */
  PyObject *session = PyDict_GetItemWithError(md, s_session);
  int ok = thread && session && PyLong_CheckExact(thread) &&
           PyLong_AsUnsignedLong(thread) == PyThread_get_thread_ident();
  Py_XINCREF(session);
  Py_DECREF(md);
  PyObject *sd = ok ? dict_of(session) : NULL, *host = sd ? dget(sd, session, s_host) : NULL;
  ok = host == Py_None;  /* the target host not modelled (runtime/hostwork.py) */
  Py_XDECREF(host);
  if (ok && route == ROUTE_OTHER) {
    ok = dtruth(sd, session, s_internal) == 0;  /* not the session's own work */
    if (ok) {  /* not shape propagation under a FakeTensorMode (the Python route runs the op then) */
      PyObject *fake = PyObject_CallOneArg(g_get_mode, g_fake_key);
      ok = fake == Py_None;
      Py_XDECREF(fake);
    }
  }
  Py_XDECREF(sd);
  Py_XDECREF(session);
  if (ok) return 1;
no:
  PyErr_Clear();
  return 0;
}

/* The op answered by quick_route, or by the Python route */
static PyObject *route_or_python(PyObject *mode, PyObject *const *argv, Py_ssize_t nargs, PyObject *func,
                                 PyObject *types, PyObject *args, PyObject *kwargs, int route) {
  if (!quick_route(mode, func, types, kwargs, route)) return call_python(mode, argv, nargs, NULL);
  if (route == ROUTE_OTHER) Py_RETURN_NOTIMPLEMENTED;
  PyObject *out = NULL;  /* pinned.host_op: `func(*args, **kwargs)`, which is `func._op(*args, **kwargs)` */
  if (g_call_op && g_call_op(func, args, kwargs, &out)) return out;
  PyObject *opfn = PyObject_GetAttr(func, s_op);
  if (!opfn) return NULL;
  out = PyObject_Call(opfn, args, kwargs);
  Py_DECREF(opfn);
  return out;
}

static PyObject *mode_op(PyObject *mode, PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames) {
  if (kwnames || nargs < 2 || nargs > 4) return call_python(mode, argv, nargs, kwnames);
  PyObject *func = argv[0], *types = argv[1];
  PyObject *args = nargs > 2 ? argv[2] : NULL;
  PyObject *kwargs = nargs > 3 && argv[3] != Py_None ? argv[3] : NULL;
  if (!args || !PyTuple_CheckExact(args) || (kwargs && !PyDict_CheckExact(kwargs)))
    return call_python(mode, argv, nargs, kwnames);
  if (!PyTuple_CheckExact(types)) return call_python(mode, argv, nargs, kwnames);
  /* plain tensors only, in a program that has made no cuda tensor: its ops are GPU work (ChargeMode._charged) */
  int plain = 1;  /* no subclass among the types (torch lists a plain tensor's type for some ops: detach) */
  for (Py_ssize_t i = 0; plain && i < PyTuple_GET_SIZE(types); i++) {
    PyObject *t = PyTuple_GET_ITEM(types, i);
    plain = t == g_tensor || t == g_param;
  }
  if (plain) {
    PyObject *seen = PyDict_GetItemWithError(g_tensor_module, s_seen);
    if (seen != Py_False) {
      if (PyErr_Occurred()) return NULL;
      if (seen == Py_True) return route_or_python(mode, argv, nargs, func, types, args, kwargs, ROUTE_HOST);
      return call_python(mode, argv, nargs, kwnames);
    }
  } else if (PyTuple_GET_SIZE(types) != 1 || PyTuple_GET_ITEM(types, 0) != g_simcuda)
    return route_or_python(mode, argv, nargs, func, types, args, kwargs, ROUTE_OTHER);
  if (kwargs) {
    int dev = PyDict_Contains(kwargs, s_device);
    if (dev < 0) return NULL;
    if (dev) return call_python(mode, argv, nargs, kwnames);
  }
  PyObject *dop = PyDict_GetItemWithError(g_fastpath, s_device_op);  /* a test or a benchmark replaced it */
  if (!dop || !PyCFunction_Check(dop) || PyCFunction_GET_FUNCTION(dop) != (PyCFunction)(void (*)(void))py_device_op) {
    if (PyErr_Occurred()) return NULL;
    return call_python(mode, argv, nargs, kwnames);
  }
  PyObject *md = dict_of(mode);
  if (!md) return NULL;
  PyObject *thread = PyDict_GetItemWithError(md, s_thread);  /* gloo worker threads inherit the mode */
  if (!thread || !PyLong_CheckExact(thread) || PyLong_AsUnsignedLong(thread) != PyThread_get_thread_ident()) {
    Py_DECREF(md);
    PyErr_Clear();
    return call_python(mode, argv, nargs, kwnames);
  }
  PyObject *installed = PyDict_GetItemWithError(g_device, s_installed);
  PyObject *fake = installed == Py_True || plain ? PyObject_CallOneArg(g_get_mode, g_fake_key) : NULL;
  if (!fake) {
    Py_DECREF(md);
    if (PyErr_Occurred()) return NULL;
    return call_python(mode, argv, nargs, kwnames);
  }
  int shapes_only = fake != Py_None;  /* shape propagation (DTensor's, the compiler's) */
  Py_DECREF(fake);
  PyObject *session = shapes_only ? NULL : PyDict_GetItemWithError(md, s_session);
  if (!session) {
    Py_DECREF(md);
    if (PyErr_Occurred()) return NULL;
    return call_python(mode, argv, nargs, kwnames);
  }
  Py_INCREF(session);
  Py_DECREF(md);
  PyObject *out = device_op(session, func, args, kwargs, plain);
  Py_DECREF(session);
  if (out != g_slow) return out;
  Py_DECREF(out);
  PyObject *kw = kwargs ? Py_NewRef(kwargs) : PyDict_New();
  if (!kw) return NULL;
  PyObject *r = PyObject_CallMethodObjArgs(mode, s_general, func, types, args, kw, NULL);  /* the general route */
  Py_DECREF(kw);
  return r;
}

/* Is `v` the int `me`? */
static int is_ident(PyObject *v, unsigned long me) {
  if (!v || !PyLong_CheckExact(v)) return 0;
  unsigned long x = PyLong_AsUnsignedLong(v);
  if (x == (unsigned long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  return x == me;
}

/* ChargeMode.__torch_dispatch__: `mode_op`, in turn with other threads' ops while threads the program started live.
   Then the mode's `_turns` is its lock (else None, or absent in an older dispatch.py), and an op of the program's
   thread (the mode's `thread`) holds it from here to its end, kernel included (a kernel lets other threads run),
   its thread ident in `_holder`, as the Python route's `_off_thread` does for the other threads' ops; an op within
   an op the thread holds it for goes straight on (the lock is not re-entrant). */
static PyObject *mode_dispatch(PyObject *mode, PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *md = dict_of(mode);
  if (!md) return NULL;
  PyObject *turns = PyDict_GetItemWithError(md, s_turns);
  unsigned long me = PyThread_get_thread_ident();
  if (!turns || turns == Py_None || !is_ident(PyDict_GetItemWithError(md, s_thread), me) ||
      is_ident(PyDict_GetItemWithError(md, s_holder), me)) {
    Py_DECREF(md);
    if (PyErr_Occurred()) return NULL;
    return mode_op(mode, argv, nargs, kwnames);
  }
  Py_INCREF(turns);
  PyObject *r = PyObject_CallMethodNoArgs(turns, s_acquire);  /* waits with the GIL released */
  PyObject *ident = r ? PyLong_FromUnsignedLong(me) : NULL;
  Py_XDECREF(r);
  if (!ident) {
    Py_DECREF(turns);
    Py_DECREF(md);
    return NULL;  /* not acquired (an interrupt) */
  }
  PyObject *out = PyDict_SetItem(md, s_holder, ident) < 0 ? NULL : mode_op(mode, argv, nargs, kwnames);
  Py_DECREF(ident);
  PyObject *type, *value, *tb;  /* the op's error, if any, kept across the hand-back */
  PyErr_Fetch(&type, &value, &tb);
  int ok = PyDict_SetItem(md, s_holder, Py_None) == 0;
  r = PyObject_CallMethodNoArgs(turns, s_release);
  ok = ok && r;
  Py_XDECREF(r);
  Py_DECREF(turns);
  Py_DECREF(md);
  if (!ok) {
    Py_CLEAR(out);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return NULL;
  }
  PyErr_Restore(type, value, tb);
  return out;
}

static PyObject *py_bind(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
  if (!g_ready || nargs != 2) {
    PyErr_SetString(PyExc_RuntimeError, "bind(mode, python_dispatch), after configure");
    return NULL;
  }
  Py_XSETREF(g_python_dispatch, Py_NewRef(argv[1]));
  return PyCFunction_NewEx(&dispatch_def, argv[0], NULL);
}

static int take(PyObject *kw, const char *name, PyObject **slot) {
  PyObject *v = PyDict_GetItemString(kw, name);
  if (!v) {
    PyErr_Format(PyExc_KeyError, "_fastop.configure: missing %s", name);
    return -1;
  }
  Py_INCREF(v);
  Py_XSETREF(*slot, v);
  return 0;
}

static int offset_of(PyObject *type, const char *slot, Py_ssize_t *off) {
  PyObject *d = PyObject_GetAttrString(type, slot);
  if (!d) return -1;
  int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
  if (ok) *off = ((PyMemberDescrObject *)d)->d_member->offset;
  Py_DECREF(d);
  if (!ok) PyErr_Format(PyExc_TypeError, "_fastop.configure: %s is not a slot", slot);
  return ok ? 0 : -1;
}

static PyObject *py_configure(PyObject *self, PyObject *args, PyObject *kw) {
  if (!kw) {
    PyErr_SetString(PyExc_TypeError, "configure(**objects)");
    return NULL;
  }
  PyObject *small = NULL;
  if (take(kw, "simcuda", &g_simcuda) || take(kw, "tensor", &g_tensor) || take(kw, "param", &g_param) ||
      take(kw, "slow", &g_slow) || take(kw, "plans", &g_plans) || take(kw, "plan", &g_plan) ||
      take(kw, "phantom_special", &g_phantom_special) || take(kw, "to_copy_id", &g_to_copy_id) ||
      take(kw, "casts_to_index", &g_casts_to_index) || take(kw, "sig", &g_sig) ||
      take(kw, "precision", &g_precision) || take(kw, "matmul_precision", &g_matmul_precision) ||
      take(kw, "tail", &g_tail) || take(kw, "wrap_output", &g_wrap_output) ||
      take(kw, "make_wrapper", &g_make_wrapper) || take(kw, "cuda", &g_cuda) ||
      take(kw, "contiguous", &g_contiguous) || take(kw, "contiguous_fn", &g_contiguous_fn) ||
      take(kw, "strided", &g_strided) || take(kw, "entry", &g_entry) || take(kw, "hooked", &g_hooked) ||
      take(kw, "tracker", &g_tracker_type) ||
      take(kw, "session", &g_session_type) || take(kw, "device", &g_device) ||
      take(kw, "tensor_module", &g_tensor_module) || take(kw, "plain_tail", &g_plain_tail) || take(kw, "get_mode", &g_get_mode) ||
      take(kw, "fake_key", &g_fake_key) || take(kw, "temp", &g_temp) || take(kw, "fastpath", &g_fastpath) ||
      take(kw, "small_size", &small) || take(kw, "trace_op", &g_trace_op) || take(kw, "layout_ops", &g_layout_ops))
    return NULL;
  g_small_size = PyLong_AsLongLong(small);
  Py_DECREF(small);
  if (PyErr_Occurred() || take(kw, "layout_grid", &small)) return NULL;
  g_layout_grid = PyLong_AsLongLong(small);
  Py_DECREF(small);
  if (PyErr_Occurred()) return NULL;
  if (g_layout_grid <= 0) {
    PyErr_SetString(PyExc_ValueError, "_fastop.configure: layout_grid must be positive");
    return NULL;
  }
  if (PyErr_Occurred() || take(kw, "report_check_ops", &small)) return NULL;
  g_report_check_ops = PyLong_AsLongLong(small);
  Py_DECREF(small);
  if (PyErr_Occurred()) return NULL;
  PyObject *routes = PyDict_GetItemString(kw, "routes");  /* optional (an older compiled.py): no quick routes */
  if (routes) {
    PyObject *f = PyDict_Check(routes) ? PyDict_GetItemString(routes, "FUNCS") : NULL;
    PyObject *t = PyDict_Check(routes) ? PyDict_GetItemString(routes, "TYPES") : NULL;
    PyObject *ff = PyDict_Check(routes) ? PyDict_GetItemString(routes, "func_flags") : NULL;
    PyObject *tk = PyDict_Check(routes) ? PyDict_GetItemString(routes, "type_kind") : NULL;
    if (!f || !t || !ff || !tk || !PyDict_Check(f) || !PyDict_Check(t)) {
      PyErr_SetString(PyExc_TypeError, "_fastop.configure: routes is not simcuda/routes.py's dict");
      return NULL;
    }
    Py_XSETREF(g_routes, Py_NewRef(routes));
    Py_XSETREF(g_route_funcs, Py_NewRef(f));
    Py_XSETREF(g_route_types, Py_NewRef(t));
    Py_XSETREF(g_func_flags, Py_NewRef(ff));
    Py_XSETREF(g_type_kind, Py_NewRef(tk));
  }
  if (!PyDict_Check(g_plans) || !PyAnySet_Check(g_phantom_special) || !PyAnySet_Check(g_layout_ops) || !PyDict_Check(g_precision) ||
      !PyTuple_Check(g_cuda) || !PyDict_Check(g_contiguous) || !PyDict_Check(g_device) || !PyDict_Check(g_tensor_module) || !PyDict_Check(g_fastpath) || !PyType_Check(g_simcuda) ||
      !PyType_Check(g_tensor) || !PyType_Check(g_param) || !PyLong_Check(g_temp)) {
    PyErr_SetString(PyExc_TypeError, "_fastop.configure: an object of the wrong type");
    return NULL;
  }
  if (!PyType_Check(g_hooked)) {
    PyErr_SetString(PyExc_TypeError, "_fastop.configure: hooked is not a class");
    return NULL;
  }
  PyObject *kinds[2] = {g_entry, g_hooked};
  for (int k = 0; k < 2; k++)
    if (offset_of(kinds[k], "cat", &g_off_cat[k]) || offset_of(kinds[k], "changed", &g_off_changed[k]) ||
        offset_of(kinds[k], "key", &g_off_key[k]) || offset_of(kinds[k], "site", &g_off_site[k]) ||
        offset_of(kinds[k], "size", &g_off_size[k]))
      return NULL;
  g_ready = 1;
  Py_RETURN_NONE;
}

/* py_set_NAME(address): a native function's address (or 0, to go without it) into `slot`, as its `type`. */
#define ADDRESS_SETTER(name, slot, type)                            \
  static PyObject *py_set_##name(PyObject *self, PyObject *addr) { \
    void *p = PyLong_AsVoidPtr(addr);                               \
    if (!p && PyErr_Occurred()) return NULL;                        \
    slot = (type)p;                                                 \
    Py_RETURN_NONE;                                                 \
  }

ADDRESS_SETTER(tensor_info, g_info, tensor_info_fn)
ADDRESS_SETTER(wrapper, g_wrap, wrap_fn)
ADDRESS_SETTER(storage_hook, g_hook, hook_fn)
ADDRESS_SETTER(op_call, g_call_op, call_op_fn)

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))py_configure, METH_VARARGS | METH_KEYWORDS,
     "Give the module the Python objects it transcribes against (fastpath.py, once)."},
    {"device_op", (PyCFunction)(void (*)(void))py_device_op, METH_FASTCALL,
     "fastpath.device_op(session, func, args, kwargs), in C."},
    {"bind", (PyCFunction)(void (*)(void))py_bind, METH_FASTCALL, "ChargeMode.__torch_dispatch__ in C, bound to `mode`."},
    {"set_tensor_info", py_set_tensor_info, METH_O,
     "The address of tensorinfo.cc's phantora_tensor_info, or 0: read tensors' metadata through Python."},
    {"set_wrapper", py_set_wrapper, METH_O,
     "The address of tensorinfo.cc's phantora_wrap_contiguous, or 0: make wrappers by _make_wrapper_subclass."},
    {"set_storage_hook", py_set_storage_hook, METH_O,
     "The address of tensorinfo.cc's phantora_hook_storage, or 0: a weak reference on every new storage's object."},
    {"set_op_call", py_set_op_call, METH_O,
     "The address of opcall.cc's phantora_call_op, or 0: run each op by its OpOverload's `_op`."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastop", "The simulated GPU's per-op fast path in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fastop(void) {
  if (intern_all() < 0) return NULL;
  return PyModule_Create(&module);
}
