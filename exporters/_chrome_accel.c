/* rltrace.exporters._chrome_accel: the Chrome encoder's per-record loop, compiled.
 *
 * ChromeEncoder.encode spends most of an export cycle on rltrace's own records: for each one
 * it looks up the track, the cached name and category, builds the ``args`` JSON (orjson) and
 * formats one ``X`` line.  This module does that loop in C for the common record (an rltrace
 * record without ``extra``: no events, error, status, user attributes or instant) and hands
 * every other item to the Python encoder (``ChromeEncoder._encode_item``), item by item, so
 * the output is the pure-Python encoder's, byte for byte (tests/test_accel.py compares
 * the two on generated records).  Anything unexpected (an int beyond 64 bits, a negative
 * time, a non-dict ``args``, a key the caches cannot hash) also goes to the Python path.
 *
 * Optional: rltrace installs and runs without it (no compiler, or RLTRACE_PURE_PYTHON=1).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <structmember.h>

static PyObject *readable_span_type; /* opentelemetry.sdk.trace.ReadableSpan */
static PyObject *last_names;         /* exporters.values._last_names: ident -> thread name */
static PyObject *thread_name_fn;     /* exporters.values.thread_name */
static PyObject *dumps_fn;           /* orjson.dumps */
static PyObject *dumps_kwargs;       /* {"default": json_default, "option": OPT_NON_STR_KEYS} */

static PyObject *s_rltrace_record, *s_thread, *s_lane, *s_name, *s_category, *s_args, *s_extra,
    *s_start_ns, *s_end_ns, *s_slot_attrs, *s_record_attrs, *s_tids, *s_names, *s_cats,
    *s_args_only, *s_args_tail, *s_new_tid, *s_name_m, *s_cat_m, *s_args_json, *s_encode_item,
    *s_rank, *s_role, *s__attrs;

/* Record fields read straight from their slots: per record type, the offsets of the fields
 * that are slot members (``__slots__`` or the compiled scope core's; a data descriptor, so an
 * instance can never shadow it), found once; anything else is read with getattr. */
enum { F_THREAD, F_LANE, F_NAME, F_CATEGORY, F_ARGS, F_EXTRA, F_START, F_END, F_ATTRS, NFIELDS };
static PyObject *field_names[NFIELDS];
#define TYPE_CACHE 16
static struct { PyTypeObject *type; Py_ssize_t off[NFIELDS]; } type_cache[TYPE_CACHE];
static int type_cache_n;

static const Py_ssize_t *
offsets_for(PyTypeObject *type)
{
    for (int i = 0; i < type_cache_n; i++)
        if (type_cache[i].type == type) return type_cache[i].off;
    if (type_cache_n == TYPE_CACHE) return NULL;
    Py_ssize_t off[NFIELDS]; /* found here, then published at once (getattr may run Python) */
    for (int f = 0; f < NFIELDS; f++) {
        off[f] = -1;
        PyObject *d = PyObject_GetAttr((PyObject *)type, field_names[f]);
        if (d == NULL) { PyErr_Clear(); continue; }
        if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && !(m->flags & READ_RESTRICTED)) off[f] = m->offset;
        }
        Py_DECREF(d);
    }
    for (int i = 0; i < type_cache_n; i++) /* another thread found it meanwhile */
        if (type_cache[i].type == type) return type_cache[i].off;
    if (type_cache_n == TYPE_CACHE) return NULL;
    Py_INCREF(type); /* kept: its address must not be reused by another type */
    memcpy(type_cache[type_cache_n].off, off, sizeof off);
    type_cache[type_cache_n].type = type;
    return type_cache[type_cache_n++].off;
}

/* rec.<field> (a new reference), from its slot when it has one */
static PyObject *
field(PyObject *rec, const Py_ssize_t *off, int f)
{
    if (off != NULL && off[f] >= 0) {
        PyObject *v = *(PyObject **)((char *)rec + off[f]);
        if (v == NULL) {
            PyErr_SetObject(PyExc_AttributeError, field_names[f]);
            return NULL;
        }
        Py_INCREF(v);
        return v;
    }
    return PyObject_GetAttr(rec, field_names[f]);
}

static int
lookup_attr(PyObject *obj, PyObject *name, PyObject **result)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(obj, name, result);
#else
    return _PyObject_LookupAttr(obj, name, result);
#endif
}

static PyObject *
configure(PyObject *self, PyObject *args)
{
    PyObject *rs, *names, *tn, *dumps, *kwargs;
    if (!PyArg_ParseTuple(args, "OO!OOO!", &rs, &PyDict_Type, &names, &tn, &dumps,
                          &PyDict_Type, &kwargs))
        return NULL;
    if (!PyType_Check(rs)) {
        PyErr_SetString(PyExc_TypeError, "configure: ReadableSpan must be a class");
        return NULL;
    }
    Py_INCREF(rs); Py_XSETREF(readable_span_type, rs);
    Py_INCREF(names); Py_XSETREF(last_names, names);
    Py_INCREF(tn); Py_XSETREF(thread_name_fn, tn);
    Py_INCREF(dumps); Py_XSETREF(dumps_fn, dumps);
    Py_INCREF(kwargs); Py_XSETREF(dumps_kwargs, kwargs);
    Py_RETURN_NONE;
}

/* An int attribute as a C long long; 0 with *ok = 0 when it is not an int that fits. */
static long long
as_ll(PyObject *v, int *ok)
{
    if (!PyLong_CheckExact(v)) { *ok = 0; return 0; }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); *ok = 0; return 0; }
    return x;
}

/* the previous record's track: (thread, lane, thread name) in the encoder's ``_tids`` -> tid */
static PyObject *last_tids, *last_thread, *last_lane, *last_tname, *last_tid;

/* Decimal digits of a non-negative ``v`` at ``p``; returns the end. */
static char *
put_ll(char *p, long long v)
{
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    if (v < 0) *p++ = '-';
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    while (n) *p++ = tmp[--n];
    return p;
}

static char *
put_s(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

#define PUT_LIT(p, lit) put_s(p, lit, sizeof(lit) - 1)

/* ``{"pid":P,"tid":T,"ph":"X","ts":US,"dur":D/1000.D%1000,"name":`` (d >= 0); its length. */
static int
format_head(char *head, long pid, long long tid, long long us, long long d)
{
    char *p = head;
    p = PUT_LIT(p, "{\"pid\":"); p = put_ll(p, pid);
    p = PUT_LIT(p, ",\"tid\":"); p = put_ll(p, tid);
    p = PUT_LIT(p, ",\"ph\":\"X\",\"ts\":"); p = put_ll(p, us);
    p = PUT_LIT(p, ",\"dur\":"); p = put_ll(p, d / 1000);
    long long frac = d % 1000;
    *p++ = '.';
    *p++ = (char)('0' + frac / 100); *p++ = (char)('0' + frac / 10 % 10); *p++ = (char)('0' + frac % 10);
    p = PUT_LIT(p, ",\"name\":");
    return (int)(p - head);
}

/* Cached bytes for ``key`` in ``cache`` (a dict), else ``encoder.<method>(key)``. */
static PyObject *
cached(PyObject *encoder, PyObject *cache, PyObject *key, PyObject *method)
{
    PyObject *b = PyDict_GetItemWithError(cache, key); /* borrowed */
    if (b != NULL) { Py_INCREF(b); return b; }
    if (PyErr_Occurred()) { /* unhashable: the Python method copes */
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
        PyErr_Clear();
    }
    return PyObject_CallMethodOneArg(encoder, method, key);
}

/* The ``args`` JSON of a record, as two parts written one after the other: ``*body`` (a new
 * reference) and ``*tail`` (borrowed, or NULL).  Returns 0, 1 for "use the Python path",
 * -1 on error. */
static int
args_parts(PyObject *encoder, PyObject *args, PyObject *args_only, PyObject *args_tail,
           PyObject **body, PyObject **tail, Py_ssize_t *body_len)
{
    *tail = NULL;
    if (args == Py_None || (PyDict_CheckExact(args) && PyDict_GET_SIZE(args) == 0)) {
        Py_INCREF(args_only); *body = args_only;
        *body_len = PyBytes_GET_SIZE(args_only);
        return 0;
    }
    if (!PyDict_CheckExact(args)) return 1;
    int has = PyDict_Contains(args, s_rank);
    if (has == 0) has = PyDict_Contains(args, s_role);
    if (has < 0) return -1;
    if (has) { /* the caller's rank/role win: the Python method merges */
        *body = PyObject_CallMethodOneArg(encoder, s_args_json, args);
        if (*body == NULL) return -1;
        if (!PyBytes_Check(*body)) { Py_CLEAR(*body); return 1; }
        *body_len = PyBytes_GET_SIZE(*body);
        return 0;
    }
    /* Attribute keys are strings and values JSON types: the plain call (no keywords, a third
     * of the cost) gives the same bytes.  Otherwise (a TypeError: a non-str key, a value that
     * needs ``default``) the call with the options, as the Python path makes it. */
    PyObject *j = PyObject_CallOneArg(dumps_fn, args);
    if (j == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear();
        PyObject *t = PyTuple_Pack(1, args);
        if (t == NULL) return -1;
        j = PyObject_Call(dumps_fn, t, dumps_kwargs);
        Py_DECREF(t);
        if (j == NULL) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) { PyErr_Clear(); return 1; } /* json_safe */
            return -1;
        }
    }
    if (!PyBytes_Check(j) || PyBytes_GET_SIZE(j) < 2) { Py_DECREF(j); return 1; }
    *body = j;
    *body_len = PyBytes_GET_SIZE(j) - 1; /* without its closing brace */
    *tail = args_tail;
    return 0;
}

/* Encode one record on the fast path: 0 done, 1 "use the Python path", -1 error. */
static int
encode_record(PyObject *encoder, PyObject *rec, long pid, PyObject *out, PyObject *tids,
              PyObject *names, PyObject *cats, PyObject *args_only, PyObject *args_tail)
{
    int rc = 1, ok = 1;
    PyObject *extra = NULL, *thread = NULL, *lane = NULL, *tname = NULL, *key = NULL,
        *tid = NULL, *name = NULL, *name_b = NULL, *cat = NULL, *cat_b = NULL, *args = NULL,
        *slot = NULL, *own = NULL, *merged = NULL, *body = NULL, *start = NULL, *end = NULL;

    const Py_ssize_t *off = offsets_for(Py_TYPE(rec));
    extra = field(rec, off, F_EXTRA);
    if (extra == NULL) goto fail_attr;
    if (extra != Py_None) goto done;
    if (!(thread = field(rec, off, F_THREAD))) goto fail_attr;
    if (!(lane = field(rec, off, F_LANE))) goto fail_attr;
    if (!(start = field(rec, off, F_START))) goto fail_attr;
    if (!(end = field(rec, off, F_END))) goto fail_attr;
    long long start_ns = as_ll(start, &ok), end_ns = as_ll(end, &ok);
    if (!ok || start_ns < 0 || end_ns < 0) goto done; /* (no overflow below) */
    long long us = start_ns / 1000, d = end_ns - us * 1000;
    if (d < 0) goto done;

    tname = PyDict_GetItemWithError(last_names, thread);
    if (tname != NULL && PyUnicode_CheckExact(tname) && PyUnicode_GET_LENGTH(tname)) {
        Py_INCREF(tname);
    } else { /* unseen, or a name thread_name() replaces ("" -> thread-<ident>) */
        if (tname == NULL && PyErr_Occurred()) goto fail;
        tname = PyObject_CallOneArg(thread_name_fn, thread);
        if (tname == NULL) goto fail;
    }
    /* the track of the previous record, most often this one's too */
    int same = last_tids == tids && last_tname == tname && PyLong_CheckExact(thread)
               && PyLong_CheckExact(lane);
    if (same) same = PyObject_RichCompareBool(last_thread, thread, Py_EQ);
    if (same > 0) same = PyObject_RichCompareBool(last_lane, lane, Py_EQ);
    if (same < 0) goto fail;
    if (same) {
        tid = last_tid;
        Py_INCREF(tid);
        goto have_tid;
    }
    key = PyTuple_Pack(3, thread, lane, tname);
    if (key == NULL) goto fail;
    tid = PyDict_GetItemWithError(tids, key);
    if (tid != NULL) {
        Py_INCREF(tid);
    } else {
        if (PyErr_Occurred()) goto fail;
        PyObject *pid_o = PyLong_FromLong(pid);
        if (pid_o == NULL) goto fail;
        tid = PyObject_CallMethodObjArgs(encoder, s_new_tid, pid_o, thread, lane, tname, out, NULL);
        Py_DECREF(pid_o);
        if (tid == NULL) goto fail;
    }
    /* remembered with strong references: a freed dict's address is never mistaken for it */
    Py_INCREF(tids); Py_XSETREF(last_tids, tids);
    Py_INCREF(thread); Py_XSETREF(last_thread, thread);
    Py_INCREF(lane); Py_XSETREF(last_lane, lane);
    Py_INCREF(tname); Py_XSETREF(last_tname, tname);
    Py_INCREF(tid); Py_XSETREF(last_tid, tid);
have_tid:;
    long long tid_v = as_ll(tid, &ok);
    if (!ok) goto done;

    if (!(name = field(rec, off, F_NAME))) goto fail_attr;
    if (!(name_b = cached(encoder, names, name, s_name_m))) goto fail;
    if (!(cat = field(rec, off, F_CATEGORY))) goto fail_attr;
    if (!(cat_b = cached(encoder, cats, cat, s_cat_m))) goto fail;
    if (!PyBytes_Check(name_b) || !PyBytes_Check(cat_b)) goto done;

    if (!(args = field(rec, off, F_ARGS))) goto fail_attr;
    if (!(slot = PyObject_GetAttr(rec, s_slot_attrs))) goto fail_attr;
    int slot_attrs = PyObject_IsTrue(slot);
    if (slot_attrs < 0) goto fail;
    PyObject *use = args; /* borrowed */
    if (slot_attrs) {
        /* as the Python path: own = rec.record_attrs(); args = own / {**args, **own} / args */
        /* a finished record's attributes are kept in ``_attrs`` once built (and
         * ``record_attrs()`` returns them from there); build them through it otherwise */
        if (off != NULL && off[F_ATTRS] >= 0) {
            own = *(PyObject **)((char *)rec + off[F_ATTRS]);
            Py_XINCREF(own);
        } else if (lookup_attr(rec, s__attrs, &own) < 0) {
            goto fail;
        }
        if (own == NULL || !PyDict_CheckExact(own)) {
            Py_XDECREF(own);
            own = PyObject_CallMethodNoArgs(rec, s_record_attrs);
            if (own == NULL) goto fail;
        }
        int args_true = args == Py_None ? 0 : PyObject_IsTrue(args);
        int own_true = own == Py_None ? 0 : PyObject_IsTrue(own);
        if (args_true < 0 || own_true < 0) goto fail;
        if (!args_true) {
            use = own_true ? own : Py_None;
        } else if (own_true) {
            if (!PyDict_CheckExact(args) || !PyDict_Check(own)) goto done;
            merged = PyDict_Copy(args);
            if (merged == NULL || PyDict_Update(merged, own) < 0) goto fail;
            use = merged;
        }
    }
    Py_ssize_t body_len = 0;
    PyObject *tail = NULL;
    int r = args_parts(encoder, use, args_only, args_tail, &body, &tail, &body_len);
    if (r < 0) goto fail;
    if (r > 0) goto done;

    char head[192];
    int hn = format_head(head, pid, tid_v, us, d);
    static const char cat_k[] = ",\"cat\":", args_k[] = ",\"args\":", close_s[] = "}\n";
    Py_ssize_t nl = PyBytes_GET_SIZE(name_b), cl = PyBytes_GET_SIZE(cat_b);
    Py_ssize_t tl = tail != NULL ? PyBytes_GET_SIZE(tail) : 0;
    Py_ssize_t total = hn + nl + (Py_ssize_t)sizeof cat_k - 1 + cl + (Py_ssize_t)sizeof args_k - 1
                       + body_len + tl + (Py_ssize_t)sizeof close_s - 1;
    PyObject *line = PyBytes_FromStringAndSize(NULL, total);
    if (line == NULL) goto fail;
    char *p = PyBytes_AS_STRING(line);
    memcpy(p, head, hn); p += hn;
    memcpy(p, PyBytes_AS_STRING(name_b), nl); p += nl;
    memcpy(p, cat_k, sizeof cat_k - 1); p += sizeof cat_k - 1;
    memcpy(p, PyBytes_AS_STRING(cat_b), cl); p += cl;
    memcpy(p, args_k, sizeof args_k - 1); p += sizeof args_k - 1;
    memcpy(p, PyBytes_AS_STRING(body), body_len); p += body_len;
    if (tl) { memcpy(p, PyBytes_AS_STRING(tail), tl); p += tl; }
    memcpy(p, close_s, sizeof close_s - 1);
    r = PyList_Append(out, line);
    Py_DECREF(line);
    rc = r < 0 ? -1 : 0;
    goto done;

fail_attr: /* a record without one of the fields: the Python path reports it as it would */
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) { PyErr_Clear(); rc = 1; goto done; }
fail:
    rc = -1;
done:
    Py_XDECREF(extra); Py_XDECREF(thread); Py_XDECREF(lane); Py_XDECREF(tname);
    Py_XDECREF(key); Py_XDECREF(tid); Py_XDECREF(name); Py_XDECREF(name_b); Py_XDECREF(cat);
    Py_XDECREF(cat_b); Py_XDECREF(args); Py_XDECREF(slot); Py_XDECREF(own); Py_XDECREF(merged);
    Py_XDECREF(body); Py_XDECREF(start); Py_XDECREF(end);
    return rc;
}

static PyObject *
encode(PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "encode(encoder, items, out, pid)");
        return NULL;
    }
    PyObject *encoder = argv[0], *items = argv[1], *out = argv[2];
    long pid = PyLong_AsLong(argv[3]);
    if (pid == -1 && PyErr_Occurred()) return NULL;
    if (readable_span_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_chrome_accel.configure() was not called");
        return NULL;
    }
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    PyObject *tids = NULL, *names = NULL, *cats = NULL, *only = NULL, *tail = NULL, *seq = NULL;
    PyObject *result = NULL;
    if (!(tids = PyObject_GetAttr(encoder, s_tids)) || !(names = PyObject_GetAttr(encoder, s_names))
        || !(cats = PyObject_GetAttr(encoder, s_cats)) || !(only = PyObject_GetAttr(encoder, s_args_only))
        || !(tail = PyObject_GetAttr(encoder, s_args_tail)))
        goto end;
    if (!PyDict_CheckExact(tids) || !PyDict_CheckExact(names) || !PyDict_CheckExact(cats)
        || !PyBytes_Check(only) || !PyBytes_Check(tail)) {
        PyErr_SetString(PyExc_TypeError, "ChromeEncoder caches of an unexpected type");
        goto end;
    }
    seq = PySequence_Fast(items, "items must be a sequence");
    if (seq == NULL) goto end;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) { /* (callbacks may change it) */
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(item);
        PyObject *rec = NULL;
        int r = 1;
        if (lookup_attr(item, s_rltrace_record, &rec) < 0) { Py_DECREF(item); goto end; }
        if (rec == NULL) { rec = item; Py_INCREF(rec); }
        int is_span = PyObject_TypeCheck(rec, (PyTypeObject *)readable_span_type);
        if (!is_span)
            r = encode_record(encoder, rec, pid, out, tids, names, cats, only, tail);
        Py_DECREF(rec);
        if (r > 0) {
            PyObject *res = PyObject_CallMethodObjArgs(encoder, s_encode_item, item, argv[3], out, NULL);
            if (res == NULL) r = -1;
            else Py_DECREF(res);
        }
        Py_DECREF(item);
        if (r < 0) goto end;
    }
    result = Py_None;
    Py_INCREF(result);
end:
    Py_XDECREF(tids); Py_XDECREF(names); Py_XDECREF(cats); Py_XDECREF(only); Py_XDECREF(tail);
    Py_XDECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(ReadableSpan, last_names, thread_name, dumps, dumps_kwargs): what encode uses."},
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(encoder, items, out, pid): ChromeEncoder.encode's loop; other items go to "
     "encoder._encode_item(item, pid, out)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_chrome_accel",
    "The Chrome encoder's per-record loop, compiled (optional; see exporters/chrome.py).", -1,
    methods,
};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC
PyInit__chrome_accel(void)
{
    INTERN(s_rltrace_record, "rltrace_record"); INTERN(s_thread, "thread");
    INTERN(s_lane, "lane"); INTERN(s_name, "name"); INTERN(s_category, "category");
    INTERN(s_args, "args"); INTERN(s_extra, "extra"); INTERN(s_start_ns, "start_ns");
    INTERN(s_end_ns, "end_ns"); INTERN(s_slot_attrs, "slot_attrs");
    INTERN(s_record_attrs, "record_attrs"); INTERN(s_tids, "_tids"); INTERN(s_names, "_names");
    INTERN(s_cats, "_cats"); INTERN(s_args_only, "_args_only"); INTERN(s_args_tail, "_args_tail");
    INTERN(s_new_tid, "_new_tid"); INTERN(s_name_m, "_name"); INTERN(s_cat_m, "_cat");
    INTERN(s_args_json, "args_json"); INTERN(s_encode_item, "_encode_item");
    INTERN(s_rank, "rank"); INTERN(s_role, "role"); INTERN(s__attrs, "_attrs");
    PyObject *fields[NFIELDS] = {s_thread, s_lane, s_name, s_category, s_args, s_extra, s_start_ns,
                                 s_end_ns, s__attrs};
    for (int f = 0; f < NFIELDS; f++) field_names[f] = fields[f];
    return PyModule_Create(&module);
}
