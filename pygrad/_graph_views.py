"""How pygrad.grad, hvp, hessian and jvp (pygrad/higher_order.py) read each
engine's graph: a node's op code and constant, its children in order, the
key that identifies its node, and the gradient's numbers in one call where
the engine has one.  Each engine's backend holds its view (``.graph``)."""
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import engine as _engine
from . import reference as _reference
from ._core import ffi, lib
from ._edges import ChildrenInOrder
from .engine import is_noop
from ._lifetime import pack
from ._node_factory import make_nary
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


class CGraph:
    """pygrad.Value's graph: op, constant and children from the C node; a
    node is known by its address (two Values can show one node)."""

    Value = _engine.Value

    @staticmethod
    def sum_of_products(bias: Any, terms: Sequence[Any]) -> Any:
        """bias + terms[0] * terms[1] + terms[2] * terms[3] + ... (bias
        None: none), Values all, as one fused node (pygrad.dot's)."""
        variant = 0 if bias is None else lib.PG_LINEAR_BIAS
        return make_nary(lib.PG_OP_LINEAR, variant, tuple(terms) if bias is None else (bias, *terms))

    @staticmethod
    def check(values: Sequence[Any], what: str) -> None:
        """Nothing to refuse: every pygrad.Value has a C node."""

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
        if flags & lib.PG_F_PY_BACKWARD:
            return "CUSTOM", None
        if code == "CUSTOM":             # Value(x, children, op) with no _backward
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
        """The children in order, and their nodes' keys: in one C call
        where the Value's operands are its children, else the slow way."""
        kids: List[Any] = []
        keys: List[Any] = []
        if lib.pg_kids_v(id(v), id(kids), id(keys)) >= 0:
            return kids, keys
        n = lib.pg_nkids_v(id(v))
        found = _children_in_order.read(v, n) if n else ()
        return found, [lib.pg_node_addr(id(k)) for k in found]

    @staticmethod
    def grad_numbers(outs: List[Any], seeds: List[float], ins: List[Any]) -> Optional[List[float]]:
        """d sum(seeds * outs) / d ins, by the C rules in one call that
        leaves every grad as it was (csrc/backward.c, pg_grad_numbers);
        None if a custom op's Python closure lies below."""
        o, i = pack(outs).nodes, pack(ins).nodes
        result = ffi.new("double[]", max(len(ins), 1))
        s = ffi.new("double[]", seeds)
        rc = lib.pg_grad_numbers_l(id(o), s, len(seeds), id(i), result, len(ins))
        while rc == lib.PG_E_BUSY:   # another thread's walk: signals run between tries
            rc = lib.pg_grad_numbers_l(id(o), s, len(seeds), id(i), result, len(ins))
        if rc == lib.PG_E_SWEEP:     # a Python closure below: the caller's sweep says which
            return None
        if rc == lib.PG_E_NOMEM:
            raise MemoryError("pygrad: out of memory in grad()")
        if rc < 0:
            raise TypeError("pygrad.grad: a Value whose __init__ never ran has no node")
        return list(ffi.unpack(result, len(ins)))


class ReferenceGraph:
    """pygrad.reference.Value's graph: each op Value keeps its rule."""

    Value = _reference.Value
    key = id

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

    @staticmethod
    def rule(v: Any) -> Tuple[str, Any]:
        if not isinstance(v, _reference.Value):
            raise TypeError("pygrad.grad works on pygrad.Value and pygrad.reference.Value, "
                            f"not {type(v).__name__}")
        r = getattr(v, "_rule", None)     # (unset on a Value whose __init__ never ran)
        if r is not None and r[0] == "FUNCTION":
            return "FUNCTION", function_class(v)
        if r is not None:
            return r
        if not v._children:
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
