/* cupyops._cfast: the per-call work of a memoized fast call (cupyops/_fast.py), in C.

   A decode-sized operator call runs a few microseconds of GPU work, so its host time is
   what a decode loop pays. Per call, _fast.FastCalls finds the call's FastCall by a key
   (the operator's spec with the signature functions of its arrays), and the FastCall reads
   the input addresses, picks the launch list by their alignment, makes the output (CuPy:
   the last one again once nothing refers to it; torch: torch's allocator), carves the
   workspace, writes the addresses into the launches' packed parameter blocks and calls
   cuLaunchKernel. In Python that is a few hundred bytecodes and a Python-level driver
   wrapper per launch; here (Finder, Replay, cupy_sig, torch_sig) it is the same steps with
   the interpreter out of the way, but for the spec, which stays the operator's own Python
   where it is not declared. The public operator itself is an Operator (below): it takes
   the caller's arguments as they are passed, with no Python frame, tuple or dict between
   them and the Finder, which runs a found FastCall (a Replay) directly; the current
   device comes from the driver (current_device), not from a Python call.
   It is an optional extension: where it was not compiled, the Python methods run, with the
   same results; FastCall and FastCalls use these in place of their methods when it was.

   The parameter blocks are _launch.DirectLaunch's (packed once, kept alive by the Replay):
   a Replay only writes addresses into them and launches. Everything between writing them
   and the driver's launch runs with the GIL held and calls no Python, so two threads
   never interleave there. A kept output array is in use from the moment a call takes a
   reference to it (its count then says so to any other thread); the kept workspace is
   taken out of the Replay while a call uses it and put back only if the stream is still
   the kept one: no lock is needed. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>

/* cuLaunchKernel's C signature (CUresult is an int-sized enum): the address comes from
   Python (ctypes on libcuda.so.1, or a stand-in in the CPU tier), so no CUDA header is
   needed to build this file. */
typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned smem, void *stream, void **params, void **extra);

typedef struct {
    launch_fn launch;
    void *func;
    unsigned geom[7]; /* grid x, y, z, block x, y, z, dynamic shared memory */
    void **params;     /* the DirectLaunch's parameter block */
    uint64_t *slots;   /* its address slots, in kernel order */
    Py_ssize_t n_slots;
    Py_ssize_t *pick;  /* for each slot, its index among the call's addresses */
} Launch;

typedef struct {
    Py_ssize_t n; /* -1: no list (the checked path's turn) */
    Launch *launches;
} LaunchList;

typedef struct {
    PyObject_HEAD
    LaunchList lists[2];   /* [some input off 16 bytes, all aligned] */
    PyObject *owners;      /* the DirectLaunches whose buffers the launches use */
    Py_ssize_t n_inputs;
    Py_ssize_t n_work;
    uint64_t *work_offsets;
    Py_ssize_t work_bytes;
    int keep_output, keep_work;
    PyObject *shape, *dtype; /* of the output */
    long device;
    /* CuPy: the ndarray type, the allocator, the current stream's address */
    PyObject *ndarray, *alloc, *stream_of;
    /* the last output array (its MemoryPointer, memory object, strides, address) and the
       workspace, kept for the next call on kept_stream */
    PyObject *kept_y, *kept_block, *kept_mem, *kept_strides, *kept_work;
    uint64_t kept_ptr;
    uintptr_t kept_stream;
    Py_ssize_t free_block_refs, free_mem_refs; /* a block nothing else holds (-1: not read yet) */
    /* torch: the output's form (0 fn(first), 1 first.new_empty(shape), 2 fn()), the
       current device, torch's stream query and caching allocator */
    int torch_form;
    PyObject *torch_make, *get_device, *raw_stream, *raw_alloc, *raw_delete;
    int ready; /* initialised (a FastCall, a subclass, may leave it not: _fast.FastCall) */
} Replay;

#define MAX_ADDRS 64 /* inputs, the output and workspace pieces of one call */

static PyObject *s_data, *s_ptr, *s_mem, *s_data_ptr, *s_new_empty, *s_shape, *s_strides;
static PyObject *launch_error; /* cupyops._cfast.LaunchError */
static PyObject *weakref_count; /* _weakref.getweakrefcount */
/* cuStreamIsCapturing(stream, &status): its address comes through bind(is_capturing=) */
typedef int (*is_capturing_t)(void *stream, int *status);
static is_capturing_t is_capturing_fn;
/* cuCtxGetDevice(&device): its address comes through bind(ctx_get_device=) */
typedef int (*ctx_get_device_t)(int *device);
static ctx_get_device_t ctx_get_device_fn;

/* DLPack's C exchange (dlpack.h 1.3, `__dlpack_c_exchange_api__`: torch 2.11 has it): a
   table of C functions through which a consumer reads a torch tensor's address, shape,
   strides, dtype and device (dltensor_from_py_object_no_sync: no Python call, no reference
   taken) and the current stream of a device (current_work_stream: torch's
   getCurrentCUDAStream), each in tens of nanoseconds where the Python attributes and
   methods cost a tenth to half a microsecond each (NOTES 141). The layouts below are
   dlpack.h's (this file needs no torch or DLPack header); bind_torch_dlpack binds torch's
   table where its major version is 1, and every use falls back to the Python attributes
   where it is unbound or declines a tensor. */
typedef struct {
    int32_t device_type, device_id;
} DLDevice_;
typedef struct {
    uint8_t code, bits;
    uint16_t lanes;
} DLDataType_;
typedef struct {
    void *data;
    DLDevice_ device;
    int32_t ndim;
    DLDataType_ dtype;
    int64_t *shape, *strides; /* strides in elements */
    uint64_t byte_offset;
} DLTensor_;
typedef struct DLPackAPIHeader_ {
    uint32_t major, minor;
    struct DLPackAPIHeader_ *prev_api; /* an older version's table, or NULL */
} DLPackAPIHeader_;
typedef struct {
    DLPackAPIHeader_ header;
    void *managed_tensor_allocator, *managed_tensor_from_py_object_no_sync, *managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor_ *out); /* may be NULL */
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} DLPackExchangeAPI_;
enum { DL_CPU = 1, DL_CUDA = 2 };

static const DLPackExchangeAPI_ *torch_dl; /* bind_torch_dlpack: NULL where unbound */
static PyObject *torch_dl_capsule;          /* the bound capsule (torch's table is a static of torch's) */
/* the torch dtype of each DLPack dtype torch's tensors report (bind_torch_dlpack); None
   where several torch dtypes report it (torch's sub-byte uint1-7 / int1-7 report uint8's
   and int8's): their tensors' dtype attribute is read then */
#define MAX_DL_DTYPES 64
static uint32_t dl_dtype_code[MAX_DL_DTYPES];
static PyObject *dl_dtype_object[MAX_DL_DTYPES];
static Py_ssize_t n_dl_dtypes;

static uint32_t dl_dtype_key(DLDataType_ t) { return t.code | (uint32_t)t.bits << 8 | (uint32_t)t.lanes << 16; }

/* The DLTensor of torch tensor ``t`` (borrowed: valid while ``t`` is unchanged): 0, or -1
   where the table is unbound or declines it (no error left set). */
static int torch_dltensor(PyObject *t, DLTensor_ *out) {
    if (!torch_dl || !torch_dl->dltensor_from_py_object_no_sync) return -1;
    if (torch_dl->dltensor_from_py_object_no_sync(t, out) == 0) return 0;
    PyErr_Clear();
    return -1;
}

/* The address of torch tensor ``t``'s first element (tensor.data_ptr()): 0, or -1 on error. */
static int take_u64(PyObject *o, uint64_t *out);
static int torch_address(PyObject *t, uint64_t *out) {
    DLTensor_ d;
    if (torch_dltensor(t, &d) == 0) {
        *out = (uint64_t)(uintptr_t)d.data + d.byte_offset;
        return 0;
    }
    return take_u64(PyObject_CallMethodNoArgs(t, s_data_ptr), out);
}

/* torch's current stream of CUDA device ``d`` (an address), through the table where bound,
   else ``raw_stream`` (torch._C._cuda_getCurrentRawStream): 0, or -1 with an error set. */
static int torch_stream(PyObject *raw_stream, long d, uint64_t *out) {
    if (torch_dl) {
        void *s = NULL;
        if (torch_dl->current_work_stream(DL_CUDA, (int32_t)d, &s)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "torch's current_work_stream failed");
            return -1;
        }
        *out = (uint64_t)(uintptr_t)s;
        return 0;
    }
    PyObject *dev = PyLong_FromLong(d);
    if (!dev) return -1;
    int rc = take_u64(PyObject_CallOneArg(raw_stream, dev), out);
    Py_DECREF(dev);
    return rc;
}

/* The current device, as CuPy's runtime.getDevice() (cudaGetDevice) answers: the device of
   the context current to this thread. CuPy and torch both work in the primary context of
   their current device (cudaSetDevice makes it current, at once since CUDA 12; CuPy's
   Device.use and torch.cuda.set_device / device guards call it), and the runtime takes its
   current device from the driver's current context; so the driver's cuCtxGetDevice gives
   the same answer with no Python call (and whichever of the process's runtimes asks).
   Where no context is current (a thread that made no CUDA call yet) the answer is 1: a
   launch there fails (CUDA_ERROR_INVALID_CONTEXT), so the call is the checked path's, whose
   runtime calls make the device's primary context current for the thread. Where the
   address is not bound, ``fallback`` (runtime.getDevice) is asked. 0: *device set; -1 on
   error. */
static int current_device(PyObject *fallback, long *device) {
    int d;
    if (ctx_get_device_fn) {
        if (ctx_get_device_fn(&d) != 0) return 1;
        *device = d;
        return 0;
    }
    PyObject *o = fallback ? PyObject_CallNoArgs(fallback) : NULL;
    if (!o) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "no device query bound");
        return -1;
    }
    *device = PyLong_AsLong(o);
    Py_DECREF(o);
    return *device == -1 && PyErr_Occurred() ? -1 : 0;
}

static void free_lists(Replay *r) {
    for (int v = 0; v < 2; v++) {
        LaunchList *l = &r->lists[v];
        for (Py_ssize_t i = 0; i < l->n; i++) PyMem_Free(l->launches[i].pick);
        PyMem_Free(l->launches);
        l->launches = NULL;
        l->n = -1;
    }
}

static int u64(PyObject *o, uint64_t *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)v;
    return 0;
}

/* One launch from (DirectLaunch, pick): the DirectLaunch exposes its driver function's
   address, its cuLaunchKernel head (function, grid, block, smem), the address of its
   parameter block and of its address slots. */
static int read_launch(PyObject *item, Launch *L) {
    PyObject *direct, *pick;
    if (!PyArg_ParseTuple(item, "OO", &direct, &pick)) return -1;
    PyObject *desc = PyObject_CallMethod(direct, "c_description", NULL);
    if (!desc) return -1;
    uint64_t launch, params, slots, head[8];
    PyObject *headt;
    int ok = 0;
    unsigned long long a, b, c;
    Py_ssize_t n_slots;
    if (!PyArg_ParseTuple(desc, "KOKKn", &a, &headt, &b, &c, &n_slots) || !PyTuple_Check(headt) ||
        PyTuple_GET_SIZE(headt) != 8) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "c_description: bad head");
        goto done;
    }
    launch = a, params = b, slots = c;
    for (int i = 0; i < 8; i++)
        if (u64(PyTuple_GET_ITEM(headt, i), &head[i])) goto done;
    PyObject *seq = PySequence_Fast(pick, "pick: a sequence of address indices");
    if (!seq) goto done;
    if (PySequence_Fast_GET_SIZE(seq) != n_slots) {
        PyErr_SetString(PyExc_ValueError, "pick: one index per address slot");
        Py_DECREF(seq);
        goto done;
    }
    L->pick = PyMem_Calloc(n_slots ? n_slots : 1, sizeof(Py_ssize_t));
    if (!L->pick) {
        PyErr_NoMemory();
        Py_DECREF(seq);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_slots; i++) {
        L->pick[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (L->pick[i] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "pick: a negative index");
            Py_DECREF(seq);
            goto done;
        }
    }
    Py_DECREF(seq);
    ok = 1;
    L->launch = (launch_fn)(uintptr_t)launch;
    L->func = (void *)(uintptr_t)head[0];
    for (int i = 0; i < 7; i++) L->geom[i] = (unsigned)head[i + 1];
    L->params = (void **)(uintptr_t)params;
    L->slots = (uint64_t *)(uintptr_t)slots;
    L->n_slots = n_slots;
done:
    if (!ok) { /* (the Replay frees only the launches it counted) */
        PyMem_Free(L->pick);
        L->pick = NULL;
    }
    Py_DECREF(desc);
    return ok ? 0 : -1;
}

static int Replay_init(Replay *r, PyObject *args, PyObject *kw) {
    static char *names[] = {"variants", "n_inputs", "shape", "dtype", "work_offsets", "work_bytes",
                            "keep_output", "keep_work", "device", "ndarray", "alloc", "stream_of",
                            "get_device", NULL};
    PyObject *variants, *work, *shape, *dtype, *ndarray, *alloc, *stream_of, *get_device;
    if (r->owners) {
        PyErr_SetString(PyExc_RuntimeError, "a Replay is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnOOOnpplOOOO", names, &variants, &r->n_inputs, &shape, &dtype,
                                     &work, &r->work_bytes, &r->keep_output, &r->keep_work, &r->device,
                                     &ndarray, &alloc, &stream_of, &get_device))
        return -1;
    r->shape = Py_NewRef(shape), r->dtype = Py_NewRef(dtype), r->ndarray = Py_NewRef(ndarray);
    r->alloc = Py_NewRef(alloc), r->stream_of = Py_NewRef(stream_of), r->get_device = Py_NewRef(get_device);
    r->free_block_refs = r->free_mem_refs = -1;
    r->owners = PyList_New(0);
    if (!r->owners) return -1;
    PyObject *wseq = PySequence_Fast(work, "work_offsets: a sequence");
    if (!wseq) return -1;
    r->n_work = PySequence_Fast_GET_SIZE(wseq);
    r->work_offsets = PyMem_Calloc(r->n_work ? r->n_work : 1, sizeof(uint64_t));
    if (!r->work_offsets) {
        Py_DECREF(wseq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < r->n_work; i++)
        if (u64(PySequence_Fast_GET_ITEM(wseq, i), &r->work_offsets[i])) {
            Py_DECREF(wseq);
            return -1;
        }
    Py_DECREF(wseq);
    if (r->n_inputs < 1 || r->n_inputs + 1 + r->n_work > MAX_ADDRS) {
        PyErr_SetString(PyExc_ValueError, "n_inputs: at least one, and all addresses at most MAX_ADDRS");
        return -1;
    }
    PyObject *vseq = PySequence_Fast(variants, "variants: two launch lists");
    if (!vseq) return -1;
    if (PySequence_Fast_GET_SIZE(vseq) != 2) {
        Py_DECREF(vseq);
        PyErr_SetString(PyExc_ValueError, "variants: two launch lists");
        return -1;
    }
    Py_ssize_t n_addrs = r->n_inputs + 1 + r->n_work;
    for (int v = 0; v < 2; v++) {
        PyObject *list = PySequence_Fast_GET_ITEM(vseq, v);
        if (list == Py_None) continue;
        PyObject *lseq = PySequence_Fast(list, "a launch list: (DirectLaunch, pick) pairs");
        if (!lseq) break;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(lseq);
        r->lists[v].launches = PyMem_Calloc(n ? n : 1, sizeof(Launch));
        r->lists[v].n = 0;
        if (!r->lists[v].launches) PyErr_NoMemory();
        for (Py_ssize_t i = 0; i < n && !PyErr_Occurred(); i++) {
            PyObject *item = PySequence_Fast_GET_ITEM(lseq, i);
            Launch *L = &r->lists[v].launches[i];
            if (read_launch(item, L)) break;
            r->lists[v].n = i + 1;
            for (Py_ssize_t s = 0; s < L->n_slots; s++)
                if (L->pick[s] >= n_addrs) PyErr_SetString(PyExc_ValueError, "pick: an index past the addresses");
            if (!PyErr_Occurred()) PyList_Append(r->owners, PyTuple_GET_ITEM(item, 0));
        }
        Py_DECREF(lseq);
        if (PyErr_Occurred()) break;
    }
    Py_DECREF(vseq);
    if (PyErr_Occurred()) return -1;
    r->ready = 1;
    return 0;
}

static PyObject *Replay_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Replay *r = (Replay *)type->tp_alloc(type, 0);
    if (r) r->lists[0].n = r->lists[1].n = -1;
    return (PyObject *)r;
}

static int Replay_traverse(Replay *r, visitproc visit, void *arg) {
    Py_VISIT(r->owners); Py_VISIT(r->shape); Py_VISIT(r->dtype); Py_VISIT(r->ndarray);
    Py_VISIT(r->alloc); Py_VISIT(r->stream_of); Py_VISIT(r->kept_block); Py_VISIT(r->kept_mem);
    Py_VISIT(r->kept_y); Py_VISIT(r->kept_strides); Py_VISIT(r->kept_work);
    Py_VISIT(r->torch_make); Py_VISIT(r->get_device); Py_VISIT(r->raw_stream);
    Py_VISIT(r->raw_alloc); Py_VISIT(r->raw_delete);
    return 0;
}

static int Replay_clear(Replay *r) {
    r->ready = 0; /* (a cleared Replay is never run again) */
    Py_CLEAR(r->owners); Py_CLEAR(r->shape); Py_CLEAR(r->dtype); Py_CLEAR(r->ndarray);
    Py_CLEAR(r->alloc); Py_CLEAR(r->stream_of); Py_CLEAR(r->kept_block); Py_CLEAR(r->kept_mem);
    Py_CLEAR(r->kept_y); Py_CLEAR(r->kept_strides); Py_CLEAR(r->kept_work);
    Py_CLEAR(r->torch_make); Py_CLEAR(r->get_device); Py_CLEAR(r->raw_stream);
    Py_CLEAR(r->raw_alloc); Py_CLEAR(r->raw_delete);
    return 0;
}

static void Replay_dealloc(Replay *r) {
    PyObject_GC_UnTrack(r);
    Replay_clear(r);
    free_lists(r);
    PyMem_Free(r->work_offsets);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* The launch list for these input addresses: the 16-byte one where every input is 16-byte
   aligned; NULL where that variant has no list (the checked path's turn). */
static LaunchList *pick_list(Replay *r, uint64_t *addrs) {
    uint64_t bits = 0;
    for (Py_ssize_t i = 0; i < r->n_inputs; i++) bits |= addrs[i];
    LaunchList *l = &r->lists[(bits & 15) == 0];
    return l->n < 0 ? NULL : l;
}

/* Write each launch's addresses and launch it on ``stream`` (GIL held, no Python between). */
static int run_list(LaunchList *l, uint64_t *addrs, void *stream) {
    for (Py_ssize_t i = 0; i < l->n; i++) {
        Launch *L = &l->launches[i];
        for (Py_ssize_t s = 0; s < L->n_slots; s++) L->slots[s] = addrs[L->pick[s]];
        int err = L->launch(L->func, L->geom[0], L->geom[1], L->geom[2], L->geom[3], L->geom[4], L->geom[5],
                            L->geom[6], stream, L->params, NULL);
        if (err) {
            PyErr_Format(launch_error, "cuLaunchKernel failed with CUDA error %d", err);
            return -1;
        }
    }
    return 0;
}

/* u64 of a new reference ``o`` (NULL: the call that made it failed), which it releases. */
static int take_u64(PyObject *o, uint64_t *out) {
    if (!o) return -1;
    int rc = u64(o, out);
    Py_DECREF(o);
    return rc;
}

/* Whether ``stream`` is capturing a graph (an error answer counts as capturing: keep nothing). */
static int capturing(uint64_t stream) {
    int status = 0;
    if (!is_capturing_fn) return 0;
    return is_capturing_fn((void *)(uintptr_t)stream, &status) != 0 || status != 0;
}

/* The kept output array, taken for this call, where nothing but the Replay refers to it:
   no other reference to the array, no weak one, no other to its MemoryPointer or to that
   pointer's memory (a view or a MemoryPointer made from it holds one of those), and still
   its shape and strides (``a.shape = ...`` reshapes in place). Reusing the array itself is
   what CuPy's pool would do with its block on this stream, less the ndarray's making.
   NULL: none (an error set only if one occurred). */
static PyObject *take_kept_array(Replay *r) {
    PyObject *y = r->kept_y;
    if (!y || Py_REFCNT(y) != 1 || Py_REFCNT(r->kept_block) != r->free_block_refs + 1 ||
        Py_REFCNT(r->kept_mem) != r->free_mem_refs)
        return NULL;
    Py_INCREF(y); /* from here another thread sees it in use */
    PyObject *weak = PyObject_CallOneArg(weakref_count, y);
    long n_weak = weak ? PyLong_AsLong(weak) : -1;
    Py_XDECREF(weak);
    PyObject *shape = n_weak == 0 ? PyObject_GetAttr(y, s_shape) : NULL;
    PyObject *strides = shape ? PyObject_GetAttr(y, s_strides) : NULL;
    int same = strides && PyObject_RichCompareBool(shape, r->shape, Py_EQ) == 1 &&
               PyObject_RichCompareBool(strides, r->kept_strides, Py_EQ) == 1;
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    if (PyErr_Occurred()) {
        Py_DECREF(y);
        return NULL;
    }
    if (!same) { /* reshaped in place, or watched: never again this call's output */
        Py_DECREF(y);
        if (r->kept_y == y) Py_CLEAR(r->kept_y);
        return NULL;
    }
    return y;
}

/* Read a new output array's address into ``addr``; with ``keep``, make it the kept one
   (with its MemoryPointer, memory object and strides). -1 on error. */
static int remember_array(Replay *r, PyObject *y, int keep, uint64_t stream, uint64_t *addr) {
    PyObject *block = PyObject_GetAttr(y, s_data);
    if (!block || take_u64(PyObject_GetAttr(block, s_ptr), addr)) {
        Py_XDECREF(block);
        return -1;
    }
    if (!keep || r->kept_stream != stream) {
        Py_DECREF(block);
        return 0;
    }
    PyObject *mem = PyObject_GetAttr(block, s_mem);
    PyObject *strides = mem ? PyObject_GetAttr(y, s_strides) : NULL;
    if (!strides) {
        Py_DECREF(block);
        Py_XDECREF(mem);
        return -1;
    }
    if (r->free_block_refs < 0) {
        /* the counts take_kept_array compares with, read now: the block held by y and by
           us (as it will be by y and the Replay), its memory object by the block and us */
        r->free_block_refs = Py_REFCNT(block) - 1;
        r->free_mem_refs = Py_REFCNT(mem);
    }
    Py_INCREF(y);
    Py_XSETREF(r->kept_y, y);
    Py_XSETREF(r->kept_block, block);
    Py_XSETREF(r->kept_mem, mem);
    Py_XSETREF(r->kept_strides, strides);
    r->kept_ptr = *addr;
    return 0;
}

/* The call's inputs as a tuple the Replay may hold across the call (a list, which the
   Python calls inside could change, is copied); NULL with an error where they are not
   the Replay's count, or the Replay is not initialised (a FastCall without C replay). */
static PyObject *input_tuple(Replay *r, PyObject *seq, const char *what) {
    if (!r->ready) {
        PyErr_SetString(PyExc_RuntimeError, "a Replay not initialised");
        return NULL;
    }
    if (!(PyTuple_Check(seq) || PyList_Check(seq)) || PySequence_Fast_GET_SIZE(seq) != r->n_inputs) {
        PyErr_Format(PyExc_TypeError, "%s: a tuple of the call's inputs", what);
        return NULL;
    }
    return PyTuple_Check(seq) ? Py_NewRef(seq) : PyList_AsTuple(seq);
}

/* As FastCall.cupy, on the call's n_inputs arrays (references the caller holds across). */
static PyObject *replay_cupy(Replay *r, PyObject *const *arrays) {
    uint64_t addrs[MAX_ADDRS];
    for (Py_ssize_t i = 0; i < r->n_inputs; i++) {
        PyObject *a = arrays[i];
        if (a == Py_None) {
            addrs[i] = 0;
            continue;
        }
        PyObject *data = PyObject_GetAttr(a, s_data);
        if (!data) return NULL;
        PyObject *ptr = PyObject_GetAttr(data, s_ptr);
        Py_DECREF(data);
        if (take_u64(ptr, &addrs[i])) return NULL;
    }
    LaunchList *list = pick_list(r, addrs);
    if (!list) Py_RETURN_NONE;
    uint64_t stream;
    if (take_u64(PyObject_CallNoArgs(r->stream_of), &stream)) return NULL;
    /* while the stream captures a graph nothing is kept or reused: the graph goes on using
       its blocks, replayed on whatever stream, after the call (NOTES 78) */
    int keep = !capturing(stream);
    if (keep && r->kept_stream != stream) { /* blocks kept for another stream are not this one's */
        /* the fields first, then the releases: releasing may run Python (CuPy's pool) and let
           another thread in, which must find the Replay consistent */
        PyObject *old[4] = {r->kept_y, r->kept_block, r->kept_mem, r->kept_work};
        r->kept_y = r->kept_block = r->kept_mem = r->kept_work = NULL;
        r->kept_stream = stream;
        for (int i = 0; i < 4; i++) Py_XDECREF(old[i]);
    }
    PyObject *y = keep ? take_kept_array(r) : NULL;
    if (y) {
        addrs[r->n_inputs] = r->kept_ptr;
    } else if (PyErr_Occurred()) {
        return NULL;
    } else {
        y = PyObject_CallFunctionObjArgs(r->ndarray, r->shape, r->dtype, NULL);
        if (!y || remember_array(r, y, keep && r->keep_output, stream, &addrs[r->n_inputs])) {
            Py_XDECREF(y);
            return NULL;
        }
    }
    PyObject *work = NULL;
    if (r->work_bytes) {
        if (keep) {
            work = r->kept_work;
            r->kept_work = NULL;
        }
        if (!work) work = PyObject_CallFunction(r->alloc, "n", r->work_bytes);
        uint64_t base = 0;
        if (!work || take_u64(PyObject_GetAttr(work, s_ptr), &base)) Py_CLEAR(y);
        for (Py_ssize_t i = 0; i < r->n_work; i++) addrs[r->n_inputs + 1 + i] = base + r->work_offsets[i];
    }
    if (y && run_list(list, addrs, (void *)(uintptr_t)stream)) Py_CLEAR(y);
    /* the workspace for the next call on the stream (ordered after this one's kernels), if
       the stream is still the kept one (another thread may have moved it meanwhile) */
    if (work && keep && r->keep_work && r->kept_stream == stream)
        Py_XSETREF(r->kept_work, work);
    else
        Py_XDECREF(work);
    return y;
}

typedef PyObject *(*replay_fn)(Replay *r, PyObject *const *inputs);

/* Replay.cupy / Replay.torch: ``run`` on the inputs given as a sequence. */
static PyObject *replay_sequence(Replay *r, PyObject *seq, const char *what, replay_fn run) {
    PyObject *t = input_tuple(r, seq, what);
    if (!t) return NULL;
    PyObject *y = run(r, &PyTuple_GET_ITEM(t, 0));
    Py_DECREF(t);
    return y;
}

/* Replay.cupy(arrays): as FastCall.cupy. */
static PyObject *Replay_cupy(Replay *r, PyObject *arrays) { return replay_sequence(r, arrays, "arrays", replay_cupy); }

/* Replay.set_torch(form, make, raw_stream, raw_alloc, raw_delete): how torch calls make
   their output (FastCall._torch_output_form) and reach torch's stream and allocator. The
   first call sets them and later ones change nothing: two threads' first torch calls may
   both get here with the same answers, and replacing a maker that the other thread's
   Replay.torch is calling (the Python call in it may let this thread in) could free it. */
static PyObject *Replay_set_torch(Replay *r, PyObject *args) {
    PyObject *make, *rs, *ra, *rd;
    int form;
    if (!PyArg_ParseTuple(args, "iOOOO", &form, &make, &rs, &ra, &rd)) return NULL;
    if (form < 0 || form > 2) {
        PyErr_SetString(PyExc_ValueError, "form: 0, 1 or 2");
        return NULL;
    }
    if (r->torch_make) Py_RETURN_NONE; /* set already */
    Py_INCREF(make); Py_INCREF(rs); Py_INCREF(ra); Py_INCREF(rd);
    Py_XSETREF(r->torch_make, make);
    Py_XSETREF(r->raw_stream, rs);
    Py_XSETREF(r->raw_alloc, ra);
    Py_XSETREF(r->raw_delete, rd);
    r->torch_form = form;
    Py_RETURN_NONE;
}

/* As FastCall.torch, once set_torch has been called, on the call's n_inputs tensors
   (references the caller holds across). */
static PyObject *replay_torch(Replay *r, PyObject *const *tensors) {
    uint64_t addrs[MAX_ADDRS];
    if (!r->torch_make) {
        PyErr_SetString(PyExc_RuntimeError, "Replay.torch before set_torch");
        return NULL;
    }
    long d;
    int no_device = current_device(r->get_device, &d);
    if (no_device < 0) return NULL;
    if (no_device || d != r->device) /* the kernels belong to the current device's context */
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < r->n_inputs; i++) {
        PyObject *t = tensors[i];
        if (t == Py_None) {
            addrs[i] = 0;
            continue;
        }
        if (torch_address(t, &addrs[i])) return NULL;
    }
    LaunchList *list = pick_list(r, addrs);
    if (!list) Py_RETURN_NONE;
    PyObject *first = tensors[0], *y;
    if (r->torch_form == 0)
        y = PyObject_CallOneArg(r->torch_make, first);
    else if (r->torch_form == 1)
        y = PyObject_CallMethodOneArg(first, s_new_empty, r->shape);
    else
        y = PyObject_CallNoArgs(r->torch_make);
    if (!y) return NULL;
    uint64_t stream, base = 0;
    if (torch_address(y, &addrs[r->n_inputs]) || torch_stream(r->raw_stream, d, &stream)) goto fail;
    if (r->work_bytes) {
        if (take_u64(PyObject_CallFunction(r->raw_alloc, "nK", r->work_bytes, (unsigned long long)stream), &base))
            goto fail;
        for (Py_ssize_t i = 0; i < r->n_work; i++) addrs[r->n_inputs + 1 + i] = base + r->work_offsets[i];
    }
    int failed = run_list(list, addrs, (void *)(uintptr_t)stream);
    if (base) { /* given back once the launches are queued, as torch's own temporaries */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *rc = PyObject_CallFunction(r->raw_delete, "K", (unsigned long long)base);
        if (!rc) failed = 1;
        Py_XDECREF(rc);
        if (type) PyErr_Restore(type, value, tb);
    }
    if (!failed) return y;
fail:
    Py_DECREF(y);
    return NULL;
}

/* Replay.torch(tensors): as FastCall.torch, once set_torch has been called. */
static PyObject *Replay_torch(Replay *r, PyObject *tensors) {
    return replay_sequence(r, tensors, "tensors", replay_torch);
}

static PyMethodDef Replay_methods[] = {
    {"cupy", (PyCFunction)Replay_cupy, METH_O, "Run on CuPy arrays (a tuple): the output, or None."},
    {"torch", (PyCFunction)Replay_torch, METH_O, "Run on CUDA torch tensors (a tuple): the output, or None."},
    {"set_torch", (PyCFunction)Replay_set_torch, METH_VARARGS, "How torch calls make their output."},
    {NULL},
};

static PyTypeObject ReplayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cupyops._cfast.Replay",
    .tp_basicsize = sizeof(Replay),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A FastCall's per-call work in C (see cupyops/_cfast.c); _fast.FastCall derives from it.",
    .tp_new = Replay_new,
    .tp_init = (initproc)Replay_init,
    .tp_dealloc = (destructor)Replay_dealloc,
    .tp_traverse = (traverseproc)Replay_traverse,
    .tp_clear = (inquiry)Replay_clear,
    .tp_methods = Replay_methods,
};

/* ------------------------------------------------------------------ finding a FastCall
   A call's key: the operator's spec (Python: the call's options and which arguments are
   arrays) with these signature functions, and a dict lookup; _fast.FastCalls.run_cupy /
   run_torch do the same in Python. */

static PyObject *cupy_type, *torch_types, *unfit, *get_device_fn; /* bind() */
static PyObject *s_dtype, *s_stride, *s_get_device, *s_cupy, *s_torch;
/* torch_types' members, compared by address (the set holds them); -1: the set is asked */
#define MAX_TORCH_TYPES 8
static PyObject *torch_type_list[MAX_TORCH_TYPES];
static Py_ssize_t n_torch_types = -1;

/* Whether ``type`` is one of torch_types (-1 on error). */
static int is_torch_type(PyObject *type) {
    if (!torch_types) return 0;
    if (n_torch_types < 0) return PySet_Contains(torch_types, type);
    for (Py_ssize_t i = 0; i < n_torch_types; i++)
        if (torch_type_list[i] == type) return 1;
    return 0;
}

/* cupy_sig(a): (shape, strides, dtype) of a CuPy array, None for None; Unfit otherwise. */
static PyObject *cupy_sig(PyObject *m, PyObject *a) {
    if (cupy_type && (PyObject *)Py_TYPE(a) == cupy_type) {
        PyObject *shape = PyObject_GetAttr(a, s_shape), *strides = NULL, *dtype = NULL, *out = NULL;
        if (shape && (strides = PyObject_GetAttr(a, s_strides)) && (dtype = PyObject_GetAttr(a, s_dtype)))
            out = PyTuple_Pack(3, shape, strides, dtype);
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        Py_XDECREF(dtype);
        return out;
    }
    if (a == Py_None) Py_RETURN_NONE;
    PyErr_SetNone(unfit ? unfit : PyExc_TypeError);
    return NULL;
}

/* PySequence_Fast of a new reference ``o`` (NULL: the call that made it failed), which it
   releases. */
static PyObject *take_fast(PyObject *o) {
    if (!o) return NULL;
    if (PyTuple_Check(o)) return o; /* torch.Size (a tuple subclass) read as it is: no copy a call */
    PyObject *seq = PySequence_Fast(o, "a tensor's shape and strides: sequences");
    Py_DECREF(o);
    return seq;
}

/* torch_sig's tuple from the tensor's DLTensor (DLPack's C exchange): NULL, with no error
   set, where the table is unbound, declines the tensor, or reports a device or dtype that
   the Python attributes would name otherwise (then they are asked). A CUDA tensor's device
   is its index, a CPU tensor's -1 (as get_device()). */
#define MAX_SIG_DIMS 32
static PyObject *torch_sig_dlpack(PyObject *a) {
    DLTensor_ t;
    if (torch_dltensor(a, &t) || !t.strides || t.ndim < 0 || t.ndim > MAX_SIG_DIMS) return NULL;
    long dev;
    if (t.device.device_type == DL_CUDA) dev = t.device.device_id;
    else if (t.device.device_type == DL_CPU) dev = -1;
    else return NULL;
    PyObject *dtype = NULL;
    const uint32_t key = dl_dtype_key(t.dtype);
    for (Py_ssize_t i = 0; i < n_dl_dtypes && !dtype; i++)
        if (dl_dtype_code[i] == key) dtype = dl_dtype_object[i];
    if (!dtype) return NULL;
    /* (copied out before any allocation: the DLTensor's arrays are the tensor's, valid only
       while no Python code, a collection's finalizers included, can run) */
    const Py_ssize_t n = t.ndim;
    int64_t v[2 * MAX_SIG_DIMS];
    for (Py_ssize_t i = 0; i < n; i++) {
        v[i] = t.shape[i];
        v[n + i] = t.strides[i];
    }
    dtype = dtype == Py_None ? PyObject_GetAttr(a, s_dtype) : Py_NewRef(dtype);
    if (!dtype) return NULL;
    PyObject *out = PyTuple_New(2 * n + 2);
    if (!out) {
        Py_DECREF(dtype);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 2 * n, dtype);
    for (Py_ssize_t i = 0; i < 2 * n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, x);
    }
    PyObject *device = PyLong_FromLong(dev);
    if (!device) {
        Py_DECREF(out);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 2 * n + 1, device);
    return out;
}

/* torch_sig(a): (*shape, *stride(), dtype, get_device()) of a torch tensor, None for None:
   one flat tuple (its length gives the rank), with no torch.Size in it: a key holding
   one hashed and compared slower than one of plain tuples (NOTES 91). */
static PyObject *torch_sig(PyObject *m, PyObject *a) {
    int is = is_torch_type((PyObject *)Py_TYPE(a));
    if (is < 0) return NULL;
    if (!is) {
        if (a == Py_None) Py_RETURN_NONE;
        PyErr_SetNone(unfit ? unfit : PyExc_TypeError);
        return NULL;
    }
    PyObject *fast = torch_sig_dlpack(a);
    if (fast || PyErr_Occurred()) return fast;
    PyObject *shape = take_fast(PyObject_GetAttr(a, s_shape)), *stride = NULL, *dtype = NULL, *dev = NULL,
             *out = NULL;
    if (shape && (stride = take_fast(PyObject_CallMethodNoArgs(a, s_stride))) &&
        (dtype = PyObject_GetAttr(a, s_dtype)) && (dev = PyObject_CallMethodNoArgs(a, s_get_device))) {
        Py_ssize_t ns = PySequence_Fast_GET_SIZE(shape), nt = PySequence_Fast_GET_SIZE(stride);
        out = PyTuple_New(ns + nt + 2);
        if (out) {
            for (Py_ssize_t i = 0; i < ns; i++) PyTuple_SET_ITEM(out, i, Py_NewRef(PySequence_Fast_GET_ITEM(shape, i)));
            for (Py_ssize_t i = 0; i < nt; i++)
                PyTuple_SET_ITEM(out, ns + i, Py_NewRef(PySequence_Fast_GET_ITEM(stride, i)));
            PyTuple_SET_ITEM(out, ns + nt, Py_NewRef(dtype));
            PyTuple_SET_ITEM(out, ns + nt + 1, Py_NewRef(dev));
        }
    }
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(dtype);
    Py_XDECREF(dev);
    return out;
}

static PyMethodDef cupy_sig_def = {"cupy_sig", cupy_sig, METH_O, "A CuPy array argument's part of a key."};
static PyMethodDef torch_sig_def = {"torch_sig", torch_sig, METH_O, "A torch tensor argument's part of a key."};
static PyObject *cupy_sig_fn, *torch_sig_fn;

/* A declared signature (_fast.Declared): the operator's parameters in order, each an array
   (its signature in the key, its value among the inputs), an option (its value in the key,
   admitted by its exact type) or fixed (it must be its default: out=None and such). */
#define MAX_PARAMS 32
enum { P_ARRAY = 'a', P_OPTION = 'o', P_FIXED = 'f' };

typedef struct {
    PyObject_HEAD
    PyObject *spec, *table;
    int torch; /* 0: CuPy arrays, keys (key, device); 1: torch tensors, keys as the spec says */
    /* declared (else names is NULL and spec is called): names, defaults (required: the
       sentinel `required`), per parameter the admitted types of an option (a tuple) */
    PyObject *names, *defaults, *types, *required, *kinds_obj;
    const char *kinds;
    Py_ssize_t n_params, n_positional, n_key, n_arrays;
} Finder;

/* A call's arguments, as the vectorcall protocol passes them (args[0:n] positional, then
   the values of the keywords kwnames names), or as the (args, kwargs) entry does (args a
   tuple's items, kwargs a dict). The caller holds them across the call. */
typedef struct {
    PyObject *const *args;
    Py_ssize_t n;
    PyObject *kwnames; /* a non-empty tuple, or NULL */
    PyObject *kwargs;  /* a dict, or NULL */
} CallArgs;

/* The parameter named `name`, or -1. (A call's keyword names are mostly the interned
   strings of the function's own code, so identity settles most.) */
static Py_ssize_t param_index(Finder *f, PyObject *name) {
    for (Py_ssize_t j = 0; j < f->n_params; j++)
        if (PyTuple_GET_ITEM(f->names, j) == name) return j;
    if (!PyUnicode_Check(name)) return -1;
    for (Py_ssize_t j = 0; j < f->n_params; j++)
        if (PyUnicode_Compare(PyTuple_GET_ITEM(f->names, j), name) == 0) return j;
    return -1;
}

/* A declared call's key (a new tuple, in *keyp) and its array inputs (n_arrays new
   references, in inputs): 1; 0 where the call is not one the fast path takes (a bad call
   included: the checked path says); -1 on an error (a signature function's Unfit among
   them, which the caller treats as a miss). Every value is held while the signature
   functions run: they may run Python (a torch function mode), which may drop a kwargs
   dict's values. */
static int declared_find(Finder *f, const CallArgs *c, PyObject **keyp, PyObject **inputs) {
    PyObject *vals[MAX_PARAMS] = {NULL}, *key = NULL;
    Py_ssize_t n = c->n, k = 0, a = 0;
    int rc = 0;
    if (n > f->n_positional) return 0;
    for (Py_ssize_t i = 0; i < n; i++) vals[i] = Py_NewRef(c->args[i]);
    if (c->kwnames) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c->kwnames); i++) {
            Py_ssize_t j = param_index(f, PyTuple_GET_ITEM(c->kwnames, i));
            if (j < 0 || vals[j]) goto done;
            vals[j] = Py_NewRef(c->args[n + i]);
        }
    }
    if (c->kwargs && PyDict_GET_SIZE(c->kwargs)) {
        Py_ssize_t pos = 0;
        PyObject *name, *value;
        while (PyDict_Next(c->kwargs, &pos, &name, &value)) {
            Py_ssize_t j = param_index(f, name);
            if (j < 0 || vals[j]) goto done;
            vals[j] = Py_NewRef(value);
        }
    }
    for (Py_ssize_t j = 0; j < f->n_params; j++) {
        if (vals[j]) continue;
        PyObject *dflt = PyTuple_GET_ITEM(f->defaults, j);
        if (dflt == f->required) goto done;
        vals[j] = Py_NewRef(dflt);
    }
    key = PyTuple_New(f->n_key);
    if (!key) goto fail;
    for (Py_ssize_t j = 0; j < f->n_params; j++) {
        PyObject *v = vals[j];
        if (f->kinds[j] == P_ARRAY) {
            PyObject *s = f->torch ? torch_sig(NULL, v) : cupy_sig(NULL, v);
            if (!s) goto fail;
            PyTuple_SET_ITEM(key, k++, s);
            inputs[a++] = Py_NewRef(v);
        } else if (f->kinds[j] == P_OPTION) {
            PyObject *admitted = PyTuple_GET_ITEM(f->types, j);
            Py_ssize_t t = 0, nt = PyTuple_GET_SIZE(admitted);
            while (t < nt && (PyObject *)Py_TYPE(v) != PyTuple_GET_ITEM(admitted, t)) t++;
            if (t == nt) goto done;
            /* a tuple option (attention's window) holds ints and Nones, each by its exact
               type: (3.0, None) or (True, 0) equals a remembered (3, None) or (1, 0) as a key,
               but is the checked path's to refuse */
            if (PyTuple_CheckExact(v))
                for (Py_ssize_t e = 0; e < PyTuple_GET_SIZE(v); e++) {
                    PyObject *x = PyTuple_GET_ITEM(v, e);
                    if (x != Py_None && !PyLong_CheckExact(x)) goto done;
                }
            PyTuple_SET_ITEM(key, k++, Py_NewRef(v));
        } else if (v != PyTuple_GET_ITEM(f->defaults, j)) {
            goto done;
        }
    }
    *keyp = key;
    key = NULL;
    rc = 1;
    goto done;
fail:
    rc = -1;
done:
    if (rc != 1)
        while (a > 0) Py_DECREF(inputs[--a]);
    Py_XDECREF(key);
    for (Py_ssize_t j = 0; j < f->n_params; j++) Py_XDECREF(vals[j]);
    return rc;
}

/* spec(sig, *args, **kwargs): an undeclared spec's (key, inputs), None, or NULL. */
static PyObject *call_spec(Finder *f, const CallArgs *c) {
    PyObject *sig = f->torch ? torch_sig_fn : cupy_sig_fn, *found;
    if (c->kwargs) { /* the (args, kwargs) entry */
        PyObject *full = PyTuple_New(c->n + 1);
        if (!full) return NULL;
        PyTuple_SET_ITEM(full, 0, Py_NewRef(sig));
        for (Py_ssize_t i = 0; i < c->n; i++) PyTuple_SET_ITEM(full, i + 1, Py_NewRef(c->args[i]));
        found = PyObject_Call(f->spec, full, PyDict_GET_SIZE(c->kwargs) ? c->kwargs : NULL);
        Py_DECREF(full);
        return found;
    }
    Py_ssize_t nk = c->kwnames ? PyTuple_GET_SIZE(c->kwnames) : 0, total = 1 + c->n + nk;
    PyObject *small[16], **stack = total <= 16 ? small : PyMem_Malloc(total * sizeof(PyObject *));
    if (!stack) return PyErr_NoMemory();
    stack[0] = sig;
    for (Py_ssize_t i = 0; i < c->n + nk; i++) stack[i + 1] = c->args[i];
    found = PyObject_Vectorcall(f->spec, stack, 1 + c->n, c->kwnames);
    if (stack != small) PyMem_Free(stack);
    return found;
}

/* Run FastCall ``fast`` on the call's inputs. A FastCall that is an initialised Replay
   (_fast.FastCall derives from Replay) runs here, on the inputs as they are: no attribute
   looked up, no tuple made, no method called; a torch one only once its first torch call
   (the Python FastCall.torch) has set its torch side. Anything else (a FastCall with no C
   replay, one before that first call) has its method (FastCall.cupy / .torch) called with
   a tuple of the inputs (``given``, or one made). */
static PyObject *call_fast(Finder *f, PyObject *fast, PyObject *const *inputs, Py_ssize_t n, PyObject *given) {
    if (PyObject_TypeCheck(fast, &ReplayType)) {
        Replay *r = (Replay *)fast; /* (held by the caller) */
        if (r->ready && (!f->torch || r->torch_make)) {
            if (n == r->n_inputs) return f->torch ? replay_torch(r, inputs) : replay_cupy(r, inputs);
            PyErr_SetString(PyExc_TypeError, "the spec's inputs: one per input of the FastCall");
            return NULL;
        }
    }
    PyObject *t = given ? Py_NewRef(given) : PyTuple_New(n), *out;
    if (!t) return NULL;
    if (!given)
        for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(inputs[i]));
    out = PyObject_CallMethodOneArg(fast, f->torch ? s_torch : s_cupy, t);
    Py_DECREF(t);
    return out;
}

/* The remembered call's result, or None (not remembered; any error of the spec, an
   unhashable option: the checked path will say). */
static PyObject *Finder_run(Finder *f, const CallArgs *c) {
    if (!f->table || !PyDict_Check(f->table) || PyDict_GET_SIZE(f->table) == 0) Py_RETURN_NONE;
    PyObject *found = NULL, *key = NULL, *fast, *given = NULL, *out, *inputs[MAX_PARAMS];
    Py_ssize_t n_inputs = 0;
    if (f->names) {
        int rc = declared_find(f, c, &key, inputs);
        if (rc <= 0) goto miss;
        n_inputs = f->n_arrays;
    } else {
        found = call_spec(f, c);
        if (!found) goto miss;
        if (found == Py_None || !PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 2) {
            Py_DECREF(found);
            Py_RETURN_NONE;
        }
        key = Py_NewRef(PyTuple_GET_ITEM(found, 0));
    }
    if (!f->torch) {
        long d;
        PyObject *dev = current_device(get_device_fn, &d) ? NULL : PyLong_FromLong(d); /* (none: a miss) */
        if (!dev) goto miss;
        Py_SETREF(key, PyTuple_Pack(2, key, dev));
        Py_DECREF(dev);
        if (!key) goto miss;
    }
    fast = PyDict_GetItemWithError(f->table, key); /* borrowed: held across the call below */
    if (!fast) goto miss;
    Py_INCREF(fast);
    if (found) {
        given = PySequence_Tuple(PyTuple_GET_ITEM(found, 1));
        out = given ? call_fast(f, fast, &PyTuple_GET_ITEM(given, 0), PyTuple_GET_SIZE(given), given) : NULL;
    } else {
        out = call_fast(f, fast, inputs, n_inputs, NULL);
    }
    Py_DECREF(fast);
    goto done; /* a launch's error is the caller's to see */
miss:
    out = NULL;
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) goto done; /* KeyboardInterrupt and such */
        PyErr_Clear();
    }
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(given);
    Py_XDECREF(key);
    Py_XDECREF(found);
    while (n_inputs > 0) Py_DECREF(inputs[--n_inputs]);
    return out;
}

/* The (args, kwargs) entry's CallArgs: false (a TypeError set) where they are not a tuple
   and a dict (or None). */
static int tuple_call_args(PyObject *callargs, CallArgs *c) {
    PyObject *args, *kwargs;
    if (!PyArg_ParseTuple(callargs, "O!O", &PyTuple_Type, &args, &kwargs)) return 0;
    c->args = &PyTuple_GET_ITEM(args, 0);
    c->n = PyTuple_GET_SIZE(args);
    c->kwnames = NULL;
    c->kwargs = PyDict_Check(kwargs) ? kwargs : NULL;
    return 1;
}

/* Finder(args, kwargs): Finder_run. */
static PyObject *Finder_call(Finder *f, PyObject *callargs, PyObject *callkw) {
    CallArgs c;
    return tuple_call_args(callargs, &c) ? Finder_run(f, &c) : NULL;
}

/* Finder(spec, table, torch, declared=None); declared: (names, positional count, defaults,
   kinds as bytes, admitted types, the required sentinel), from _fast.Declared. Once: a
   call reads the description across Python calls. */
static int Finder_init(Finder *f, PyObject *args, PyObject *kw) {
    static char *names[] = {"spec", "table", "torch", "declared", NULL};
    PyObject *spec, *table, *declared = Py_None;
    int torch;
    if (f->table) {
        PyErr_SetString(PyExc_RuntimeError, "a Finder is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!p|O", names, &spec, &PyDict_Type, &table, &torch, &declared))
        return -1;
    PyObject *pnames = NULL, *defaults = NULL, *kinds = NULL, *types = NULL, *required = NULL;
    Py_ssize_t n_positional = 0, n = 0, n_key = 0, n_arrays = 0;
    if (declared != Py_None) {
        if (!PyArg_ParseTuple(declared, "O!nO!O!O!O", &PyTuple_Type, &pnames, &n_positional, &PyTuple_Type, &defaults,
                              &PyBytes_Type, &kinds, &PyTuple_Type, &types, &required))
            return -1;
        n = PyTuple_GET_SIZE(pnames);
        if (n > MAX_PARAMS || PyTuple_GET_SIZE(defaults) != n || PyBytes_GET_SIZE(kinds) != n ||
            PyTuple_GET_SIZE(types) != n || n_positional < 0 || n_positional > n) {
            PyErr_SetString(PyExc_ValueError, "declared: names, defaults, kinds and types of one length");
            return -1;
        }
        const char *k = PyBytes_AS_STRING(kinds);
        for (Py_ssize_t j = 0; j < n; j++) {
            if (k[j] == P_OPTION && !PyTuple_Check(PyTuple_GET_ITEM(types, j))) {
                PyErr_SetString(PyExc_TypeError, "declared: an option's admitted types as a tuple");
                return -1;
            }
            if (k[j] != P_ARRAY && k[j] != P_OPTION && k[j] != P_FIXED) {
                PyErr_SetString(PyExc_ValueError, "declared: kinds of b'a', b'o' and b'f'");
                return -1;
            }
            n_key += k[j] != P_FIXED;
            n_arrays += k[j] == P_ARRAY;
        }
    }
    Py_XSETREF(f->spec, Py_NewRef(spec));
    Py_XSETREF(f->table, Py_NewRef(table));
    Py_XSETREF(f->names, Py_XNewRef(pnames));
    Py_XSETREF(f->defaults, Py_XNewRef(defaults));
    Py_XSETREF(f->kinds_obj, Py_XNewRef(kinds));
    Py_XSETREF(f->types, Py_XNewRef(types));
    Py_XSETREF(f->required, Py_XNewRef(required));
    f->kinds = kinds ? PyBytes_AS_STRING(kinds) : NULL;
    f->torch = torch;
    f->n_params = n;
    f->n_positional = n_positional;
    f->n_key = n_key;
    f->n_arrays = n_arrays;
    return 0;
}

static int Finder_traverse(Finder *f, visitproc visit, void *arg) {
    Py_VISIT(f->spec);
    Py_VISIT(f->table);
    Py_VISIT(f->names);
    Py_VISIT(f->defaults);
    Py_VISIT(f->types);
    Py_VISIT(f->required);
    return 0;
}

static int Finder_clear(Finder *f) {
    Py_CLEAR(f->spec);
    Py_CLEAR(f->table);
    Py_CLEAR(f->names);
    Py_CLEAR(f->defaults);
    Py_CLEAR(f->types);
    Py_CLEAR(f->required);
    Py_CLEAR(f->kinds_obj);
    f->kinds = NULL;
    f->n_params = 0;
    return 0;
}

static void Finder_dealloc(Finder *f) {
    PyObject_GC_UnTrack(f);
    Finder_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyTypeObject FinderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cupyops._cfast.Finder",
    .tp_basicsize = sizeof(Finder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Finder(spec, table, torch, declared=None)(args, kwargs): FastCalls.run_cupy / run_torch in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Finder_init,
    .tp_dealloc = (destructor)Finder_dealloc,
    .tp_traverse = (traverseproc)Finder_traverse,
    .tp_clear = (inquiry)Finder_clear,
    .tp_call = (ternaryfunc)Finder_call,
};

/* Dispatch(cupy_finder, torch_finder)(args, kwargs): FastCalls.run in C: the finder of the
   first argument's kind (a CuPy array, a torch tensor), None for any other. What an
   operator (Operator below, or its Python wrapper) calls first. */
typedef struct {
    PyObject_HEAD
    Finder *cupy, *torch;
} Dispatch;

static PyObject *dispatch_run(Dispatch *d, const CallArgs *c) {
    if (c->n == 0 || !d->cupy) Py_RETURN_NONE;
    PyObject *type = (PyObject *)Py_TYPE(c->args[0]);
    if (cupy_type && type == cupy_type) return Finder_run(d->cupy, c);
    int is = is_torch_type(type);
    if (is < 0) return NULL;
    if (is) return Finder_run(d->torch, c);
    Py_RETURN_NONE;
}

static PyObject *Dispatch_call(Dispatch *d, PyObject *callargs, PyObject *callkw) {
    CallArgs c;
    return tuple_call_args(callargs, &c) ? dispatch_run(d, &c) : NULL;
}

/* Dispatch(cupy_finder, torch_finder), once: a call holds no reference to its finder. */
static int Dispatch_init(Dispatch *d, PyObject *args, PyObject *kw) {
    static char *names[] = {"cupy_finder", "torch_finder", NULL};
    Finder *c, *t;
    if (d->cupy) {
        PyErr_SetString(PyExc_RuntimeError, "a Dispatch is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!", names, &FinderType, &c, &FinderType, &t)) return -1;
    d->torch = (Finder *)Py_NewRef(t);
    d->cupy = (Finder *)Py_NewRef(c);
    return 0;
}

static int Dispatch_traverse(Dispatch *d, visitproc visit, void *arg) {
    Py_VISIT(d->cupy);
    Py_VISIT(d->torch);
    return 0;
}

static int Dispatch_clear(Dispatch *d) {
    Py_CLEAR(d->cupy);
    Py_CLEAR(d->torch);
    return 0;
}

static void Dispatch_dealloc(Dispatch *d) {
    PyObject_GC_UnTrack(d);
    Dispatch_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyTypeObject DispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cupyops._cfast.Dispatch",
    .tp_basicsize = sizeof(Dispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Dispatch(cupy_finder, torch_finder)(args, kwargs): FastCalls.run in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Dispatch_init,
    .tp_dealloc = (destructor)Dispatch_dealloc,
    .tp_traverse = (traverseproc)Dispatch_traverse,
    .tp_clear = (inquiry)Dispatch_clear,
    .tp_call = (ternaryfunc)Dispatch_call,
};

/* ------------------------------------------------------------------ the operator itself
   Operator(dispatch, checked): a public operator with a fast path (_interop.foreign_arrays),
   called as the function it stands for. A call takes its arguments as the caller passes
   them (vectorcall: no tuple or dict is made of them), tries the remembered call of its
   first argument's kind (dispatch) on them, and otherwise hands them on, as they came, to
   ``checked`` (the wrapper's checked path, a Python function). What a Python wrapper
   cost per call (its frame, the argument tuple and dict, Dispatch's call) is gone.
   functools.update_wrapper gives it the function's name, qualified name, module, doc and
   __wrapped__ (in its __dict__), so that inspect.signature and help() show the
   function's; it binds as a function does in a class body, and pickles by name. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Dispatch *dispatch;
    PyObject *checked, *dict, *weakrefs;
} Operator;

static PyObject *Operator_vectorcall(Operator *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (!op->checked) {
        PyErr_SetString(PyExc_TypeError, "an Operator before its __init__");
        return NULL;
    }
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n > 0) {
        CallArgs c = {args, n, kwnames && PyTuple_GET_SIZE(kwnames) ? kwnames : NULL, NULL};
        PyObject *r = dispatch_run(op->dispatch, &c);
        if (r != Py_None) return r; /* the result, or an error (an interrupt, a failed launch) */
        Py_DECREF(r);
    }
    return PyObject_Vectorcall(op->checked, args, nargsf, kwnames);
}

/* Operator(dispatch, checked), once: a call holds no reference to either. */
static int Operator_init(Operator *op, PyObject *args, PyObject *kw) {
    static char *names[] = {"dispatch", "checked", NULL};
    PyObject *d, *checked;
    if (op->checked) {
        PyErr_SetString(PyExc_RuntimeError, "an Operator is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O", names, &DispatchType, &d, &checked)) return -1;
    if (!PyCallable_Check(checked)) {
        PyErr_SetString(PyExc_TypeError, "checked: a callable");
        return -1;
    }
    op->dispatch = (Dispatch *)Py_NewRef(d);
    op->checked = Py_NewRef(checked);
    op->vectorcall = (vectorcallfunc)Operator_vectorcall;
    return 0;
}

static PyObject *Operator_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Operator *op = (Operator *)type->tp_alloc(type, 0);
    if (op) op->vectorcall = (vectorcallfunc)Operator_vectorcall;
    return (PyObject *)op;
}

/* As a function in a class body: the operator itself from the class, bound to an instance. */
static PyObject *Operator_get(PyObject *op, PyObject *obj, PyObject *type) {
    if (!obj || obj == Py_None) return Py_NewRef(op);
    return PyMethod_New(op, obj);
}

static PyObject *Operator_repr(PyObject *op) {
    PyObject *name = PyObject_GetAttrString(op, "__qualname__");
    if (!name) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
        PyErr_Clear();
        return PyUnicode_FromFormat("<cupyops._cfast.Operator object at %p>", op);
    }
    PyObject *r = PyUnicode_FromFormat("<function %S at %p>", name, op);
    Py_DECREF(name);
    return r;
}

/* Pickled (and copied) as a function is: by its module and qualified name. */
static PyObject *Operator_reduce(PyObject *op, PyObject *unused) {
    return PyObject_GetAttrString(op, "__qualname__");
}

static int Operator_traverse(Operator *op, visitproc visit, void *arg) {
    Py_VISIT(op->dispatch);
    Py_VISIT(op->checked);
    Py_VISIT(op->dict);
    return 0;
}

static int Operator_clear(Operator *op) {
    Py_CLEAR(op->dispatch);
    Py_CLEAR(op->checked);
    Py_CLEAR(op->dict);
    return 0;
}

static void Operator_dealloc(Operator *op) {
    PyObject_GC_UnTrack(op);
    if (op->weakrefs) PyObject_ClearWeakRefs((PyObject *)op);
    Operator_clear(op);
    Py_TYPE(op)->tp_free((PyObject *)op);
}

static PyMethodDef Operator_methods[] = {
    {"__reduce__", Operator_reduce, METH_NOARGS, "Pickled by name, as a function."},
    {NULL},
};

static PyMemberDef Operator_members[] = {
    {"dispatch", T_OBJECT, offsetof(Operator, dispatch), READONLY, "The remembered calls' Dispatch."},
    {"checked", T_OBJECT, offsetof(Operator, checked), READONLY, "What a call not remembered runs."},
    {NULL},
};

static PyGetSetDef Operator_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyTypeObject OperatorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cupyops._cfast.Operator",
    .tp_basicsize = sizeof(Operator),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Operator(dispatch, checked): a public operator with a fast path (see cupyops/_cfast.c).",
    .tp_new = Operator_new,
    .tp_init = (initproc)Operator_init,
    .tp_dealloc = (destructor)Operator_dealloc,
    .tp_traverse = (traverseproc)Operator_traverse,
    .tp_clear = (inquiry)Operator_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Operator, vectorcall),
    .tp_dictoffset = offsetof(Operator, dict),
    .tp_weaklistoffset = offsetof(Operator, weakrefs),
    .tp_descr_get = Operator_get,
    .tp_repr = Operator_repr,
    .tp_methods = Operator_methods,
    .tp_members = Operator_members,
    .tp_getset = Operator_getset,
};

/* torch_types' members into torch_type_list, where a frozenset of few (a set could change
   after: it is asked each time). */
static int list_torch_types(void) {
    n_torch_types = -1;
    if (!torch_types || !PyFrozenSet_Check(torch_types) || PySet_GET_SIZE(torch_types) > MAX_TORCH_TYPES) return 0;
    PyObject *it = PyObject_GetIter(torch_types), *t;
    if (!it) return -1;
    Py_ssize_t n = 0;
    while ((t = PyIter_Next(it))) {
        torch_type_list[n++] = t; /* (held by the frozenset) */
        Py_DECREF(t);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return -1;
    n_torch_types = n;
    return 0;
}

/* An address argument of bind (None: unbound), as a C pointer: 0, or -1 on error. */
static int address_of(PyObject *o, uintptr_t *out) {
    uint64_t v = 0;
    if (o != Py_None && u64(o, &v)) return -1;
    *out = (uintptr_t)v;
    return 0;
}

/* bind(cupy_type=, torch_types=, unfit=, get_device=, is_capturing=, ctx_get_device=):
   what the signature functions, Finders and Replays use (set as the libraries load;
   is_capturing and ctx_get_device are cuStreamIsCapturing's and cuCtxGetDevice's
   addresses); returns the previous values, as a dict. */
static PyObject *bind(PyObject *m, PyObject *args, PyObject *kw) {
    static char *names[] = {"cupy_type", "torch_types", "unfit", "get_device", "is_capturing", "ctx_get_device",
                            NULL};
    PyObject *vals[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    PyObject **slots[4] = {&cupy_type, &torch_types, &unfit, &get_device_fn};
    void **addresses[2] = {(void **)&is_capturing_fn, (void **)&ctx_get_device_fn};
    uintptr_t new_address[2] = {0, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOOOO", names, &vals[0], &vals[1], &vals[2], &vals[3], &vals[4],
                                     &vals[5]))
        return NULL;
    if (vals[1] && vals[1] != Py_None && !PyAnySet_Check(vals[1])) {
        PyErr_SetString(PyExc_TypeError, "torch_types: a set of types");
        return NULL;
    }
    for (int i = 0; i < 2; i++)
        if (vals[4 + i] && address_of(vals[4 + i], &new_address[i])) return NULL;
    PyObject *old = PyDict_New();
    if (!old) return NULL;
    for (int i = 0; i < 4; i++) {
        if (PyDict_SetItemString(old, names[i], *slots[i] ? *slots[i] : Py_None)) {
            Py_DECREF(old);
            return NULL;
        }
    }
    for (int i = 0; i < 2; i++) {
        void *a = *addresses[i];
        PyObject *was = a ? PyLong_FromUnsignedLongLong((uintptr_t)a) : Py_NewRef(Py_None);
        if (!was || PyDict_SetItemString(old, names[4 + i], was)) {
            Py_XDECREF(was);
            Py_DECREF(old);
            return NULL;
        }
        Py_DECREF(was);
    }
    for (int i = 0; i < 4; i++) {
        if (!vals[i]) continue;
        if (i == 1) n_torch_types = -1; /* (the list refers into the set being replaced) */
        Py_XSETREF(*slots[i], vals[i] == Py_None ? NULL : Py_NewRef(vals[i]));
    }
    for (int i = 0; i < 2; i++)
        if (vals[4 + i]) *addresses[i] = (void *)new_address[i];
    if (vals[1] && list_torch_types()) {
        Py_DECREF(old);
        return NULL;
    }
    return old;
}

/* ctx_device(): the current device as the C calls see it without Python (cuCtxGetDevice),
   or None where it is not bound or no context is current (they ask get_device then). */
static PyObject *ctx_device(PyObject *m, PyObject *unused) {
    int d;
    if (ctx_get_device_fn && ctx_get_device_fn(&d) == 0) return PyLong_FromLong(d);
    Py_RETURN_NONE;
}

/* bind_torch_dlpack(capsule, samples): bind torch's DLPack C exchange table (the
   "dlpack_exchange_api" capsule of torch.Tensor.__dlpack_c_exchange_api__; None unbinds),
   and learn the torch dtype of each DLPack dtype from ``samples`` (a tensor of every dtype:
   a DLPack dtype that several report is marked, and its tensors' dtype attribute read).
   True where bound; False where unbound: None given, or a table this file does not read
   (no major version 1 in its chain, no dltensor or stream function), or more DLPack dtypes
   than it holds. The Python attributes serve where unbound. */
static void unbind_torch_dlpack(void) {
    torch_dl = NULL;
    n_dl_dtypes = 0;
    for (Py_ssize_t i = 0; i < MAX_DL_DTYPES; i++) Py_CLEAR(dl_dtype_object[i]);
    Py_CLEAR(torch_dl_capsule);
}

static PyObject *bind_torch_dlpack(PyObject *m, PyObject *args) {
    PyObject *capsule, *samples;
    if (!PyArg_ParseTuple(args, "OO", &capsule, &samples)) return NULL;
    unbind_torch_dlpack();
    if (capsule == Py_None) Py_RETURN_FALSE;
    const DLPackAPIHeader_ *h = PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
    if (!h) return NULL;
    while (h && h->major != 1) h = h->prev_api;
    const DLPackExchangeAPI_ *api = (const DLPackExchangeAPI_ *)h;
    if (!api || !api->dltensor_from_py_object_no_sync || !api->current_work_stream) Py_RETURN_FALSE;
    PyObject *seq = PySequence_Fast(samples, "samples: a sequence of tensors");
    if (!seq) return NULL;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
        DLTensor_ d;
        if (api->dltensor_from_py_object_no_sync(t, &d)) {
            PyErr_Clear(); /* a dtype DLPack cannot carry: its tensors are declined */
            continue;
        }
        const uint32_t key = dl_dtype_key(d.dtype);
        PyObject *dtype = PyObject_GetAttr(t, s_dtype);
        if (!dtype) goto fail;
        Py_ssize_t j = 0;
        while (j < n && dl_dtype_code[j] != key) j++;
        if (j < n) { /* another torch dtype reports this DLPack dtype: read the attribute */
            if (dl_dtype_object[j] != dtype) Py_XSETREF(dl_dtype_object[j], Py_NewRef(Py_None));
            Py_DECREF(dtype);
            continue;
        }
        if (n == MAX_DL_DTYPES) { /* (more than this file holds: left to the attributes) */
            Py_DECREF(dtype);
            Py_DECREF(seq);
            unbind_torch_dlpack();
            Py_RETURN_FALSE;
        }
        dl_dtype_code[n] = key;
        dl_dtype_object[n++] = dtype;
        n_dl_dtypes = n;
    }
    Py_DECREF(seq);
    torch_dl_capsule = Py_NewRef(capsule);
    torch_dl = api;
    Py_RETURN_TRUE;
fail:
    Py_DECREF(seq);
    unbind_torch_dlpack();
    return NULL;
}

/* dl_describe(t): (address, shape, strides, dtype code | bits << 8 | lanes << 16, device
   type, device index) of torch tensor ``t`` as the bound table reports it; None where
   unbound or declined. (For the tests: what the C calls read.) */
static PyObject *dl_describe(PyObject *m, PyObject *t) {
    DLTensor_ d;
    if (torch_dltensor(t, &d)) Py_RETURN_NONE;
    PyObject *shape = PyTuple_New(d.ndim), *strides = PyTuple_New(d.strides ? d.ndim : 0);
    if (!shape || !strides) goto fail;
    for (Py_ssize_t i = 0; i < d.ndim; i++) {
        PyObject *v = PyLong_FromLongLong(d.shape[i]);
        if (!v) goto fail;
        PyTuple_SET_ITEM(shape, i, v);
        if (d.strides) {
            if (!(v = PyLong_FromLongLong(d.strides[i]))) goto fail;
            PyTuple_SET_ITEM(strides, i, v);
        }
    }
    return Py_BuildValue("(KNNkii)", (unsigned long long)((uintptr_t)d.data + d.byte_offset), shape, strides,
                         (unsigned long)dl_dtype_key(d.dtype), (int)d.device.device_type, (int)d.device.device_id);
fail:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return NULL;
}

/* dl_current_stream(device): torch's current stream of a CUDA device through the bound table
   (an address), None where unbound. (For the tests.) */
static PyObject *dl_current_stream(PyObject *m, PyObject *dev) {
    if (!torch_dl) Py_RETURN_NONE;
    long d = PyLong_AsLong(dev);
    if (d == -1 && PyErr_Occurred()) return NULL;
    uint64_t s;
    return torch_stream(NULL, d, &s) ? NULL : PyLong_FromUnsignedLongLong(s);
}

static PyMethodDef module_methods[] = {
    {"bind_torch_dlpack", bind_torch_dlpack, METH_VARARGS,
     "Bind torch's DLPack C exchange table and its dtypes; True where bound."},
    {"dl_describe", dl_describe, METH_O, "A torch tensor as the bound DLPack table reports it (None: unbound)."},
    {"dl_current_stream", dl_current_stream, METH_O, "torch's current stream of a device by the bound table."},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_VARARGS | METH_KEYWORDS,
     "What the signature functions and Finders use; returns the previous values."},
    {"ctx_device", ctx_device, METH_NOARGS, "The current device by cuCtxGetDevice (None: unbound, no context)."},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cupyops._cfast",
                                    "A memoized fast call's per-call work in C (cupyops/_cfast.c).", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__cfast(void) {
    if (PyType_Ready(&ReplayType) < 0 || PyType_Ready(&FinderType) < 0 || PyType_Ready(&DispatchType) < 0 ||
        PyType_Ready(&OperatorType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    s_data = PyUnicode_InternFromString("data");
    s_ptr = PyUnicode_InternFromString("ptr");
    s_mem = PyUnicode_InternFromString("mem");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_new_empty = PyUnicode_InternFromString("new_empty");
    s_shape = PyUnicode_InternFromString("shape");
    s_strides = PyUnicode_InternFromString("strides");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_stride = PyUnicode_InternFromString("stride");
    s_get_device = PyUnicode_InternFromString("get_device");
    s_cupy = PyUnicode_InternFromString("cupy");
    s_torch = PyUnicode_InternFromString("torch");
    cupy_sig_fn = PyCFunction_NewEx(&cupy_sig_def, NULL, NULL);
    torch_sig_fn = PyCFunction_NewEx(&torch_sig_def, NULL, NULL);
    launch_error = PyErr_NewException("cupyops._cfast.LaunchError", PyExc_RuntimeError, NULL);
    PyObject *weakref_module = PyImport_ImportModule("_weakref");
    weakref_count = weakref_module ? PyObject_GetAttrString(weakref_module, "getweakrefcount") : NULL;
    Py_XDECREF(weakref_module);
    if (!weakref_count || !s_data || !s_ptr || !s_mem || !s_data_ptr || !s_new_empty || !launch_error || !s_shape || !s_strides ||
        !s_dtype || !s_stride || !s_get_device || !s_cupy || !s_torch || !cupy_sig_fn || !torch_sig_fn ||
        PyModule_AddObjectRef(m, "Replay", (PyObject *)&ReplayType) < 0 ||
        PyModule_AddObjectRef(m, "Finder", (PyObject *)&FinderType) < 0 ||
        PyModule_AddObjectRef(m, "Dispatch", (PyObject *)&DispatchType) < 0 ||
        PyModule_AddObjectRef(m, "Operator", (PyObject *)&OperatorType) < 0 ||
        PyModule_AddObjectRef(m, "cupy_sig", cupy_sig_fn) < 0 ||
        PyModule_AddObjectRef(m, "torch_sig", torch_sig_fn) < 0 ||
        PyModule_AddObjectRef(m, "LaunchError", launch_error) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
