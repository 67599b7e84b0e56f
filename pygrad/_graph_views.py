"""How pygrad.grad, hvp, hessian and jvp (pygrad/higher_order.py) read each
engine's graph: a node's op code and constant, its children in order, the
key that identifies its node, and the gradient's numbers in one call where
the engine has one.  Each engine's backend holds its view (``.graph``)."""
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import engine as _engine
from . import reference as _reference
from ._core import ffi, lib
from ._custom_sweep import GONE
from ._edges import ChildrenInOrder
from .engine import is_noop
from ._lazy import import_whole
from ._lifetime import pack
from ._node_factory import make_nary

_new = object.__new__
from ._numbers import is_value
from ._ops import OPS

_CODE = {op.code: op.key.upper() for op in OPS}
_ACT_CODE = {lib.PG_ACT_RELU: "RELU", lib.PG_ACT_TANH: "TANH", lib.PG_ACT_SIGMOID: "SIGMOID"}
_children_in_order = ChildrenInOrder()


def function_class(v: Any) -> Any:
    """The pygrad.Function class (declared differentiable) that made ``v``,
    else None."""
    d = getattr(v, "__dict__", None)
    return d.get("_pg_function") if d else None


def traced_error(what: str = "pygrad") -> ValueError:
    """The error of differentiating (``what``) a graph made from a token
    program's traced inputs (PG_F_TRACED)."""
    return ValueError(
        f"{what}: this graph holds Values made from a token program's traced inputs "
        "(pygrad.per_length traces the loss once; their numbers are the trace's, not the "
        "program's): differentiate an eager graph (call the model with int tokens), or let "
        "the program train")


def _made_call_collector_paused() -> Any:
    """The builtin fn(arg) with the cyclic collector paused (one C call, so a
    Ctrl-C can't leave it paused: csrc/value_binding.h)."""
    out: List[Any] = []
    if lib.pg_call_collector_paused_function(id(out)):
        raise MemoryError("pygrad: out of memory making call_collector_paused")
    return out[0]


#: fn(arg) with the collector paused: grad(create_graph=True)'s sweep makes
#: many Values and no cycle, and the collector would walk all the Values a
#: program holds, again and again, to find no garbage.
call_collector_paused = _made_call_collector_paused()


def _slow_kids(v: Any) -> Tuple[Any, ...]:
    """The children grad's walk goes to: none below a detached_max (no
    gradient flows there: backward()'s walk, csrc/backward.c)."""
    if lib.pg_describe_v(id(v)) & 0xFF == lib.PG_OP_MAX:
        return ()
    n = lib.pg_nkids_v(id(v))
    return tuple(_children_in_order.read(v, n)) if n else ()


def _sweep_call(call: Any, what: str) -> bool:
    """Run a C call that walks a graph under the sweep lock (again while
    another thread's walk holds it: signals run between tries): True if it
    ran, False if a Python closure lies below (the caller's Python sweep
    says which), else the error it met, raised."""
    rc = call()
    while rc == lib.PG_E_BUSY:
        rc = call()
    if rc == lib.PG_E_SWEEP:
        return False
    if rc == lib.PG_E_TRACED:
        raise traced_error()
    if rc == lib.PG_E_NOMEM:
        raise MemoryError(f"pygrad: out of memory in {what}")
    if rc < 0:
        raise TypeError("pygrad.grad: a Value whose __init__ never ran has no node")
    return True


class CGraph:
    """pygrad.Value's graph: op, constant and children from the C node; a
    node is known by its address (two Values can show one node)."""

    Value = _engine.Value
    paused = staticmethod(call_collector_paused)

    # The bookkeeping of grad(create_graph=True) in one C call each
    # (csrc/value_binding.h), where the graph allows: False / None, and
    # pygrad/higher_order.py does the same in Python.

    @staticmethod
    def walk(roots: List[Any], order: List[Any], kids_of: Dict[Any, Any],
             key_of: Dict[int, Any]) -> bool:
        """_Walk's walk (pg_walk_l), a Value whose operands are not its
        node's children read the slow way; False (Python walks, and meets
        the error itself) on an error."""
        return lib.pg_walk_l(id(roots), id(order), id(kids_of), id(key_of), id(_slow_kids)) == 0

    @staticmethod
    def gather_products(kids: Any, first: int, g: Any, terms: Dict[Any, Any]) -> bool:
        """A fused neuron's terms (_linear_grads's loop) in one C call
        (pg_add_pairs_l), for children in a tuple."""
        if type(kids) is not tuple:
            return False
        if lib.pg_add_pairs_l(id(kids), first, id(g), id(terms)):
            raise MemoryError("pygrad: out of memory in grad()")
        return True

    @staticmethod
    def sum_terms(terms: List[Any], one: Any) -> Any:
        """_Sums.take's fused sum (pg_sum_of_products_l); None if a
        coefficient is a number (Python makes it a leaf first)."""
        out = _new(_engine.Value)
        rc = lib.pg_sum_of_products_l(id(out), id(terms), id(one))
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory in grad()")
        return out if rc == 0 else None

    @staticmethod
    def sum_of_products(bias: Any, terms: Sequence[Any]) -> Any:
        """bias + terms[0] * terms[1] + terms[2] * terms[3] + ... (bias
        None: none), Values all, as one fused node (pygrad.dot's)."""
        variant = 0 if bias is None else lib.PG_LINEAR_BIAS
        return make_nary(lib.PG_OP_LINEAR, variant, tuple(terms) if bias is None else (bias, *terms))

    @staticmethod
    def check(values: Sequence[Any], what: str) -> None:
        """TypeError for a Value whose __init__ never ran (no node)."""
        for v in values:
            if is_value(v) and not lib.pg_node_addr(id(v)):
                raise TypeError(f"{what}: a Value whose __init__ never ran has no node: "
                                "make Values with Value(x)")

    @staticmethod
    def key(v: Any) -> int:
        return lib.pg_node_addr(id(v))

    @staticmethod
    def rule(v: Any) -> Tuple[str, Any]:
        """(op code, its constant): POWK's exponent, LINEAR's (activation
        code or None, has a bias), a differentiable Function's class."""
        d = lib.pg_describe_v(id(v))
        if d < 0:
            raise TypeError("pygrad.grad: a Value whose __init__ never ran has no node: "
                            "make Values with Value(x)")
        op, flags = d & 0xFF, d >> 8
        code = _CODE[op]
        if flags & lib.PG_F_TRACED:
            raise traced_error()
        if flags & lib.PG_F_PY_BACKWARD:
            fn = getattr(v, "__dict__", {}).get("_backward")
            if fn is None and op != lib.PG_OP_CUSTOM:
                raise RuntimeError(GONE)       # (as backward() says: _custom_sweep.py)
            # Value(x, children, op) whose _backward was never set (or is
            # micrograd's `lambda: None`) adds nothing: backward() skips it
            return ("NONE", None) if fn is None or is_noop(fn) else ("CUSTOM", None)
        if code == "CUSTOM":
            return "NONE", None
        if code == "POWK":
            return code, lib.pg_exponent_v(id(v))
        if code == "LINEAR":
            variant = lib.pg_variant_v(id(v))
            return code, (_ACT_CODE.get(variant & lib.PG_ACT_MASK),
                          bool(variant & lib.PG_LINEAR_BIAS))
        if code == "FUNCTION":
            return code, function_class(v)
        return code, None

    @staticmethod
    def kids_and_keys(v: Any) -> Tuple[Sequence[Any], Sequence[Any]]:
        """The children in order, and their nodes' keys (the Python walk's,
        which runs only where pg_walk_l met an error)."""
        found = _slow_kids(v)
        return found, [lib.pg_node_addr(id(k)) for k in found]

    @staticmethod
    def grad_numbers(outs: List[Any], seeds: List[float], ins: List[Any]) -> Optional[List[float]]:
        """d sum(seeds * outs) / d ins, by the C rules in one call that
        leaves every grad as it was (csrc/backward.c, pg_grad_numbers);
        None if a custom op's Python closure lies below."""
        o, i = pack(outs).nodes, pack(ins).nodes
        result = ffi.new("double[]", max(len(ins), 1))
        s = ffi.new("double[]", seeds)
        if not _sweep_call(lambda: lib.pg_grad_numbers_l(id(o), s, len(seeds), id(i), result,
                                                         len(ins)), "grad()"):
            return None
        return list(ffi.unpack(result, len(ins)))

    @staticmethod
    def hvp_numbers(root: Any, ins: List[Any], rows: Any, reverse: bool) -> Any:
        """For each row of tangents (a float64 array, rows x len(ins)): the
        root's tangent along it, and (if reverse) the Hessian of root times
        it, by forward-over-reverse in one C call that writes no node
        (csrc/second_order.c); None if a Python closure or a Function lies
        below."""
        np = import_whole("numpy")
        r, i = pack([root]).nodes, pack(ins).nodes
        k, n = rows.shape
        products = np.zeros((k, n) if reverse else (1, 1), dtype=np.float64)
        root_t = np.zeros(max(k, 1), dtype=np.float64)
        tangents = ffi.from_buffer("double[]", rows)
        out, out_t = ffi.from_buffer("double[]", products), ffi.from_buffer("double[]", root_t)
        call = lambda: lib.pg_hvp_numbers_l(id(r), id(i), tangents, k * n, k, out,  # noqa: E731
                                            products.size, out_t, root_t.size, int(reverse))
        if not _sweep_call(call, "a second-order sweep"):
            return None
        return root_t[:k], products


class ReferenceGraph:
    """pygrad.reference.Value's graph: each op Value keeps its rule."""

    Value = _reference.Value
    key = id
    paused = staticmethod(call_collector_paused)

    @staticmethod
    def walk(roots: List[Any], order: List[Any], kids_of: Dict[Any, Any],
             key_of: Dict[int, Any]) -> bool:
        return False

    @staticmethod
    def gather_products(kids: Any, first: int, g: Any, terms: Dict[Any, Any]) -> bool:
        return False

    @staticmethod
    def sum_terms(terms: List[Any], one: Any) -> Any:
        return None

    sum_of_products = staticmethod(_reference.sum_of_products)
    #: the rules' functions over floats (C's IEEE results)
    floats: Dict[str, Any] = _reference.FLOATS
    float_rules = staticmethod(_reference.float_rules)

    @staticmethod
    def check(values: Sequence[Any], what: str) -> None:
        for v in values:
            if is_value(v) and not isinstance(v, _reference.Value):
                raise TypeError(f"{what}: pygrad.grad works on pygrad.Value and "
                                f"pygrad.reference.Value, not {type(v).__name__}")
            if is_value(v) and not hasattr(v, "_children"):
                raise TypeError(f"{what}: a Value whose __init__ never ran has no children "
                                "or op: make Values with Value(x)")

    @staticmethod
    def rule(v: Any) -> Tuple[str, Any]:
        if not isinstance(v, _reference.Value):
            raise TypeError("pygrad.grad works on pygrad.Value and pygrad.reference.Value, "
                            f"not {type(v).__name__}")
        if not hasattr(v, "_children"):
            raise TypeError("pygrad.grad: a Value whose __init__ never ran has no children "
                            "or op: make Values with Value(x)")
        # _rule: (code, constant, the op's own _backward): a _backward set
        # since is the user's closure, which the rule no longer describes
        r = getattr(v, "_rule", None)
        if r is not None and v._backward is r[2]:
            return ("FUNCTION", function_class(v)) if r[0] == "FUNCTION" else (r[0], r[1])
        if r is None and not v._children and is_noop(v._backward):
            return "LEAF", None
        # Value(x, children, op) with micrograd's `lambda: None` does nothing
        return ("NONE", None) if is_noop(v._backward) else ("CUSTOM", None)

    @staticmethod
    def kids_and_keys(v: Any) -> Tuple[Sequence[Any], Sequence[Any]]:
        kids = v._children
        return kids, [id(k) for k in kids]

    @staticmethod
    def grad_numbers(outs: List[Any], seeds: List[float], ins: List[Any]) -> Optional[List[float]]:
        """None: the sweep runs the rules over floats."""
        return None

    @staticmethod
    def hvp_numbers(root: Any, ins: List[Any], rows: Any, reverse: bool) -> Any:
        """None: pygrad/_second_order.py's sweep runs over floats."""
        return None
