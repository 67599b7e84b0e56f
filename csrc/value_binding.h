/*
 * The C half of pygrad.Value's op path (pygrad/engine.py), included once,
 * by the cffi module's preamble (csrc/cffi_build.py): the only code of the
 * core that touches Python objects.  Python calls it with the GIL held
 * (these calls keep it) and passes objects by id(): only Values, their
 * keeps, and the tuple of what an op made.
 *
 * An op's dunder makes the Value (object.__new__), the node memory (a
 * bytes object: pygrad/_lifetime.py) and the keep, then calls the op's
 * `_v` entry point with one argument, id() of  made = (value, keep, a, b[, k]):  the operand Values
 * a and b (b None for a number, b is a for a unary op), keep = (node
 * memory, a's keep[, b's keep]), and k the number operand.  The entry
 * point reads the node pointers from the keeps' first items (made holds
 * them for the call), makes the node, then stores keep, a and b in the
 * Value's slots and untracks what may leave the collector (pg_finish).
 * One call, and no argument for cffi to convert but an int: half the cost
 * of an op that C doesn't spend (three slot stores past Value.__setattr__,
 * a second call, and cffi's conversion of each pointer).
 *
 * Where a Value keeps its slots, and where a cffi cdata keeps its pointer
 * and its ctype, are found once at import (pg_binding_init), from objects
 * whose fields hold known values: nothing about either layout is assumed.
 * A node is read only from node memory (a bytes object with room for it)
 * or from a pg_node * cdata (a node within memory the keep holds).
 *
 * The collector: a keep, a tuple whose items are all untracked, can be in
 * no cycle; CPython untracks such tuples itself, but only during a
 * collection and only once their items are (a parent keep is often met
 * before its child's, so a chain of keeps would stay tracked).  A Value
 * refers to its keep and its operands, which are older: it can be in a
 * cycle only through an attribute set later, on it or on a Value below it.
 * So a new leaf's Value, and an op's Value whose operands are untracked,
 * leave the collector; an op over a tracked operand, such as a custom op,
 * stays tracked, so that below a tracked Value every Value is tracked (or
 * the collector would take a cycle below it for one held from outside).
 * Value.__setattr__ keeps that so: an attribute that may close a cycle
 * puts its holder, and the Values it refers to, back in the collector's
 * sight with everything below them (engine._track_below).
 */

/* An op's number operand did not convert to a double (an int too large):
 * Python takes its slower path, which raises the right error. */
#define PG_E_NUMBER -6

/* Untrack the keep if every item it holds is untracked, and the Value if
 * its operands are untracked.  (A Value can be untracked over a tracked
 * keep: what the keep holds can be in a cycle only through a custom op's
 * handle, and a cycle through the Value itself must pass an attribute, set
 * through Value.__setattr__, which tracks what it refers to.) */
static void pg_untrack_objects(PyObject *t, PyObject *value, PyObject *a, PyObject *b) {
    if (PyTuple_CheckExact(t) && PyObject_GC_IsTracked(t)) {
        Py_ssize_t n = PyTuple_Size(t), i;
        for (i = 0; i < n; i++) {
            PyObject *x = PyTuple_GetItem(t, i);
            /* node memory refers to nothing (the tests count it in a bytes
             * subclass, tracked, whose dict holds only a token:
             * tests/internals.py) */
            if (PyType_IS_GC(Py_TYPE(x)) && (!PyTuple_CheckExact(x) || PyObject_GC_IsTracked(x))
                && !PyBytes_Check(x))
                break;
        }
        if (i == n) PyObject_GC_UnTrack(t);
    }
    if (value != NULL && PyObject_GC_IsTracked(value) && (a == NULL || !PyObject_GC_IsTracked(a))
        && (b == NULL || !PyObject_GC_IsTracked(b)))
        PyObject_GC_UnTrack(value);
}

static void pg_track(uintptr_t value) {
    if (!PyObject_GC_IsTracked((PyObject *)value)) PyObject_GC_Track((PyObject *)value);
}

/* What pg_binding_init found: byte offsets of Value's slots _pg_keep,
 * _pg_a, _pg_b and _pg_kids, and the class Value; where a bytes object
 * keeps its bytes; the offsets of a cdata's pointer and ctype, and the
 * class and ctype of a node pointer cdata (pg_node *). */
static Py_ssize_t slot_keep, slot_a, slot_b, slot_kids;
static PyObject *value_type;
static Py_ssize_t bytes_data_at, cdata_ptr_at, cdata_ctype_at;
static PyObject *pointer_class, *pointer_ctype;

/* The offset of the word of object o (within its first `size` bytes, past
 * its header) that equals x; 0 if none does, or more than one. */
static Py_ssize_t word_holding(PyObject *o, Py_ssize_t size, const void *x) {
    const void *const *words = (const void *const *)o;
    Py_ssize_t found = 0;
    for (Py_ssize_t i = (Py_ssize_t)(sizeof(PyObject) / sizeof *words);
         (i + 1) * (Py_ssize_t)sizeof *words <= size; i++) {
        if (words[i] != x) continue;
        if (found) return 0;
        found = i * (Py_ssize_t)sizeof *words;
    }
    return found;
}

/* probe: a Value of basic size `size` whose slots _pg_keep, _pg_a, _pg_b
 * and _pg_kids hold the four markers.  pointer: (a pg_node * cdata, its
 * address as an int, its ctype).  0 if every field was found once; else
 * -1 (pygrad's import fails).  Like every function here it runs with the
 * GIL: cffi_build.py's gil_source keeps it for these calls
 * (tests/test_install.py checks cffi's wrappers). */
static int pg_binding_init(uintptr_t probe, intptr_t size, uintptr_t keep, uintptr_t a,
                           uintptr_t b, uintptr_t kids, uintptr_t pointer) {
    PyObject *p = (PyObject *)probe, *item = (PyObject *)pointer;
    Py_ssize_t k = word_holding(p, (Py_ssize_t)size, (void *)keep),
               at_a = word_holding(p, (Py_ssize_t)size, (void *)a),
               at_b = word_holding(p, (Py_ssize_t)size, (void *)b),
               at_kids = word_holding(p, (Py_ssize_t)size, (void *)kids);
    if (!k || !at_a || !at_b || !at_kids) return -1;     /* (each found once, so apart) */
    if (!PyTuple_CheckExact(item) || PyTuple_Size(item) != 3) return -1;
    PyObject *c = PyTuple_GetItem(item, 0), *ct = PyTuple_GetItem(item, 2);
    void *address = PyLong_AsVoidPtr(PyTuple_GetItem(item, 1));
    if (address == NULL) {
        PyErr_Clear();
        return -1;
    }
    /* the two fields sit at the start of every cdata, right after the
     * object header (a pointer cdata has no more than that) */
    Py_ssize_t head = (Py_ssize_t)sizeof(PyObject) + 2 * (Py_ssize_t)sizeof(void *);
    Py_ssize_t ptr_at = word_holding(c, head, address), ctype_at = word_holding(c, head, ct);
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, 2);
    if (bytes == NULL) {
        PyErr_Clear();
        return -1;
    }
    bytes_data_at = PyBytes_AsString(bytes) - (char *)bytes;
    Py_DECREF(bytes);
    if (!ptr_at || !ctype_at || bytes_data_at <= 0) return -1;
    slot_keep = k;
    slot_a = at_a;
    slot_b = at_b;
    slot_kids = at_kids;
    cdata_ptr_at = ptr_at;
    cdata_ctype_at = ctype_at;
    /* held for the life of the process: nothing here is ever released */
    value_type = (PyObject *)Py_TYPE(p);
    Py_INCREF(value_type);
    pointer_class = (PyObject *)Py_TYPE(c);
    Py_INCREF(pointer_class);
    pointer_ctype = ct;
    Py_INCREF(pointer_ctype);
    return 0;
}

/* The first of `n` nodes that x holds, or NULL: node memory (a bytes
 * object of room for n nodes: pygrad/_lifetime.py), or a pg_node * cdata
 * (a node within such memory, which the rest of the keep holds). */
static pg_node *node_at(PyObject *x, Py_ssize_t n) {
    if (PyBytes_Check(x)) {
        char *at = (char *)x + bytes_data_at;
        return Py_SIZE(x) >= n * (Py_ssize_t)sizeof(pg_node) && (uintptr_t)at % _Alignof(pg_node) == 0
               ? (pg_node *)(void *)at : NULL;
    }
    if ((PyObject *)Py_TYPE(x) != pointer_class
        || *(PyObject **)(void *)((char *)x + cdata_ctype_at) != pointer_ctype)
        return NULL;
    return *(pg_node **)(void *)((char *)x + cdata_ptr_at);
}

/* The node of `keep`, if it is what Value v's own slot holds; else NULL.
 * Any bytes object passes node_at, so a keep is taken only from a real
 * Value's slot: not from an object that says it is a Value (__class__),
 * nor from what a subclass answers for _pg_keep (Value refuses subclasses
 * that define the name). */
static pg_node *keep_node(PyObject *v, PyObject *keep) {
    if (!PyObject_TypeCheck(v, (PyTypeObject *)value_type)
        || *(PyObject **)(void *)((char *)v + slot_keep) != keep
        || !PyTuple_CheckExact(keep) || PyTuple_Size(keep) < 1)
        return NULL;
    return node_at(PyTuple_GetItem(keep, 0), 1);
}

/* made's new node and its operands' nodes (b NULL for a unary op or one
 * with a number, whose memory holds the number's leaf too); 0 if any is
 * missing.  made = (value, keep, a, b[, k]): keep's items after the
 * memory are a's and b's keeps. */
static int made_nodes(PyObject *made, pg_node **out, pg_node **a, pg_node **b, Py_ssize_t n) {
    if (value_type == NULL || !PyTuple_CheckExact(made) || PyTuple_Size(made) < 4) return 0;
    PyObject *keep = PyTuple_GetItem(made, 1);
    if (!PyTuple_CheckExact(keep) || PyTuple_Size(keep) != (b != NULL ? 3 : 2)) return 0;
    *out = node_at(PyTuple_GetItem(keep, 0), n);
    *a = keep_node(PyTuple_GetItem(made, 2), PyTuple_GetItem(keep, 1));
    if (b != NULL) *b = keep_node(PyTuple_GetItem(made, 3), PyTuple_GetItem(keep, 2));
    return *out != NULL && *a != NULL && (b == NULL || *b != NULL);
}

/* The nodes of the n Values in the tuple `values`, whose keeps are the
 * tuple `keeps`, into ptrs (bulk paths, n-ary nodes' children); PG_E_ARG
 * if any is no Value or its keep is not the one given. */
static int32_t pg_pack_keeps(uintptr_t values, uintptr_t keeps, pg_node **ptrs, uint32_t n) {
    PyObject *v = (PyObject *)values, *t = (PyObject *)keeps;
    if (value_type == NULL || !PyTuple_CheckExact(v) || !PyTuple_CheckExact(t)
        || PyTuple_Size(v) != (Py_ssize_t)n || PyTuple_Size(t) != (Py_ssize_t)n)
        return PG_E_ARG;
    for (uint32_t i = 0; i < n; i++) {
        Py_ssize_t j = (Py_ssize_t)i;
        if ((ptrs[i] = keep_node(PyTuple_GetItem(v, j), PyTuple_GetItem(t, j))) == NULL)
            return PG_E_ARG;
    }
    return 0;
}

/* Node memory (or a node pointer) as a pg_node * cdata: pointer arithmetic
 * and comparison in Python (pygrad/_lifetime.py's first_node). */
static pg_node *pg_node_ptr(void *memory) {
    return memory;
}

/* made's number operand k, as float(k) makes it; 0 if it has none. */
static int made_number(PyObject *made, double *k) {
    if (PyTuple_Size(made) != 5) return 0;
    *k = PyFloat_AsDouble(PyTuple_GetItem(made, 4));
    if (*k == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static void put_slot(PyObject *value, Py_ssize_t offset, PyObject *x) {
    PyObject **slot = (PyObject **)(void *)((char *)value + offset);
    PyObject *old = *slot;
    Py_INCREF(x);
    *slot = x;
    Py_XDECREF(old);
}

/* Store made's keep, a and b in its Value's slots, and None in _pg_kids
 * (the cache of _prev: so its first read raises no AttributeError), and
 * untrack what may leave the collector; PG_E_ARG (and nothing stored) if made holds no
 * Value. */
static int32_t pg_finish(uintptr_t made) {
    PyObject *t = (PyObject *)made;
    if (value_type == NULL || !PyTuple_CheckExact(t) || PyTuple_Size(t) < 4) return PG_E_ARG;
    PyObject *value = PyTuple_GetItem(t, 0), *keep = PyTuple_GetItem(t, 1),
             *a = PyTuple_GetItem(t, 2), *b = PyTuple_GetItem(t, 3);
    if (!PyObject_TypeCheck(value, (PyTypeObject *)value_type)) return PG_E_ARG;
    /* A fresh Value has no _pg_a yet; Value.__setattr__ gives one to a
     * Value that gets an attribute before its __init__ is done (as does an
     * __init__ run again): such a Value may be in a cycle, and stays
     * tracked. */
    int fresh = *(PyObject **)(void *)((char *)value + slot_a) == NULL;
    put_slot(value, slot_keep, keep);
    put_slot(value, slot_a, a);
    put_slot(value, slot_b, b);
    put_slot(value, slot_kids, Py_None);
    pg_untrack_objects(keep, fresh ? value : NULL, a, b);
    return 0;
}

/* A leaf's Value (Value(x) for a float x): made = (value, (node,), None,
 * None). */
static int32_t pg_leaf_v(pg_node *out, double data, uintptr_t made) {
    int32_t rc = pg_leaf(out, data);
    return rc ? rc : pg_finish(made);
}
