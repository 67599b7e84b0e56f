"""Issue 45's Value items: a hook on a leaf and replay, ``_prev`` that can't
be changed behind backward()'s back, subclasses whole (their slots in copies
and pickles, the class an op returns), internal attributes that a write
can't turn into a crash or another Value's numbers, and mixing engines
named as such."""
import copy
import gc
import pickle

import pytest

import pygrad
import pygrad._core
from pygrad._core import ffi, lib
from pygrad import Value

import internals


def clip(v):
    def hook():
        v.grad = max(-1.0, min(1.0, v.grad))
    return hook


def test_a_hook_on_a_leaf_runs_in_backward_as_in_micrograd():
    # micrograd calls every node's _backward, leaves' too, after all their
    # parents': a hook that clips the leaf's grad sees the whole sum.
    w, x = Value(3.0), Value(2.0)
    w._backward = clip(w)
    (w * x * 5.0).backward()
    assert w.grad == 1.0 and x.grad == 15.0


def test_replay_refuses_a_leaf_whose_backward_is_python():
    w, x = Value(3.0), Value(2.0)
    w._backward = clip(w)
    with pytest.raises(ValueError, match="_backward was set in Python"):
        pygrad.compile(w * x * 5.0)
    with pytest.raises(ValueError, match="_backward was set in Python"):
        pygrad.compile(w * x * 5.0, inputs=[x])
    # micrograd's own `lambda: None` on a leaf changes nothing: it compiles
    u = Value(3.0)
    u._backward = lambda: None
    assert pygrad.compile(u * x * 5.0).forward() == 30.0


def test_prev_cannot_be_changed_behind_backwards_back():
    a, b, c = Value(1.0), Value(2.0), Value(3.0)
    y = a * b
    prev = y._prev
    assert isinstance(prev, set) and prev == {a, b}
    for change in (lambda: prev.add(c), lambda: prev.discard(a), lambda: prev.update({c}),
                   lambda: prev.remove(a), lambda: prev.clear(), lambda: prev.pop()):
        with pytest.raises(TypeError, match="_prev can't be changed"):
            change()
    with pytest.raises(TypeError):
        prev |= {c}
    assert y._prev == {a, b} and repr(y._prev) in (repr({a, b}), repr({b, a}))
    with pytest.raises(AttributeError, match="children are fixed"):
        y._prev = {c}


class Slotted(Value):
    __slots__ = ("tag", "__hidden")

    def set_hidden(self, x):
        self.__hidden = x

    def hidden(self):
        return self.__hidden


class Stateful(Value):
    def __getstate__(self):
        return {"kind": "stateful", "note": getattr(self, "note", None)}

    def __setstate__(self, state):
        self.restored = state


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy,
                                   lambda v: pickle.loads(pickle.dumps(v))],
                         ids=["copy", "deepcopy", "pickle"])
def test_a_subclass_keeps_its_slots_and_state_through_copies(clone):
    v = Slotted(1.5)
    v.tag = "w0"
    v.set_hidden([1, 2])
    v.extra = "dict"
    v.grad = 0.25
    c = clone(v)
    assert type(c) is Slotted and (c.data, c.grad) == (1.5, 0.25)
    assert c.tag == "w0" and c.hidden() == [1, 2] and c.extra == "dict"
    s = Stateful(2.0)
    s.note = "n"
    d = clone(s)
    assert type(d) is Stateful and d.data == 2.0
    assert d.restored == {"kind": "stateful", "note": "n"}


class Named(Value):
    def __init__(self, data, name="?"):
        super().__init__(data)
        self.name = name

    def __repr__(self):
        return f"Named({self.name}={self.data})"


class Plain(Value):
    pass


class Hooked(Value):
    def __init__(self, data):
        super().__init__(data)
        self.kind = "hooked"


class HookedResult(Value):
    pass


Hooked._pygrad_result_class = HookedResult


def test_an_op_never_hands_out_a_half_made_subclass():
    n = Named(1.0, name="a")
    for y in (n * 2, 2 * n, n + n, -n, n ** 2, n.tanh(), 1 - n):
        assert type(y) is Value, y          # its __init__ would not have run
    print(n * 2)                             # Value's repr: no AttributeError
    p = Plain(1.0)
    assert all(type(y) is Plain for y in (p * 2, p + 1, p.relu(), 3 - p, p ** 2))
    h = Hooked(1.0)
    assert type(h * 2) is HookedResult


def test_a_subclass_may_keep_its_own_data_in_names_micrograd_leaves_free():
    class Mine(Value):
        def __init__(self, data, _children=(), _op=""):
            super().__init__(data, _children, _op)
            self._a, self._b, self._h, self._s, self._p = "mine", 42, None, None, None

    a, b = Mine(2.0), Mine(3.0)
    y = a * b
    assert y._prev == {a, b} and y.data == 6.0
    y.backward()
    assert (a.grad, b.grad) == (3.0, 2.0) and a._a == "mine"


def test_writing_internal_attributes_gives_an_exception_never_a_crash():
    # A Value's node is in its C base, written once by C: no attribute
    # reaches it.  The operands are read-only; _prev's cache can be
    # rewritten (C never reads it), and only _prev shows it.
    for name in ("_pg_keep", "_pg_node", "_pg_owner"):
        v = Value(2.0)
        setattr(v, name, (b"\xff" * 96,))          # an ordinary attribute now
        assert v.data == 2.0 and (v * 2.0).data == 4.0
    for name in ("_pg_a", "_pg_b"):
        a, b = Value(1.0), Value(2.0)
        y = a * b
        with pytest.raises(AttributeError):
            setattr(y, name, None)
        with pytest.raises(AttributeError):
            delattr(y, name)
        del a, b
        gc.collect()
        y.backward()
        assert y.data == 2.0 and len(y._prev) == 2
        assert sorted(k.data for k in y._prev) == [1.0, 2.0]
        assert sorted(k.grad for k in y._prev) == [1.0, 2.0]
    y = Value(1.0) * Value(2.0)
    y._pg_kids = None
    del y._pg_kids
    y.backward()
    assert sorted(k.grad for k in y._prev) == [1.0, 2.0]
    for bad in ("data", "grad"):
        with pytest.raises(AttributeError, match="can't be deleted"):
            delattr(Value(1.0), bad)


def test_a_value_whose_init_never_ran_raises_where_it_is_used():
    v = Value.__new__(Value)
    for use in (lambda: v.data, lambda: v.grad, lambda: v * 2.0, lambda: 2.0 - v,
                lambda: Value(1.0) + v, lambda: v.exp(), lambda: v ** 2, v.backward,
                lambda: v._backward):
        with pytest.raises(TypeError, match="no node|__init__ never ran"):
            use()
    with pytest.raises(TypeError):
        v.data = 1.0
    Value.__init__(v, 3.0)                      # then made as any leaf
    assert (v * 2.0).data == 6.0


def test_mixing_engines_is_named_whichever_side_is_left():
    ref = pygrad.reference.Value(1.0)
    with pytest.raises(TypeError, match="another engine"):
        Value(1.0) + ref
    with pytest.raises(TypeError, match="can't be ordered"):
        Value(1.0) < 0
    micrograd = pytest.importorskip("micrograd.engine")
    mg = micrograd.Value(2.0)
    with pytest.raises(TypeError, match="another engine"):
        Value(1.0) * mg
    # micrograd's Value on the left wraps ours as its data; its relu then
    # compares it, where pygrad says what happened
    with pytest.raises(TypeError, match="engines were mixed"):
        (mg + Value(1.0)).relu()



