/* rltrace._scope_accel: the hot path of rltrace.recorder.Scope, compiled.
 *
 * ``ScopeCore`` holds a scope record's fields and its hot methods: ``__init__``,
 * ``__enter__``/``__exit__`` (``with trace_scope(...)``), ``_start_under`` and ``finish`` (the
 * session, task and phase records).  It is rltrace.recorder._PyScopeCore written in C,
 * statement by statement: the same fields (unset until assigned, as slots are), the same
 * lanes, context, clock and queue, and the same Python helpers for everything off the common
 * path (``_acquire_lane``'s pool, ``on_start`` processors, ``_past_wake``, ``_set_error``,
 * ``_restore_parent``, ``internal_error``).  recorder.Scope derives from whichever core is
 * loaded; RLTRACE_PURE_PYTHON=1, or no C compiler at install, gives the Python one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>
#include <limits.h>

typedef struct {
    PyObject_HEAD
    PyObject *sc, *token, *args, *category, *end_ns, *extra, *lane, *name, *owns_lane, *parent,
        *start_ns, *task, *thread;
} ScopeCore;

static PyTypeObject ScopeCoreType;

/* set by configure() from rltrace.recorder */
static PyObject *cv;               /* the contextvar behind OTel's runtime context */
static PyObject *span_key;         /* OTel's current-span context key */
static PyObject *context_type;     /* opentelemetry.context.Context */
static PyObject *state;            /* recorder.STATE */
static PyObject *lanes;            /* recorder._LANES: thread -> [free-lane heap, next lane] */
static PyObject *heappop, *heappush;
static PyObject *get_running_loop, *current_task;
static PyObject *globals;          /* recorder's module dict: ``now_ns`` is read from it */
static PyObject *call_on_start, *past_wake, *internal_error;
static PyObject *span_context_type; /* opentelemetry.trace.SpanContext */
static PyObject *sampled_flags;     /* recorder._SAMPLED */
static PyObject *span_context_py;   /* _PyScopeCore.get_span_context: the rest of the cases */
static PyObject *empty_tuple;

static PyObject *s_now_ns, *s_on_start, *s_buffer, *s_cap, *s_wake_at, *s_dropped, *s_overflow,
    *s_kept, *s_thread, *s_task, *s_lane, *s_set_error, *s_restore_parent, *s_get_span_context,
    *s_is_valid, *s_enter_where, *s_exit_where, *s_append, *s_enabled, *s_device, *zero, *one,
    *s_sampling, *s_rand_bits, *s_id_lock, *s_acquire, *s_release, *n128, *n64;

#define SET(field, value) do { PyObject *_v = (value); Py_XSETREF(self->field, _v); } while (0)

static PyObject *
now(void)
{
    PyObject *clock = PyDict_GetItemWithError(globals, s_now_ns); /* borrowed */
    if (clock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "recorder.now_ns is gone");
        return NULL;
    }
    Py_INCREF(clock); /* another thread may replace it (set_clock) while it runs */
    PyObject *t = PyObject_CallNoArgs(clock);
    Py_DECREF(clock);
    return t;
}

/* Context(ctx): a copy of the current OTel context (what calling the class does: dict's new
 * and init, which Context does not override) */
static PyObject *
context_copy(PyObject *ctx)
{
    PyTypeObject *t = (PyTypeObject *)context_type;
    if (t->tp_init != PyDict_Type.tp_init || t->tp_new != PyDict_Type.tp_new)
        return PyObject_CallOneArg(context_type, ctx);
    PyObject *fresh = t->tp_new(t, empty_tuple, NULL);
    if (fresh == NULL) return NULL;
    if (PyDict_Merge(fresh, ctx, 1) < 0) { Py_DECREF(fresh); return NULL; }
    return fresh;
}

static PyObject *
thread_ident(void)
{
    return PyLong_FromUnsignedLong(PyThread_get_thread_ident());
}

/* the running asyncio task of this thread, or None */
static PyObject *
running_task(void)
{
    PyObject *loop = PyObject_CallNoArgs(get_running_loop);
    if (loop == NULL) return NULL;
    if (loop == Py_None) return loop;
    PyObject *task = PyObject_CallOneArg(current_task, loop);
    Py_DECREF(loop);
    return task;
}

/* a < b for two lanes: exact ints (rltrace makes every lane), whose comparison runs no Python
 * code, so the heap's borrowed items stay valid while it sifts */
static int
lane_lt(PyObject *a, PyObject *b)
{
    if (!PyLong_CheckExact(a) || !PyLong_CheckExact(b)) {
        PyErr_SetString(PyExc_TypeError, "rltrace lane heap holds something other than an int");
        return -1;
    }
    return PyObject_RichCompareBool(a, b, Py_LT);
}

/* heapq.heappop / heappush on a list (the lanes' free heaps; the Python path uses heapq on
 * the same lists: both keep the heap invariant, so both always take the lowest free lane) */
static PyObject *
heap_pop(PyObject *heap)
{
    Py_ssize_t n = PyList_GET_SIZE(heap);
    if (n == 0) {
        PyErr_SetString(PyExc_IndexError, "index out of range");
        return NULL;
    }
    PyObject *last = PyList_GET_ITEM(heap, n - 1);
    Py_INCREF(last);
    if (PyList_SetSlice(heap, n - 1, n, NULL) < 0) { Py_DECREF(last); return NULL; }
    if (--n == 0) return last;
    PyObject *top = PyList_GET_ITEM(heap, 0); /* the list's reference becomes ours */
    PyList_SET_ITEM(heap, 0, last);
    /* sift ``last`` down from the root */
    Py_ssize_t pos = 0;
    for (;;) {
        Py_ssize_t child = 2 * pos + 1;
        if (child >= n) break;
        if (child + 1 < n) {
            int lt = lane_lt(PyList_GET_ITEM(heap, child + 1), PyList_GET_ITEM(heap, child));
            if (lt < 0) { Py_DECREF(top); return NULL; }
            if (lt) child++;
        }
        int lt = lane_lt(PyList_GET_ITEM(heap, child), PyList_GET_ITEM(heap, pos));
        if (lt < 0) { Py_DECREF(top); return NULL; }
        if (!lt) break;
        PyObject *tmp = PyList_GET_ITEM(heap, pos);
        PyList_SET_ITEM(heap, pos, PyList_GET_ITEM(heap, child));
        PyList_SET_ITEM(heap, child, tmp);
        pos = child;
    }
    return top;
}

static int
heap_push(PyObject *heap, PyObject *item)
{
    if (PyList_Append(heap, item) < 0) return -1;
    Py_ssize_t pos = PyList_GET_SIZE(heap) - 1;
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) / 2;
        int lt = lane_lt(PyList_GET_ITEM(heap, pos), PyList_GET_ITEM(heap, parent));
        if (lt < 0) return -1;
        if (!lt) break;
        PyObject *tmp = PyList_GET_ITEM(heap, pos);
        PyList_SET_ITEM(heap, pos, PyList_GET_ITEM(heap, parent));
        PyList_SET_ITEM(heap, parent, tmp);
        pos = parent;
    }
    return 0;
}

/* recorder._acquire_lane(thread) */
static PyObject *
acquire_lane(PyObject *thread)
{
    PyObject *pool = PyDict_GetItemWithError(lanes, thread); /* borrowed */
    if (pool == NULL || pool == Py_None) {
        if (PyErr_Occurred()) return NULL;
        PyObject *free = PyList_New(0);
        if (free == NULL) return NULL;
        pool = Py_BuildValue("[Ni]", free, 0);
        if (pool == NULL) return NULL;
        int r = PyDict_SetItem(lanes, thread, pool);
        Py_DECREF(pool); /* the dict holds it */
        if (r < 0) return NULL;
    }
    if (!PyList_Check(pool) || PyList_GET_SIZE(pool) != 2) {
        PyErr_SetString(PyExc_TypeError, "recorder._LANES holds an unexpected pool");
        return NULL;
    }
    PyObject *free = PyList_GET_ITEM(pool, 0);
    if (PyList_CheckExact(free)) {
        if (PyList_GET_SIZE(free)) return heap_pop(free);
    } else {
        int nonempty = PyObject_IsTrue(free);
        if (nonempty < 0) return NULL;
        if (nonempty) return PyObject_CallOneArg(heappop, free);
    }
    PyObject *lane = PyList_GET_ITEM(pool, 1);
    Py_INCREF(lane);
    PyObject *next = PyNumber_Add(lane, one);
    if (next == NULL) { Py_DECREF(lane); return NULL; }
    PyList_SetItem(pool, 1, next); /* steals next */
    return lane;
}

/* recorder._release_lane(thread, lane) */
static int
release_lane(PyObject *thread, PyObject *lane)
{
    PyObject *pool = PyDict_GetItemWithError(lanes, thread);
    if (pool == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *free = PySequence_GetItem(pool, 0);
    if (free == NULL) return -1;
    int rc = 0;
    if (PyList_CheckExact(free) && PyLong_CheckExact(lane)) {
        rc = heap_push(free, lane);
    } else {
        PyObject *argv[2] = {free, lane};
        PyObject *r = PyObject_Vectorcall(heappush, argv, 2, NULL);
        if (r == NULL) rc = -1;
        else Py_DECREF(r);
    }
    Py_DECREF(free);
    return rc;
}

/* recorder.STATE's fields, read through their slots (RecorderState has __slots__): the
 * offsets are taken from its member descriptors at configure(); -1 reads via getattr */
static Py_ssize_t off_buffer = -1, off_cap = -1, off_wake_at = -1, off_on_start = -1,
    off_enabled = -1, off_device = -1, off_sampling = -1;

static Py_ssize_t
slot_offset(PyObject *obj, const char *name)
{
    PyObject *d = PyDict_GetItemString(Py_TYPE(obj)->tp_dict, name); /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    return m->type == T_OBJECT_EX ? m->offset : -1;
}

/* state.<name> (a new reference) */
static PyObject *
state_get(Py_ssize_t off, PyObject *name)
{
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)state + off);
        if (v != NULL) { Py_INCREF(v); return v; }
    }
    return PyObject_GetAttr(state, name);
}

/* call on_start processors if any (state.on_start is not None) */
static int
maybe_on_start(PyObject *self, PyObject *ctx)
{
    PyObject *on = state_get(off_on_start, s_on_start);
    if (on == NULL) return -1;
    int none = on == Py_None;
    Py_DECREF(on);
    if (none) return 0;
    PyObject *r = PyObject_CallFunctionObjArgs(call_on_start, self, ctx, NULL);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* the rest of recorder.push(self, keep) */
static int
push(PyObject *item, int keep)
{
    PyObject *buf = NULL, *cap_o = NULL, *wake_o = NULL;
    int rc = -1;
    if (!(buf = state_get(off_buffer, s_buffer)) || !(cap_o = state_get(off_cap, s_cap))
        || !(wake_o = state_get(off_wake_at, s_wake_at)))
        goto end;
    Py_ssize_t n = PyObject_Length(buf);
    int of_cap = 0, of_wake = 0;
    long long cap = PyLong_AsLongLongAndOverflow(cap_o, &of_cap);
    long long wake_at = PyLong_AsLongLongAndOverflow(wake_o, &of_wake);
    if (n < 0 || ((cap == -1 || wake_at == -1) && PyErr_Occurred())) goto end;
    /* beyond 64 bits: as Python compares them (n is never that large) */
    if (of_cap) cap = of_cap > 0 ? LLONG_MAX : LLONG_MIN;
    if (of_wake) wake_at = of_wake > 0 ? LLONG_MAX : LLONG_MIN;
    int below_twice = cap > LLONG_MAX / 2 || (cap > 0 && n < 2 * cap);
    if (n < cap || (keep && below_twice)) {
        PyObject *r = PyObject_CallMethodOneArg(buf, s_append, item);
        if (r == NULL) goto end;
        Py_DECREF(r);
        if (n >= wake_at) {
            PyObject *n_o = PyLong_FromSsize_t(n);
            if (n_o == NULL) goto end;
            r = PyObject_CallFunctionObjArgs(past_wake, state, n_o, NULL);
            Py_DECREF(n_o);
            if (r == NULL) goto end;
            Py_DECREF(r);
        }
        rc = 0;
        goto end;
    }
    if (keep) {
        PyObject *overflow = PyObject_GetAttr(state, s_overflow);
        if (overflow == NULL) goto end;
        if (overflow != Py_None) {
            PyObject *r = PyObject_CallOneArg(overflow, item);
            Py_DECREF(overflow);
            if (r == NULL) goto end;
            Py_DECREF(r);
            rc = 0;
            goto end;
        }
        Py_DECREF(overflow);
    }
    PyObject *dropped = PyObject_GetAttr(state, s_dropped);
    if (dropped == NULL) goto end;
    PyObject *more = PyNumber_Add(dropped, one);
    Py_DECREF(dropped);
    if (more == NULL) goto end;
    rc = PyObject_SetAttr(state, s_dropped, more);
    Py_DECREF(more);
end:
    Py_XDECREF(buf); Py_XDECREF(cap_o); Py_XDECREF(wake_o);
    return rc;
}

/* ``except Exception as exc: internal_error(where, exc)``: 0 when handled, -1 to propagate */
static int
report(PyObject *where)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *value = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
    Py_XDECREF(type); Py_XDECREF(tb);
#endif
    PyObject *r = PyObject_CallFunctionObjArgs(internal_error, where, value ? value : Py_None, NULL);
    Py_XDECREF(value);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static int
field_is(PyObject *obj, const char *what)
{
    if (obj == NULL) {
        PyErr_Format(PyExc_AttributeError, "'Scope' object has no attribute '%s'", what);
        return 0;
    }
    return 1;
}

/* ---- ScopeCore ------------------------------------------------------------------------- */

static int
core_init(ScopeCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "category", "args", NULL};
    PyObject *name, *category = Py_None, *a = Py_None;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (kwds == NULL && n >= 1 && n <= 3) { /* Scope(name, category, args): the hot call */
        name = PyTuple_GET_ITEM(args, 0);
        if (n > 1) category = PyTuple_GET_ITEM(args, 1);
        if (n > 2) a = PyTuple_GET_ITEM(args, 2);
    } else if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OO:Scope", kwlist, &name, &category, &a)) {
        return -1;
    }
    Py_INCREF(name); SET(name, name);
    Py_INCREF(category); SET(category, category);
    Py_INCREF(a); SET(args, a);
    Py_INCREF(zero); SET(end_ns, zero);
    Py_INCREF(Py_None); SET(extra, Py_None);
    return 0;
}

static PyObject *
core_enter(ScopeCore *self, PyObject *unused)
{
    PyObject *ctx = NULL, *thread = NULL, *task = NULL, *lane = NULL, *fresh = NULL,
        *token = NULL, *start = NULL;
    if (PyContextVar_Get(cv, NULL, &ctx) < 0) goto error;
    if (ctx == NULL || !PyDict_Check(ctx)) {
        PyErr_SetString(PyExc_TypeError, "the OTel context is not a dict");
        goto error;
    }
    PyObject *parent = PyDict_GetItemWithError(ctx, span_key); /* borrowed */
    if (parent == NULL && PyErr_Occurred()) goto error;
    if (!(thread = thread_ident()) || !(task = running_task())) goto error;
    if (parent == NULL || parent == Py_None) {
        Py_INCREF(Py_None); SET(parent, Py_None);
        if (!(lane = acquire_lane(thread))) goto error;
        Py_INCREF(Py_True); SET(owns_lane, Py_True);
    } else if (PyObject_TypeCheck(parent, &ScopeCoreType)) {
        ScopeCore *p = (ScopeCore *)parent;
        Py_INCREF(parent); SET(parent, parent);
        if (!field_is(p->thread, "thread") || !field_is(p->task, "task")) goto error;
        int same = PyObject_RichCompareBool(p->thread, thread, Py_EQ);
        if (same < 0) goto error;
        if (same && p->task == task) {
            if (!field_is(p->lane, "lane")) goto error;
            lane = p->lane; Py_INCREF(lane);
            Py_INCREF(Py_False); SET(owns_lane, Py_False);
        } else {
            if (!(lane = acquire_lane(thread))) goto error;
            Py_INCREF(Py_True); SET(owns_lane, Py_True);
        }
    } else {
        Py_INCREF(parent); /* ours while its get_span_context() runs */
        PyObject *psc = PyObject_CallMethodNoArgs(parent, s_get_span_context);
        Py_DECREF(parent); /* ctx, which we hold, still holds it */
        if (psc == NULL) goto error;
        PyObject *valid_o = PyObject_GetAttr(psc, s_is_valid);
        Py_DECREF(psc);
        if (valid_o == NULL) goto error;
        int valid = PyObject_IsTrue(valid_o);
        Py_DECREF(valid_o);
        if (valid < 0) goto error;
        PyObject *keep = valid ? parent : Py_None;
        Py_INCREF(keep); SET(parent, keep);
        if (!(lane = acquire_lane(thread))) goto error;
        Py_INCREF(Py_True); SET(owns_lane, Py_True);
    }
    SET(lane, lane); lane = NULL;
    SET(thread, thread); thread = NULL;
    SET(task, task); task = NULL;
    fresh = context_copy(ctx);
    if (fresh == NULL) goto error;
    if (!PyDict_Check(fresh)) {
        PyErr_SetString(PyExc_TypeError, "Context(...) did not make a dict");
        goto error;
    }
    if (PyDict_SetItem(fresh, span_key, (PyObject *)self) < 0) goto error;
    if (!(token = PyContextVar_Set(cv, fresh))) goto error;
    SET(token, token); token = NULL;
    if (!(start = now())) goto error;
    SET(start_ns, start); start = NULL;
    if (maybe_on_start((PyObject *)self, ctx) < 0) goto error;
    goto done;
error:
    if (report(s_enter_where) < 0) {
        Py_XDECREF(ctx); Py_XDECREF(thread); Py_XDECREF(task); Py_XDECREF(lane);
        Py_XDECREF(fresh);
        return NULL;
    }
done:
    Py_XDECREF(ctx); Py_XDECREF(thread); Py_XDECREF(task); Py_XDECREF(lane); Py_XDECREF(fresh);
    Py_XDECREF(token); Py_XDECREF(start);
    Py_INCREF(self);
    return (PyObject *)self;
}

/* end_ns == 0 (Python ==) */
static int
not_ended(ScopeCore *self)
{
    if (!field_is(self->end_ns, "end_ns")) return -1;
    return PyObject_RichCompareBool(self->end_ns, zero, Py_EQ);
}

static int
set_error(ScopeCore *self, PyObject *exc)
{
    PyObject *r = PyObject_CallMethodOneArg((PyObject *)self, s_set_error, exc);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static int
release_if_owned(ScopeCore *self)
{
    if (!field_is(self->owns_lane, "owns_lane")) return -1;
    int owns = PyObject_IsTrue(self->owns_lane);
    if (owns <= 0) return owns;
    if (!field_is(self->thread, "thread") || !field_is(self->lane, "lane")) return -1;
    return release_lane(self->thread, self->lane);
}

static PyObject *
core_exit(ScopeCore *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    PyObject *exc = argv[1];
    PyObject *end = now();
    if (end == NULL) goto error; /* as in Python: the clock's error reaches the caller */
    if (self->token == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'Scope' object has no attribute '_token'");
        goto report_it;
    }
    if (self->token != Py_None) {
        PyObject *token = self->token;
        Py_INCREF(Py_None);
        self->token = Py_None; /* token's reference is ours now */
        int r = PyContextVar_Reset(cv, token);
        Py_DECREF(token);
        if (r < 0) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_RuntimeError))
                goto report_it;
            PyErr_Clear(); /* exited in another context: put the parent back there */
            PyObject *res = PyObject_CallMethodNoArgs((PyObject *)self, s_restore_parent);
            if (res == NULL) goto report_it;
            Py_DECREF(res);
        }
        int open = not_ended(self);
        if (open < 0) goto report_it;
        if (open) {
            Py_INCREF(end); SET(end_ns, end);
            if (exc != Py_None && set_error(self, exc) < 0) goto report_it;
            if (release_if_owned(self) < 0) goto report_it;
            if (push((PyObject *)self, 0) < 0) goto report_it; /* a plain scope: droppable */
        }
    }
    Py_DECREF(end);
    Py_RETURN_NONE;
report_it:
    Py_DECREF(end);
    if (report(s_exit_where) < 0) return NULL;
    Py_RETURN_NONE;
error:
    return NULL;
}

static PyObject *
core_start_under(ScopeCore *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "_start_under(parent, share_lane)");
        return NULL;
    }
    PyObject *parent = argv[0];
    int share = PyObject_IsTrue(argv[1]);
    if (share < 0) return NULL;
    Py_INCREF(parent); SET(parent, parent);
    PyObject *thread = thread_ident(); /* our reference, kept to the end */
    if (thread == NULL) return NULL;
    Py_INCREF(thread); SET(thread, thread);
    PyObject *task = running_task();
    if (task == NULL) { Py_DECREF(thread); return NULL; }
    SET(task, task); /* compared by identity only, below */
    int same = 0;
    if (share && parent != Py_None) {
        PyObject *pt = PyObject_GetAttr(parent, s_thread);
        if (pt == NULL) goto fail;
        same = PyObject_RichCompareBool(pt, thread, Py_EQ);
        Py_DECREF(pt);
        if (same < 0) goto fail;
        if (same) {
            PyObject *ptask = PyObject_GetAttr(parent, s_task);
            if (ptask == NULL) goto fail;
            same = ptask == task;
            Py_DECREF(ptask);
        }
    }
    if (same) {
        PyObject *lane = PyObject_GetAttr(parent, s_lane);
        if (lane == NULL) goto fail;
        SET(lane, lane);
        Py_INCREF(Py_False); SET(owns_lane, Py_False);
    } else {
        PyObject *lane = acquire_lane(thread);
        if (lane == NULL) goto fail;
        SET(lane, lane);
        Py_INCREF(Py_True); SET(owns_lane, Py_True);
    }
    PyObject *start = now();
    if (start == NULL) goto fail;
    SET(start_ns, start);
    PyObject *on = state_get(off_on_start, s_on_start);
    if (on == NULL) goto fail;
    int none = on == Py_None;
    Py_DECREF(on);
    if (!none) {
        PyObject *ctx = NULL;
        if (PyContextVar_Get(cv, NULL, &ctx) < 0) goto fail;
        int r = maybe_on_start((PyObject *)self, ctx);
        Py_XDECREF(ctx);
        if (r < 0) goto fail;
    }
    Py_DECREF(thread);
    Py_RETURN_NONE;
fail:
    Py_DECREF(thread);
    return NULL;
}

static PyObject *
core_finish(ScopeCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"end_ns", "exc", "keep", "hold", NULL};
    PyObject *end, *exc = Py_None, *keep_o = Py_False, *hold_o = Py_False;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OOO:finish", kwlist, &end, &exc, &keep_o, &hold_o))
        return NULL;
    if (!field_is(self->end_ns, "end_ns")) return NULL;
    int ended = PyObject_IsTrue(self->end_ns);
    if (ended < 0) return NULL;
    if (ended) Py_RETURN_NONE;
    Py_INCREF(end); SET(end_ns, end);
    if (exc != Py_None && set_error(self, exc) < 0) return NULL;
    if (release_if_owned(self) < 0) return NULL;
    int hold = PyObject_IsTrue(hold_o);
    if (hold < 0) return NULL;
    if (!hold) {
        int keep = PyObject_IsTrue(keep_o);
        if (keep < 0) return NULL;
        if (!keep) {
            PyObject *kept = PyObject_GetAttr((PyObject *)self, s_kept);
            if (kept == NULL) return NULL;
            keep = PyObject_IsTrue(kept);
            Py_DECREF(kept);
            if (keep < 0) return NULL;
        }
        if (push((PyObject *)self, keep) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* rand_bits(bits) or 1: recorder.rand_bits, read at each call (testing.deterministic and
 * set_id_source replace it) */
static PyObject *
draw(PyObject *bits)
{
    PyObject *fn = PyDict_GetItemWithError(globals, s_rand_bits); /* borrowed */
    if (fn == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "recorder.rand_bits is gone");
        return NULL;
    }
    Py_INCREF(fn);
    PyObject *v = PyObject_CallOneArg(fn, bits);
    Py_DECREF(fn);
    if (v == NULL) return NULL;
    int t = PyObject_IsTrue(v);
    if (t < 0) { Py_DECREF(v); return NULL; }
    if (!t) { Py_DECREF(v); Py_INCREF(one); return one; }
    return v;
}

/* _PyScopeCore.get_span_context for the common cases (no head sampler; no parent, or an
 * rltrace parent): the parent's trace id and flags, new ids drawn under recorder._ID_LOCK, as
 * the Python method does; everything else is handed to that method */
static PyObject *
core_get_span_context(ScopeCore *self, PyObject *unused)
{
    if (self->sc != NULL && self->sc != Py_None) { Py_INCREF(self->sc); return self->sc; }
    PyObject *sampling = state_get(off_sampling, s_sampling);
    if (sampling == NULL) return NULL;
    int plain = sampling == Py_None;
    Py_DECREF(sampling);
    PyObject *parent = self->parent; /* NULL: never started (as ``hasattr`` in Python) */
    int root = parent == NULL || parent == Py_None;
    if (!plain || (!root && !PyObject_TypeCheck(parent, &ScopeCoreType)))
        return PyObject_CallOneArg(span_context_py, (PyObject *)self);
    PyObject *trace_id, *flags, *span_id = NULL, *sc = NULL, *r;
    if (root) {
        trace_id = zero; flags = sampled_flags;
        Py_INCREF(trace_id); Py_INCREF(flags);
    } else {
        Py_INCREF(parent); /* Python code below may replace self.parent */
        PyObject *psc = PyObject_CallMethodNoArgs(parent, s_get_span_context);
        Py_DECREF(parent);
        if (psc == NULL) return NULL;
        if (!PyTuple_Check(psc) || PyTuple_GET_SIZE(psc) < 4) {
            Py_DECREF(psc);
            PyErr_SetString(PyExc_TypeError, "an rltrace record's get_span_context() returned "
                            "something other than a SpanContext");
            return NULL;
        }
        trace_id = PyTuple_GET_ITEM(psc, 0); flags = PyTuple_GET_ITEM(psc, 3);
        Py_INCREF(trace_id); Py_INCREF(flags);
        Py_DECREF(psc);
    }
    /* recorder._ID_LOCK, read at each call (a forked child gets a new one) */
    PyObject *lock = PyDict_GetItemWithError(globals, s_id_lock);
    if (lock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "recorder._ID_LOCK is gone");
        goto done;
    }
    Py_INCREF(lock);
    if (!(r = PyObject_CallMethodNoArgs(lock, s_acquire))) { Py_DECREF(lock); goto done; }
    Py_DECREF(r);
    if (self->sc != NULL && self->sc != Py_None) { /* drawn meanwhile, by another thread */
        sc = self->sc;
        Py_INCREF(sc);
    } else {
        int has = PyObject_IsTrue(trace_id);
        if (has == 0) Py_SETREF(trace_id, draw(n128));
        if (has >= 0 && trace_id != NULL && (span_id = draw(n64)) != NULL) {
            PyObject *argv[4] = {trace_id, span_id, Py_False, flags};
            sc = PyObject_Vectorcall(span_context_type, argv, 4, NULL);
            if (sc != NULL) {
                Py_INCREF(sc);
                Py_XSETREF(self->sc, sc);
            }
        }
    }
    /* release the lock, keeping an error raised above */
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *err = PyErr_GetRaisedException();
#else
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
#endif
    r = PyObject_CallMethodNoArgs(lock, s_release);
    Py_DECREF(lock);
    if (r == NULL) Py_CLEAR(sc);
    else Py_DECREF(r);
#if PY_VERSION_HEX >= 0x030C0000
    if (err != NULL) { Py_XDECREF(PyErr_GetRaisedException()); PyErr_SetRaisedException(err); }
#else
    if (et != NULL) {
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        Py_XDECREF(t2); Py_XDECREF(v2); Py_XDECREF(tb2);
        PyErr_Restore(et, ev, etb);
    }
#endif
done:
    Py_XDECREF(trace_id); Py_XDECREF(flags); Py_XDECREF(span_id);
    return sc;
}

static int
core_traverse(ScopeCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->sc); Py_VISIT(self->token); Py_VISIT(self->args); Py_VISIT(self->category);
    Py_VISIT(self->end_ns); Py_VISIT(self->extra); Py_VISIT(self->lane); Py_VISIT(self->name);
    Py_VISIT(self->owns_lane); Py_VISIT(self->parent); Py_VISIT(self->start_ns);
    Py_VISIT(self->task); Py_VISIT(self->thread);
    return 0;
}

static int
core_clear(ScopeCore *self)
{
    Py_CLEAR(self->sc); Py_CLEAR(self->token); Py_CLEAR(self->args); Py_CLEAR(self->category);
    Py_CLEAR(self->end_ns); Py_CLEAR(self->extra); Py_CLEAR(self->lane); Py_CLEAR(self->name);
    Py_CLEAR(self->owns_lane); Py_CLEAR(self->parent); Py_CLEAR(self->start_ns);
    Py_CLEAR(self->task); Py_CLEAR(self->thread);
    return 0;
}

static void
core_dealloc(ScopeCore *self)
{
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define MEMBER(pyname, field) {pyname, T_OBJECT_EX, offsetof(ScopeCore, field), 0, NULL}

static PyMemberDef core_members[] = {
    /* ``_sc`` reads None while unset: ``getattr(rec, "_sc", None)`` raises nothing (the ids are
     * asked for once per record on the OTLP and session paths) */
    {"_sc", T_OBJECT, offsetof(ScopeCore, sc), 0, NULL},
    MEMBER("_token", token), MEMBER("args", args),
    MEMBER("category", category), MEMBER("end_ns", end_ns), MEMBER("extra", extra),
    MEMBER("lane", lane), MEMBER("name", name), MEMBER("owns_lane", owns_lane),
    MEMBER("parent", parent), MEMBER("start_ns", start_ns), MEMBER("task", task),
    MEMBER("thread", thread), {NULL, 0, 0, 0, NULL},
};

static PyMethodDef core_methods[] = {
    {"__enter__", (PyCFunction)core_enter, METH_NOARGS, "Open the scope (see Scope)."},
    {"get_span_context", (PyCFunction)core_get_span_context, METH_NOARGS,
     "The record's SpanContext: its ids are drawn the first time anything asks."},
    {"__exit__", (PyCFunction)(void (*)(void))core_exit, METH_FASTCALL, "Close the scope."},
    {"_start_under", (PyCFunction)(void (*)(void))core_start_under, METH_FASTCALL,
     "Start without entering the context, under ``parent`` (see Scope.begin_detached)."},
    {"finish", (PyCFunction)(void (*)(void))core_finish, METH_VARARGS | METH_KEYWORDS,
     "finish(end_ns, exc=None, keep=False, hold=False): close and queue (see Scope)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScopeCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rltrace._scope_accel.ScopeCore",
    .tp_basicsize = sizeof(ScopeCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields and hot methods of rltrace.recorder.Scope, compiled.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)core_init,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_members = core_members,
    .tp_methods = core_methods,
};

/* ---- ScopeFactory: trace_scope's common call, compiled ---------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *fallback; /* the Python function: every other call goes there */
    PyObject *scope;    /* recorder.Scope */
    PyObject *noop;     /* recorder.NOOP */
    PyObject *dict;     /* __dict__: functools.update_wrapper gives it the function's name, doc */
    vectorcallfunc vectorcall;
} ScopeFactory;

/* ``trace_scope(name[, category[, args]])`` with a str name and dict/None args, tracing on and
 * no device defaults: ``Scope(name, category, dict(args) if args else None)``, or NOOP while
 * tracing is off; anything else (keywords, bad input, device options) calls ``fallback``. */
static PyObject *
factory_vectorcall(ScopeFactory *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && n >= 1 && n <= 3 && state != NULL) {
        PyObject *name = args[0], *cat = n > 1 ? args[1] : Py_None, *a = n > 2 ? args[2] : Py_None;
        if (PyUnicode_CheckExact(name) && (a == Py_None || PyDict_CheckExact(a))) {
            PyObject *enabled = state_get(off_enabled, s_enabled);
            if (enabled == NULL) return NULL;
            int on = PyObject_IsTrue(enabled);
            Py_DECREF(enabled);
            if (on < 0) return NULL;
            if (!on) { Py_INCREF(self->noop); return self->noop; }
            PyObject *device = state_get(off_device, s_device);
            if (device == NULL) return NULL;
            int plain = device == Py_None;
            Py_DECREF(device);
            if (plain) {
                PyObject *copy = Py_None;
                if (a != Py_None && PyDict_GET_SIZE(a)) {
                    if (!(copy = PyDict_Copy(a))) return NULL;
                } else {
                    Py_INCREF(copy);
                }
                PyObject *argv[3] = {name, cat, copy};
                PyObject *scope = PyObject_Vectorcall(self->scope, argv, 3, NULL);
                Py_DECREF(copy);
                return scope;
            }
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
factory_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *fallback, *scope, *noop;
    if (!PyArg_ParseTuple(args, "OOO:ScopeFactory", &fallback, &scope, &noop)) return NULL;
    if (!PyCallable_Check(fallback) || !PyType_Check(scope)) {
        PyErr_SetString(PyExc_TypeError, "ScopeFactory(fallback, Scope, NOOP)");
        return NULL;
    }
    ScopeFactory *self = (ScopeFactory *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(fallback); self->fallback = fallback;
    Py_INCREF(scope); self->scope = scope;
    Py_INCREF(noop); self->noop = noop;
    self->vectorcall = (vectorcallfunc)factory_vectorcall;
    return (PyObject *)self;
}

static int
factory_traverse(ScopeFactory *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback); Py_VISIT(self->scope); Py_VISIT(self->noop); Py_VISIT(self->dict);
    return 0;
}

static int
factory_clear(ScopeFactory *self)
{
    Py_CLEAR(self->fallback); Py_CLEAR(self->scope); Py_CLEAR(self->noop); Py_CLEAR(self->dict);
    return 0;
}

static void
factory_dealloc(ScopeFactory *self)
{
    PyObject_GC_UnTrack(self);
    factory_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
factory_repr(ScopeFactory *self)
{
    PyObject *name = PyObject_GetAttrString(self->fallback, "__qualname__");
    if (name == NULL) return NULL;
    PyObject *r = PyUnicode_FromFormat("<function %S (compiled common call)>", name);
    Py_DECREF(name);
    return r;
}

/* pickled as the function it stands for: by name (``__module__`` and ``__qualname__``, which
 * functools.update_wrapper copied) */
static PyObject *
factory_reduce(ScopeFactory *self, PyObject *unused)
{
    return PyObject_GetAttrString((PyObject *)self, "__qualname__");
}

static PyMethodDef factory_methods[] = {
    {"__reduce__", (PyCFunction)factory_reduce, METH_NOARGS, "Pickled by reference."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef factory_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ScopeFactoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rltrace._scope_accel.ScopeFactory",
    .tp_basicsize = sizeof(ScopeFactory),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "ScopeFactory(fallback, Scope, NOOP): trace_scope's common call, compiled.",
    .tp_new = factory_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ScopeFactory, vectorcall),
    .tp_dictoffset = offsetof(ScopeFactory, dict),
    .tp_getset = factory_getset,
    .tp_methods = factory_methods,
    .tp_repr = (reprfunc)factory_repr,
    .tp_dealloc = (destructor)factory_dealloc,
    .tp_traverse = (traverseproc)factory_traverse,
    .tp_clear = (inquiry)factory_clear,
};

/* ---- session_record: session_metrics.build_record, compiled ----------------------------- */

static PyObject *builtin_phases;   /* frozenset of the built-in phase names */
static PyObject *counter_prefix;   /* "rl.session.counter." */
static PyObject *k_status, *k_task, *k_session, *k_reason, *k_step, *v_pending, *f_1e9, *f_zero,
    *s_start_ts, *s_end_ts, *s_turn, *s_interrupted, *r_task_id, *r_session_id, *r_rank, *r_role,
    *r_status, *r_reason, *r_submit_ts, *r_finalized_ts, *r_total_s, *r_generate_s, *r_reward_s,
    *r_toolcall_s, *r_phases, *r_counters, *r_trace_id, *r_turns, *r_step, *r_phase_counts,
    *p_generate, *p_reward, *p_toolcall, *suffix_s, *fmt_032x, *s_sort, *kw_key;
static PyObject *exec_key;         /* operator.itemgetter(0, 1): executions sort by their times */

static int
put(PyObject *d, PyObject *k, PyObject *v) /* steals v */
{
    if (v == NULL) return -1;
    int r = PyDict_SetItem(d, k, v);
    Py_DECREF(v);
    return r;
}

/* attrs.get(key, default) on a dict (a new reference) */
static PyObject *
dget(PyObject *attrs, PyObject *key, PyObject *dflt)
{
    PyObject *v = PyDict_GetItemWithError(attrs, key);
    if (v == NULL) {
        if (PyErr_Occurred()) return NULL;
        v = dflt;
    }
    Py_INCREF(v);
    return v;
}

static PyObject *
div_1e9(PyObject *x)
{
    return PyNumber_TrueDivide(x, f_1e9);
}

/* session_record(attrs, start, end, trace_id, phases, rank, role, custom, counters_possible):
 * the record build_record makes, or None when the inputs are off its common path (not
 * dicts and lists) so the caller builds it in Python. */
static PyObject *
session_record(PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 9) {
        PyErr_SetString(PyExc_TypeError, "session_record takes 9 arguments");
        return NULL;
    }
    PyObject *attrs = argv[0], *start = argv[1], *end = argv[2], *trace_id = argv[3],
        *phases = argv[4], *rank = argv[5], *role = argv[6], *custom = argv[7];
    if (k_step == NULL || !PyDict_CheckExact(attrs) || !PyDict_CheckExact(phases)
        || !PyTuple_CheckExact(custom))
        Py_RETURN_NONE;
    int counters_possible = PyObject_IsTrue(argv[8]);
    if (counters_possible < 0) return NULL;
    PyObject *status = NULL, *totals = NULL, *out_phases = NULL, *counts = NULL, *turns = NULL,
        *record = NULL, *result = NULL, *total = NULL, *items = NULL;
    Py_ssize_t pos = 0;
    PyObject *p, *execs;
    if (!(status = dget(attrs, k_status, v_pending))) goto end;
    if (!(totals = PyDict_New()) || !(out_phases = PyDict_New()) || !(counts = PyDict_New()))
        goto end;
    turns = PyLong_FromLong(-1);
    if (turns == NULL) goto end;
    while (PyDict_Next(phases, &pos, &p, &execs)) {
        /* the phases and their lists are the processor's own, never touched by other code */
        if (!PyList_CheckExact(execs)) { result = Py_None; Py_INCREF(result); goto end; }
        Py_ssize_t n = PyList_GET_SIZE(execs);
        if (n > 1) {  /* execs.sort(key=exec_key) */
            PyObject *sargs[2] = {execs, exec_key};
            PyObject *r = PyObject_VectorcallMethod(s_sort, sargs, 1, kw_key);
            if (r == NULL) goto end;
            Py_DECREF(r);
        }
        total = PyLong_FromLong(0);
        items = PyList_New(0);
        if (total == NULL || items == NULL) goto end;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(execs); i++) {
            PyObject *ex = PyList_GET_ITEM(execs, i);
            if (!PyTuple_Check(ex) || PyTuple_GET_SIZE(ex) != 4) {
                result = Py_None; Py_INCREF(result); goto end;
            }
            PyObject *s = PyTuple_GET_ITEM(ex, 0), *e = PyTuple_GET_ITEM(ex, 1),
                *turn = PyTuple_GET_ITEM(ex, 2), *interrupted = PyTuple_GET_ITEM(ex, 3);
            PyObject *d = PyNumber_Subtract(e, s);
            if (d == NULL) goto end;
            Py_SETREF(total, PyNumber_Add(total, d));
            Py_DECREF(d);
            if (total == NULL) goto end;
            PyObject *item = PyDict_New();
            if (item == NULL) goto end;
            if (put(item, s_start_ts, div_1e9(s)) < 0 || put(item, s_end_ts, div_1e9(e)) < 0) {
                Py_DECREF(item);
                goto end;
            }
            if (turn != Py_None) {
                int gt;
                if (PyDict_SetItem(item, s_turn, turn) < 0
                    || (gt = PyObject_RichCompareBool(turn, turns, Py_GT)) < 0) {
                    Py_DECREF(item);
                    goto end;
                }
                if (gt) { Py_INCREF(turn); Py_SETREF(turns, turn); }
            }
            int intr = PyObject_IsTrue(interrupted);
            if (intr < 0 || (intr && PyDict_SetItem(item, s_interrupted, Py_True) < 0)) {
                Py_DECREF(item);
                goto end;
            }
            int r = PyList_Append(items, item);
            Py_DECREF(item);
            if (r < 0) goto end;
        }
        if (put(totals, p, div_1e9(total)) < 0) goto end;
        Py_CLEAR(total);
        int r = PyDict_SetItem(out_phases, p, items);
        Py_CLEAR(items);
        if (r < 0 || put(counts, p, PyLong_FromSsize_t(PyList_GET_SIZE(execs))) < 0) goto end;
    }
    PyObject *sid = PyDict_GetItemWithError(attrs, k_session);
    if (sid == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, k_session);
        goto end;
    }
    if (!(record = PyDict_New())) goto end;
    PyObject *diff = PyNumber_Subtract(end, start);
    if (diff == NULL) goto end;
    PyObject *total_s = div_1e9(diff);
    Py_DECREF(diff);
    if (put(record, r_task_id, dget(attrs, k_task, Py_None)) < 0
        || PyDict_SetItem(record, r_session_id, sid) < 0
        || PyDict_SetItem(record, r_rank, rank) < 0
        || (role != Py_None && PyDict_SetItem(record, r_role, role) < 0)
        || PyDict_SetItem(record, r_status, status) < 0
        || put(record, r_reason, dget(attrs, k_reason, Py_None)) < 0
        || put(record, r_submit_ts, div_1e9(start)) < 0
        || put(record, r_finalized_ts, div_1e9(end)) < 0
        || put(record, r_total_s, total_s) < 0
        || put(record, r_generate_s, dget(totals, p_generate, f_zero)) < 0
        || put(record, r_reward_s, dget(totals, p_reward, f_zero)) < 0
        || put(record, r_toolcall_s, dget(totals, p_toolcall, f_zero)) < 0
        || PyDict_SetItem(record, r_phases, out_phases) < 0)
        goto end;
    if (counters_possible) {
        PyObject *counters = PyDict_New(), *k, *v;
        if (counters == NULL) goto end;
        Py_ssize_t cpos = 0, plen = PyUnicode_GET_LENGTH(counter_prefix);
        while (PyDict_Next(attrs, &cpos, &k, &v)) {
            if (!PyUnicode_Check(k)) { Py_DECREF(counters); result = Py_None; Py_INCREF(result); goto end; }
            Py_ssize_t m = PyUnicode_Tailmatch(k, counter_prefix, 0, plen, -1);
            if (m < 0) { Py_DECREF(counters); goto end; }
            if (m) {
                PyObject *name = PyUnicode_Substring(k, plen, PyUnicode_GET_LENGTH(k));
                if (name == NULL || put(counters, name, (Py_INCREF(v), v)) < 0) {
                    Py_XDECREF(name);
                    Py_DECREF(counters);
                    goto end;
                }
                Py_DECREF(name);
            }
        }
        int r = PyDict_GET_SIZE(counters) ? PyDict_SetItem(record, r_counters, counters) : 0;
        Py_DECREF(counters);
        if (r < 0) goto end;
    }
    if (put(record, r_trace_id, PyObject_Format(trace_id, fmt_032x)) < 0
        || put(record, r_turns, PyNumber_Add(turns, one)) < 0
        || put(record, r_step, dget(attrs, k_step, Py_None)) < 0)
        goto end;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(custom); i++) { /* registered phases */
        PyObject *c = PyTuple_GET_ITEM(custom, i);
        PyObject *key = PyNumber_Add(c, suffix_s);
        if (key == NULL) goto end;
        int r = put(record, key, dget(totals, c, f_zero));
        Py_DECREF(key);
        if (r < 0) goto end;
    }
    pos = 0;
    PyObject *phase_s;
    while (PyDict_Next(totals, &pos, &p, &phase_s)) { /* and any other phase seen */
        int builtin = PySet_Contains(builtin_phases, p);
        if (builtin < 0) goto end;
        if (builtin) continue;
        PyObject *key = PyNumber_Add(p, suffix_s);
        if (key == NULL) goto end;
        int r = PyDict_SetItem(record, key, phase_s);
        Py_DECREF(key);
        if (r < 0) goto end;
    }
    if (PyDict_SetItem(record, r_phase_counts, counts) < 0) goto end;
    result = record;
    record = NULL;
end:
    Py_XDECREF(status); Py_XDECREF(totals); Py_XDECREF(out_phases); Py_XDECREF(counts);
    Py_XDECREF(turns); Py_XDECREF(record); Py_XDECREF(total); Py_XDECREF(items);
    return result;
}

static PyObject *
configure_sessions(PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 8 || !PyAnySet_Check(argv[0]) || !PyCallable_Check(argv[7])) {
        PyErr_SetString(PyExc_TypeError, "configure_sessions(builtin_phase_names, counter_prefix, "
                        "status_key, task_key, session_key, reason_key, step_key, exec_key)");
        return NULL;
    }
    for (int i = 1; i < 7; i++) {
        if (!PyUnicode_Check(argv[i])) {
            PyErr_SetString(PyExc_TypeError, "configure_sessions: names must be str");
            return NULL;
        }
    }
    PyObject **slots[8] = {&builtin_phases, &counter_prefix, &k_status, &k_task, &k_session,
                           &k_reason, &k_step, &exec_key};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(argv[i]);
        Py_XSETREF(*slots[i], argv[i]);
    }
    Py_RETURN_NONE;
}

static PyObject *
configure(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"contextvar", "span_key", "context_type", "state", "lanes", "heappop",
                             "heappush", "get_running_loop", "current_task", "globals",
                             "call_on_start", "past_wake", "internal_error", "span_context_type",
                             "sampled", "span_context_py", NULL};
    PyObject *a[16];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOO!OOOOO!OOOOOO:configure", kwlist,
                                     &PyContextVar_Type, &a[0], &a[1], &a[2], &a[3],
                                     &PyDict_Type, &a[4], &a[5], &a[6], &a[7], &a[8],
                                     &PyDict_Type, &a[9], &a[10], &a[11], &a[12], &a[13], &a[14],
                                     &a[15]))
        return NULL;
    if (!PyType_Check(a[2]) || !PyType_Check(a[13])) {
        PyErr_SetString(PyExc_TypeError, "configure: context_type and span_context_type must be "
                        "classes");
        return NULL;
    }
    PyObject **slots[16] = {&cv, &span_key, &context_type, &state, &lanes, &heappop, &heappush,
                            &get_running_loop, &current_task, &globals, &call_on_start,
                            &past_wake, &internal_error, &span_context_type, &sampled_flags,
                            &span_context_py};
    for (int i = 0; i < 16; i++) {
        Py_INCREF(a[i]);
        Py_XSETREF(*slots[i], a[i]);
    }
    off_buffer = slot_offset(state, "buffer"); off_cap = slot_offset(state, "cap");
    off_wake_at = slot_offset(state, "wake_at"); off_on_start = slot_offset(state, "on_start");
    off_enabled = slot_offset(state, "enabled"); off_device = slot_offset(state, "device");
    off_sampling = slot_offset(state, "sampling");
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure_sessions", (PyCFunction)(void (*)(void))configure_sessions, METH_FASTCALL,
     "Hand over the built-in phase names and the counter prefix (rltrace.session_metrics)."},
    {"session_record", (PyCFunction)(void (*)(void))session_record, METH_FASTCALL,
     "session_record(attrs, start, end, trace_id, phases, rank, role, custom, counters_possible):"
     " session_metrics.build_record's dict, or None off its common path."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Hand over what the hot path uses (rltrace.recorder calls it once, at import)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scope_accel",
    "The hot path of rltrace.recorder.Scope, compiled (optional; see rltrace/recorder.py).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC
PyInit__scope_accel(void)
{
    INTERN(s_now_ns, "now_ns"); INTERN(s_on_start, "on_start"); INTERN(s_buffer, "buffer");
    INTERN(s_cap, "cap"); INTERN(s_wake_at, "wake_at"); INTERN(s_dropped, "dropped");
    INTERN(s_overflow, "overflow"); INTERN(s_kept, "kept"); INTERN(s_thread, "thread");
    INTERN(s_task, "task"); INTERN(s_lane, "lane"); INTERN(s_set_error, "_set_error");
    INTERN(s_restore_parent, "_restore_parent"); INTERN(s_get_span_context, "get_span_context");
    INTERN(s_is_valid, "is_valid"); INTERN(s_enter_where, "trace_scope enter");
    INTERN(s_exit_where, "trace_scope exit"); INTERN(s_append, "append");
    INTERN(s_enabled, "enabled"); INTERN(s_device, "device"); INTERN(s_sampling, "sampling");
    INTERN(s_rand_bits, "rand_bits"); INTERN(s_id_lock, "_ID_LOCK"); INTERN(s_acquire, "acquire"); INTERN(s_release, "release");
    if (!(n128 = PyLong_FromLong(128)) || !(n64 = PyLong_FromLong(64))) return NULL;
    if (!(zero = PyLong_FromLong(0)) || !(one = PyLong_FromLong(1))) return NULL;
    if (!(empty_tuple = PyTuple_New(0))) return NULL;
    INTERN(v_pending, "pending"); INTERN(s_start_ts, "start_ts");
    INTERN(s_end_ts, "end_ts"); INTERN(s_turn, "turn"); INTERN(s_interrupted, "interrupted");
    INTERN(r_task_id, "task_id"); INTERN(r_session_id, "session_id"); INTERN(r_rank, "rank");
    INTERN(r_role, "role"); INTERN(r_status, "status"); INTERN(r_reason, "reason");
    INTERN(r_submit_ts, "submit_ts"); INTERN(r_finalized_ts, "finalized_ts");
    INTERN(r_total_s, "total_s"); INTERN(r_generate_s, "generate_s");
    INTERN(r_reward_s, "reward_s"); INTERN(r_toolcall_s, "toolcall_s"); INTERN(r_phases, "phases");
    INTERN(r_counters, "counters"); INTERN(r_trace_id, "trace_id"); INTERN(r_turns, "turns");
    INTERN(r_step, "step"); INTERN(r_phase_counts, "phase_counts"); INTERN(p_generate, "generate");
    INTERN(p_reward, "reward"); INTERN(p_toolcall, "toolcall"); INTERN(suffix_s, "_s");
    INTERN(fmt_032x, "032x"); INTERN(s_sort, "sort");
    if (!(kw_key = Py_BuildValue("(s)", "key"))) return NULL;
    if (!(f_1e9 = PyFloat_FromDouble(1e9)) || !(f_zero = PyFloat_FromDouble(0.0))) return NULL;
    if (PyType_Ready(&ScopeCoreType) < 0 || PyType_Ready(&ScopeFactoryType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "ScopeCore", (PyObject *)&ScopeCoreType) < 0
        || PyModule_AddObjectRef(m, "ScopeFactory", (PyObject *)&ScopeFactoryType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
