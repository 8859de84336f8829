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
static PyObject *trace_state;       /* otel_compat.SPAN_CONTEXT_TRACE_STATE: None, or SpanContext
                                     * is built as its tuple (otel_compat.new_span_context) */
static PyObject *trace_id_max, *span_id_max;
static PyObject *empty_tuple;

static PyObject *s_now_ns, *s_on_start, *s_buffer, *s_cap, *s_wake_at, *s_dropped, *s_overflow,
    *s_kept, *s_thread, *s_task, *s_lane, *s_set_error, *s_restore_parent, *s_get_span_context,
    *s_is_valid, *s_enter_where, *s_exit_where, *s_append, *s_enabled, *s_device, *zero, *one,
    *s_sampling, *s_category, *s_starts_turn, *s_open_phases, *s_remove, *s_help_at, *s_help_every, *s_rand_bits, *s_id_lock, *s_acquire, *s_release, *n128, *n64;

#define SET(field, value) do { PyObject *_v = (value); Py_XSETREF(self->field, _v); } while (0)

/* *slots[i] = vals[i] (new references) for i < n: what the configure functions hand over */
static void
keep_all(PyObject **const *slots, PyObject *const *vals, int n)
{
    for (int i = 0; i < n; i++) {
        Py_INCREF(vals[i]);
        Py_XSETREF(*slots[i], vals[i]);
    }
}

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
    off_enabled = -1, off_device = -1, off_sampling = -1, off_help_at = -1;

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
            /* recorder._past_wake acts only at the mark, or past help_at every HELP_EVERY */
            int act = n == wake_at;
            if (!act) {
                PyObject *help_o = state_get(off_help_at, s_help_at);
                if (help_o == NULL) goto end;
                int of_help = 0;
                long long help_at = PyLong_AsLongLongAndOverflow(help_o, &of_help);
                Py_DECREF(help_o);
                if (help_at == -1 && PyErr_Occurred()) goto end;
                if (of_help) help_at = of_help > 0 ? LLONG_MAX : LLONG_MIN;
                PyObject *every_o = PyDict_GetItemWithError(globals, s_help_every); /* borrowed */
                if (every_o == NULL && PyErr_Occurred()) goto end;
                long long every = every_o == NULL ? 0 : PyLong_AsLongLong(every_o);
                if (every == -1 && PyErr_Occurred()) goto end;
                /* an unusable HELP_EVERY: the Python function decides (and raises) */
                act = every <= 0 || (n >= help_at && n % every == 0);
            }
            if (!act) { rc = 0; goto end; }
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

static PyObject *start_under_impl(ScopeCore *self, PyObject *parent, int share);

static PyObject *
core_start_under(ScopeCore *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "_start_under(parent, share_lane)");
        return NULL;
    }
    int share = PyObject_IsTrue(argv[1]);
    if (share < 0) return NULL;
    return start_under_impl(self, argv[0], share);
}

static PyObject *
start_under_impl(ScopeCore *self, PyObject *parent, int share)
{
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

/* finish(end_ns, exc=None, keep=False, hold=False): the arguments, taken without
 * PyArg_ParseTupleAndKeywords (whose keyword parsing cost more than the rest of the call) */
static const char *const finish_names[4] = {"end_ns", "exc", "keep", "hold"};

static int
finish_args(PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames, PyObject **vals)
{
    if (nargs > 4) {
        PyErr_Format(PyExc_TypeError, "finish() takes at most 4 arguments (%zd given)", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) vals[i] = argv[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int j = 0;
        while (j < 4 && PyUnicode_CompareWithASCIIString(name, finish_names[j]) != 0) j++;
        if (j == 4) {
            PyErr_Format(PyExc_TypeError, "finish() got an unexpected keyword argument '%S'", name);
            return -1;
        }
        if (j < nargs || vals[j] != NULL) {
            PyErr_Format(PyExc_TypeError, "finish() got multiple values for argument '%s'",
                         finish_names[j]);
            return -1;
        }
        vals[j] = argv[nargs + k];
    }
    if (vals[0] == NULL) {
        PyErr_SetString(PyExc_TypeError, "finish() missing required argument 'end_ns' (pos 1)");
        return -1;
    }
    return 0;
}

static PyObject *finish_impl(ScopeCore *self, PyObject *end, PyObject *exc, PyObject *keep_o,
                             PyObject *hold_o);

static PyObject *
core_finish(ScopeCore *self, PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *vals[4] = {NULL, NULL, NULL, NULL};
    if (finish_args(argv, nargs, kwnames, vals) < 0) return NULL;
    return finish_impl(self, vals[0], vals[1] ? vals[1] : Py_None, vals[2] ? vals[2] : Py_False,
                       vals[3] ? vals[3] : Py_False);
}

static PyObject *
finish_impl(ScopeCore *self, PyObject *end, PyObject *exc, PyObject *keep_o, PyObject *hold_o)
{
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

/* call lock.release() keeping any exception already raised; -1 when release itself failed */
static int
release_keeping_error(PyObject *lock)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *err = PyErr_GetRaisedException();
#else
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
#endif
    PyObject *r = PyObject_CallMethodNoArgs(lock, s_release);
    int rc = r == NULL ? -1 : 0;
    Py_XDECREF(r);
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
    return rc;
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

/* 1 when 0 < v <= max, 0 when not (or not comparable: __new__ then decides), -1 on error */
static int
in_id_range(PyObject *v, PyObject *max)
{
    if (!PyLong_CheckExact(v)) return 0;
    int gt = PyObject_RichCompareBool(v, zero, Py_GT);
    if (gt <= 0) return gt;
    return PyObject_RichCompareBool(v, max, Py_LE);
}

/* otel_compat.new_span_context: SpanContext(trace_id, span_id, False, flags), built as its tuple
 * (trace_id, span_id, False, flags, trace_state, True) when the probe allowed it and the ids
 * are valid (what __new__ computes), else by calling SpanContext */
static PyObject *
new_span_context(PyObject *trace_id, PyObject *span_id, PyObject *flags)
{
    if (trace_state != NULL && trace_state != Py_None && flags != Py_None) {
        int ok = in_id_range(trace_id, trace_id_max);
        if (ok > 0) ok = in_id_range(span_id, span_id_max);
        if (ok < 0) return NULL;
        if (ok) {
            PyObject *fields = PyTuple_Pack(6, trace_id, span_id, Py_False, flags, trace_state,
                                            Py_True);
            if (fields == NULL) return NULL;
            PyObject *args = PyTuple_Pack(1, fields);
            Py_DECREF(fields);
            if (args == NULL) return NULL;
            /* tuple.__new__(SpanContext, fields) */
            PyObject *sc = PyTuple_Type.tp_new((PyTypeObject *)span_context_type, args, NULL);
            Py_DECREF(args);
            return sc;
        }
    }
    PyObject *argv[4] = {trace_id, span_id, Py_False, flags};
    return PyObject_Vectorcall(span_context_type, argv, 4, NULL);
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
            sc = new_span_context(trace_id, span_id, flags);
            if (sc != NULL) {
                Py_INCREF(sc);
                Py_XSETREF(self->sc, sc);
            }
        }
    }
    if (release_keeping_error(lock) < 0) Py_CLEAR(sc); /* an error raised above is kept */
    Py_DECREF(lock);
done:
    Py_XDECREF(trace_id); Py_XDECREF(flags); Py_XDECREF(span_id);
    return sc;
}

/* ---- PhaseScope.__enter__/__exit__ (rltrace.sessions), compiled -------------------------
 *
 * The ``with trace_session_phase(...)`` path of a PhaseScope statement by statement, set up by
 * configure_phases() from rltrace.sessions.  Its Python fields are read through their slots
 * (offsets from the classes' member descriptors); anything off the common path (a handle
 * entered again, no session, an unset field, a subclass) goes to the Python methods before
 * anything is changed, and the rare races after that call the same Python methods the Python
 * code calls. */

static PyTypeObject *phase_type, *session_type, *registry_type;
static PyObject *session_cv;        /* sessions._SESSION_CV */
static PyObject *phase_enter_py, *phase_exit_py, *phase_attrs_py; /* PhaseScope's Python methods */
static PyObject *attr_interrupted;  /* semconv.ATTR_INTERRUPTED */
static Py_ssize_t off_p_reg = -1, off_p_sid = -1, off_p_spec = -1, off_p_turn = -1,
    off_s_turn = -1, off_s_sid = -1, off_s_ops = -1, off_r_enabled = -1, off_r_sessions = -1,
    off_p_attrs = -1, off_p_start = -1, off_p_end = -1, off_s_task = -1, off_t_id = -1;
static PyTypeObject *task_type;     /* sessions.TaskScope */
static PyObject *task_span, *session_span, *scheduler; /* TASK_SPAN, SESSION_SPAN, "scheduler" */
static Py_ssize_t off_t_attrs = -1, off_t_open = -1, off_t_spread = -1, off_t_step = -1,
    off_s_attrs = -1, off_s_step = -1, off_s_status = -1, off_s_reason = -1;
static PyObject *attr_phase, *attr_turn, *attr_session, *attr_task, *attr_genai_op,
    *attr_genai_conv, *attr_status, *attr_reason, *attr_step, *v_pending_status, *s_name,
    *s_genai_operation;
static PyObject *task_attrs_py, *session_attrs_py; /* TaskScope/SessionScope.record_attrs */

/* the offset of slot ``name`` of class ``t`` (anywhere in its MRO), or -1 */
static Py_ssize_t
type_slot(PyTypeObject *t, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)t, name);
    if (d == NULL) { PyErr_Clear(); return -1; }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX) off = m->offset;
    }
    Py_DECREF(d);
    return off;
}

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* replace a slot's value (steals v) */
static void
slot_set(PyObject *obj, Py_ssize_t off, PyObject *v)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = v;
    Py_XDECREF(old);
}

static PyObject *
call_py(PyObject *fn, PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    PyObject *args[4] = {self, NULL, NULL, NULL};
    for (Py_ssize_t i = 0; i < argc && i < 3; i++) args[i + 1] = argv[i];
    return PyObject_Vectorcall(fn, args, argc + 1, NULL);
}

/* PhaseScope.__enter__ */
static PyObject *
core_phase_enter(ScopeCore *self, PyObject *unused)
{
    PyObject *o = (PyObject *)self;
    if (phase_type == NULL || Py_TYPE(o) != phase_type || (self->parent != NULL && self->parent != Py_None))
        return call_py(phase_enter_py, o, NULL, 0);
    PyObject *reg = SLOT(o, off_p_reg);
    if (reg == NULL || Py_TYPE(reg) != registry_type) return call_py(phase_enter_py, o, NULL, 0);
    PyObject *enabled = SLOT(reg, off_r_enabled), *sessions = SLOT(reg, off_r_sessions);
    if (enabled == NULL || sessions == NULL || !PyDict_CheckExact(sessions))
        return call_py(phase_enter_py, o, NULL, 0);
    int on = PyObject_IsTrue(enabled);
    if (on < 0) return NULL;
    if (!on) { Py_INCREF(o); return o; }
    PyObject *sid = SLOT(o, off_p_sid), *spec = SLOT(o, off_p_spec), *turn = SLOT(o, off_p_turn);
    if (sid == NULL || spec == NULL || turn == NULL || (turn != Py_None && !PyLong_CheckExact(turn)))
        return call_py(phase_enter_py, o, NULL, 0);
    PyObject *sid_owned = NULL, *sess = NULL;
    if (sid == Py_None) {
        if (PyContextVar_Get(session_cv, Py_None, &sid_owned) < 0) return NULL;
        sid = sid_owned;
    } else {
        Py_INCREF(sid);
        sid_owned = sid;
    }
    sess = PyDict_GetItemWithError(sessions, sid); /* borrowed */
    Py_DECREF(sid_owned);
    if (sess == NULL) {
        if (PyErr_Occurred()) return NULL;
        return call_py(phase_enter_py, o, NULL, 0); /* no session: counted there */
    }
    if (Py_TYPE(sess) != session_type) return call_py(phase_enter_py, o, NULL, 0);
    PyObject *s_turn = SLOT(sess, off_s_turn), *s_sid = SLOT(sess, off_s_sid);
    if (s_turn == NULL || s_sid == NULL || !PyLong_CheckExact(s_turn))
        return call_py(phase_enter_py, o, NULL, 0);
    Py_INCREF(sess); /* ours: the registry may drop it while Python code runs below */
    PyObject *ctx = NULL, *fresh = NULL, *token = NULL, *r = NULL;
    /* _start(sess, True): the turn */
    if (turn == Py_None) {
        PyObject *starts_o = PyObject_GetAttr(spec, s_starts_turn);
        if (starts_o == NULL) goto error;
        int starts = PyObject_IsTrue(starts_o);
        Py_DECREF(starts_o);
        if (starts < 0) goto error;
        if (starts) {
            PyObject *next = PyNumber_Add(s_turn, one);
            if (next == NULL) goto error;
            slot_set(sess, off_s_turn, next);
        }
        PyObject *t = SLOT(sess, off_s_turn);
        int pos = PyObject_RichCompareBool(t, zero, Py_GT);
        if (pos < 0) goto error;
        PyObject *mine = pos ? t : zero;
        Py_INCREF(mine);
        slot_set(o, off_p_turn, mine);
    } else {
        int gt = PyObject_RichCompareBool(turn, s_turn, Py_GT);
        if (gt < 0) goto error;
        if (gt) { Py_INCREF(turn); slot_set(sess, off_s_turn, turn); }
    }
    s_sid = SLOT(sess, off_s_sid);
    Py_INCREF(s_sid);
    slot_set(o, off_p_sid, s_sid);
    if (!(r = start_under_impl(self, sess, 1))) goto error;
    Py_CLEAR(r);
    PyObject *ops = SLOT(sess, off_s_ops);
    if (ops == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'SessionScope' object has no attribute 'open_phases'");
        goto error;
    }
    Py_INCREF(ops);
    r = PyObject_CallMethodOneArg(ops, s_append, o); /* atomic; whoever removes it closes it */
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) { Py_DECREF(ops); goto error; }
        PyErr_Clear(); /* finalized meanwhile (a race): recorded, and interrupted */
        Py_DECREF(ops);
        PyObject *end = NULL;
        if (!(r = PyObject_CallMethod(o, "set_attribute", "OO", attr_interrupted, Py_True)))
            goto error;
        Py_CLEAR(r);
        if (!(end = now())) goto error;
        r = finish_impl(self, end, Py_None, Py_False, Py_False);
        Py_DECREF(end);
        if (r == NULL) goto error;
        Py_CLEAR(r);
        goto started; /* as Python: the phase is not made the current span... */
    }
    Py_CLEAR(r);
    {
        PyObject *reg_sessions = SLOT(reg, off_r_sessions), *key = SLOT(sess, off_s_sid);
        if (reg_sessions == NULL || key == NULL || !PyDict_Check(reg_sessions)) {
            PyErr_SetString(PyExc_AttributeError, "a session registry or session lost a field");
            Py_DECREF(ops);
            goto error;
        }
        PyObject *now_sess = PyDict_GetItemWithError(reg_sessions, key);
        if (now_sess == NULL && PyErr_Occurred()) { Py_DECREF(ops); goto error; }
        if (now_sess != sess) { /* finalized meanwhile */
            PyObject *end = now();
            if (end == NULL) { Py_DECREF(ops); goto error; }
            r = PyObject_CallMethod(o, "_close_if_open", "OOOO", ops, end, Py_None, Py_True);
            Py_DECREF(end);
            if (r == NULL) { Py_DECREF(ops); goto error; }
            Py_CLEAR(r);
        }
    }
    Py_DECREF(ops);
started:
    /* ...but here it is, as Python makes it after _start() returns whatever happened */
    if (PyContextVar_Get(cv, NULL, &ctx) < 0) goto error;
    if (ctx == NULL || !PyDict_Check(ctx)) {
        PyErr_SetString(PyExc_TypeError, "the OTel context is not a dict");
        goto error;
    }
    if (!(fresh = context_copy(ctx))) goto error;
    if (!PyDict_Check(fresh)) {
        PyErr_SetString(PyExc_TypeError, "Context(...) did not make a dict");
        goto error;
    }
    if (PyDict_SetItem(fresh, span_key, o) < 0) goto error;
    if (!(token = PyContextVar_Set(cv, fresh))) goto error;
    SET(token, token);
    Py_DECREF(ctx); Py_DECREF(fresh); Py_DECREF(sess);
    Py_INCREF(o);
    return o;
error:
    Py_XDECREF(ctx); Py_XDECREF(fresh); Py_DECREF(sess);
    return NULL;
}

/* PhaseScope.__exit__ */
static PyObject *
core_phase_exit(ScopeCore *self, PyObject *const *argv, Py_ssize_t argc)
{
    PyObject *o = (PyObject *)self;
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    if (phase_type == NULL || Py_TYPE(o) != phase_type) return call_py(phase_exit_py, o, argv, 3);
    PyObject *sess = self->parent, *exc = argv[1];
    if (sess == NULL || sess == Py_None) Py_RETURN_NONE;
    Py_INCREF(sess);
    PyObject *end = now(), *token = NULL, *ops = NULL, *r = NULL;
    if (end == NULL) goto error;
    token = self->token;
    if (token == NULL) { /* the AttributeError Python raises */
        PyErr_SetString(PyExc_AttributeError, "'PhaseScope' object has no attribute '_token'");
        goto error;
    }
    Py_INCREF(token);
    Py_INCREF(Py_None);
    SET(token, Py_None); /* a kept token would keep a context alive with the record */
    if (PyContextVar_Reset(cv, token) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_RuntimeError)
            && !PyErr_ExceptionMatches(PyExc_TypeError))
            goto error;
        PyErr_Clear(); /* exited in another context (or never attached): nothing to undo here */
    }
    Py_CLEAR(token);
    ops = PyObject_GetAttr(sess, s_open_phases);
    if (ops != NULL) {
        r = PyObject_CallMethodOneArg(ops, s_remove, o); /* as in _close_if_open: one closer wins */
        Py_DECREF(ops);
    }
    if (ops == NULL || r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_AttributeError))
            goto error;
        PyErr_Clear();
        Py_DECREF(end); Py_DECREF(sess);
        Py_RETURN_NONE;
    }
    Py_CLEAR(r);
    if (exc != Py_None) {
        if (!(r = PyObject_CallMethod(o, "set_attribute", "OO", attr_interrupted, Py_True)))
            goto error;
        Py_CLEAR(r);
    }
    r = finish_impl(self, end, exc, Py_False, Py_False);
    Py_DECREF(end); Py_DECREF(sess);
    return r;
error:
    Py_XDECREF(end); Py_XDECREF(token); Py_DECREF(sess);
    return NULL;
}

/* PhaseScope.record_attrs: its span attributes (rl.phase, rl.turn, rl.session.id, rl.task.id,
 * and the GenAI pair on generate/toolcall), kept in ``_attrs`` once it ended; a record with
 * payloads or user-set attributes is the Python method's */
static PyObject *
core_phase_attrs(ScopeCore *self, PyObject *unused)
{
    PyObject *o = (PyObject *)self;
    if (phase_type == NULL || task_type == NULL || !PyObject_TypeCheck(o, phase_type))
        return PyObject_CallOneArg(phase_attrs_py, o);
    PyObject *cached = SLOT(o, off_p_attrs);
    if (cached != NULL && cached != Py_None) { Py_INCREF(cached); return cached; }
    PyObject *sp = SLOT(o, off_p_start), *ep = SLOT(o, off_p_end), *spec = SLOT(o, off_p_spec),
        *sid = SLOT(o, off_p_sid), *turn = SLOT(o, off_p_turn), *sess = self->parent;
    if ((self->extra != NULL && self->extra != Py_None) || sp == NULL || ep == NULL
        || spec == NULL || sid == NULL || turn == NULL || sess == NULL || self->end_ns == NULL
        || (sp != Py_None && (!PyDict_CheckExact(sp) || PyDict_GET_SIZE(sp)))
        || (ep != Py_None && (!PyDict_CheckExact(ep) || PyDict_GET_SIZE(ep))))
        return PyObject_CallOneArg(phase_attrs_py, o);
    PyObject *task_id = Py_None;
    if (Py_TYPE(sess) == session_type) {
        PyObject *task = SLOT(sess, off_s_task);
        if (task == NULL || !PyObject_TypeCheck(task, task_type)) return PyObject_CallOneArg(phase_attrs_py, o);
        task_id = SLOT(task, off_t_id);
        if (task_id == NULL) return PyObject_CallOneArg(phase_attrs_py, o);
    } else if (sess != Py_None) {
        return PyObject_CallOneArg(phase_attrs_py, o);
    }
    PyObject *attrs = NULL, *name = NULL, *genai = NULL, *conv = NULL;
    Py_INCREF(task_id); Py_INCREF(sid); Py_INCREF(turn); /* held while Python code runs below */
    if (!(name = PyObject_GetAttr(spec, s_name)) || !(genai = PyObject_GetAttr(spec, s_genai_operation)))
        goto fail;
    if (!(attrs = PyDict_New())) goto fail;
    if (PyDict_SetItem(attrs, attr_phase, name) < 0 || PyDict_SetItem(attrs, attr_turn, turn) < 0
        || PyDict_SetItem(attrs, attr_session, sid) < 0 || PyDict_SetItem(attrs, attr_task, task_id) < 0)
        goto fail;
    if (genai != Py_None) {
        if (PyDict_SetItem(attrs, attr_genai_op, genai) < 0 || !(conv = PyObject_Str(sid))
            || PyDict_SetItem(attrs, attr_genai_conv, conv) < 0)
            goto fail;
    }
    int ended = PyObject_IsTrue(self->end_ns);
    if (ended < 0) goto fail;
    if (ended) { /* _with_user_attrs: kept once the record is finished */
        Py_INCREF(attrs);
        slot_set(o, off_p_attrs, attrs);
    }
    Py_DECREF(task_id); Py_DECREF(sid); Py_DECREF(turn); Py_DECREF(name); Py_DECREF(genai);
    Py_XDECREF(conv);
    return attrs;
fail:
    Py_DECREF(task_id); Py_DECREF(sid); Py_DECREF(turn); Py_XDECREF(name); Py_XDECREF(genai);
    Py_XDECREF(conv); Py_XDECREF(attrs);
    return NULL;
}

/* TaskScope.record_attrs: rl.task.id and rl.step (when set), kept once it ended; a record with
 * user-set attributes is the Python method's */
static PyObject *
core_task_attrs(ScopeCore *self, PyObject *unused)
{
    PyObject *o = (PyObject *)self;
    if (task_type == NULL || !PyObject_TypeCheck(o, task_type))
        return PyObject_CallOneArg(task_attrs_py, o);
    PyObject *cached = SLOT(o, off_t_attrs);
    if (cached != NULL && cached != Py_None) { Py_INCREF(cached); return cached; }
    PyObject *tid = SLOT(o, off_t_id), *step = SLOT(o, off_t_step);
    if ((self->extra != NULL && self->extra != Py_None) || tid == NULL || step == NULL
        || self->end_ns == NULL)
        return PyObject_CallOneArg(task_attrs_py, o);
    PyObject *attrs = PyDict_New();
    if (attrs == NULL) return NULL;
    if (PyDict_SetItem(attrs, attr_task, tid) < 0
        || (step != Py_None && PyDict_SetItem(attrs, attr_step, step) < 0))
        goto fail;
    int ended = PyObject_IsTrue(self->end_ns);
    if (ended < 0) goto fail;
    if (ended) { Py_INCREF(attrs); slot_set(o, off_t_attrs, attrs); }
    return attrs;
fail:
    Py_DECREF(attrs);
    return NULL;
}

/* SessionScope.record_attrs: rl.task.id, rl.session.id, rl.session.status (pending until
 * finalized), rl.session.reason (when set), rl.step (when set), kept once it ended */
static PyObject *
core_session_attrs(ScopeCore *self, PyObject *unused)
{
    PyObject *o = (PyObject *)self;
    if (session_type == NULL || Py_TYPE(o) != session_type)
        return PyObject_CallOneArg(session_attrs_py, o);
    PyObject *cached = SLOT(o, off_s_attrs);
    if (cached != NULL && cached != Py_None) { Py_INCREF(cached); return cached; }
    PyObject *task = SLOT(o, off_s_task), *sid = SLOT(o, off_s_sid), *step = SLOT(o, off_s_step),
        *status = SLOT(o, off_s_status), *reason = SLOT(o, off_s_reason), *tid = NULL;
    if ((self->extra != NULL && self->extra != Py_None) || task == NULL || sid == NULL
        || step == NULL || self->end_ns == NULL || !PyObject_TypeCheck(task, task_type)
        || (tid = SLOT(task, off_t_id)) == NULL)
        return PyObject_CallOneArg(session_attrs_py, o);
    PyObject *attrs = PyDict_New();
    if (attrs == NULL) return NULL;
    if (PyDict_SetItem(attrs, attr_task, tid) < 0 || PyDict_SetItem(attrs, attr_session, sid) < 0)
        goto fail;
    int ended = PyObject_IsTrue(self->end_ns);
    if (ended < 0) goto fail;
    if (ended) { Py_INCREF(attrs); slot_set(o, off_s_attrs, attrs); }
    /* unset status: ended through the OTel API instead of being finalized */
    if (PyDict_SetItem(attrs, attr_status, status != NULL ? status : v_pending_status) < 0
        || (reason != NULL && reason != Py_None && PyDict_SetItem(attrs, attr_reason, reason) < 0)
        || (step != Py_None && PyDict_SetItem(attrs, attr_step, step) < 0))
        goto fail;
    return attrs;
fail:
    Py_DECREF(attrs);
    return NULL;
}

/* ---- the session records' constructors, compiled ------------------------------------------
 * TaskScope(task_id), SessionScope(session_id, task), PhaseScope(spec, ...): each __init__
 * statement by statement on a new object (made as calling the class makes it, without the
 * Python __init__ frame); the step is the caller's (the Python code computes it, as before). */

/* a new record of class t: name, category, args None, end_ns 0, extra None, _attrs None */
static PyObject *
new_record(PyTypeObject *t, PyObject *name, PyObject *category, Py_ssize_t off_attrs)
{
    PyObject *o = t->tp_new(t, empty_tuple, NULL);
    if (o == NULL) return NULL;
    if (!PyObject_TypeCheck(o, &ScopeCoreType)) {
        Py_DECREF(o);
        PyErr_SetString(PyExc_TypeError, "a session record class that is not a ScopeCore");
        return NULL;
    }
    ScopeCore *self = (ScopeCore *)o;
    Py_INCREF(name); SET(name, name);
    Py_INCREF(category); SET(category, category);
    Py_INCREF(Py_None); SET(args, Py_None);
    Py_INCREF(zero); SET(end_ns, zero);
    Py_INCREF(Py_None); SET(extra, Py_None);
    Py_INCREF(Py_None); slot_set(o, off_attrs, Py_None);
    return o;
}

/* record o started under parent (its own lane): o, or NULL (o released) */
static PyObject *
started(PyObject *o, PyObject *parent)
{
    PyObject *r = start_under_impl((ScopeCore *)o, parent, 0);
    if (r == NULL) { Py_DECREF(o); return NULL; }
    Py_DECREF(r);
    return o;
}

static int
records_configured(void)
{
    if (phase_type == NULL || task_type == NULL || session_type == NULL || task_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_phases() was not called");
        return 0;
    }
    return 1;
}

/* new_task(task_id, step): TaskScope.__init__, started (a root) */
static PyObject *
new_task(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 2) { PyErr_SetString(PyExc_TypeError, "new_task(task_id, step)"); return NULL; }
    if (!records_configured()) return NULL;
    PyObject *o = new_record(task_type, task_span, scheduler, off_t_attrs);
    if (o == NULL) return NULL;
    PyObject *open = PySet_New(NULL);
    if (open == NULL) { Py_DECREF(o); return NULL; }
    Py_INCREF(argv[0]); slot_set(o, off_t_id, argv[0]);
    slot_set(o, off_t_open, open);
    Py_INCREF(Py_False); slot_set(o, off_t_spread, Py_False);
    Py_INCREF(argv[1]); slot_set(o, off_t_step, argv[1]);
    return started(o, Py_None);
}

/* new_session(session_id, task, step): SessionScope.__init__, started under its task */
static PyObject *
new_session(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "new_session(session_id, task, step)");
        return NULL;
    }
    if (!records_configured()) return NULL;
    PyObject *o = new_record(session_type, session_span, scheduler, off_s_attrs);
    if (o == NULL) return NULL;
    PyObject *ops = PyList_New(0), *turn = PyLong_FromLong(-1);
    if (ops == NULL || turn == NULL) { Py_XDECREF(ops); Py_XDECREF(turn); Py_DECREF(o); return NULL; }
    Py_INCREF(argv[0]); slot_set(o, off_s_sid, argv[0]);
    Py_INCREF(argv[1]); slot_set(o, off_s_task, argv[1]);
    slot_set(o, off_s_turn, turn);
    slot_set(o, off_s_ops, ops);
    Py_INCREF(argv[2]); slot_set(o, off_s_step, argv[2]);
    return started(o, argv[1]);
}

/* new_phase(spec, start_payload, end_payload, turn, session_id, reg): PhaseScope.__init__ */
static PyObject *
new_phase(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 6) {
        PyErr_SetString(PyExc_TypeError, "new_phase(spec, start_payload, end_payload, turn, "
                        "session_id, reg)");
        return NULL;
    }
    if (!records_configured()) return NULL;
    PyObject *spec = argv[0], *name = PyObject_GetAttr(spec, s_name), *cat = NULL, *o = NULL;
    if (name == NULL || !(cat = PyObject_GetAttr(spec, s_category))) goto done;
    if (!(o = new_record(phase_type, name, cat, off_p_attrs))) goto done;
    ScopeCore *self = (ScopeCore *)o;
    Py_INCREF(Py_None); SET(parent, Py_None); /* its session, once started */
    Py_INCREF(spec); slot_set(o, off_p_spec, spec);
    Py_INCREF(argv[1]); slot_set(o, off_p_start, argv[1]);
    Py_INCREF(argv[2]); slot_set(o, off_p_end, argv[2]);
    Py_INCREF(argv[3]); slot_set(o, off_p_turn, argv[3]);
    Py_INCREF(argv[4]); slot_set(o, off_p_sid, argv[4]);
    Py_INCREF(argv[5]); slot_set(o, off_p_reg, argv[5]);
done:
    Py_XDECREF(name); Py_XDECREF(cat);
    return o;
}

/* ---- trace_session_event("mark_finalized", session_id=..., status=...[, reason=...]) --------
 * SessionRegistry._finalize for a known session, finalized accepted/rejected/dropped with a str
 * reason or none, compiled statement by statement; every other call (other methods, a task, an
 * unknown session, "failed", bad input) goes to the registry's Python method. */

static PyObject *final_statuses;    /* sessions._FINAL_SET */
static PyObject *no_phases;         /* sessions._NO_PHASES */
static PyObject *finalized_index;   /* tally.FINALIZED */
static PyObject *kw_keep;           /* ("keep",) */
static PyObject *v_failed, *s_mark_finalized, *s_session_id, *s_task_id, *s_status, *s_reason,
    *s_close_if_open, *s_finish;
static Py_ssize_t off_r_lock = -1, off_r_tasks = -1, off_r_tally = -1, off_r_phases = -1;
static PyObject *s_start_payload, *s_end_payload, *s_device_sync, *s_specs, *s_turn_kw;

/* the locked part of _finalize: 1 when the session was registered (and is not now), with
 * *task_done set as _session_left says; 0 when another caller finalized it first */
static int
finalize_locked(PyObject *reg, PyObject *sess, PyObject *task, int *task_done)
{
    PyObject *sessions = SLOT(reg, off_r_sessions), *sid = SLOT(sess, off_s_sid);
    if (sessions == NULL || sid == NULL || !PyDict_Check(sessions)) {
        PyErr_SetString(PyExc_AttributeError, "a session registry or session lost a field");
        return -1;
    }
    PyObject *found = PyDict_GetItemWithError(sessions, sid);
    if (found == NULL) return PyErr_Occurred() ? -1 : 0;
    if (PyDict_DelItem(sessions, sid) < 0) return -1;
    *task_done = 0;
    PyObject *open = SLOT(task, off_t_open);
    if (open == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'TaskScope' object has no attribute 'open'");
        return -1;
    }
    if (open != Py_None) { /* _session_left */
        if (!PyAnySet_Check(open)) {
            PyErr_SetString(PyExc_TypeError, "a task's open sessions are not a set");
            return -1;
        }
        if (PySet_Discard(open, sid) < 0) return -1;
        if (PySet_GET_SIZE(open) == 0) { /* _drop_task */
            PyObject *tasks = SLOT(reg, off_r_tasks), *tid = SLOT(task, off_t_id);
            if (tasks == NULL || tid == NULL || !PyDict_Check(tasks)) {
                PyErr_SetString(PyExc_AttributeError, "a session registry or task lost a field");
                return -1;
            }
            PyObject *t = PyDict_GetItemWithError(tasks, tid);
            if (t == NULL && PyErr_Occurred()) return -1;
            if (t == task) {
                if (PyDict_DelItem(tasks, tid) < 0) return -1;
                Py_INCREF(Py_None);
                slot_set(task, off_t_open, Py_None);
                *task_done = 1;
            }
        }
    }
    PyObject *tally = SLOT(reg, off_r_tally);
    if (tally != NULL && tally != Py_None) {
        PyObject *n = PyObject_GetItem(tally, finalized_index);
        if (n == NULL) return -1;
        PyObject *more = PyNumber_Add(n, one);
        Py_DECREF(n);
        if (more == NULL) return -1;
        int r = PyObject_SetItem(tally, finalized_index, more);
        Py_DECREF(more);
        if (r < 0) return -1;
    }
    return 1;
}

/* SessionRegistry._finalize(sess, status, reason) for a str status other than "failed" and a
 * str reason or None */
static PyObject *
finalize_session_fast(PyObject *reg, PyObject *sess, PyObject *status, PyObject *reason)
{
    PyObject *task = SLOT(sess, off_s_task), *lock = SLOT(reg, off_r_lock), *end = NULL,
        *ops = NULL, *r = NULL;
    if (task == NULL || lock == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a session registry or session lost a field");
        return NULL;
    }
    Py_INCREF(task); Py_INCREF(lock);
    if (!(r = PyObject_CallMethodNoArgs(lock, s_acquire))) goto fail;
    Py_CLEAR(r);
    int task_done = 0;
    int registered = finalize_locked(reg, sess, task, &task_done);
    if (release_keeping_error(lock) < 0 || registered < 0) goto fail;
    if (!registered) { Py_DECREF(task); Py_DECREF(lock); Py_RETURN_NONE; }
    if (!(end = now())) goto fail;
    ops = SLOT(sess, off_s_ops);
    if (ops == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'SessionScope' object has no attribute 'open_phases'");
        goto fail;
    }
    Py_INCREF(ops);
    for (;;) { /* close what is still open; a phase ending concurrently is closed once */
        int more = PyObject_IsTrue(ops);
        if (more < 0) goto fail;
        if (!more) break;
        PyObject *handle = PySequence_GetItem(ops, -1);
        if (handle == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_IndexError)) goto fail;
            PyErr_Clear();
            break;
        }
        r = PyObject_CallMethodObjArgs(handle, s_close_if_open, ops, end, Py_None, Py_True, NULL);
        Py_DECREF(handle);
        if (r == NULL) goto fail;
        Py_CLEAR(r);
    }
    Py_CLEAR(ops);
    Py_INCREF(no_phases); slot_set(sess, off_s_ops, no_phases);
    Py_INCREF(status); slot_set(sess, off_s_status, status);
    Py_INCREF(reason); slot_set(sess, off_s_reason, reason);
    if (!(r = finish_impl((ScopeCore *)sess, end, Py_None, Py_True, Py_False))) goto fail;
    Py_CLEAR(r);
    if (task_done) {
        if (Py_TYPE(task) == task_type)
            r = finish_impl((ScopeCore *)task, end, Py_None, Py_True, Py_False);
        else { /* a RemoteTaskScope: its own finish(end, keep=True) */
            PyObject *call[3] = {task, end, Py_True};
            r = PyObject_VectorcallMethod(s_finish, call, 2, kw_keep);
        }
        if (r == NULL) goto fail;
        Py_CLEAR(r);
    }
    Py_DECREF(end); Py_DECREF(task); Py_DECREF(lock);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(end); Py_XDECREF(ops); Py_DECREF(task); Py_DECREF(lock);
    return NULL;
}

typedef struct {
    PyObject_HEAD
    PyObject *fallback; /* the registry's method: every other call goes there */
    PyObject *registry;
    PyObject *dict;     /* __dict__: functools.update_wrapper gives it the method's name, doc */
    vectorcallfunc vectorcall;
} RegistryCall;

static int
kw_is(PyObject *name, PyObject *interned)
{
    return name == interned || PyUnicode_Compare(name, interned) == 0;
}

static PyObject *
event_vectorcall(RegistryCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *reg = self->registry;
    if (n != 1 || kwnames == NULL || phase_type == NULL || final_statuses == NULL
        || Py_TYPE(reg) != registry_type || !PyUnicode_CheckExact(args[0])
        || !kw_is(args[0], s_mark_finalized))
        goto fallback;
    PyObject *sid = NULL, *status = NULL, *reason = Py_None;
    Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[n + i];
        if (!PyUnicode_CheckExact(k)) goto fallback;
        if (kw_is(k, s_session_id)) sid = v;
        else if (kw_is(k, s_status)) status = v;
        else if (kw_is(k, s_reason)) reason = v;
        else if (!kw_is(k, s_task_id) || v != Py_None) goto fallback; /* task_id=None: absent */
        if (PyErr_Occurred()) return NULL;
    }
    if (sid == NULL || sid == Py_None || status == NULL || !PyUnicode_CheckExact(status)
        || (reason != Py_None && !PyUnicode_CheckExact(reason)))
        goto fallback;
    int final = PySet_Contains(final_statuses, status);
    if (final < 0) return NULL;
    if (!final || kw_is(status, v_failed)) goto fallback;
    if (PyErr_Occurred()) return NULL;
    PyObject *enabled = SLOT(reg, off_r_enabled), *sessions = SLOT(reg, off_r_sessions);
    if (enabled == NULL || sessions == NULL || !PyDict_CheckExact(sessions)) goto fallback;
    int on = PyObject_IsTrue(enabled);
    if (on < 0) return NULL;
    if (!on) Py_RETURN_NONE;
    PyObject *sess = PyDict_GetItemWithError(sessions, sid);
    if (sess == NULL) {
        if (PyErr_Occurred()) return NULL;
        goto fallback; /* unknown: counted there */
    }
    if (Py_TYPE(sess) != session_type) goto fallback;
    Py_INCREF(sess);
    PyObject *r = finalize_session_fast(reg, sess, status, reason);
    Py_DECREF(sess);
    return r;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* trace_session_phase(phase[, start_payload[, end_payload]], *, turn=None, session_id=None,
 * device_sync=None) for a registered phase, dict or no payloads, an int turn or none and no
 * device sync: new_phase(...) as the method makes it; every other call goes to the method */
static PyObject *
phase_vectorcall(RegistryCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *reg = self->registry;
    if (n < 1 || n > 3 || phase_type == NULL || Py_TYPE(reg) != registry_type
        || !PyUnicode_CheckExact(args[0]))
        goto fallback;
    PyObject *sp = n > 1 ? args[1] : Py_None, *ep = n > 2 ? args[2] : Py_None, *turn = Py_None,
        *sid = Py_None;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i), *v = args[n + i];
        if (!PyUnicode_CheckExact(k)) goto fallback;
        if (kw_is(k, s_session_id)) {
            sid = v;
        } else if (kw_is(k, s_turn_kw)) {
            turn = v;
        } else if (kw_is(k, s_start_payload) && n < 2) {
            sp = v;
        } else if (kw_is(k, s_end_payload) && n < 3) {
            ep = v;
        } else if (kw_is(k, s_device_sync)) {
            int sync = PyObject_IsTrue(v); /* the method's ``if device_sync:`` */
            if (sync < 0) return NULL;
            if (sync) goto fallback;
        } else {
            goto fallback; /* a duplicate or unknown keyword: the method raises */
        }
    }
    if ((sp != Py_None && !PyDict_CheckExact(sp)) || (ep != Py_None && !PyDict_CheckExact(ep))
        || (turn != Py_None && !PyLong_CheckExact(turn)))
        goto fallback;
    PyObject *phases = SLOT(reg, off_r_phases);
    if (phases == NULL) goto fallback;
    PyObject *specs = PyObject_GetAttr(phases, s_specs);
    if (specs == NULL) return NULL;
    if (!PyDict_CheckExact(specs)) { Py_DECREF(specs); goto fallback; }
    PyObject *spec = PyDict_GetItemWithError(specs, args[0]);
    Py_XINCREF(spec);
    Py_DECREF(specs);
    if (spec == NULL) {
        if (PyErr_Occurred()) return NULL;
        goto fallback; /* unknown: the method raises, naming the fix */
    }
    /* dict(payload) if payload else None */
    PyObject *start = NULL, *end = NULL, *rec = NULL;
    start = sp != Py_None && PyDict_GET_SIZE(sp) ? PyDict_Copy(sp) : Py_NewRef(Py_None);
    end = ep != Py_None && PyDict_GET_SIZE(ep) ? PyDict_Copy(ep) : Py_NewRef(Py_None);
    if (start == NULL || end == NULL) goto done;
    PyObject *argv[6] = {spec, start, end, turn, sid, reg};
    rec = new_phase(NULL, argv, 6);
done:
    Py_DECREF(spec); Py_XDECREF(start); Py_XDECREF(end);
    return rec;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* ---- register_task / register_session ------------------------------------------------------
 * The registry's methods for a task id that is not the caller's task in another process (no
 * ``CALLER_TASK_KEY`` in the context: that one is a RemoteTaskScope, the method's), statement
 * by statement; the step as the methods take it (``rltrace.step``, else the task's, else the
 * enclosing scope's args through steps.scope_arg_step). */

static PyObject *step_cv, *task_cv, *caller_task_key, *caller_step_key, *scope_arg_step_fn,
    *remote_task_type, *registered_index, *recent_gen, *s_parts;
static Py_ssize_t off_r_task_ids = -1, off_r_session_ids = -1, off_r_recent_tasks = -1,
    off_r_recent_sessions = -1;

/* the OTel context holds the caller's task of another process (sessions.caller_task) */
static int
has_caller_task(void)
{
    PyObject *ctx = NULL;
    if (PyContextVar_Get(cv, NULL, &ctx) < 0) return -1;
    if (ctx == NULL) return 0;
    int has = 0;
    if (PyDict_Check(ctx)) {
        PyObject *found = PyDict_GetItemWithError(ctx, caller_task_key);
        if (found == NULL && PyErr_Occurred()) has = -1;
        else has = found != NULL && PyTuple_CheckExact(found);
    } else {
        has = 1; /* not a dict: the Python method decides */
    }
    Py_DECREF(ctx);
    return has;
}

/* steps.scope_arg_step(): without an open scope, a remote caller's int step or None (its first
 * lines); otherwise the Python function walks the scopes */
static PyObject *
arg_step(void)
{
    PyObject *ctx = NULL;
    if (PyContextVar_Get(cv, NULL, &ctx) < 0) return NULL;
    if (ctx != NULL && PyDict_Check(ctx)) { /* OTel's Context: a dict */
        PyObject *node = PyDict_GetItemWithError(ctx, span_key);
        if (node == NULL && PyErr_Occurred()) { Py_DECREF(ctx); return NULL; }
        if (node == NULL || node == Py_None) {
            PyObject *v = PyDict_GetItemWithError(ctx, caller_step_key);
            if (v == NULL && PyErr_Occurred()) { Py_DECREF(ctx); return NULL; }
            PyObject *step = v != NULL && PyLong_CheckExact(v) ? v : Py_None;
            Py_INCREF(step);
            Py_DECREF(ctx);
            return step;
        }
    }
    Py_XDECREF(ctx);
    return PyObject_CallNoArgs(scope_arg_step_fn);
}

/* sessions._remember(gens, key, value) */
static int
remember(PyObject *gens, PyObject *key, PyObject *value)
{
    if (!PyList_Check(gens) || PyList_GET_SIZE(gens) != 2) {
        PyErr_SetString(PyExc_TypeError, "the registry's recent ids are not two generations");
        return -1;
    }
    PyObject *recent = PyList_GET_ITEM(gens, 0);
    Py_INCREF(recent);
    int rc = PyObject_SetItem(recent, key, value);
    if (rc == 0) {
        Py_ssize_t n = PyObject_Length(recent);
        Py_ssize_t cap = PyLong_AsSsize_t(recent_gen);
        if (n < 0 || (cap == -1 && PyErr_Occurred())) {
            rc = -1;
        } else if (n >= cap) { /* the older generation goes */
            PyObject *fresh = PyDict_New();
            if (fresh == NULL) rc = -1;
            else {
                Py_INCREF(recent);
                PyList_SetItem(gens, 1, recent); /* steals */
                PyList_SetItem(gens, 0, fresh);  /* steals */
            }
        }
    }
    Py_DECREF(recent);
    return rc;
}

/* _task_locked(task_id) for a task that is not another process's (the caller holds the lock):
 * a borrowed reference to the registered task */
static PyObject *
task_locked(PyObject *reg, PyObject *task_id)
{
    PyObject *tasks = SLOT(reg, off_r_tasks);
    if (tasks == NULL || !PyDict_Check(tasks)) {
        PyErr_SetString(PyExc_AttributeError, "a session registry lost its tasks");
        return NULL;
    }
    PyObject *task = PyDict_GetItemWithError(tasks, task_id);
    if (task != NULL || PyErr_Occurred()) return task;
    PyObject *step = NULL;
    if (PyContextVar_Get(step_cv, Py_None, &step) < 0) return NULL;
    if (step == Py_None) {
        Py_DECREF(step);
        if (!(step = arg_step())) return NULL;
    }
    PyObject *argv[2] = {task_id, step};
    PyObject *made = new_task(NULL, argv, 2);
    Py_DECREF(step);
    if (made == NULL) return NULL;
    int rc = PyDict_SetItem(tasks, task_id, made);
    if (rc == 0) rc = remember(SLOT(reg, off_r_recent_tasks), task_id, made);
    Py_DECREF(made); /* the registry holds it */
    return rc < 0 ? NULL : PyDict_GetItemWithError(tasks, task_id);
}

static PyObject *
next_id(PyObject *reg, Py_ssize_t off)
{
    PyObject *ids = SLOT(reg, off);
    if (ids == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a session registry lost its id counter");
        return NULL;
    }
    PyObject *id = PyIter_Next(ids);
    if (id == NULL && !PyErr_Occurred()) PyErr_SetNone(PyExc_StopIteration);
    return id;
}

/* the arguments of register_task/register_session(task_id=None), the registry's enabled and
 * lock fields (borrowed): 1 for the compiled path, 0 for the method's, -1 on error */
static int
register_args(RegistryCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames,
              PyObject **task_id, PyObject **enabled, PyObject **lock)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *reg = self->registry;
    *task_id = n ? args[0] : Py_None;
    if (n > 1 || phase_type == NULL || step_cv == NULL || Py_TYPE(reg) != registry_type) return 0;
    if (kwnames != NULL) {
        if (n || PyTuple_GET_SIZE(kwnames) != 1 || !kw_is(PyTuple_GET_ITEM(kwnames, 0), s_task_id))
            return 0;
        *task_id = args[0];
    }
    int remote = has_caller_task();
    if (remote <= 0) {
        *enabled = SLOT(reg, off_r_enabled);
        *lock = SLOT(reg, off_r_lock);
    }
    return remote < 0 ? -1 : !remote && *enabled != NULL && *lock != NULL;
}

/* register_task(task_id=None) */
static PyObject *
task_vectorcall(RegistryCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *reg = self->registry, *task_id, *enabled = NULL, *lock = NULL;
    int fast = register_args(self, args, nargsf, kwnames, &task_id, &enabled, &lock);
    if (fast < 0) return NULL;
    if (!fast) goto fallback;
    if (task_id == Py_None) {
        if (!(task_id = next_id(reg, off_r_task_ids))) return NULL;
    } else {
        Py_INCREF(task_id);
    }
    int on = PyObject_IsTrue(enabled);
    if (on <= 0) {
        if (on < 0) Py_CLEAR(task_id);
        return task_id;
    }
    Py_INCREF(lock);
    PyObject *r = PyObject_CallMethodNoArgs(lock, s_acquire);
    if (r == NULL) { Py_DECREF(lock); Py_DECREF(task_id); return NULL; }
    Py_DECREF(r);
    PyObject *task = task_locked(reg, task_id);
    if (release_keeping_error(lock) < 0 || task == NULL) Py_CLEAR(task_id);
    Py_DECREF(lock);
    return task_id;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* the locked part of register_session: the session under task_id (or a new task) */
static int
session_locked(PyObject *reg, PyObject *task_id, PyObject *session_id)
{
    PyObject *task = NULL, *step = NULL, *sess = NULL;
    if (task_id != Py_None) {
        PyObject *tasks = SLOT(reg, off_r_tasks);
        if (tasks == NULL || !PyDict_Check(tasks)) {
            PyErr_SetString(PyExc_AttributeError, "a session registry lost its tasks");
            return -1;
        }
        task = PyDict_GetItemWithError(tasks, task_id);
        if (task == NULL && PyErr_Occurred()) return -1;
    }
    if (task == NULL) {
        if (task_id == Py_None) {
            PyObject *fresh = next_id(reg, off_r_task_ids);
            if (fresh == NULL) return -1;
            task = task_locked(reg, fresh);
            Py_DECREF(fresh);
        } else {
            task = task_locked(reg, task_id);
        }
        if (task == NULL) return -1;
    }
    Py_INCREF(task);
    int rc = -1;
    if (!PyObject_TypeCheck(task, task_type)) {
        PyErr_SetString(PyExc_TypeError, "a registered task is not a TaskScope");
        goto done;
    }
    PyObject *open = SLOT(task, off_t_open);
    if (open == NULL || !PyAnySet_Check(open)) { /* None: as Python, add() on it fails */
        PyErr_SetString(PyExc_AttributeError, "'NoneType' object has no attribute 'add'");
        goto done;
    }
    if (PySet_Add(open, session_id) < 0) goto done;
    if (Py_TYPE(task) == (PyTypeObject *)remote_task_type) { /* task.parts += 1 */
        PyObject *parts = PyObject_GetAttr(task, s_parts), *more = NULL;
        if (parts == NULL) goto done;
        more = PyNumber_Add(parts, one);
        Py_DECREF(parts);
        if (more == NULL) goto done;
        int r = PyObject_SetAttr(task, s_parts, more);
        Py_DECREF(more);
        if (r < 0) goto done;
    }
    if (PyContextVar_Get(step_cv, Py_None, &step) < 0) goto done;
    if (step == Py_None) { /* the task's, else the enclosing scope's args.global_step */
        PyObject *tstep = SLOT(task, off_t_step);
        if (tstep != NULL && tstep != Py_None) {
            Py_INCREF(tstep);
            Py_SETREF(step, tstep);
        } else {
            Py_DECREF(step);
            if (!(step = arg_step())) goto done;
        }
    }
    PyObject *argv[3] = {session_id, task, step};
    if (!(sess = new_session(NULL, argv, 3))) goto done;
    PyObject *sessions = SLOT(reg, off_r_sessions);
    if (sessions == NULL || PyObject_SetItem(sessions, session_id, sess) < 0) {
        if (sessions == NULL) PyErr_SetString(PyExc_AttributeError, "a registry lost its sessions");
        goto done;
    }
    if (remember(SLOT(reg, off_r_recent_sessions), session_id, task) < 0) goto done;
    PyObject *tally = SLOT(reg, off_r_tally);
    if (tally != NULL && tally != Py_None) {
        PyObject *cnt = PyObject_GetItem(tally, registered_index), *more = NULL;
        if (cnt == NULL) goto done;
        more = PyNumber_Add(cnt, one);
        Py_DECREF(cnt);
        if (more == NULL) goto done;
        int r = PyObject_SetItem(tally, registered_index, more);
        Py_DECREF(more);
        if (r < 0) goto done;
    }
    rc = 0;
done:
    Py_DECREF(task); Py_XDECREF(step); Py_XDECREF(sess);
    return rc;
}

/* register_session(task_id=None) */
static PyObject *
session_vectorcall(RegistryCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *reg = self->registry, *task_id, *enabled = NULL, *lock = NULL;
    int fast = register_args(self, args, nargsf, kwnames, &task_id, &enabled, &lock);
    if (fast < 0) return NULL;
    if (!fast) goto fallback;
    PyObject *session_id = next_id(reg, off_r_session_ids);
    if (session_id == NULL) return NULL;
    int on = PyObject_IsTrue(enabled);
    if (on <= 0) {
        if (on < 0) Py_CLEAR(session_id);
        return session_id;
    }
    PyObject *tid = NULL;
    if (task_id == Py_None) { /* the current task */
        if (PyContextVar_Get(task_cv, Py_None, &tid) < 0) { Py_DECREF(session_id); return NULL; }
    } else {
        Py_INCREF(task_id);
        tid = task_id;
    }
    Py_INCREF(lock);
    PyObject *r = PyObject_CallMethodNoArgs(lock, s_acquire);
    if (r == NULL) { Py_DECREF(lock); Py_DECREF(tid); Py_DECREF(session_id); return NULL; }
    Py_DECREF(r);
    int rc = session_locked(reg, tid, session_id);
    if (release_keeping_error(lock) < 0 || rc < 0) Py_CLEAR(session_id);
    Py_DECREF(lock); Py_DECREF(tid);
    return session_id;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
configure_registry(PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 8 || !PyType_Check(argv[5]) || !PyLong_CheckExact(argv[7])) {
        PyErr_SetString(PyExc_TypeError, "configure_registry(step_cv, task_cv, caller_task_key, "
                        "caller_step_key, scope_arg_step, RemoteTaskScope, REGISTERED, "
                        "recent_generation)");
        return NULL;
    }
    if (registry_type == NULL || !PyContextVar_CheckExact(argv[0]) || !PyContextVar_CheckExact(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "configure_registry: configure_phases() first, and "
                        "two ContextVars");
        return NULL;
    }
    Py_ssize_t offs[4] = {type_slot(registry_type, "_task_ids"),
                          type_slot(registry_type, "_session_ids"),
                          type_slot(registry_type, "recent_tasks"),
                          type_slot(registry_type, "recent_sessions")};
    for (int i = 0; i < 4; i++) {
        if (offs[i] < 0) {
            PyErr_Format(PyExc_TypeError, "configure_registry: slot %d is not a plain slot", i);
            return NULL;
        }
    }
    off_r_task_ids = offs[0]; off_r_session_ids = offs[1]; off_r_recent_tasks = offs[2];
    off_r_recent_sessions = offs[3];
    PyObject **slots[8] = {&step_cv, &task_cv, &caller_task_key, &caller_step_key,
                           &scope_arg_step_fn, &remote_task_type, &registered_index, &recent_gen};
    keep_all(slots, argv, 8);
    Py_RETURN_NONE;
}

/* RegistryCall(fallback, registry, kind): kind "event" is trace_session_event's compiled
 * common call, "phase" trace_session_phase's, "task" register_task's, "session"
 * register_session's */
static PyObject *
event_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *fallback, *registry;
    const char *kind;
    if (!PyArg_ParseTuple(args, "OOs:RegistryCall", &fallback, &registry, &kind)) return NULL;
    vectorcallfunc call;
    if (strcmp(kind, "event") == 0) call = (vectorcallfunc)event_vectorcall;
    else if (strcmp(kind, "phase") == 0) call = (vectorcallfunc)phase_vectorcall;
    else if (strcmp(kind, "task") == 0) call = (vectorcallfunc)task_vectorcall;
    else if (strcmp(kind, "session") == 0) call = (vectorcallfunc)session_vectorcall;
    else {
        PyErr_Format(PyExc_ValueError, "RegistryCall: unknown kind %s", kind);
        return NULL;
    }
    RegistryCall *self = (RegistryCall *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    Py_INCREF(fallback); self->fallback = fallback;
    Py_INCREF(registry); self->registry = registry;
    self->vectorcall = call;
    return (PyObject *)self;
}

static int
event_traverse(RegistryCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fallback); Py_VISIT(self->registry); Py_VISIT(self->dict);
    return 0;
}

static int
event_clear(RegistryCall *self)
{
    Py_CLEAR(self->fallback); Py_CLEAR(self->registry); Py_CLEAR(self->dict);
    return 0;
}

static void
event_dealloc(RegistryCall *self)
{
    PyObject_GC_UnTrack(self);
    event_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
event_repr(RegistryCall *self)
{
    return PyUnicode_FromFormat("<compiled %R>", self->fallback);
}

/* the registry, as the method it stands for is bound to it */
static PyObject *
event_self(RegistryCall *self, void *unused)
{
    Py_INCREF(self->registry);
    return self->registry;
}

static PyGetSetDef event_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"__self__", (getter)event_self, NULL, "The registry the method is bound to.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RegistryCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rltrace._scope_accel.RegistryCall",
    .tp_basicsize = sizeof(RegistryCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "RegistryCall(fallback, registry, kind): a session API method's common call, "
              "compiled (kind: 'event' or 'phase').",
    .tp_new = event_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RegistryCall, vectorcall),
    .tp_dictoffset = offsetof(RegistryCall, dict),
    .tp_getset = event_getset,
    .tp_repr = (reprfunc)event_repr,
    .tp_dealloc = (destructor)event_dealloc,
    .tp_traverse = (traverseproc)event_traverse,
    .tp_clear = (inquiry)event_clear,
};

static PyObject *
configure_events(PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 3 || !PyAnySet_Check(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "configure_events(final_statuses, no_phases, finalized)");
        return NULL;
    }
    if (registry_type == NULL || session_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure_phases() first");
        return NULL;
    }
    Py_ssize_t offs[4] = {type_slot(registry_type, "lock"), type_slot(registry_type, "tasks"),
                          type_slot(registry_type, "tally"), type_slot(registry_type, "phases")};
    for (int i = 0; i < 4; i++) {
        if (offs[i] < 0) {
            PyErr_Format(PyExc_TypeError, "configure_events: slot %d is not a plain slot", i);
            return NULL;
        }
    }
    off_r_lock = offs[0]; off_r_tasks = offs[1]; off_r_tally = offs[2]; off_r_phases = offs[3];
    PyObject **slots[3] = {&final_statuses, &no_phases, &finalized_index};
    keep_all(slots, argv, 3);
    Py_RETURN_NONE;
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
    {"phase_enter", (PyCFunction)core_phase_enter, METH_NOARGS,
     "PhaseScope.__enter__, compiled (rltrace.sessions installs it)."},
    {"phase_exit", (PyCFunction)(void (*)(void))core_phase_exit, METH_FASTCALL,
     "PhaseScope.__exit__, compiled (rltrace.sessions installs it)."},
    {"phase_attrs", (PyCFunction)core_phase_attrs, METH_NOARGS,
     "PhaseScope.record_attrs, compiled (rltrace.sessions installs it)."},
    {"task_attrs", (PyCFunction)core_task_attrs, METH_NOARGS,
     "TaskScope.record_attrs, compiled (rltrace.sessions installs it)."},
    {"session_attrs", (PyCFunction)core_session_attrs, METH_NOARGS,
     "SessionScope.record_attrs, compiled (rltrace.sessions installs it)."},
    {"finish", (PyCFunction)(void (*)(void))core_finish, METH_FASTCALL | METH_KEYWORDS,
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

/* x / 1e9: for an int of up to 63 bits the quotient of its nearest double (as float division
 * converts it: C's conversion rounds to nearest-even, as PyLong_AsDouble does) without the
 * number protocol's detour through int.__truediv__; anything else as Python divides */
static PyObject *
div_1e9(PyObject *x)
{
    if (PyLong_CheckExact(x)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (!overflow) {
            if (v == -1 && PyErr_Occurred()) return NULL;
            return PyFloat_FromDouble((double)v / 1e9);
        }
    }
    return PyNumber_TrueDivide(x, f_1e9);
}

/* format(v, "032x"): written out directly for an int in [0, 2**128) (every trace id), through
 * PyObject_Format otherwise (its format-spec machinery costs more than the rest of a record) */
static PyObject *
hex032(PyObject *v)
{
    if (PyLong_CheckExact(v)) {
        int nonneg = PyObject_RichCompareBool(v, zero, Py_GE);
        if (nonneg < 0) return NULL;
        if (nonneg) {
            PyObject *hi_o = PyNumber_Rshift(v, n64);
            if (hi_o == NULL) return NULL;
            unsigned long long hi = PyLong_AsUnsignedLongLong(hi_o);
            Py_DECREF(hi_o);
            if (hi == (unsigned long long)-1 && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
                PyErr_Clear(); /* 2**128 or more: as format() writes it */
            } else {
                unsigned long long lo = PyLong_AsUnsignedLongLongMask(v);
                if (lo == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
                static const char digits[] = "0123456789abcdef";
                char buf[32];
                for (int i = 15; i >= 0; i--) { buf[i] = digits[hi & 15]; hi >>= 4; }
                for (int i = 31; i >= 16; i--) { buf[i] = digits[lo & 15]; lo >>= 4; }
                return PyUnicode_FromStringAndSize(buf, 32);
            }
        }
    }
    return PyObject_Format(v, fmt_032x);
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
    if (!(record = _PyDict_NewPresized(24))) goto end; /* its ~20 fields without a resize */
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
    if (put(record, r_trace_id, hex032(trace_id)) < 0
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

/* SessionMetricsProcessor._session_ended(attrs, start, end, rec, attrs) for an rltrace session
 * record, compiled statement by statement (processor class exactly the configured one) */
static PyObject *s__done;
static PyObject *sm_class, *sm_build_py, *sm_custom_names, *sm_no_phases, *sm_done_gen,
    *s_pop, *s__record_metrics, *s_record, *s_sessions, *s_add, *w_total_s, *w_turns;

static PyObject *session_record(PyObject *self, PyObject *const *argv, Py_ssize_t argc);

/* the processor's fields, read at their slot offsets (its class declares __slots__) */
enum { P_ACC, P_RANK, P_ROLE, P_AGGREGATES, P_METRICS, P_PHASE_KEYS, P_DONE, P_SESSIONS,
       P_WRITER, P_LISTENERS, P_MAX_OPEN, NPROC };
static const char *const proc_fields[NPROC] = {"_acc", "rank", "role", "_aggregates", "_metrics",
    "_phase_keys", "_done", "sessions", "writer", "listeners", "max_open"};
static Py_ssize_t proc_off[NPROC] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};

/* proc.<field i> (a new reference): from its slot on the configured class, else getattr */
static PyObject *
proc_get(PyObject *proc, int i)
{
    if (sm_class != NULL && (PyObject *)Py_TYPE(proc) == sm_class && proc_off[i] >= 0) {
        PyObject *v = SLOT(proc, proc_off[i]);
        if (v != NULL) { Py_INCREF(v); return v; }
    }
    return PyObject_GetAttrString(proc, proc_fields[i]);
}

static int
set_attr_plus_one(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name), *more = NULL;
    if (v == NULL) return -1;
    more = PyNumber_Add(v, one);
    Py_DECREF(v);
    if (more == NULL) return -1;
    int r = PyObject_SetAttr(obj, name, more);
    Py_DECREF(more);
    return r;
}

/* record[key] as a new reference (KeyError as Python raises it) */
static PyObject *
item(PyObject *d, PyObject *key)
{
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

/* SessionRecordWriter.add(record) (rltrace.exporters.sessions), statement by statement: the
 * record's JSON line (orjson's plain call, else the Python dumps_line), buffered under the
 * writer's lock and appended once flush_threshold lines are held */
static PyObject *writer_class, *writer_dumps, *writer_dumps_line, *s__write_locked;
static Py_ssize_t off_w_buf = -1, off_w_lock = -1, off_w_threshold = -1;

static PyObject *
writer_add(PyObject *w, PyObject *record)
{
    PyObject *lock = SLOT(w, off_w_lock), *j = NULL, *line = NULL, *r = NULL;
    if (lock == NULL || SLOT(w, off_w_buf) == NULL || SLOT(w, off_w_threshold) == NULL)
        return PyObject_CallMethodOneArg(w, s_add, record); /* unset: the method raises */
    j = PyObject_CallOneArg(writer_dumps, record);
    if (j == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
        PyErr_Clear(); /* not plain JSON: the Python function's other ways */
        if (!(j = PyObject_CallOneArg(writer_dumps_line, record))) return NULL;
    }
    if (!PyBytes_Check(j)) {
        Py_DECREF(j);
        PyErr_SetString(PyExc_TypeError, "a session record's JSON is not bytes");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(j);
    line = PyBytes_FromStringAndSize(NULL, n + 1); /* dumps_line(record) + b"\n" */
    if (line != NULL) {
        memcpy(PyBytes_AS_STRING(line), PyBytes_AS_STRING(j), n);
        PyBytes_AS_STRING(line)[n] = '\n';
    }
    Py_DECREF(j);
    if (line == NULL) return NULL;
    Py_INCREF(lock);
    if (!(r = PyObject_CallMethodNoArgs(lock, s_acquire))) { Py_DECREF(lock); Py_DECREF(line); return NULL; }
    Py_CLEAR(r);
    PyObject *buf = SLOT(w, off_w_buf), *threshold = SLOT(w, off_w_threshold), *res = NULL;
    if (buf == NULL || threshold == NULL || !PyList_Check(buf)) {
        PyErr_SetString(PyExc_AttributeError, "a session writer lost its buffer");
    } else if (PyList_Append(buf, line) == 0) {
        PyObject *held = PyLong_FromSsize_t(PyList_GET_SIZE(buf));
        int full = held == NULL ? -1 : PyObject_RichCompareBool(held, threshold, Py_GE);
        Py_XDECREF(held);
        if (full > 0) res = PyObject_CallMethodNoArgs(w, s__write_locked);
        else if (full == 0) { res = Py_None; Py_INCREF(res); }
    }
    if (release_keeping_error(lock) < 0) Py_CLEAR(res);
    Py_DECREF(lock); Py_DECREF(line);
    return res;
}

static PyObject *
session_ended_fast(PyObject *proc, PyObject *attrs, ScopeCore *rec)
{
    PyObject *sid = NULL, *acc = NULL, *phases = NULL, *sc = NULL, *rank = NULL, *role = NULL,
        *custom = NULL, *record = NULL, *obj = NULL, *r = NULL, *v = NULL, *keys = NULL;
    PyObject *res = NULL;
    if (!(sid = item(attrs, k_session)) || !(acc = proc_get(proc, P_ACC))) goto done;
    if (!(phases = PyObject_CallMethodObjArgs(acc, s_pop, sid, sm_no_phases, NULL))) goto done;
    /* the trace id: an rltrace session's is its task's */
    PyObject *ids = rec->parent != NULL && PyObject_TypeCheck(rec->parent, &ScopeCoreType)
        ? rec->parent : (PyObject *)rec;
    if (!(sc = PyObject_CallMethodNoArgs(ids, s_get_span_context))) goto done;
    PyObject *trace_id = PySequence_GetItem(sc, 0);
    if (trace_id == NULL) goto done;
    Py_SETREF(sc, trace_id);
    if (!(rank = proc_get(proc, P_RANK)) || !(role = proc_get(proc, P_ROLE))
        || !(custom = PyObject_CallNoArgs(sm_custom_names)))
        goto done;
    if (!field_is(rec->extra, "extra") || !field_is(rec->start_ns, "start_ns")
        || !field_is(rec->end_ns, "end_ns"))
        goto done;
    PyObject *args[9] = {attrs, rec->start_ns, rec->end_ns, sc, phases, rank, role, custom,
                         rec->extra != Py_None ? Py_True : Py_False};
    if (!(record = session_record(NULL, args, 9))) goto done;
    if (record == Py_None) { /* off its common path */
        Py_DECREF(record);
        if (!(record = PyObject_Vectorcall(sm_build_py, args, 9, NULL))) goto done;
    }
    if (!PyDict_Check(record)) {
        PyErr_SetString(PyExc_TypeError, "a session record is not a dict");
        goto done;
    }
    if (!(obj = proc_get(proc, P_AGGREGATES))) goto done;
    if (obj != Py_None) {
        PyObject *status = item(record, r_status), *total = item(record, r_total_s);
        if (status != NULL && total != NULL)
            r = PyObject_CallMethodObjArgs(obj, s_record, status, total, phases, NULL);
        Py_XDECREF(status); Py_XDECREF(total);
        if (r == NULL) goto done;
        Py_CLEAR(r);
    } else {
        Py_CLEAR(obj);
        if (!(obj = proc_get(proc, P_METRICS))) goto done;
        if (obj != Py_None) {
            if (!(r = PyObject_CallMethodObjArgs(proc, s__record_metrics, record, phases, NULL)))
                goto done;
            Py_CLEAR(r);
        }
    }
    Py_CLEAR(obj);
    /* the figures on the session span (attrs is the record's own dict) */
    if (!(v = item(record, r_total_s)) || PyDict_SetItem(attrs, w_total_s, v) < 0) goto done;
    Py_CLEAR(v);
    if (!(v = item(record, r_turns)) || PyDict_SetItem(attrs, w_turns, v) < 0) goto done;
    Py_CLEAR(v);
    if (!(keys = proc_get(proc, P_PHASE_KEYS))) goto done;
    if (!(obj = item(record, r_phase_counts))) goto done;
    if (!PyDict_Check(keys) || !PyDict_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "phase keys or counts are not dicts");
        goto done;
    }
    Py_ssize_t pos = 0;
    PyObject *p, *cnt;
    while (PyDict_Next(obj, &pos, &p, &cnt)) {
        PyObject *k = PyDict_GetItemWithError(keys, p); /* (rl.session.<p>_s, <p>_s) */
        if (k == NULL) {
            if (PyErr_Occurred()) goto done;
            PyObject *a = PyUnicode_FromFormat("rl.session.%S_s", p), *b = PyUnicode_FromFormat("%S_s", p);
            k = a && b ? PyTuple_Pack(2, a, b) : NULL;
            Py_XDECREF(a); Py_XDECREF(b);
            if (k == NULL) goto done;
            int rc = PyDict_SetItem(keys, p, k);
            Py_DECREF(k);
            if (rc < 0) goto done;
        }
        if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 2) {
            PyErr_SetString(PyExc_TypeError, "a phase key is not a pair");
            goto done;
        }
        if (!(v = item(record, PyTuple_GET_ITEM(k, 1)))
            || PyDict_SetItem(attrs, PyTuple_GET_ITEM(k, 0), v) < 0)
            goto done;
        Py_CLEAR(v);
    }
    Py_CLEAR(obj);
    /* an rltrace record: its session ids are never reused */
    if (!(obj = proc_get(proc, P_DONE))) goto done;
    if (!PyList_Check(obj) || PyList_GET_SIZE(obj) < 1 || !PyAnySet_Check(PyList_GET_ITEM(obj, 0))) {
        PyErr_SetString(PyExc_TypeError, "the processor's finished ids are not sets");
        goto done;
    }
    PyObject *recent = PyList_GET_ITEM(obj, 0);
    if (PySet_Add(recent, sid) < 0) goto done;
    Py_ssize_t gen = PyLong_AsSsize_t(sm_done_gen);
    if (gen == -1 && PyErr_Occurred()) goto done;
    if (PySet_GET_SIZE(recent) >= gen) {
        PyObject *fresh = PySet_New(NULL), *pair = NULL;
        if (fresh == NULL) goto done;
        pair = PyList_New(2);
        if (pair == NULL) { Py_DECREF(fresh); goto done; }
        Py_INCREF(recent);
        PyList_SET_ITEM(pair, 0, fresh);
        PyList_SET_ITEM(pair, 1, recent);
        int rc = PyObject_SetAttr(proc, s__done, pair);
        Py_DECREF(pair);
        if (rc < 0) goto done;
    }
    Py_CLEAR(obj);
    if (sm_class != NULL && (PyObject *)Py_TYPE(proc) == sm_class && proc_off[P_SESSIONS] >= 0
        && SLOT(proc, proc_off[P_SESSIONS]) != NULL) { /* self.sessions += 1 */
        PyObject *more = PyNumber_Add(SLOT(proc, proc_off[P_SESSIONS]), one);
        if (more == NULL) goto done;
        slot_set(proc, proc_off[P_SESSIONS], more);
    } else if (set_attr_plus_one(proc, s_sessions) < 0) {
        goto done;
    }
    if (!(obj = proc_get(proc, P_WRITER))) goto done;
    if (obj != Py_None) {
        r = writer_class != NULL && (PyObject *)Py_TYPE(obj) == writer_class
            ? writer_add(obj, record) : PyObject_CallMethodOneArg(obj, s_add, record);
        if (r == NULL) goto done;
        Py_CLEAR(r);
    }
    Py_CLEAR(obj);
    if (!(obj = proc_get(proc, P_LISTENERS))) goto done;
    PyObject *it = PyObject_GetIter(obj);
    if (it == NULL) goto done;
    PyObject *listener;
    while ((listener = PyIter_Next(it)) != NULL) {
        r = PyObject_CallOneArg(listener, record);
        Py_DECREF(listener);
        if (r == NULL) { Py_DECREF(it); goto done; }
        Py_CLEAR(r);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) goto done;
    res = Py_None;
    Py_INCREF(res);
done:
    Py_XDECREF(sid); Py_XDECREF(acc); Py_XDECREF(phases); Py_XDECREF(sc); Py_XDECREF(rank);
    Py_XDECREF(role); Py_XDECREF(custom); Py_XDECREF(record); Py_XDECREF(obj); Py_XDECREF(v);
    Py_XDECREF(keys);
    return res;
}

static PyObject *
configure_session_ended(PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 8 || !PyType_Check(argv[0]) || !PyCallable_Check(argv[1])
        || !PyCallable_Check(argv[2]) || !PyLong_CheckExact(argv[4]) || !PyType_Check(argv[5])
        || !PyCallable_Check(argv[6]) || !PyCallable_Check(argv[7])) {
        PyErr_SetString(PyExc_TypeError, "configure_session_ended(SessionMetricsProcessor, "
                        "build_record, custom_phase_names, no_phases, done_generation, "
                        "SessionRecordWriter, orjson.dumps, dumps_line)");
        return NULL;
    }
    Py_ssize_t woff[3] = {type_slot((PyTypeObject *)argv[5], "_buf"),
                          type_slot((PyTypeObject *)argv[5], "_lock"),
                          type_slot((PyTypeObject *)argv[5], "flush_threshold")};
    if (woff[0] < 0 || woff[1] < 0 || woff[2] < 0) {
        PyErr_SetString(PyExc_TypeError, "configure_session_ended: the writer class has no "
                        "_buf/_lock/flush_threshold slots");
        return NULL;
    }
    off_w_buf = woff[0]; off_w_lock = woff[1]; off_w_threshold = woff[2];
    PyObject **wslots[3] = {&writer_class, &writer_dumps, &writer_dumps_line};
    keep_all(wslots, argv + 5, 3);
    PyObject **slots[5] = {&sm_class, &sm_build_py, &sm_custom_names, &sm_no_phases, &sm_done_gen};
    for (int i = 0; i < NPROC; i++) proc_off[i] = type_slot((PyTypeObject *)argv[0], proc_fields[i]);
    keep_all(slots, argv, 5);
    Py_RETURN_NONE;
}

/* ---- observe_record: SessionMetricsProcessor.on_record, compiled ---------------------------
 *
 * A phase execution is held here (the processor's ``_phase_ended``, statement by statement); a
 * session span goes to the processor's ``_session_ended`` and anything off the common path to
 * its ``_phase_ended`` (attributes not a dict, a session finished already). */

static PyObject *s_on_record, *o_on_record_py, *o_session_span, *o_phase_key, *o_turn_key,
    *o_interrupted_key, *s_slot_attrs, *s_record_attrs, *s__session_ended, *s__phase_ended,
    *s__evict_oldest;

static PyObject *
observe_record(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "observe_record(processor, record)");
        return NULL;
    }
    PyObject *proc = argv[0], *rec = argv[1];
    if (o_session_span == NULL || k_session == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "observe_record: configure_observe() and "
                        "configure_sessions() were not called");
        return NULL;
    }
    if (!PyObject_TypeCheck(rec, &ScopeCoreType)) /* not a compiled record: the Python method */
        return PyObject_CallFunctionObjArgs(o_on_record_py, proc, rec, NULL);
    ScopeCore *r = (ScopeCore *)rec;
    if (!field_is(r->extra, "extra")) return NULL;
    if (r->extra == Py_None) {
        PyObject *sa = PyObject_GetAttr(rec, s_slot_attrs);
        if (sa == NULL) return NULL;
        int t = PyObject_IsTrue(sa);
        Py_DECREF(sa);
        if (t < 0) return NULL;
        if (!t) Py_RETURN_NONE; /* a plain scope without attributes: the common case */
    }
    PyObject *attrs = PyObject_CallMethodNoArgs(rec, s_record_attrs), *res = NULL, *acc = NULL,
        *phases = NULL, *execs = NULL, *item = NULL;
    if (attrs == NULL) return NULL;
    int t = PyObject_IsTrue(attrs);
    if (t > 0) t = PySequence_Contains(attrs, k_session);
    if (t <= 0) goto done_t;
    if (!field_is(r->name, "name") || !field_is(r->start_ns, "start_ns") || !field_is(r->end_ns, "end_ns"))
        goto fail;
    int is_session = PyObject_RichCompareBool(r->name, o_session_span, Py_EQ);
    if (is_session < 0) goto fail;
    if (is_session) {
        if (sm_class != NULL && (PyObject *)Py_TYPE(proc) == sm_class && PyDict_CheckExact(attrs))
            res = session_ended_fast(proc, attrs, r);
        else
            res = PyObject_CallMethodObjArgs(proc, s__session_ended, attrs, r->start_ns, r->end_ns,
                                             rec, attrs, NULL);
        goto out;
    }
    if (!PyDict_CheckExact(attrs)) goto python;
    PyObject *phase = PyDict_GetItemWithError(attrs, o_phase_key); /* borrowed */
    if (phase == NULL && PyErr_Occurred()) goto fail;
    if (phase == NULL || phase == Py_None) { res = Py_None; Py_INCREF(res); goto out; }
    PyObject *sid = PyDict_GetItemWithError(attrs, k_session);
    if (sid == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, k_session);
        goto fail;
    }
    if (!(acc = proc_get(proc, P_ACC))) goto fail;
    if (!PyDict_Check(acc)) goto python;
    phases = PyDict_GetItemWithError(acc, sid);
    if (phases != NULL) {
        if (!PyDict_CheckExact(phases)) { phases = NULL; goto python; }
        Py_INCREF(phases);
    } else { /* the session's first phase: held from now on, unless it finished already */
        if (PyErr_Occurred()) goto fail;
        PyObject *done = proc_get(proc, P_DONE);
        if (done == NULL) goto fail;
        int late = -1;
        if (PyList_CheckExact(done) && PyList_GET_SIZE(done) == 2
            && PyAnySet_CheckExact(PyList_GET_ITEM(done, 0))
            && PyAnySet_CheckExact(PyList_GET_ITEM(done, 1))) {
            late = PySet_Contains(PyList_GET_ITEM(done, 0), sid);
            if (late == 0) late = PySet_Contains(PyList_GET_ITEM(done, 1), sid);
            if (late < 0) { Py_DECREF(done); goto fail; }
        }
        Py_DECREF(done);
        if (late != 0) goto python; /* counted there (or an unexpected _done) */
        if (!(phases = PyDict_New()) || PyObject_SetItem(acc, sid, phases) < 0) goto fail;
        Py_ssize_t n = PyObject_Length(acc);
        PyObject *max_o = proc_get(proc, P_MAX_OPEN);
        if (n < 0 || max_o == NULL) { Py_XDECREF(max_o); goto fail; }
        PyObject *n_o = PyLong_FromSsize_t(n);
        int over = n_o == NULL ? -1 : PyObject_RichCompareBool(n_o, max_o, Py_GT);
        Py_XDECREF(n_o); Py_DECREF(max_o);
        if (over < 0) goto fail;
        if (over) {
            PyObject *ev = PyObject_CallMethodNoArgs(proc, s__evict_oldest);
            if (ev == NULL) goto fail;
            Py_DECREF(ev);
        }
    }
    execs = PyDict_GetItemWithError(phases, phase);
    if (execs == NULL) {
        if (PyErr_Occurred()) goto fail;
        if (!(execs = PyList_New(0)) || PyDict_SetItem(phases, phase, execs) < 0) goto fail;
    } else {
        Py_INCREF(execs);
    }
    if (!PyList_Check(execs)) goto python;
    PyObject *turn = PyDict_GetItemWithError(attrs, o_turn_key);
    if (turn == NULL && PyErr_Occurred()) goto fail;
    PyObject *intr = PyDict_GetItemWithError(attrs, o_interrupted_key);
    if (intr == NULL && PyErr_Occurred()) goto fail;
    int interrupted = intr == NULL ? 0 : PyObject_IsTrue(intr);
    if (interrupted < 0) goto fail;
    item = PyTuple_Pack(4, r->start_ns, r->end_ns, turn ? turn : Py_None,
                        interrupted ? Py_True : Py_False);
    if (item == NULL || PyList_Append(execs, item) < 0) goto fail;
    res = Py_None;
    Py_INCREF(res);
    goto out;
python:
    res = PyObject_CallMethodObjArgs(proc, s__phase_ended, attrs, r->start_ns, r->end_ns, NULL);
    goto out;
done_t:
    if (t < 0) goto fail;
    res = Py_None;
    Py_INCREF(res);
    goto out;
fail:
    res = NULL;
out:
    Py_DECREF(attrs); Py_XDECREF(acc); Py_XDECREF(phases); Py_XDECREF(execs); Py_XDECREF(item);
    return res;
}

/* run_record_processors(popleft, todo, processors, taken, on_error): the export cycle's loop
 * over queued records (rltrace.pipeline.Pipeline._cycle), compiled: up to ``todo`` records are
 * popped; each goes to every processor's ``on_record`` and then into ``taken``, unless one
 * raised an Exception, which goes to ``on_error`` (the record is then not exported) */
static PyObject *
run_record_processors(PyObject *module, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 5 || !PyList_CheckExact(argv[2]) || !PyList_CheckExact(argv[3])) {
        PyErr_SetString(PyExc_TypeError, "run_record_processors(popleft, todo, processors: list, "
                        "taken: list, on_error)");
        return NULL;
    }
    PyObject *popleft = argv[0], *procs = argv[2], *taken = argv[3], *on_error = argv[4];
    Py_ssize_t todo = PyLong_AsSsize_t(argv[1]);
    if (todo == -1 && PyErr_Occurred()) return NULL;
    for (Py_ssize_t i = 0; i < todo; i++) {
        PyObject *rec = PyObject_CallNoArgs(popleft);
        if (rec == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_IndexError)) return NULL;
            PyErr_Clear();
            break;
        }
        int ok = 1;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(procs); j++) {
            PyObject *rp = PyList_GET_ITEM(procs, j);
            Py_INCREF(rp);
            PyObject *r = PyObject_CallMethodOneArg(rp, s_on_record, rec);
            Py_DECREF(rp);
            if (r != NULL) { Py_DECREF(r); continue; }
            if (!PyErr_ExceptionMatches(PyExc_Exception)) { Py_DECREF(rec); return NULL; }
#if PY_VERSION_HEX >= 0x030C0000
            PyObject *exc = PyErr_GetRaisedException();
#else
            PyObject *et, *exc, *tb;
            PyErr_Fetch(&et, &exc, &tb);
            PyErr_NormalizeException(&et, &exc, &tb);
            if (tb != NULL && exc != NULL) PyException_SetTraceback(exc, tb);
            Py_XDECREF(et); Py_XDECREF(tb);
#endif
            PyObject *h = PyObject_CallOneArg(on_error, exc ? exc : Py_None);
            Py_XDECREF(exc);
            if (h == NULL) { Py_DECREF(rec); return NULL; }
            Py_DECREF(h);
            ok = 0;
            break;
        }
        int rc = ok ? PyList_Append(taken, rec) : 0;
        Py_DECREF(rec);
        if (rc < 0) return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
configure_observe(PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 5 || !PyCallable_Check(argv[4])) {
        PyErr_SetString(PyExc_TypeError, "configure_observe(session_span, phase_key, turn_key, "
                        "interrupted_key, on_record)");
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        if (!PyUnicode_CheckExact(argv[i])) {
            PyErr_SetString(PyExc_TypeError, "configure_observe: names must be str");
            return NULL;
        }
    }
    PyObject **slots[5] = {&o_session_span, &o_phase_key, &o_turn_key, &o_interrupted_key,
                           &o_on_record_py};
    keep_all(slots, argv, 5);
    Py_RETURN_NONE;
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
    keep_all(slots, argv, 8);
    Py_RETURN_NONE;
}

static PyObject *
configure(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"contextvar", "span_key", "context_type", "state", "lanes", "heappop",
                             "heappush", "get_running_loop", "current_task", "globals",
                             "call_on_start", "past_wake", "internal_error", "span_context_type",
                             "sampled", "span_context_py", "trace_state", NULL};
    PyObject *a[17];
    a[16] = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOO!OOOOO!OOOOOO|O:configure", kwlist,
                                     &PyContextVar_Type, &a[0], &a[1], &a[2], &a[3],
                                     &PyDict_Type, &a[4], &a[5], &a[6], &a[7], &a[8],
                                     &PyDict_Type, &a[9], &a[10], &a[11], &a[12], &a[13], &a[14],
                                     &a[15], &a[16]))
        return NULL;
    if (!PyType_Check(a[2]) || !PyType_Check(a[13])) {
        PyErr_SetString(PyExc_TypeError, "configure: context_type and span_context_type must be "
                        "classes");
        return NULL;
    }
    if (a[16] != Py_None && !PyType_IsSubtype((PyTypeObject *)a[13], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: a trace_state is given but span_context_type "
                        "is not a tuple");
        return NULL;
    }
    PyObject **slots[17] = {&cv, &span_key, &context_type, &state, &lanes, &heappop, &heappush,
                            &get_running_loop, &current_task, &globals, &call_on_start,
                            &past_wake, &internal_error, &span_context_type, &sampled_flags,
                            &span_context_py, &trace_state};
    keep_all(slots, a, 17);
    off_buffer = slot_offset(state, "buffer"); off_cap = slot_offset(state, "cap");
    off_wake_at = slot_offset(state, "wake_at"); off_on_start = slot_offset(state, "on_start");
    off_enabled = slot_offset(state, "enabled"); off_device = slot_offset(state, "device");
    off_sampling = slot_offset(state, "sampling");
    off_help_at = slot_offset(state, "help_at");
    Py_RETURN_NONE;
}

static PyObject *
configure_phases(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"phase_type", "session_type", "registry_type", "task_type",
                             "session_cv", "enter", "exit", "attrs", "interrupted", "keys",
                             "task_span", "session_span", "scheduler", "task_attrs",
                             "session_attrs", NULL};
    PyObject *pt, *st, *rt, *tt, *scv, *enter, *exit_, *attrs_fn, *intr, *keys, *tspan, *sspan,
        *sched, *tattrs, *sattrs;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!O!O!OOOUO!UUUOO:configure_phases", kwlist,
                                     &PyType_Type, &pt, &PyType_Type, &st, &PyType_Type, &rt,
                                     &PyType_Type, &tt, &PyContextVar_Type, &scv, &enter, &exit_,
                                     &attrs_fn, &intr, &PyTuple_Type, &keys, &tspan, &sspan,
                                     &sched, &tattrs, &sattrs))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)tt, &ScopeCoreType)) {
        PyErr_SetString(PyExc_TypeError, "configure_phases: the task class must derive from "
                        "ScopeCore");
        return NULL;
    }
    if (PyTuple_GET_SIZE(keys) != 10) {
        PyErr_SetString(PyExc_TypeError, "configure_phases: keys are (phase, turn, session, task, "
                        "genai operation, genai conversation, status, reason, step, pending)");
        return NULL;
    }
    for (int i = 0; i < 10; i++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, i))) {
            PyErr_SetString(PyExc_TypeError, "configure_phases: keys must be str");
            return NULL;
        }
    }
    if (!PyType_IsSubtype((PyTypeObject *)pt, &ScopeCoreType)
        || !PyType_IsSubtype((PyTypeObject *)st, &ScopeCoreType)) {
        PyErr_SetString(PyExc_TypeError, "configure_phases: the phase and session classes must "
                        "derive from ScopeCore");
        return NULL;
    }
    Py_ssize_t offs[22] = {
        type_slot((PyTypeObject *)pt, "reg"), type_slot((PyTypeObject *)pt, "session_id"),
        type_slot((PyTypeObject *)pt, "spec"), type_slot((PyTypeObject *)pt, "turn"),
        type_slot((PyTypeObject *)st, "turn"), type_slot((PyTypeObject *)st, "session_id"),
        type_slot((PyTypeObject *)st, "open_phases"), type_slot((PyTypeObject *)rt, "enabled"),
        type_slot((PyTypeObject *)rt, "sessions"), type_slot((PyTypeObject *)pt, "_attrs"),
        type_slot((PyTypeObject *)pt, "start_payload"), type_slot((PyTypeObject *)pt, "end_payload"),
        type_slot((PyTypeObject *)st, "task_rec"), type_slot((PyTypeObject *)tt, "task_id"),
        type_slot((PyTypeObject *)tt, "_attrs"), type_slot((PyTypeObject *)tt, "open"),
        type_slot((PyTypeObject *)tt, "spread"), type_slot((PyTypeObject *)tt, "step"),
        type_slot((PyTypeObject *)st, "_attrs"), type_slot((PyTypeObject *)st, "step"),
        type_slot((PyTypeObject *)st, "status"), type_slot((PyTypeObject *)st, "reason")};
    for (int i = 0; i < 22; i++) {
        if (offs[i] < 0) {
            PyErr_Format(PyExc_TypeError, "configure_phases: slot %d is not a plain slot", i);
            return NULL;
        }
    }
    off_p_reg = offs[0]; off_p_sid = offs[1]; off_p_spec = offs[2]; off_p_turn = offs[3];
    off_s_turn = offs[4]; off_s_sid = offs[5]; off_s_ops = offs[6]; off_r_enabled = offs[7];
    off_r_sessions = offs[8]; off_p_attrs = offs[9]; off_p_start = offs[10]; off_p_end = offs[11];
    off_s_task = offs[12]; off_t_id = offs[13]; off_t_attrs = offs[14]; off_t_open = offs[15];
    off_t_spread = offs[16]; off_t_step = offs[17]; off_s_attrs = offs[18]; off_s_step = offs[19];
    off_s_status = offs[20]; off_s_reason = offs[21];
    PyObject **slots[24] = {(PyObject **)&phase_type, (PyObject **)&session_type,
                            (PyObject **)&registry_type, (PyObject **)&task_type, &session_cv,
                            &phase_enter_py, &phase_exit_py, &phase_attrs_py, &attr_interrupted,
                            &attr_phase, &attr_turn, &attr_session, &attr_task, &attr_genai_op,
                            &attr_genai_conv, &task_span, &session_span, &scheduler,
                            &attr_status, &attr_reason, &attr_step, &v_pending_status,
                            &task_attrs_py, &session_attrs_py};
    PyObject *vals[24] = {pt, st, rt, tt, scv, enter, exit_, attrs_fn, intr,
                          PyTuple_GET_ITEM(keys, 0), PyTuple_GET_ITEM(keys, 1),
                          PyTuple_GET_ITEM(keys, 2), PyTuple_GET_ITEM(keys, 3),
                          PyTuple_GET_ITEM(keys, 4), PyTuple_GET_ITEM(keys, 5), tspan, sspan,
                          sched, PyTuple_GET_ITEM(keys, 6), PyTuple_GET_ITEM(keys, 7),
                          PyTuple_GET_ITEM(keys, 8), PyTuple_GET_ITEM(keys, 9), tattrs, sattrs};
    keep_all(slots, vals, 24);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure_phases", (PyCFunction)(void (*)(void))configure_phases, METH_VARARGS | METH_KEYWORDS,
     "Hand over PhaseScope's classes and Python methods (rltrace.sessions calls it once)."},
    {"new_task", (PyCFunction)(void (*)(void))new_task, METH_FASTCALL,
     "new_task(task_id, step): a started TaskScope (its __init__, compiled)."},
    {"new_session", (PyCFunction)(void (*)(void))new_session, METH_FASTCALL,
     "new_session(session_id, task, step): a started SessionScope (its __init__, compiled)."},
    {"new_phase", (PyCFunction)(void (*)(void))new_phase, METH_FASTCALL,
     "new_phase(spec, start_payload, end_payload, turn, session_id, reg): a PhaseScope."},
    {"configure_registry", (PyCFunction)(void (*)(void))configure_registry, METH_FASTCALL,
     "Hand over what register_task/register_session read (rltrace.sessions)."},
    {"configure_events", (PyCFunction)(void (*)(void))configure_events, METH_FASTCALL,
     "Hand over what mark_finalized reads (rltrace.sessions, after configure_phases)."},
    {"run_record_processors", (PyCFunction)(void (*)(void))run_record_processors, METH_FASTCALL,
     "The export cycle's loop over queued records (rltrace.pipeline), compiled."},
    {"configure_session_ended", (PyCFunction)(void (*)(void))configure_session_ended,
     METH_FASTCALL, "Hand over what a session record's end reads (rltrace.session_metrics)."},
    {"configure_observe", (PyCFunction)(void (*)(void))configure_observe, METH_FASTCALL,
     "Hand over the names observe_record reads (rltrace.session_metrics)."},
    {"observe_record", (PyCFunction)(void (*)(void))observe_record, METH_FASTCALL,
     "observe_record(processor, record): SessionMetricsProcessor.on_record, compiled."},
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
    INTERN(s_starts_turn, "starts_turn"); INTERN(s_name, "name"); INTERN(s_category, "category");
    INTERN(s_genai_operation, "genai_operation"); INTERN(s_slot_attrs, "slot_attrs");
    INTERN(s_record_attrs, "record_attrs"); INTERN(s__done, "_done");
    INTERN(s__session_ended, "_session_ended"); INTERN(s__phase_ended, "_phase_ended");
    INTERN(s__evict_oldest, "_evict_oldest"); INTERN(s_on_record, "on_record");
    INTERN(s_pop, "pop"); INTERN(s__record_metrics, "_record_metrics"); INTERN(s_record, "record");
    INTERN(s_sessions, "sessions"); INTERN(s_add, "add"); INTERN(s__write_locked, "_write_locked");
    INTERN(w_total_s, "rl.session.total_s");
    INTERN(w_turns, "rl.session.turns");
    if (!(kw_keep = Py_BuildValue("(s)", "keep"))) return NULL;
    INTERN(v_failed, "failed"); INTERN(s_mark_finalized, "mark_finalized");
    INTERN(s_session_id, "session_id"); INTERN(s_task_id, "task_id"); INTERN(s_status, "status");
    INTERN(s_reason, "reason");
    INTERN(s_close_if_open, "_close_if_open"); INTERN(s_finish, "finish");
    INTERN(s_start_payload, "start_payload"); INTERN(s_end_payload, "end_payload");
    INTERN(s_device_sync, "device_sync"); INTERN(s_specs, "specs");
    INTERN(s_turn_kw, "turn"); INTERN(s_parts, "parts");
    INTERN(s_open_phases, "open_phases"); INTERN(s_remove, "remove"); INTERN(s_help_at, "help_at");
    INTERN(s_help_every, "HELP_EVERY");
    INTERN(s_rand_bits, "rand_bits"); INTERN(s_id_lock, "_ID_LOCK"); INTERN(s_acquire, "acquire"); INTERN(s_release, "release");
    if (!(n128 = PyLong_FromLong(128)) || !(n64 = PyLong_FromLong(64))) return NULL;
    if (!(trace_id_max = PyLong_FromString("ffffffffffffffffffffffffffffffff", NULL, 16))
        || !(span_id_max = PyLong_FromUnsignedLongLong(0xffffffffffffffffULL)))
        return NULL;
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
    if (PyType_Ready(&ScopeCoreType) < 0 || PyType_Ready(&ScopeFactoryType) < 0
        || PyType_Ready(&RegistryCallType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "ScopeCore", (PyObject *)&ScopeCoreType) < 0
        || PyModule_AddObjectRef(m, "ScopeFactory", (PyObject *)&ScopeFactoryType) < 0
        || PyModule_AddObjectRef(m, "RegistryCall", (PyObject *)&RegistryCallType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
