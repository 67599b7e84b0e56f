/*
 * Lifetime, and the C half of pygrad.Value (pygrad/engine.py).  Included
 * once, by the cffi module's preamble (csrc/cffi_build.py): the only code
 * of the core that touches Python objects.  It uses CPython's limited,
 * documented C API only: no object's layout is probed or assumed.
 *
 * Lifetime is five rules (pygrad/_lifetime.py states the same for Python;
 * docs/lifetime.md links here).  What is listed under a rule is where it
 * applies, not a further rule.  Threads have rules of their own
 * (csrc/lock.h), and so do numbers C keeps outside their nodes
 * (csrc/replay.c, "Deferred write-back"; pygrad/token_programs.py).
 *
 *  1. A node object owns what its nodes point to, and a node's op and
 *     children never change.
 *     - A node lives in a node object (_Node), pygrad's own type, which
 *       only this file makes: Python can't construct, read, write or
 *       resize one (on 3.9, whose types can't be made immutable, giving
 *       the type a __new__ makes an empty one, which nothing accepts).  It holds its nodes inline (an n-ary node's child list
 *       and a Function's partials too) and a reference to every node
 *       object or node list (_NodeList) they point to, so whatever holds a
 *       node object holds all C can reach.
 *     - One node object may hold many nodes (a block of leaves, a fused
 *       layer's): a Value made for one of them holds the whole object,
 *       found as the object or one it holds directly (owner_of).
 *     - A custom op's node names its Value too, without a reference (for
 *       backward() to find the closure); the Value erases the name as it
 *       goes.
 *
 *  2. A Value holds its node object, given once by C, and the operands it
 *     was made from.
 *     - _ValueBase (its C base) has the node object and the node's place
 *       in it, written when __init__ or an op gives it a node.  Before
 *       that, every call that needs the node refuses the Value, and the
 *       views _prev, _children, _local_grads and _op read as empty.
 *     - Attributes, __class__, subclasses and the collector reach only the
 *       operands (for _prev: the Python graph mirrors C's) and _prev's
 *       cache (_pg_kids: writable, so _prev may then differ from C's
 *       children, which C never reads from it).
 *
 *  3. The collector sees every Value and no node object.
 *     - Node objects point only to older node objects and node lists, so
 *       they form no cycle and are not tracked.  Values' cycles (a user's
 *       closure, a fused model's table of the Values _prev makes for its
 *       hidden nodes) are collected as any.
 *     - A call that makes a big batch of Values and no garbage (a trace,
 *       grad(create_graph=True)) runs with the collector paused, for speed
 *       only, and turns it back on only if it was on (a gc.disable() made
 *       during the call is undone; a forked child turns it back on).
 *
 *  4. Freeing is reference counting, never recursive, and a release
 *     finishes what its object left open.
 *     - A node object's references go through a per-thread list, a
 *       Value's through CPython's trashcan (ops make only Python classes'
 *       Values, whose dealloc has it): a chain of any length frees in
 *       constant stack, and no pygrad Python runs.  Nothing reads a
 *       reference count.
 *     - Sweeps, programs and batches are released by ffi.gc: a sweep's
 *       release puts back the grads it saved unless kept (pg_sweep_keep),
 *       a program's writes back its pending numbers; then each lets go of
 *       its hold.  A run checks replay.py's alive() first, since a cycle's
 *       __del__ may reach a released program.
 *     - Never released: C's statics (the four types _ValueBase, _Node,
 *       _NodeList and _OpName, set.__new__, engine's callbacks and op
 *       names, the number converter), so pygrad runs in one interpreter
 *       per process (pg_binding_init refuses a second).
 *
 *  5. Whatever C reads is held by a reference while it reads it.
 *     - A call's arguments (passed by id()) by its caller; a call that
 *       lets the GIL go, by its own reference or by the `hold` of its
 *       sweep, program or batch, made (ffi.gc) before the call that fills
 *       it, so a Ctrl-C can't lose it.  So a node's address, Python's key
 *       for its identity, names one node while the Value is held.
 *     - The one read without a reference: a custom op's node's name for
 *       its Value (rule 1), read with the GIL held and erased by the
 *       Value's dealloc before the Value goes.
 *
 * Python calls these with the GIL held (cffi keeps it for them) and
 * passes objects by id(), which is their address in CPython (pygrad
 * refuses other interpreters at import).
 */

/* An op's number operand did not convert to a double (an int too large):
 * Python takes its slower path, which raises the right error. */
#define PG_E_NUMBER -6
/* An op's number operand is no float or int (Python converts the others
 * before calling: the op functions refuse them). */
#define PG_E_NOT_A_NUMBER -7

/* -- node objects (rule 1) ------------------------------------------------- */

typedef struct pg_nodeobj {
    PyObject_VAR_HEAD             /* ob_size: the words that follow the head */
    uint32_t nnodes;              /* nodes, first in the words */
    uint32_t nrefs;               /* then the objects it holds, then C words */
} pg_nodeobj;

/* The head, rounded to the nodes' alignment. */
#define NODE_HEAD ((sizeof(pg_nodeobj) + sizeof(double) - 1) / sizeof(double) * sizeof(double))
#define NODE_WORDS (sizeof(pg_node) / sizeof(void *))
_Static_assert(sizeof(pg_node) % sizeof(void *) == 0, "a node is a whole number of words");

static PyTypeObject *node_type, *list_type, *value_type;
/* Nodes alive, in node objects (the tests count them: pg_live_nodes). */
static int64_t live_nodes;

static pg_node *obj_nodes(pg_nodeobj *x) {
    return (pg_node *)(void *)((char *)x + NODE_HEAD);
}
static PyObject **obj_refs(pg_nodeobj *x) {
    return (PyObject **)(void *)(obj_nodes(x) + x->nnodes);
}
static pg_node **obj_words(pg_nodeobj *x) {
    return (pg_node **)(obj_refs(x) + x->nrefs);
}

/* A new node object of `nodes` nodes (at least one: its dealloc links the
 * free list through the first), room for `refs` references (NULL until
 * set) and `words` words; NULL with nothing raised when out of memory or
 * for no node. */
static pg_nodeobj *new_nodeobj(uint32_t nodes, uint32_t refs, size_t words) {
    if (nodes == 0) return NULL;
    size_t total = (size_t)nodes * NODE_WORDS + refs + words;
    if (total > (size_t)PY_SSIZE_T_MAX / sizeof(void *) / 2) return NULL;
    pg_nodeobj *x = PyObject_NewVar(pg_nodeobj, node_type, (Py_ssize_t)total);
    if (x == NULL) {
        PyErr_Clear();
        return NULL;
    }
    x->nnodes = nodes;
    x->nrefs = refs;
    memset(obj_refs(x), 0, refs * sizeof(PyObject *));
    live_nodes += nodes;
    return x;
}

/* Rule 4: a node object being freed while another one's references are
 * let go is put on this thread's list (linked through its first node,
 * which is dead by then), and the outermost call lets its references go. */
static _Thread_local pg_nodeobj *freeing_list;
static _Thread_local int freeing;

static void node_dealloc(PyObject *o) {
    pg_nodeobj *x = (pg_nodeobj *)o;
    if (x->nnodes == 0) {
        /* (no node to link through: one made empty past no_new, which
         * CPython 3.9 allows by assigning the type's __new__; it holds
         * nothing, and nothing accepts it) */
        PyTypeObject *tp = Py_TYPE(x);
        PyObject_Free(x);
        Py_DECREF(tp);
        return;
    }
    memcpy(obj_nodes(x), &freeing_list, sizeof freeing_list);
    freeing_list = x;
    if (freeing) return;
    freeing = 1;
    while (freeing_list != NULL) {
        x = freeing_list;
        memcpy(&freeing_list, obj_nodes(x), sizeof freeing_list);
        PyObject **refs = obj_refs(x);
        for (uint32_t i = 0; i < x->nrefs; i++) Py_XDECREF(refs[i]);
        live_nodes -= x->nnodes;
        PyTypeObject *tp = Py_TYPE(x);
        PyObject_Free(x);
        Py_DECREF(tp);
    }
    freeing = 0;
}

/* Py_TPFLAGS_IMMUTABLETYPE, its stable value (3.10+; the limited API of
 * 3.9 that the core is built against does not name it). */
#define PG_TPFLAGS_IMMUTABLETYPE (1UL << 8)

/* Neither node objects nor node lists can be made from Python. */
static PyObject *no_new(PyTypeObject *t, PyObject *args, PyObject *kwargs) {
    (void)t, (void)args, (void)kwargs;
    PyErr_SetString(PyExc_TypeError, "pygrad's node objects are made only by pygrad's ops");
    return NULL;
}

static PyType_Slot node_slots[] = {
    {Py_tp_dealloc, (void *)node_dealloc},
    {Py_tp_new, (void *)no_new},
    {Py_tp_doc, (void *)"A graph node's memory (pygrad's own; opaque)."},
    {0, NULL},
};
static PyType_Spec node_spec = {"pygrad._Node", (int)sizeof(pg_nodeobj), (int)sizeof(void *),
                                Py_TPFLAGS_DEFAULT, node_slots};

/* -- node lists: the nodes of many Values, for bulk calls ------------------ */

/* n references to node objects, then the n node pointers. */
typedef struct pg_listobj {
    PyObject_VAR_HEAD
    uint32_t n;
} pg_listobj;

static PyObject **list_refs(pg_listobj *l) {
    return (PyObject **)(void *)((char *)l + NODE_HEAD);
}
static pg_node **list_nodes(pg_listobj *l) {
    return (pg_node **)(list_refs(l) + l->n);
}

static void list_dealloc(PyObject *o) {
    pg_listobj *l = (pg_listobj *)o;
    PyTypeObject *tp = Py_TYPE(l);
    /* (a node object's dealloc only queues itself: no recursion here) */
    for (uint32_t i = 0; i < l->n; i++) Py_XDECREF(list_refs(l)[i]);
    PyObject_Free(l);
    Py_DECREF(tp);
}

static PyType_Slot list_slots[] = {
    {Py_tp_dealloc, (void *)list_dealloc},
    {Py_tp_new, (void *)no_new},
    {Py_tp_doc, (void *)"The nodes of many Values, for one C call (pygrad's own; opaque)."},
    {0, NULL},
};
static PyType_Spec list_spec = {"pygrad._NodeList", (int)sizeof(pg_listobj), (int)sizeof(void *),
                                Py_TPFLAGS_DEFAULT, list_slots};

/* -- Value's C base (rule 2) ----------------------------------------------- */

typedef struct pg_valueobj {
    PyObject_HEAD
    pg_nodeobj *owner;      /* holds node; written once, by C */
    pg_node *node;
    PyObject *a, *b;        /* the operands it was made from (_prev), or NULL */
    PyObject *kids;         /* _prev's cache, or NULL */
    /* Unused: they make a Value (with Value's __dict__ and __weakref__, and
     * the collector's header) a 104-112-byte block on CPython 3.9-3.13, in
     * pools of its own, while a unary or binary op's node object is a
     * 96-byte one.  Sharing pools, a graph's nodes lay twice as far apart,
     * and backward()'s walk, bound by memory, took 1.6x as long. */
    void *spare[2];
} pg_valueobj;

/* Python's converter of a number for data/grad (engine._convert):
 * convert(x, name) -> float, or raises the error a user should see. */
static PyObject *number_converter;

/* Replayed numbers not yet in their nodes go back before anything reads
 * or writes a node's numbers (csrc/replay.c: deferred write-back): every
 * call that takes a Value or a node list passes here first (as_value,
 * as_list; as_own_list if one of its nodes is a program's), and a .data or
 * .grad read or write of a PG_F_REPLAYED node. */
static void settle_replays(void) {
    if (pg_replay_any_pending) pg_replay_settle();
}

static pg_valueobj *as_value(PyObject *o) {
    settle_replays();
    return o != NULL && PyObject_TypeCheck(o, value_type) ? (pg_valueobj *)o : NULL;
}

/* The node of Value o, or NULL (no Value, or one whose __init__ never ran). */
static pg_node *value_node(PyObject *o) {
    pg_valueobj *v = as_value(o);
    return v != NULL ? v->node : NULL;
}

static PyObject *no_node(void) {
    PyErr_SetString(PyExc_TypeError,
                    "this pygrad.Value has no node: its __init__ never ran (make Values with "
                    "Value(data), or from other Values' operators)");
    return NULL;
}

/* Nonzero while this thread traces a loss into programs (call_tracing,
 * below): any number read then, or written, would be baked into (or left
 * out of) every later run of the program. */
static _Thread_local int tracing;
/* How many threads trace now (under the GIL): a read checks the
 * thread-local flag only when some thread does, because that look-up
 * costs a call in a shared library and a .data read is a few ns. */
static int tracers;

static PyObject *traced_number(const char *which, int writing) {
    PyErr_Format(PyExc_ValueError,
                 "v.%s was %s while pygrad.per_length traces the loss: that happens once, "
                 "not on every run of the program.  Keep such numbers in the graph (for a "
                 "softmax's max(v.data for v in xs) shift: pygrad.detached_max(xs)), and read "
                 "or set them outside the loss function", which, writing ? "set" : "read");
    return NULL;
}

static PyObject *get_number(PyObject *self, void *which) {
    pg_node *n = ((pg_valueobj *)self)->node;
    if (n == NULL) return no_node();
    if (tracers && tracing) return traced_number(which != NULL ? "grad" : "data", 0);
    if (n->flags & (PG_F_REPLAYED | PG_F_TRACED)) {     /* (one test on the common path) */
        if (n->flags & PG_F_TRACED) {
            /* (a traced program's input, or made from one: pg_set_traced) */
            PyErr_Format(PyExc_ValueError,
                         "v.%s was read from a Value that depends on a traced program's "
                         "input (pygrad.per_length): the number changes with every run, and "
                         "a float read now would be baked into all of them.  Keep it in the "
                         "graph instead (for a softmax's max(v.data for v in xs) shift: "
                         "pygrad.detached_max(xs))", which != NULL ? "grad" : "data");
            return NULL;
        }
        settle_replays();
    }
    return PyFloat_FromDouble(which != NULL ? n->grad : n->data);
}

static int set_number(PyObject *self, PyObject *x, void *which) {
    const char *name = which != NULL ? "grad" : "data";
    if (tracers && tracing) {
        traced_number(name, 1);
        return -1;
    }
    if (x == NULL) {
        PyErr_Format(PyExc_AttributeError, "a pygrad.Value's %s can't be deleted: set a number",
                     name);
        return -1;
    }
    double d;
    if (PyFloat_CheckExact(x)) {
        d = PyFloat_AsDouble(x);
    } else {
        d = -1.0;
        if (PyLong_CheckExact(x)) d = PyLong_AsDouble(x);   /* as float(int) rounds */
        if (!PyLong_CheckExact(x) || (d == -1.0 && PyErr_Occurred())) {
            PyErr_Clear();
            /* anything else, or an int too large: Python's converter says
             * what is wrong (it may run the number's own __float__) */
            PyObject *r = PyObject_CallFunction(number_converter, "Os", x, name);
            if (r == NULL) return -1;
            d = PyFloat_AsDouble(r);
            Py_DECREF(r);
            if (d == -1.0 && PyErr_Occurred()) return -1;
        }
    }
    pg_node *n = ((pg_valueobj *)self)->node;
    if (n == NULL) {
        no_node();
        return -1;
    }
    if (n->flags & PG_F_REPLAYED) settle_replays();      /* (or a later settle would undo this) */
    if (which != NULL) n->grad = d;
    else n->data = d;
    return 0;
}

static PyObject *get_ref(PyObject *self, void *field) {
    PyObject *x = *(PyObject **)(void *)((char *)self + (size_t)field);
    if (x == NULL) x = Py_None;
    Py_INCREF(x);
    return x;
}

static int set_kids(PyObject *self, PyObject *x, void *field) {
    (void)field;
    pg_valueobj *v = (pg_valueobj *)self;
    PyObject *old = v->kids;
    if (x == Py_None) x = NULL;      /* (None reads back as no cache: as get_ref shows it) */
    Py_XINCREF(x);
    v->kids = x;
    Py_XDECREF(old);
    return 0;
}

/* Value v's children as a new tuple of Values (kids_tuple, below). */
static PyObject *kids_tuple(pg_valueobj *v);

/* engine._Children (the set type _prev hands out), engine._prev_slow (v
 * -> that set, made the slow way) and engine.Value (the class of a Value
 * made for a child that has none): set once, by pg_binding_prev. */
static PyObject *children_type, *prev_slow, *engine_value;
/* set.__new__: get_prev makes _prev's sets with it, without _Children's
 * __init__, which refuses to run on a set that has children
 * (pygrad/engine.py: _prev can't be changed). */
static PyObject *set_new;

/* A new _Children of tuple t's items. */
static PyObject *children_of(PyObject *t) {
    PyObject *kids = PyObject_CallFunctionObjArgs(set_new, children_type, NULL);
    for (Py_ssize_t i = 0, n = kids != NULL ? PyTuple_Size(t) : 0; i < n; i++) {
        if (PySet_Add(kids, PyTuple_GetItem(t, i)) < 0) {   /* (may run __hash__) */
            Py_DECREF(kids);
            return NULL;
        }
    }
    return kids;
}

/* Value._prev, micrograd's set of children: the cache (_pg_kids) if set,
 * else made once and cached.  In C because drawing helpers and hand-written
 * backward passes read it for every node: the common cases (the operands
 * are the children; a number's leaf) cost one set here, not a Python
 * property, cffi calls and the set. */
static PyObject *get_prev(PyObject *self, void *unused) {
    (void)unused;
    pg_valueobj *v = (pg_valueobj *)self;
    if (v->kids != NULL) {
        Py_INCREF(v->kids);
        return v->kids;
    }
    if (children_type == NULL || prev_slow == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pygrad: the engine is not initialised");
        return NULL;
    }
    if (v->node == NULL)        /* (__init__ not run yet: nothing to cache) */
        return PyObject_CallFunctionObjArgs(prev_slow, (PyObject *)v, NULL);
    PyObject *t = kids_tuple(v), *kids;
    if (t == NULL && PyErr_Occurred()) return NULL;
    if (t != NULL) {
        kids = children_of(t);
        Py_DECREF(t);
    } else {
        kids = PyObject_CallFunctionObjArgs(prev_slow, (PyObject *)v, NULL);
    }
    if (kids == NULL) return NULL;
    if (v->kids != NULL) {           /* Python code above set it first: the same set always */
        Py_DECREF(kids);
        Py_INCREF(v->kids);
        return v->kids;
    }
    Py_INCREF(kids);
    v->kids = kids;                  /* children refer to no parent: no cycle */
    return kids;
}

static int set_prev(PyObject *self, PyObject *x, void *unused) {
    (void)self, (void)x, (void)unused;
    PyErr_SetString(PyExc_AttributeError,
                    "a pygrad.Value's children are fixed when it is made (they are the C "
                    "node's): make it with Value(data, children, op) and set its _backward, "
                    "as micrograd's own ops do");
    return -1;
}

static int value_traverse(PyObject *self, visitproc visit, void *arg) {
    pg_valueobj *v = (pg_valueobj *)self;
    Py_VISIT(v->a);
    Py_VISIT(v->b);
    Py_VISIT(v->kids);
    Py_VISIT((PyObject *)Py_TYPE(self));
    return 0;
}

/* The collector clears what may close a cycle; the node stays (rule 2). */
static int value_clear(PyObject *self) {
    pg_valueobj *v = (pg_valueobj *)self;
    Py_CLEAR(v->a);
    Py_CLEAR(v->b);
    Py_CLEAR(v->kids);
    return 0;
}

static void value_dealloc(PyObject *self) {
    pg_valueobj *v = (pg_valueobj *)self;
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (v->node != NULL && v->node->op == PG_OP_CUSTOM && v->node->c.list.py == (void *)self)
        v->node->c.list.py = NULL;       /* (pg_custom_v) */
    value_clear(self);
    Py_CLEAR(v->owner);
    v->node = NULL;
    PyObject_GC_Del(self);
    Py_DECREF(tp);
}

static PyGetSetDef value_getset[] = {
    {"data", get_number, set_number, "The value: a float, stored in the C node.", NULL},
    {"grad", get_number, set_number,
     "d(output)/d(self), accumulated by backward(): a float, stored in the C node.",
     (void *)1},
    {"_pg_a", get_ref, NULL, "The operand(s) this Value was made from (for _prev).",
     (void *)offsetof(pg_valueobj, a)},
    {"_pg_b", get_ref, NULL, "The second operand, or a fused model's table (for _prev).",
     (void *)offsetof(pg_valueobj, b)},
    {"_pg_kids", get_ref, set_kids, "_prev's cache.", (void *)offsetof(pg_valueobj, kids)},
    {"_prev", get_prev, set_prev,
     "The children, as micrograd's set of Values: the Values this one was made from "
     "(yours, with their class and attributes), and for a node made without one (a "
     "number's leaf, a fused layer's hidden node) a Value made on first read; the same "
     "set on every read.  The set can't be changed: the children are the C node's.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot value_slots[] = {
    {Py_tp_dealloc, (void *)value_dealloc},
    {Py_tp_traverse, (void *)value_traverse},
    {Py_tp_clear, (void *)value_clear},
    {Py_tp_getset, (void *)value_getset},
    {Py_tp_doc, (void *)"pygrad.Value's C base: the node it holds, and its numbers."},
    {0, NULL},
};
static PyType_Spec value_spec = {"pygrad._ValueBase", (int)sizeof(pg_valueobj), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
                                 value_slots};

/* Make the three types and append them to the list `out` (_ValueBase,
 * _Node, _NodeList); `converter` is engine's number converter.  Once per
 * process: -2 when called again (pygrad in a second interpreter), -1 if a
 * type could not be made (an exception is left pending... cleared). */
static int pg_binding_init(uintptr_t out, uintptr_t converter) {
    PyObject *list = (PyObject *)out;
    if (value_type != NULL) return -2;
    if (!PyList_Check(list)) return -1;
    /* From 3.10 the node types are immutable: no __new__ of Python's can
     * be given them (the flag's bit is unused before) */
    PyObject *hex = PySys_GetObject("hexversion");          /* (borrowed) */
    long version = hex != NULL ? PyLong_AsLong(hex) : 0;
    PyErr_Clear();
    if (version >= 0x030A0000) {
        node_spec.flags |= PG_TPFLAGS_IMMUTABLETYPE;
        list_spec.flags |= PG_TPFLAGS_IMMUTABLETYPE;
    }
    PyTypeObject *v = (PyTypeObject *)PyType_FromSpec(&value_spec);
    PyTypeObject *n = (PyTypeObject *)PyType_FromSpec(&node_spec);
    PyTypeObject *l = (PyTypeObject *)PyType_FromSpec(&list_spec);
    if (v == NULL || n == NULL || l == NULL || PyList_Append(list, (PyObject *)v) ||
            PyList_Append(list, (PyObject *)n) || PyList_Append(list, (PyObject *)l)) {
        PyErr_Clear();
        Py_XDECREF(v);
        Py_XDECREF(n);
        Py_XDECREF(l);
        return -1;
    }
    /* held for the life of the process */
    value_type = v;
    node_type = n;
    list_type = l;
    number_converter = (PyObject *)converter;
    Py_INCREF(number_converter);
    return 0;
}

/* engine's _Children type, _prev_slow function and Value class, for
 * Value._prev (get_prev): 0, or -1 if they are set already, children is no
 * set type or cls no subclass of the C base (held for the process). */
static int pg_binding_prev(uintptr_t children, uintptr_t slow, uintptr_t cls) {
    if (children_type != NULL || value_type == NULL || !PyType_Check((PyObject *)cls) ||
            !PyType_IsSubtype((PyTypeObject *)cls, value_type) ||
            !PyType_Check((PyObject *)children) ||
            !PyType_IsSubtype((PyTypeObject *)children, &PySet_Type))
        return -1;
    set_new = PyObject_GetAttrString((PyObject *)&PySet_Type, "__new__");
    if (set_new == NULL) {
        PyErr_Clear();
        return -1;
    }
    children_type = (PyObject *)children;
    prev_slow = (PyObject *)slow;
    engine_value = (PyObject *)cls;
    Py_INCREF(children_type);
    Py_INCREF(prev_slow);
    Py_INCREF(engine_value);
    return 0;
}

/* -- Value._op's descriptor ------------------------------------------------ */

/* Each op's name by code (a str; None where it depends on the node: a
 * power's exponent, a fused neuron's activation, which op_name_slow(v)
 * gives): set once, by pg_binding_op_name. */
static PyObject *op_names, *op_name_slow;

/* A non-data descriptor (no __set__), so that a name set on a Value (a
 * custom op's, micrograd's `out._op = '-'`) lives in its instance dict and
 * comes first, as micrograd keeps it; else the name is read from the node.
 * In C because drawing helpers read it for every node. */
static PyObject *op_name_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    pg_node *n = value_node(obj);
    if (n == NULL || (Py_ssize_t)n->op >= PyTuple_Size(op_names))
        return PyUnicode_FromString("");          /* (no node: its __init__ never ran) */
    PyObject *name = PyTuple_GetItem(op_names, (Py_ssize_t)n->op);
    if (name == NULL || name == Py_None) return PyObject_CallFunctionObjArgs(op_name_slow, obj, NULL);
    Py_INCREF(name);
    return name;
}

static void op_name_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyType_Slot op_name_slots[] = {
    {Py_tp_descr_get, (void *)op_name_get},
    {Py_tp_dealloc, (void *)op_name_dealloc},
    {Py_tp_new, (void *)no_new},
    {Py_tp_doc, (void *)"Value._op: the op's name, for drawing ('+', '*', '**2', ...), "
                        "micrograd's; a name set on a Value comes first."},
    {0, NULL},
};
static PyType_Spec op_name_spec = {"pygrad._OpName", (int)sizeof(PyObject), 0, Py_TPFLAGS_DEFAULT,
                                   op_name_slots};

/* The _op descriptor, appended to list out, over the tuple names and the
 * callable slow (held for the process): 0, or -1 (called before, or no
 * memory: nothing appended, nothing raised). */
static int pg_binding_op_name(uintptr_t out, uintptr_t names, uintptr_t slow) {
    if (op_names != NULL || !PyList_Check((PyObject *)out) || !PyTuple_Check((PyObject *)names))
        return -1;
    PyTypeObject *tp = (PyTypeObject *)PyType_FromSpec(&op_name_spec);
    PyObject *d = tp != NULL ? PyType_GenericAlloc(tp, 0) : NULL;
    Py_XDECREF(tp);                                  /* (d holds its type) */
    if (d == NULL || PyList_Append((PyObject *)out, d)) {
        PyErr_Clear();
        Py_XDECREF(d);
        return -1;
    }
    Py_DECREF(d);
    op_names = (PyObject *)names;
    op_name_slow = (PyObject *)slow;
    Py_INCREF(op_names);
    Py_INCREF(op_name_slow);
    return 0;
}

/* Value `out` now holds node `node` of node object x (taking x's new
 * reference) and operands a, b; PG_E_ARG, and x released, if out is no
 * fresh Value. */
static int32_t give(PyObject *out, pg_nodeobj *x, pg_node *node, PyObject *a, PyObject *b) {
    pg_valueobj *v = as_value(out);
    if (v == NULL || v->owner != NULL) {
        Py_DECREF(x);
        return PG_E_ARG;
    }
    v->owner = x;
    v->node = node;
    Py_XINCREF(a);
    Py_XINCREF(b);
    v->a = a;
    v->b = b;
    return 0;
}

/* Value v's children, in order, as a new tuple: operand a or b where it
 * holds the child, else (a number's leaf, in v's own node object) a new
 * engine.Value over it, holding nothing more.  NULL with no error set for
 * any other shape (n-ary and fused nodes, a custom op's tuple, no node):
 * engine._prev_slow makes those; NULL with an error if out of memory. */
static PyObject *kids_tuple(pg_valueobj *v) {
    if (v->node == NULL || v->owner == NULL || engine_value == NULL) return NULL;
    uint32_t n = pg_nkids(v->node);
    if (n > 2) return NULL;
    pg_node *first = obj_nodes(v->owner), *end = first + v->owner->nnodes;
    pg_node *na = value_node(v->a), *nb = value_node(v->b), *kids[2] = {NULL, NULL};
    for (uint32_t i = 0; i < n; i++) {
        pg_node *kid = pg_kid(v->node, i);
        if (kid == NULL || (kid != na && kid != nb && (kid < first || kid >= end)))
            return NULL;
        kids[i] = kid;
    }
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    if (t == NULL) return NULL;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *item = kids[i] == na ? v->a : kids[i] == nb ? v->b : NULL;
        if (item != NULL) {
            Py_INCREF(item);
        } else {
            item = PyType_GenericAlloc((PyTypeObject *)engine_value, 0);
            if (item == NULL) {
                Py_DECREF(t);
                return NULL;
            }
            Py_INCREF(v->owner);
            give(item, v->owner, kids[i], NULL, NULL);      /* (a fresh Value: can't fail) */
        }
        PyTuple_SetItem(t, (Py_ssize_t)i, item);
    }
    return t;
}

/* A fresh Value's node is being made, for a creator's check first: out a
 * Value with no node yet. */
static int fresh(PyObject *out) {
    pg_valueobj *v = as_value(out);
    return v != NULL && v->owner == NULL;
}

/* x's reference i holds Value o's node object. */
static void hold(pg_nodeobj *x, uint32_t i, PyObject *o) {
    PyObject *owner = (PyObject *)((pg_valueobj *)o)->owner;
    Py_INCREF(owner);
    obj_refs(x)[i] = owner;
}

/* The nodes of the Values in tuple t, into ptrs, each node object held by
 * x's references from `first` on; 0 if an item is no Value with a node. */
static int hold_all(pg_nodeobj *x, uint32_t first, PyObject *t, pg_node **ptrs) {
    Py_ssize_t n = PyTuple_Size(t);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyTuple_GetItem(t, i);
        pg_node *p = value_node(o);
        if (p == NULL) return 0;
        hold(x, first + (uint32_t)i, o);
        if (ptrs != NULL) ptrs[i] = p;
    }
    return 1;
}

static int all_values(PyObject *t, uint32_t n) {
    if (!PyTuple_Check(t) || PyTuple_Size(t) != (Py_ssize_t)n) return 0;
    for (uint32_t i = 0; i < n; i++)
        if (value_node(PyTuple_GetItem(t, (Py_ssize_t)i)) == NULL) return 0;
    return 1;
}

/* -- the op path ------------------------------------------------------------ */

/* The number operand k of an op, a float or an int, as float(k) makes it:
 * 1; 0 for an int too large for a double; -1 for anything else. */
static int number_of(PyObject *k, double *d) {
    if (PyFloat_CheckExact(k)) {
        *d = PyFloat_AsDouble(k);
        return 1;
    }
    if (!PyLong_CheckExact(k)) return -1;        /* (Python converts the others) */
    *d = PyLong_AsDouble(k);
    if (*d == -1.0 && PyErr_Occurred()) {        /* an int too large: OverflowError */
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* out = a op b (binary, Values), or op a (unary: its Value holds a twice,
 * as _prev reads it; b is a). */
static int32_t make_op(PyObject *out, int op, int arity, PyObject *a, PyObject *b) {
    pg_node *na = value_node(a), *nb = value_node(b);
    if (na == NULL || nb == NULL || !fresh(out)) return PG_E_ARG;
    pg_nodeobj *x = new_nodeobj(1, (uint32_t)arity, 0);
    if (x == NULL) return PG_E_NOMEM;
    hold(x, 0, a);
    if (arity == 2) hold(x, 1, b);
    int32_t rc = arity == 2 ? pg_binary(obj_nodes(x), op, na, nb) : pg_unary(obj_nodes(x), op, na);
    if (rc) {
        Py_DECREF(x);
        return rc;
    }
    return give(out, x, obj_nodes(x), a, b);
}

/* out = a op k (k_first 0) or k op a (1), k a number: the node object
 * holds the number's leaf too, micrograd's Value(k). */
static int32_t make_op_number(PyObject *out, int op, int k_first, PyObject *a, PyObject *kobj) {
    pg_node *na = value_node(a);
    double k;
    if (na == NULL || !fresh(out)) return PG_E_ARG;
    int got = number_of(kobj, &k);
    if (got <= 0) return got == 0 ? PG_E_NUMBER : PG_E_NOT_A_NUMBER;
    pg_nodeobj *x = new_nodeobj(2, 1, 0);
    if (x == NULL) return PG_E_NOMEM;
    hold(x, 0, a);
    int32_t rc = pg_binary_k(obj_nodes(x), op, na, k, k_first);
    if (rc) {
        Py_DECREF(x);
        return rc;
    }
    return give(out, x, obj_nodes(x), a, NULL);
}

/* out = a ** k for a number k (its Value holds a twice: one child, as for
 * a unary op). */
static int32_t make_powk(PyObject *out, int k_is_int, PyObject *a, PyObject *kobj) {
    pg_node *na = value_node(a);
    double k;
    if (na == NULL || !fresh(out)) return PG_E_ARG;
    int got = number_of(kobj, &k);
    if (got <= 0) return got == 0 ? PG_E_NUMBER : PG_E_NOT_A_NUMBER;
    pg_nodeobj *x = new_nodeobj(1, 1, 0);
    if (x == NULL) return PG_E_NOMEM;
    hold(x, 0, a);
    pg_powk(obj_nodes(x), na, k, k_is_int);
    return give(out, x, obj_nodes(x), a, a);
}

/*
 * The op functions: builtins that Value's operator methods call as
 * make(cls, a, b) (or make(cls, a) for a unary op) and that return the new
 * Value of class cls, made here: one call per op, with no id(), tuple or
 * object.__new__ in Python.  Each is one PyCFunction whose self is an int,
 * op * OP_FORMS + form.  They return None for a number operand that does
 * not convert to a double (an int too large: Python's slower path says
 * why), and raise for an operand without a node or no memory.
 */
#define PG_FORM_VALUES 0     /* make(cls, a, b): a op b, Values */
#define PG_FORM_K 1          /* make(cls, a, k): a op k, k a number */
#define PG_FORM_RK 2         /* make(cls, a, k): k op a */
#define PG_FORM_UNARY 3      /* make(cls, a): op a */
#define PG_FORM_POWK_FLOAT 4 /* make(cls, a, k): a ** k, k a float */
#define PG_FORM_POWK_INT 5   /* make(cls, a, k): a ** k, k an int */
#define OP_FORMS 6

static PyObject *op_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long code = PyLong_AsLong(self);
    int op = (int)(code / OP_FORMS), form = (int)(code % OP_FORMS);
    if (nargs != (form == PG_FORM_UNARY ? 2 : 3)) {
        PyErr_SetString(PyExc_TypeError, "pygrad: an op function takes (cls, a) or (cls, a, b)");
        return NULL;
    }
    PyObject *cls = args[0];
    /* A class of Python's (Value or a subclass), never the C base itself:
     * a Python class's dealloc runs in CPython's trashcan, which bounds
     * the stack for a chain of results (rule 4). */
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, value_type)
            || (PyTypeObject *)cls == value_type) {
        PyErr_SetString(PyExc_TypeError, "pygrad: an op's result class must be a Value class "
                                         "(pygrad.Value or a subclass), not the C base");
        return NULL;
    }
    PyObject *out = PyType_GenericAlloc((PyTypeObject *)cls, 0);
    if (out == NULL) return NULL;
    int32_t rc;
    switch (form) {
    case PG_FORM_VALUES: rc = make_op(out, op, 2, args[1], args[2]); break;
    case PG_FORM_K: rc = make_op_number(out, op, 0, args[1], args[2]); break;
    case PG_FORM_RK: rc = make_op_number(out, op, 1, args[1], args[2]); break;
    case PG_FORM_UNARY: rc = make_op(out, op, 1, args[1], args[1]); break;
    default: rc = make_powk(out, form == PG_FORM_POWK_INT, args[1], args[2]); break;
    }
    if (rc == 0) return out;
    Py_DECREF(out);
    if (rc == PG_E_NUMBER) {
        Py_INCREF(Py_None);
        return Py_None;
    }
    if (rc == PG_E_NOMEM) return PyErr_NoMemory();
    if (rc == PG_E_NOT_A_NUMBER) {
        PyErr_SetString(PyExc_TypeError, "pygrad: an op function's number operand must be a "
                        "float or an int (the operators convert other numbers first)");
        return NULL;
    }
    PyErr_SetString(PyExc_TypeError,
                    "pygrad: an operand has no node (a Value whose __init__ never ran): make "
                    "Values with Value(data), or from other Values' operators");
    return NULL;
}

/* Python 3.9's stable ABI has no METH_FASTCALL (3.10's has): there the
 * arguments come as a tuple. */
static PyObject *op_call_tuple(PyObject *self, PyObject *args) {
    PyObject *items[3] = {NULL, NULL, NULL};
    Py_ssize_t n = PyTuple_Size(args);
    if (n < 0 || n > 3) n = 0;
    for (Py_ssize_t i = 0; i < n; i++) items[i] = PyTuple_GetItem(args, i);
    return op_call(self, items, n);
}

#ifndef METH_FASTCALL
#define METH_FASTCALL 0x0080     /* its stable value (stable ABI from 3.10) */
#endif
static PyMethodDef op_call_def = {"pygrad_op", (PyCFunction)(void (*)(void))op_call,
                                  METH_FASTCALL, "Make an op's Value (pygrad/engine.py)."};
static PyMethodDef op_call_tuple_def = {"pygrad_op", (PyCFunction)op_call_tuple, METH_VARARGS,
                                        "Make an op's Value (pygrad/engine.py)."};

/*
 * call_tracing(fn, arg): fn(arg) while this thread traces
 * (pygrad/token_programs.py): its numbers can't be read or set (`tracing`,
 * above), and the cyclic collector is paused (a trace makes a whole graph
 * of Values that all live until it is compiled, which the collector would
 * walk again and again to find no garbage).  Being one C call, nothing can
 * stop it between setting both and putting them back: a Ctrl-C or an
 * exception in fn propagates after they are as they were.
 */
static PyObject *gc_call(PyObject *gc, const char *name) {
    return PyObject_CallMethod(gc, name, NULL);
}

/* fn(arg) with the cyclic collector paused (and, if trace, numbers
 * unreadable: `tracing`), both put back before it returns. */
/* How many calls pause the collector now (under the GIL): a child forked
 * while another thread's call does has no thread to turn it back on. */
static int pauses;

/* In a forked child (os.register_at_fork): 1 if the collector was paused
 * by calls the child may have no thread to end (Python turns it back on);
 * only the forking thread can be tracing now. */
static int pg_after_fork_in_child(void) {
    pg_replay_after_fork();
    int paused = pauses > 0;
    pauses = 0;
    tracers = tracing ? 1 : 0;
    return paused;
}

static PyObject *call_paused(PyObject *args, const char *name, int trace) {
    PyObject *fn, *arg;
    if (!PyArg_UnpackTuple(args, name, 2, 2, &fn, &arg)) return NULL;
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *was = gc != NULL ? gc_call(gc, "isenabled") : NULL;
    int on = was != NULL ? PyObject_IsTrue(was) : -1;
    Py_XDECREF(was);
    PyObject *off = on == 1 ? gc_call(gc, "disable") : NULL;
    if (on < 0 || (on == 1 && off == NULL)) {
        Py_XDECREF(gc);
        return NULL;
    }
    Py_XDECREF(off);
    if (on == 1) pauses++;
    int outer = tracing;
    if (trace) {
        tracing = 1;
        tracers++;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(fn, arg, NULL);
    tracing = outer;
    if (trace) tracers--;
    if (on == 1 && pauses > 0) {                   /* (0: a fork since: the child's own) */
        pauses--;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);           /* fn's error, if any, kept */
        PyObject *back = gc_call(gc, "enable");
        if (back == NULL && r != NULL) {
            Py_CLEAR(r);                           /* (enable() itself failed) */
            Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
        } else {
            if (back == NULL) PyErr_Clear();
            Py_XDECREF(back);
            PyErr_Restore(type, value, tb);
        }
    }
    Py_DECREF(gc);
    return r;
}

static PyObject *call_tracing(PyObject *self, PyObject *args) {
    (void)self;
    return call_paused(args, "call_tracing", 1);
}

/* pygrad.grad(create_graph=True)'s sweep makes tens of thousands of Values
 * and no cycle: the collector, paused for it, would walk every Value the
 * program holds again and again to find no garbage. */
static PyObject *call_collector_paused(PyObject *self, PyObject *args) {
    (void)self;
    return call_paused(args, "call_collector_paused", 0);
}

static PyMethodDef call_collector_paused_def = {
    "call_collector_paused", call_collector_paused, METH_VARARGS,
    "fn(arg) with the cyclic collector paused."};

static PyMethodDef call_tracing_def = {"call_tracing", call_tracing, METH_VARARGS,
                                       "fn(arg) traced: numbers unreadable, collector paused."};

/* Append to list `out` a builtin function of def, with self (NULL or an
 * object, which it holds): 0, or -1 (nothing appended, nothing raised). */
static int append_function(uintptr_t out, PyMethodDef *def, PyObject *self) {
    PyObject *list = (PyObject *)out;
    PyObject *f = PyList_Check(list) ? PyCFunction_NewEx(def, self, NULL) : NULL;
    if (f == NULL || PyList_Append(list, f)) {
        PyErr_Clear();
        Py_XDECREF(f);
        return -1;
    }
    Py_DECREF(f);
    return 0;
}

static int pg_call_tracing_function(uintptr_t out) {
    return append_function(out, &call_tracing_def, NULL);
}

static int pg_call_collector_paused_function(uintptr_t out) {
    return append_function(out, &call_collector_paused_def, NULL);
}

/* Append to list out the op function of (op, form) (fastcall: the
 * interpreter has METH_FASTCALL in its stable ABI, 3.10+).  0, PG_E_ARG for
 * no such op or form, or -1 (out of memory). */
static int pg_op_function(uintptr_t out, int op, int form, int fastcall) {
    if (op < 0 || op >= PG_OP_COUNT || form < 0 || form >= OP_FORMS) return PG_E_ARG;
    PyObject *code = PyLong_FromLong((long)op * OP_FORMS + form);
    if (code == NULL) {
        PyErr_Clear();
        return -1;
    }
    int rc = append_function(out, fastcall ? &op_call_def : &op_call_tuple_def, code);
    Py_DECREF(code);
    return rc;
}

/* Value(x): a leaf. */
static int32_t pg_leaf_v(uintptr_t value, double data) {
    if (!fresh((PyObject *)value)) return PG_E_ARG;
    pg_nodeobj *x = new_nodeobj(1, 0, 0);
    if (x == NULL) return PG_E_NOMEM;
    pg_leaf(obj_nodes(x), data);
    return give((PyObject *)value, x, obj_nodes(x), NULL, NULL);
}

/* Value(data, children, op): a custom op over the Values of tuple kids,
 * whose backward is its Value's closure (micrograd's). */
static int32_t pg_custom_v(uintptr_t value, double data, uintptr_t kids) {
    PyObject *t = (PyObject *)kids;
    if (!PyTuple_Check(t) || !fresh((PyObject *)value)) return PG_E_ARG;
    uint32_t n = (uint32_t)PyTuple_Size(t);
    if (!all_values(t, n)) return PG_E_ARG;
    pg_nodeobj *x = new_nodeobj(1, n, n);
    if (x == NULL) return PG_E_NOMEM;
    hold_all(x, 0, t, obj_words(x));
    /* the node names its Value, without a reference, for backward() to
     * hand its closure to Python; the Value's dealloc erases the name */
    pg_custom(obj_nodes(x), data, obj_words(x), n, (void *)value);
    return give((PyObject *)value, x, obj_nodes(x), t, NULL);
}

/* A fused n-ary node (LINEAR, SUM, LOGSUMEXP) over the Values of tuple
 * values. */
static int32_t pg_nary_v(uintptr_t value, int op, int variant, uintptr_t values) {
    PyObject *t = (PyObject *)values;
    if (!PyTuple_Check(t) || !fresh((PyObject *)value)) return PG_E_ARG;
    uint32_t n = (uint32_t)PyTuple_Size(t);
    if (!all_values(t, n)) return PG_E_ARG;
    pg_nodeobj *x = new_nodeobj(1, n, n);
    if (x == NULL) return PG_E_NOMEM;
    hold_all(x, 0, t, obj_words(x));
    int32_t rc = pg_nary(obj_nodes(x), op, variant, obj_words(x), n);
    if (rc) {
        Py_DECREF(x);
        return rc;
    }
    return give((PyObject *)value, x, obj_nodes(x), t, NULL);
}

/* A pygrad.Function's node: value data, partials[i] by child i (npartials
 * of them: one per Value of tuple values, or PG_E_ARG). */
static int32_t pg_function_v(uintptr_t value, double data, uintptr_t values,
                             const double *partials, size_t npartials) {
    PyObject *t = (PyObject *)values;
    if (!PyTuple_Check(t) || !fresh((PyObject *)value)) return PG_E_ARG;
    uint32_t n = (uint32_t)PyTuple_Size(t);
    if (!all_values(t, n) || npartials != n || (n > 0 && partials == NULL)) return PG_E_ARG;
    pg_nodeobj *x = new_nodeobj(1, n, pg_function_words(n) + n);
    if (x == NULL) return PG_E_NOMEM;
    /* the children's pointers go after the edges, where pg_function copies
     * them from */
    pg_node **kids = obj_words(x) + pg_function_words(n);
    hold_all(x, 0, t, kids);
    pg_function(obj_nodes(x), data, kids, partials, n, obj_words(x));
    return give((PyObject *)value, x, obj_nodes(x), t, NULL);
}

/* -- blocks of nodes with one Value each ------------------------------------ */

/* count new Values of class cls, appended to list out over nodes[0..count)
 * of x (which each holds), with operands a and b; PG_E_NOMEM with the
 * Values made so far in the list. */
static int32_t give_all(PyObject *out, PyObject *cls, pg_nodeobj *x, pg_node *nodes,
                        uint32_t count, PyObject *a, PyObject *b) {
    int32_t rc = 0;
    for (uint32_t j = 0; j < count && rc == 0; j++) {
        PyObject *v = PyType_GenericAlloc((PyTypeObject *)cls, 0);
        if (v == NULL || PyList_Append(out, v)) {
            PyErr_Clear();
            Py_XDECREF(v);
            rc = PG_E_NOMEM;
            break;
        }
        Py_INCREF(x);
        rc = give(v, x, nodes + j, a, b);
        Py_DECREF(v);
    }
    Py_DECREF(x);
    return rc;
}

/* A Python class of Values: the C base itself is refused, since its
 * dealloc has no trashcan (rule 4: a chain of them would free recursively). */
static int value_class(PyObject *cls) {
    return PyType_Check(cls) && PyType_IsSubtype((PyTypeObject *)cls, value_type) &&
           (PyTypeObject *)cls != value_type;
}

/* n leaves holding data[0..n), appended to list out as Values of cls. */
static int32_t pg_leaves_v(uintptr_t out, uintptr_t cls, const double *data, uint32_t n) {
    if (!PyList_Check((PyObject *)out) || !value_class((PyObject *)cls)) return PG_E_ARG;
    if (n == 0) return 0;
    pg_nodeobj *x = new_nodeobj(n, 0, 0);
    if (x == NULL) return PG_E_NOMEM;
    int32_t rc = pg_leaves(obj_nodes(x), data, n);
    if (rc) {
        Py_DECREF(x);
        return rc;
    }
    return give_all((PyObject *)out, (PyObject *)cls, x, obj_nodes(x), n, NULL, NULL);
}

static pg_listobj *as_list(PyObject *o) {
    settle_replays();
    return o != NULL && Py_IS_TYPE(o, list_type) ? (pg_listobj *)o : NULL;
}

/* A node list for a call that reads or writes only its own nodes' numbers
 * (bulk reads and writes, optimizer steps): settled only if one of them is
 * a program's interior node (PG_F_REPLAYED).  A model's parameters are
 * leaves, whose numbers a program writes at once: an optimizer's step
 * between two runs then costs no write-back of every program's nodes. */
static pg_listobj *as_own_list(PyObject *o) {
    if (o == NULL || !Py_IS_TYPE(o, list_type)) return NULL;
    pg_listobj *l = (pg_listobj *)o;
    if (pg_replay_any_pending) {
        pg_node *const *nodes = list_nodes(l);
        for (uint32_t i = 0; i < l->n; i++) {
            if (nodes[i]->flags & PG_F_REPLAYED) {
                pg_replay_settle();
                break;
            }
        }
    }
    return l;
}

/* A fused layer (pg_linear_layer): nout LINEAR nodes over the parameters
 * of node list params and the Values of tuple xs; their Values (class
 * Value) appended to out, holding `holds` as their operands. */
static int32_t pg_layer_v(uintptr_t out, uintptr_t cls, int act, uintptr_t params, uintptr_t xs,
                          uint32_t nin, uint32_t nout, uintptr_t holds) {
    pg_listobj *p = as_list((PyObject *)params);
    PyObject *t = (PyObject *)xs;
    if (!PyList_Check((PyObject *)out) || !value_class((PyObject *)cls) || p == NULL ||
            nout == 0 || (uint64_t)p->n != (uint64_t)nout * ((uint64_t)nin + 1) ||
            !all_values(t, nin))
        return PG_E_ARG;
    pg_node **x_nodes = PyMem_Malloc((nin ? nin : 1) * sizeof *x_nodes);
    if (x_nodes == NULL) return PG_E_NOMEM;
    pg_nodeobj *x = new_nodeobj(nout, 1 + nin, pg_layer_words(nin, nout));
    if (x == NULL) {
        PyMem_Free(x_nodes);
        return PG_E_NOMEM;
    }
    Py_INCREF(p);
    obj_refs(x)[0] = (PyObject *)p;
    hold_all(x, 1, t, x_nodes);
    int32_t rc = pg_linear_layer(obj_nodes(x), obj_words(x), act, list_nodes(p), x_nodes, nin,
                                 nout);
    PyMem_Free(x_nodes);
    if (rc) {
        Py_DECREF(x);
        return rc;
    }
    return give_all((PyObject *)out, (PyObject *)cls, x, obj_nodes(x), nout, (PyObject *)holds,
                    NULL);
}

/* A fused MLP (pg_mlp): params a tuple of one node list per layer; the
 * last layer's Values appended to out, holding `holds` and `table` as
 * their operands (the hidden layers' nodes have no Value until _prev
 * makes one). */
static int32_t pg_mlp_v(uintptr_t out, uintptr_t cls, uint32_t nlayers, const int *acts,
                        uintptr_t params, const uint32_t *sizes, uintptr_t xs, uintptr_t holds,
                        uintptr_t table) {
    PyObject *pt = (PyObject *)params, *t = (PyObject *)xs;
    if (!PyList_Check((PyObject *)out) || !value_class((PyObject *)cls) || nlayers == 0 ||
            !PyTuple_Check(pt) || PyTuple_Size(pt) != (Py_ssize_t)nlayers ||
            !all_values(t, sizes[0]))
        return PG_E_ARG;
    size_t words = 0;
    uint64_t total = 0;
    for (uint32_t l = 0; l < nlayers; l++) {
        pg_listobj *p = as_list(PyTuple_GetItem(pt, (Py_ssize_t)l));
        if (p == NULL || sizes[l + 1] == 0 ||
                (uint64_t)p->n != (uint64_t)sizes[l + 1] * ((uint64_t)sizes[l] + 1))
            return PG_E_ARG;
        words += pg_layer_words(sizes[l], sizes[l + 1]);
        total += sizes[l + 1];
    }
    if (total > UINT32_MAX / 2) return PG_E_ARG;
    uint32_t nin = sizes[0];
    pg_node **x_nodes = PyMem_Malloc((nin ? nin : 1) * sizeof *x_nodes);
    pg_node *const **arrays = PyMem_Malloc(nlayers * sizeof *arrays);
    pg_nodeobj *x = x_nodes && arrays ? new_nodeobj((uint32_t)total, nlayers + nin, words) : NULL;
    if (x == NULL) {
        PyMem_Free(x_nodes);
        PyMem_Free((void *)arrays);
        return PG_E_NOMEM;
    }
    for (uint32_t l = 0; l < nlayers; l++) {
        pg_listobj *p = as_list(PyTuple_GetItem(pt, (Py_ssize_t)l));
        Py_INCREF(p);
        obj_refs(x)[l] = (PyObject *)p;
        arrays[l] = list_nodes(p);
    }
    hold_all(x, nlayers, t, x_nodes);
    int32_t rc = pg_mlp(obj_nodes(x), obj_words(x), nlayers, acts, arrays, sizes, x_nodes);
    PyMem_Free(x_nodes);
    PyMem_Free((void *)arrays);
    if (rc) {
        Py_DECREF(x);
        return rc;
    }
    uint32_t last = sizes[nlayers];
    return give_all((PyObject *)out, (PyObject *)cls, x, obj_nodes(x) + (total - last), last,
                    (PyObject *)holds, (PyObject *)table);
}

/* The node object, among x and what it holds (and what the node lists it
 * holds hold), whose nodes include p; NULL if none. */
static pg_nodeobj *owner_of(pg_nodeobj *x, const pg_node *p) {
    pg_node *first = obj_nodes(x);
    if (p >= first && p < first + x->nnodes) return x;
    for (uint32_t i = 0; i < x->nrefs; i++) {
        PyObject *r = obj_refs(x)[i];
        if (r == NULL) continue;
        if (Py_IS_TYPE(r, node_type)) {
            pg_nodeobj *y = (pg_nodeobj *)r;
            if (p >= obj_nodes(y) && p < obj_nodes(y) + y->nnodes) return y;
        } else if (Py_IS_TYPE(r, list_type)) {
            pg_listobj *l = (pg_listobj *)r;
            for (uint32_t j = 0; j < l->n; j++) {
                pg_nodeobj *y = (pg_nodeobj *)list_refs(l)[j];
                if (p >= obj_nodes(y) && p < obj_nodes(y) + y->nnodes) return y;
            }
        }
    }
    return NULL;
}

/* Value out over child i of parent's node (a node with no Value of its
 * own: a number's leaf, a fused model's hidden node), holding a and b. */
static int32_t pg_view_v(uintptr_t out, uintptr_t parent, uint32_t i, uintptr_t a,
                         uintptr_t b) {
    pg_valueobj *v = as_value((PyObject *)parent);
    if (v == NULL || v->node == NULL || !fresh((PyObject *)out)) return PG_E_ARG;
    pg_node *kid = pg_kid(v->node, i);
    pg_nodeobj *x = kid != NULL ? owner_of(v->owner, kid) : NULL;
    if (x == NULL) return PG_E_ARG;
    Py_INCREF(x);
    return give((PyObject *)out, x, kid, (PyObject *)a == Py_None ? NULL : (PyObject *)a,
                (PyObject *)b == Py_None ? NULL : (PyObject *)b);
}

/* The nodes of the Values of tuple values, as a node list appended to out. */
static int32_t pg_pack_v(uintptr_t values, uintptr_t out) {
    PyObject *t = (PyObject *)values;
    if (!PyTuple_Check(t) || !PyList_Check((PyObject *)out)) return PG_E_ARG;
    uint32_t n = (uint32_t)PyTuple_Size(t);
    if ((Py_ssize_t)n != PyTuple_Size(t) || !all_values(t, n)) return PG_E_ARG;
    pg_listobj *l = PyObject_NewVar(pg_listobj, list_type, 2 * (Py_ssize_t)n);
    if (l == NULL) {
        PyErr_Clear();
        return PG_E_NOMEM;
    }
    l->n = n;
    for (uint32_t i = 0; i < n; i++) {
        pg_valueobj *v = (pg_valueobj *)PyTuple_GetItem(t, (Py_ssize_t)i);
        Py_INCREF(v->owner);
        list_refs(l)[i] = (PyObject *)v->owner;
        list_nodes(l)[i] = v->node;
    }
    int rc = PyList_Append((PyObject *)out, (PyObject *)l);
    Py_DECREF(l);
    if (rc) {
        PyErr_Clear();
        return PG_E_NOMEM;
    }
    return 0;
}

/* -- reading a Value's node (drawing, _prev, _op) --------------------------- */

/* The node's address as a number, for identity (0: no node). */
static uintptr_t pg_node_addr(uintptr_t value) {
    return (uintptr_t)value_node((PyObject *)value);
}

/* op | flags << 8, or -1 for no node. */
static int64_t pg_describe_v(uintptr_t value) {
    pg_node *n = value_node((PyObject *)value);
    return n != NULL ? pg_describe(n) : -1;
}

static double pg_exponent_v(uintptr_t value) {
    pg_node *n = value_node((PyObject *)value);
    return n != NULL ? pg_exponent(n) : 0.0;
}

static int pg_variant_v(uintptr_t value) {
    pg_node *n = value_node((PyObject *)value);
    return n != NULL ? pg_variant(n) : 0;
}

static uint32_t pg_nkids_v(uintptr_t value) {
    pg_node *n = value_node((PyObject *)value);
    return n != NULL ? pg_nkids(n) : 0;
}

/* Child i's address (0 past the last). */
static uintptr_t pg_kid_addr(uintptr_t value, uint32_t i) {
    pg_node *n = value_node((PyObject *)value);
    return n != NULL ? (uintptr_t)pg_kid(n, i) : 0;
}

/* Value v's local gradients (pg_local_grads), or PG_E_ARG for no node. */
static int32_t pg_local_grads_v(uintptr_t value, double *out, uint32_t cap) {
    pg_node *n = value_node((PyObject *)value);
    return n != NULL ? pg_local_grads(n, out, cap) : PG_E_ARG;
}

/* -- pygrad.grad(create_graph=True)'s bookkeeping (pygrad/higher_order.py
 * does the same in Python where these return -1) ---------------------------- */

/* Value o's children as its operands hold them, in order, as a new tuple,
 * or NULL (no error set) unless its operands are exactly its node's
 * children: a, or a and b, or a tuple of Values.  A detached_max has none
 * here: grad's walk does not go below it. */
static PyObject *operand_kids(PyObject *o) {
    pg_valueobj *v = as_value(o);
    if (v == NULL || v->node == NULL) return NULL;
    if (v->node->op == PG_OP_MAX) return PyTuple_New(0);   /* (no gradient goes below) */
    uint32_t n = pg_nkids(v->node);
    int tuple = n > 0 && v->a != NULL && PyTuple_Check(v->a);
    if (tuple ? (uint32_t)PyTuple_Size(v->a) != n : n > 2) return NULL;
    PyObject *kids = PyTuple_New((Py_ssize_t)n);
    if (kids == NULL) {
        PyErr_Clear();
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        PyObject *item = tuple ? PyTuple_GetItem(v->a, (Py_ssize_t)i) : i == 0 ? v->a : v->b;
        if (item == NULL || value_node(item) != pg_kid(v->node, i)) {
            Py_DECREF(kids);
            return NULL;
        }
        Py_INCREF(item);
        PyTuple_SetItem(kids, (Py_ssize_t)i, item);
    }
    return kids;
}

/* A node's key: its address, as a Python int (new reference). */
static PyObject *node_key(PyObject *o) {
    return PyLong_FromVoidPtr(value_node(o));
}

/* The walk of pygrad.grad: every Value below the Values of list roots,
 * children first (csrc/backward.c's graded order: a depth-first walk from
 * each root in turn, children in order, none below a detached_max),
 * appended to list order; dict kids_of
 * gets each node's key -> its children (a tuple), key_of each Value's
 * id -> its node's key.  A Value whose operands are not its node's
 * children gets them from slow_kids(value) (a tuple: pygrad's Python
 * reading, which may make Values for nodes without one).  0, or -1 on an
 * error, cleared: Python clears what was appended and walks again, meeting
 * the error itself. */
static int32_t pg_walk_l(uintptr_t roots, uintptr_t order, uintptr_t kids_of, uintptr_t key_of,
                         uintptr_t slow_kids) {
    PyObject *r = (PyObject *)roots, *out = (PyObject *)order, *slow = (PyObject *)slow_kids;
    PyObject *kd = (PyObject *)kids_of, *kk = (PyObject *)key_of;
    if (!PyList_Check(r) || !PyList_Check(out) || !PyDict_Check(kd) || !PyDict_Check(kk)) return -1;
    /* the stack: a Value, its children and the next child's index */
    typedef struct { PyObject *v, *kids; Py_ssize_t next; } entry;
    size_t cap = 64, depth = 0;
    entry *stack = PyMem_Malloc(cap * sizeof *stack);
    if (stack == NULL) return -1;
    int32_t rc = 0;
#define VISIT(o, ok)                                                                  \
    do {                                                                              \
        PyObject *key_ = node_key(o), *id_ = PyLong_FromVoidPtr(o);                   \
        ok = 0;                                                                       \
        if (key_ != NULL && id_ != NULL && PyDict_SetItem(kk, id_, key_) == 0) {      \
            int seen_ = PyDict_Contains(kd, key_);                                    \
            if (seen_ == 1) {                                                         \
                ok = 1;                                                               \
            } else if (seen_ == 0) {                                                  \
                PyObject *kids_ = operand_kids(o);                                    \
                if (kids_ == NULL) kids_ = PyObject_CallFunctionObjArgs(slow, o, NULL); \
                if (kids_ != NULL && !PyTuple_Check(kids_)) Py_CLEAR(kids_);          \
                if (kids_ != NULL && PyDict_SetItem(kd, key_, kids_) == 0) {          \
                    if (depth == cap) {                                               \
                        entry *more_ = PyMem_Realloc(stack, 2 * cap * sizeof *stack); \
                        if (more_ != NULL) { stack = more_; cap *= 2; }               \
                    }                                                                 \
                    if (depth < cap) {                                                \
                        stack[depth++] = (entry){o, kids_, 0};                        \
                        kids_ = NULL;                                                 \
                        ok = 1;                                                       \
                    }                                                                 \
                }                                                                     \
                Py_XDECREF(kids_);                                                    \
            }                                                                         \
        }                                                                             \
        Py_XDECREF(key_);                                                             \
        Py_XDECREF(id_);                                                              \
    } while (0)
    for (Py_ssize_t i = 0; i < PyList_Size(r) && rc == 0; i++) {
        int ok;
        VISIT(PyList_GetItem(r, i), ok);
        if (!ok) rc = -1;
        while (depth > 0 && rc == 0) {
            entry *top = &stack[depth - 1];
            if (top->next < PyTuple_Size(top->kids)) {
                PyObject *child = PyTuple_GetItem(top->kids, top->next++);
                VISIT(child, ok);
                if (!ok) rc = -1;
            } else {
                if (PyList_Append(out, top->v)) rc = -1;
                Py_DECREF(top->kids);
                depth--;
            }
        }
    }
#undef VISIT
    while (depth > 0) Py_DECREF(stack[--depth].kids);
    PyMem_Free(stack);
    if (rc) PyErr_Clear();         /* Python walks again, and meets any error itself */
    return rc;
}

/* A fused neuron's terms (pygrad/higher_order.py, _linear_grads): for
 * each product w * x of the children (tuple kids, from index first), last
 * first, dict terms gets (x, g) under w's key and (w, g) under x's; the
 * bias (first == 1), g, just before the first product's.  0, or -1 with
 * nothing appended for the pair it failed at (Python then fails too). */
static int32_t pg_add_pairs_l(uintptr_t kids, uint32_t first, uintptr_t g, uintptr_t terms) {
    PyObject *k = (PyObject *)kids, *gv = (PyObject *)g, *t = (PyObject *)terms;
    if (!PyTuple_Check(k) || !PyDict_Check(t)) return -1;
    Py_ssize_t n = PyTuple_Size(k);
#define ADD_TERM(target, c, mult)                                              \
    do {                                                                       \
        PyObject *key_ = node_key(target);                                     \
        PyObject *item_ = key_ != NULL ? PyTuple_Pack(2, c, mult) : NULL;      \
        PyObject *list_ = key_ != NULL ? PyDict_GetItem(t, key_) : NULL;       \
        int bad_ = item_ == NULL;                                              \
        if (!bad_ && list_ != NULL) {                                          \
            bad_ = PyList_Append(list_, item_);                                \
        } else if (!bad_) {                                                    \
            PyObject *new_ = PyList_New(1);                                    \
            bad_ = new_ == NULL;                                               \
            if (!bad_) {                                                       \
                Py_INCREF(item_);                                              \
                PyList_SetItem(new_, 0, item_);                                \
                bad_ = PyDict_SetItem(t, key_, new_);                          \
                Py_DECREF(new_);                                               \
            }                                                                  \
        }                                                                      \
        Py_XDECREF(item_);                                                     \
        Py_XDECREF(key_);                                                      \
        if (bad_) {                                                            \
            PyErr_Clear();                                                     \
            return -1;                                                         \
        }                                                                      \
    } while (0)
    for (Py_ssize_t j = n; j > (Py_ssize_t)first; j -= 2) {
        PyObject *w = PyTuple_GetItem(k, j - 2), *x = PyTuple_GetItem(k, j - 1);
        if (first && j - 2 == (Py_ssize_t)first) ADD_TERM(PyTuple_GetItem(k, 0), gv, Py_None);
        ADD_TERM(w, x, gv);
        ADD_TERM(x, w, gv);
    }
    if (first && n == 1) ADD_TERM(PyTuple_GetItem(k, 0), gv, Py_None);
#undef ADD_TERM
    return 0;
}

/* A gradient's terms as one fused node on the fresh Value out: list terms
 * of pairs (c, g), c and g Values or g None (a plain term: times Value
 * one), made b + c1 * g1 + c2 * g2 + ... (b the first term if plain): the
 * additions in the terms' order.  0, or PG_E_ARG (nothing made) if a c is
 * no Value (Python then takes it). */
static int32_t pg_sum_of_products_l(uintptr_t out, uintptr_t terms, uintptr_t one) {
    PyObject *t = (PyObject *)terms, *o = (PyObject *)one;
    if (!PyList_Check(t) || PyList_Size(t) < 2 || value_node(o) == NULL) return PG_E_ARG;
    Py_ssize_t n = PyList_Size(t);
    PyObject *first = PyList_GetItem(t, 0);
    if (!PyTuple_Check(first) || PyTuple_Size(first) != 2) return PG_E_ARG;
    int bias = PyTuple_GetItem(first, 1) == Py_None;
    PyObject *values = PyTuple_New(2 * n - (bias ? 1 : 0));
    if (values == NULL) {
        PyErr_Clear();
        return PG_E_NOMEM;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GetItem(t, i);
        if (!PyTuple_Check(pair) || PyTuple_Size(pair) != 2) {
            Py_DECREF(values);
            return PG_E_ARG;
        }
        PyObject *c = PyTuple_GetItem(pair, 0), *g = PyTuple_GetItem(pair, 1);
        if (value_node(c) == NULL || (g != Py_None && value_node(g) == NULL)) {
            Py_DECREF(values);
            return PG_E_ARG;
        }
        Py_INCREF(c);
        PyTuple_SetItem(values, at++, c);
        if (i == 0 && bias) continue;
        PyObject *m = g == Py_None ? o : g;
        Py_INCREF(m);
        PyTuple_SetItem(values, at++, m);
    }
    int32_t rc = pg_nary_v(out, PG_OP_LINEAR, bias ? PG_LINEAR_BIAS : 0, (uintptr_t)values);
    Py_DECREF(values);
    return rc;
}

/* How many of program p's leaves are traced inputs (PG_F_TRACED) that are
 * not among the nodes of node list `inputs`: another trace's inputs, which
 * a Value kept from that trace brought in (pg_program_foreign_leaves). */
static int64_t pg_program_foreign_inputs_l(pg_program *p, uintptr_t inputs) {
    pg_listobj *l = as_list((PyObject *)inputs);
    if (l == NULL) return PG_E_ARG;
    return pg_program_foreign_leaves(p, PG_F_TRACED, list_nodes(l), l->n);
}

/* Mark leaf Value v a traced program's input (PG_F_TRACED). */
static int32_t pg_set_traced_v(uintptr_t value) {
    pg_node *n = value_node((PyObject *)value);
    if (n == NULL || n->op != PG_OP_LEAF) return PG_E_ARG;
    pg_set_traced(n);
    return 0;
}

static int32_t pg_set_py_backward_v(uintptr_t value) {
    pg_node *n = value_node((PyObject *)value);
    if (n == NULL) return PG_E_ARG;
    pg_set_py_backward(n);
    return 0;
}

/* The node's own gradient rule (its Value's _backward, for a C node). */
static int32_t pg_node_backward_v(uintptr_t value) {
    pg_node *n = value_node((PyObject *)value);
    if (n == NULL) return PG_E_ARG;
    pg_node_backward(n);
    return 0;
}

static int64_t pg_live_nodes(void) { return live_nodes; }

/* The Value of the custom op whose closure a sweep waits for, appended to
 * list out: 1, or 0 if its Value is gone or it is no custom op (a C
 * node whose _backward was set later: Python looks for its Value). */
static int pg_sweep_value(pg_sweep *s, uintptr_t out) {
    pg_node *n = s != NULL ? s->py : NULL;
    PyObject *v = n != NULL && n->op == PG_OP_CUSTOM ? (PyObject *)n->c.list.py : NULL;
    if (v == NULL || !PyList_Check((PyObject *)out)) return 0;
    if (PyList_Append((PyObject *)out, v)) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The address of the node whose closure a sweep waits for, as a number
 * (for identity: pg_node_addr's), or 0. */
static uintptr_t pg_sweep_node_addr(const pg_sweep *s) {
    return s != NULL ? (uintptr_t)s->py : 0;
}

/* Test hook: pg_zero_hidden on Value v's node. */
static void pg_zero_hidden_v(uintptr_t value) {
    pg_node *n = value_node((PyObject *)value);
    if (n != NULL) pg_zero_hidden(n);
}

/* -- walks without the GIL (rule 5) ------------------------------------------ */

/* A sweep, program or batch holds what its nodes live in from the call
 * that fills it (its `hold`, which cffi does not show) until its release
 * below, which Python's ffi.gc calls, with the GIL, in place of the
 * core's clear. */
/* 0, or -1 when it already holds another object (a second root): what it
 * holds must cover every node it will read. */
static int take_hold(void **hold, PyObject *x) {
    if (*hold != NULL) return *hold == (void *)x ? 0 : -1;
    Py_INCREF(x);
    *hold = x;
    return 0;
}

static void let_go(void **hold) {
    PyObject *x = (PyObject *)*hold;
    *hold = NULL;
    Py_XDECREF(x);
}

static void pg_sweep_release(pg_sweep *s) {
    if (s == NULL) return;
    settle_replays();
    pg_sweep_clear(s);
    let_go(&s->hold);
}

static void pg_program_release(pg_program *p) {
    if (p == NULL) return;
    pg_replay_unlist(p);                  /* (its numbers written back first) */
    pg_program_clear(p);
    let_go(&p->hold);
}

static void pg_batch_release(pg_batch *b) {
    if (b == NULL) return;
    pg_batch_clear(b);
    let_go(&b->hold);
}

/* pg_backward_resume and pg_sweep_restore for Python: the closure that ran
 * before may have run a compiled program, whose numbers go back first. */
static int32_t pg_backward_resume_s(pg_sweep *s) {
    settle_replays();
    PyThreadState *save = PyEval_SaveThread();
    int32_t rc = pg_backward_resume(s);
    PyEval_RestoreThread(save);
    return rc;
}

static void pg_sweep_restore_s(pg_sweep *s) {
    settle_replays();
    PyThreadState *save = PyEval_SaveThread();
    pg_sweep_restore(s);
    PyEval_RestoreThread(save);
}

/* Backward from Value root (pg_backward), or PG_E_BUSY (nothing done)
 * while another thread's walk holds the sweep lock after about 50 ms of
 * waiting without the GIL: Python calls again, and its signal handlers
 * (a Ctrl-C) run between the calls. */
static int32_t pg_backward_v(uintptr_t root, pg_sweep *sweep) {
    pg_valueobj *v = as_value((PyObject *)root);
    if (v == NULL || v->node == NULL) return PG_E_ARG;
    PyObject *owner = (PyObject *)v->owner;
    if (sweep != NULL && take_hold(&sweep->hold, owner)) return PG_E_ARG;
    Py_INCREF(owner);
    PyThreadState *save = PyEval_SaveThread();
    int32_t rc = pg_backward_wait(v->node, sweep, 50);
    PyEval_RestoreThread(save);
    Py_DECREF(owner);
    return rc;
}

/* The node a compile refused, told as bad[0] its address (for identity:
 * pg_node_addr's number) and bad[1] its op; 0, 0 for none.  No node
 * pointer reaches Python. */
static void tell_bad(const pg_node *found, uintptr_t *bad) {
    bad[0] = (uintptr_t)found;
    bad[1] = found != NULL ? found->op : 0;
}

/* pg_compile from Value root (the caller holds it while the program lives);
 * the walk's wait is for C only (csrc/backward.c's lock). */
static int32_t pg_compile_v(uintptr_t root, pg_program *p, uintptr_t *bad) {
    pg_valueobj *v = as_value((PyObject *)root);
    if (v == NULL || v->node == NULL || bad == NULL) return PG_E_ARG;
    PyObject *owner = (PyObject *)v->owner;
    if (p != NULL && take_hold(&p->hold, owner)) return PG_E_ARG;
    Py_INCREF(owner);
    pg_replay_unlist(p);                  /* (compiled again: its numbers go back first) */
    pg_node *found = NULL;
    PyThreadState *save = PyEval_SaveThread();
    int32_t rc = pg_compile(v->node, p, &found);
    PyEval_RestoreThread(save);
    Py_DECREF(owner);
    tell_bad(found, bad);
    if (rc == 0) pg_replay_enlist(p);
    return rc;
}

/* pg_batch_step over the optimizer opt with its parameters the nodes of
 * node list params, held for the call (opt's own params and n are not
 * read): no node pointer reaches Python.  PG_E_ARG for no node list. */
static int32_t pg_batch_step_l(pg_batch *b, const double *rows, size_t n, double *out,
                               const double *w, uint32_t threads, const pg_optimizer *opt,
                               uintptr_t params) {
    pg_listobj *l = as_own_list((PyObject *)params);
    if (l == NULL || opt == NULL) return PG_E_ARG;
    pg_optimizer o = *opt;
    o.params = list_nodes(l);
    o.n = l->n;
    Py_INCREF(l);
    PyThreadState *save = PyEval_SaveThread();
    int32_t rc = pg_batch_step(b, rows, n, out, w, threads, &o);
    PyEval_RestoreThread(save);
    Py_DECREF(l);
    return rc;
}

/* pg_batch_compile over node lists outputs and inputs (the batch holds
 * them till its release). */
static int32_t pg_batch_compile_v(uintptr_t outputs, uintptr_t inputs, pg_batch *b,
                                  uintptr_t *bad) {
    pg_listobj *o = as_list((PyObject *)outputs), *i = as_list((PyObject *)inputs);
    if (o == NULL || i == NULL || b == NULL || b->hold != NULL || bad == NULL) return PG_E_ARG;
    PyObject *both = PyTuple_Pack(2, (PyObject *)o, (PyObject *)i);
    if (both == NULL) {
        PyErr_Clear();
        return PG_E_NOMEM;
    }
    b->hold = both;
    pg_node *found = NULL;
    PyThreadState *save = PyEval_SaveThread();
    int32_t rc = pg_batch_compile(list_nodes(o), o->n, list_nodes(i), i->n, b, &found);
    PyEval_RestoreThread(save);
    if (rc == PG_E_BUSY) let_go(&b->hold);          /* (nothing made: Python tries again) */
    tell_bad(found, bad);
    return rc;
}

/* pygrad.grad's numbers over node lists outs and ins (pg_grad_numbers):
 * with the GIL held throughout, so no thread sees a grad between its save
 * and its restore; the wait for the sweep lock is short (ms), and Python
 * calls again on PG_E_BUSY, its signal handlers running between. */
static int32_t pg_grad_numbers_l(uintptr_t outs, const double *seeds, size_t nseeds,
                                 uintptr_t ins, double *result, size_t nresult) {
    pg_listobj *o = as_list((PyObject *)outs), *i = as_list((PyObject *)ins);
    if (o == NULL || i == NULL || nseeds < o->n || nresult < i->n) return PG_E_ARG;
    return pg_grad_numbers(list_nodes(o), seeds, o->n, list_nodes(i), i->n, result, 20);
}

/* pygrad.hvp's, hessian's and jvp's numbers (pg_hvp_numbers) from the one
 * node of list `root` over node list ins: without the GIL, since they
 * write no node's numbers, holding both lists (which hold every node) for
 * the call; the wait for the sweep lock is short, and Python calls again
 * on PG_E_BUSY, its signal handlers running between. */
static int32_t pg_hvp_numbers_l(uintptr_t root, uintptr_t ins, const double *tangents,
                                size_t ntangents, uint32_t ntan, double *result, size_t nresult,
                                double *root_tangents, size_t nroot, int reverse) {
    pg_listobj *r = as_list((PyObject *)root), *i = as_list((PyObject *)ins);
    if (r == NULL || i == NULL || r->n != 1 || ntangents < (size_t)ntan * i->n
        || (reverse && nresult < (size_t)ntan * i->n) || (root_tangents != NULL && nroot < ntan))
        return PG_E_ARG;
    Py_INCREF((PyObject *)r);
    Py_INCREF((PyObject *)i);
    PyThreadState *save = PyEval_SaveThread();
    int32_t rc = pg_hvp_numbers(list_nodes(r)[0], list_nodes(i), i->n, tangents, ntan,
                                reverse ? result : NULL, root_tangents, reverse, 50);
    PyEval_RestoreThread(save);
    Py_DECREF((PyObject *)i);
    Py_DECREF((PyObject *)r);
    return rc;
}

/* Bulk reads and writes over node list `list`, without the GIL while they
 * run (the list, held here, holds every node). */
#define PG_LIST_CALL(name, call)                                                   \
    static int32_t name {                                                          \
        pg_listobj *l = as_own_list((PyObject *)list);                             \
        if (l == NULL) return PG_E_ARG;                                            \
        int tracing_here = tracers && tracing;   /* (read with the GIL) */         \
        (void)tracing_here;                                                        \
        Py_INCREF(l);                                                              \
        PyThreadState *save = PyEval_SaveThread();                                 \
        int32_t rc = call;                                                         \
        PyEval_RestoreThread(save);                                                \
        Py_DECREF(l);                                                              \
        return rc;                                                                 \
    }
/* (each buffer comes with its length: PG_E_ARG, nothing done, unless it
 * is the list's own, so that a count Python was told wrong reads or writes
 * nothing C did not) */
/* A bulk read while this thread traces, or of a node made from a traced
 * input, is refused as a read of v.data is (PG_E_TRACED): its numbers are
 * a trace's.  (A bulk write is not: per_length's own token writes are bulk
 * writes.) */
static int any_traced(pg_listobj *l) {
    pg_node *const *nodes = list_nodes(l);
    for (size_t i = 0; i < l->n; i++)
        if (nodes[i]->flags & PG_F_TRACED) return 1;
    return 0;
}
static int32_t gather_data(pg_listobj *l, double *out, size_t nout, int traced) {
    if (traced || any_traced(l)) return PG_E_TRACED;
    if (nout != l->n) return PG_E_ARG;
    pg_gather_data(list_nodes(l), l->n, out);
    return 0;
}
static int32_t gather_grad(pg_listobj *l, double *out, size_t nout, int traced) {
    if (traced || any_traced(l)) return PG_E_TRACED;
    if (nout != l->n) return PG_E_ARG;
    pg_gather_grad(list_nodes(l), l->n, out);
    return 0;
}
static int32_t scatter_data(pg_listobj *l, const double *in, size_t nin) {
    if (nin != l->n) return PG_E_ARG;
    pg_scatter_data(list_nodes(l), l->n, in);
    return 0;
}
static int32_t fill_grad(pg_listobj *l, double x) {
    pg_fill_grad(list_nodes(l), l->n, x);
    return 0;
}
PG_LIST_CALL(pg_gather_data_l(uintptr_t list, double *out, size_t nout),
             gather_data(l, out, nout, tracing_here))
PG_LIST_CALL(pg_gather_grad_l(uintptr_t list, double *out, size_t nout),
             gather_grad(l, out, nout, tracing_here))
PG_LIST_CALL(pg_scatter_data_l(uintptr_t list, const double *in, size_t nin),
             scatter_data(l, in, nin))
PG_LIST_CALL(pg_fill_grad_l(uintptr_t list, double x), fill_grad(l, x))
PG_LIST_CALL(pg_program_onehot_l(pg_program *p, uintptr_t list, const uint32_t *ids, size_t nids,
                                 uint32_t vocab, int backward, double *loss),
             pg_program_run_onehot(p, list_nodes(l), l->n, ids, nids, vocab, backward, loss))
PG_LIST_CALL(pg_sgd_step_l(uintptr_t list, double lr, double momentum, double weight_decay,
                           double *velocity, size_t nvelocity, double *steps),
             pg_sgd_step(list_nodes(l), l->n, lr, momentum, weight_decay, velocity, nvelocity,
                         steps))
PG_LIST_CALL(pg_adam_step_l(uintptr_t list, double lr, double beta1, double beta2, double eps,
                            double weight_decay, double bias1, double bias2, double *m,
                            size_t nm, double *v, size_t nv, double *steps),
             pg_adam_step(list_nodes(l), l->n, lr, beta1, beta2, eps, weight_decay, bias1,
                          bias2, m, nm, v, nv, steps))
#undef PG_LIST_CALL
