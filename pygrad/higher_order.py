"""Derivatives of derivatives: ``pygrad.grad`` (whose result can be a graph
of Values, differentiable again, to any order), ``hvp``, ``hessian`` and
``jvp`` (forward mode), on ``pygrad.Value`` and ``pygrad.reference.Value``
alike.

Every plain op's gradient rule is read from its one statement in
``pygrad/op_rules.py``:

- ``grad(..., create_graph=True)`` evaluates each rule over Values, so a
  gradient is made of ops that have rules of their own.  A rule over
  Values computes exactly what the C rule computes over doubles, so its
  numbers are ``backward()``'s, bit for bit;
- ``grad`` without ``create_graph`` runs the C rules in one C call that
  leaves every ``.grad`` as it was (the reference engine: the same rules
  over floats);
- ``jvp`` pushes tangents forward through the same rules: a scalar op's
  gradient rule is linear in ``g``, so an output's tangent is the sum of
  the rules with ``g`` each input's tangent.

The fused ops (``pygrad.dot``, ``sum``, ``logsumexp``: the nodes of
``pygrad.nn``) differentiate as the plain graph they stand for, written
here with the same plain rules.  A custom op's ``_backward`` adds numbers
to ``.grad`` and can't be differentiated again: ``create_graph`` refuses it
with a TypeError, never a silent zero.
"""
import math
import operator
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _backend, op_rules
from ._lazy import import_whole
from ._numbers import is_value, real_or_none, refuse_unordered, to_real
from ._rule_functions import Rules
from ._second_order import Sweep, second_order, sum_order

__all__ = ["grad", "hvp", "hessian", "jvp"]

Scalars = Union[Any, Sequence[Any]]


def _view_of(values: Sequence[Any], what: str) -> Any:
    """How the sweep reads the graph of the engine ``values`` come from
    (pygrad/_graph_views.py)."""
    graph = _backend.backend_of(values, what).graph
    graph.check(values, what)
    return graph


# -- the rules over Values ------------------------------------------------------

def _floats() -> Dict[str, Any]:
    return _backend.REFERENCE.graph.floats


def _reference_rules() -> Rules:
    return _backend.REFERENCE.graph.float_rules()


_ELEMENTARY = ("exp", "log", "tanh", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
               "cosh", "asinh", "acosh", "atanh", "sqrt", "log2", "log10", "log1p", "expm1",
               "erf", "erfc")
_value_rules: Dict[type, Rules] = {}


def _rules_over(V: type) -> Rules:
    """op_rules' rules over Values of class V (made once per engine)."""
    rules = _value_rules.get(V)
    if rules is not None:
        return rules

    def power(x: Any, e: Any) -> Any:
        # C's pg_pow: an exponent of 1 is the base itself; x ** 2.0 as a
        # Value ** Value, whose number is pow's (x ** 2 would be x * x).
        if is_value(e):
            return x ** e
        if e == 1.0:
            return x
        return x ** V(e) if e == 2.0 else x ** e

    def constant(name: str) -> Callable[[Any], float]:
        f = _floats()[name]
        return lambda v: f(v.data)      # no gradient flows through a slope or a sign

    ns: Dict[str, Any] = {name: getattr(V, name) for name in _ELEMENTARY}
    ns.update(div=operator.truediv, pow=power, relu_slope=constant("relu_slope"),
              sign_of=constant("sign_of"))
    rules = _value_rules[V] = Rules(ns, numbers=_floats())
    return rules



# -- the sweep --------------------------------------------------------------------


class _Walk:
    """Every node below the roots, children first: csrc/backward.c's walk
    (a depth-first walk from each root in turn, children in order), so the
    grads add up in backward()'s order.  Each node's key and children are
    read once: ``key_of`` by the Values' ids (the walk holds them), and
    ``kids_of`` by key."""

    def __init__(self, roots: Sequence[Any], view: Any) -> None:
        self.order: List[Any] = []
        self.key_of: Dict[int, Any] = {}
        self.kids_of: Dict[Any, Sequence[Any]] = {}
        if view.walk(list(roots), self.order, self.kids_of, self.key_of):
            return
        self.order.clear()
        self.key_of.clear()
        self.kids_of.clear()
        for root in roots:
            self._walk(root, view)

    def key(self, v: Any, view: Any) -> Any:
        k = self.key_of.get(id(v))
        if k is None:
            k = self.key_of[id(v)] = view.key(v)
        return k

    def _walk(self, root: Any, view: Any) -> None:
        kids_of, key_of = self.kids_of, self.key_of
        k = self.key(root, view)
        if k in kids_of:
            return
        kids, keys = view.kids_and_keys(root)
        kids_of[k] = kids
        stack = [(root, iter(zip(kids, keys)))]
        while stack:
            node, children = stack[-1]
            for child, ck in children:
                key_of[id(child)] = ck
                if ck not in kids_of:
                    grandkids, keys = view.kids_and_keys(child)
                    kids_of[ck] = grandkids
                    stack.append((child, iter(zip(grandkids, keys))))
                    break
            else:
                stack.pop()
                self.order.append(node)


def custom_op_error(v: Any, what: str) -> TypeError:
    return TypeError(
        f"{what}: the custom op {getattr(v, '_op', '') or '(unnamed)'!r} has a Python _backward, "
        "which adds numbers to .grad and can't be differentiated again or run without writing "
        ".grad. Write the op with Value operations (it then needs no _backward of its own), "
        "or as a pygrad.Function with differentiable = True; backward() still runs it.")


def _function_error(v: Any) -> TypeError:
    return TypeError(
        f"pygrad.grad(create_graph=True): {getattr(v, '_op', '') or 'a node'!r} has numbers for "
        "its local gradients (a pygrad.Function, or Value(data, children, local_grads)), which "
        "can't be differentiated again. A Function whose forward and backward are written with "
        "operations Values have (+, *, exp(), ...) declares `differentiable = True`; else build "
        "the op from Value operations.")


class _Sums:
    """Each node's gradient, as the terms that add up to it, in the order
    backward() adds them: a term is a Value or number c (numbers: added at
    once, from 0.0, as C's fresh grads) or, in a graph, a pair (c, g) for
    c * g.  A graph's node gets its gradient as one fused sum of products
    (b + c1 * g1 + c2 * g2 + ...: pygrad.dot's node, the same additions in
    the same order), when the sweep reaches it, instead of a node per
    term.  Nodes are known by their key (``key_of``: by Value id, from the
    walk)."""

    def __init__(self, walk: "_Walk", view: Any, graph: bool) -> None:
        self.walk, self.view, self.graph = walk, view, graph
        self.terms: Dict[Any, Any] = {}
        self.done: Dict[Any, Any] = {}
        V = view.Value
        self.one = V(1.0)           # the factor of a plain term in a sum of products
        self.constant = lambda c: c if is_value(c) else V(c)

    def add(self, v: Any, c: Any, g: Any = None) -> None:
        """Add c (times g, if given) to v's gradient."""
        k = self.walk.key_of[id(v)]
        if not self.graph:
            c = c if g is None else c * g
            old = self.terms.get(k)
            self.terms[k] = 0.0 + c if old is None else old + c
        elif k in self.terms:
            self.terms[k].append((c, g))
        else:
            self.terms[k] = [(c, g)]

    def take(self, k: Any) -> Any:
        """The gradient of the node of key k, complete once the sweep
        reaches it (None: none)."""
        terms = self.terms.pop(k, None)
        if terms is None or not self.graph:
            total = terms
        elif len(terms) == 1:
            c, g = terms[0]
            total = c if g is None else c * g
        else:
            total = self.view.sum_terms(terms, self.one)      # one C call, if it can
            if total is None:
                total = self._fused_sum(terms)
        if self.graph and total is not None:
            d = total.data
            if d == 0.0 and math.copysign(1.0, d) < 0.0:
                # C's fresh grad is 0.0, and 0.0 + -0.0 is +0.0: a graph whose
                # sum starts at its first term would keep -0.0
                total = total + 0.0
        if total is not None:
            self.done[k] = total
        return total

    def _fused_sum(self, terms: List[Any]) -> Any:
        """b + c1 * g1 + c2 * g2 + ... from pairs (c, g) (g None: a plain
        term, b if first, else times one), numbers made leaves."""
        first, gfirst = terms[0]
        bias = self.constant(first) if gfirst is None else None
        flat: List[Any] = []
        for c, g in (terms[1:] if bias is not None else terms):
            flat.append(self.constant(c))
            flat.append(self.one if g is None else g)
        return self.view.sum_of_products(bias, flat)

    def get(self, v: Any) -> Any:
        """v's gradient once the sweep is over (a leaf's is gathered only
        now, if asked for)."""
        k = self.walk.key(v, self.view)
        return self.done[k] if k in self.done else self.take(k)


def _backprop(view: Any, outputs: Sequence[Any], seeds: Sequence[Any], rules: Rules,
              graph: bool) -> "_Sums":
    """Every node's gradient of sum(seed * output): Values of a new graph
    (``graph``) or numbers."""
    walk = _Walk(outputs, view)
    sums = _Sums(walk, view, graph)
    add = sums.add
    num: Callable[[Any], Any] = (lambda v: v) if graph else (lambda v: v.data)
    ns, coef = rules.namespace, rules.coefficients
    for o, s in zip(outputs, seeds):
        add(o, s)
    key_of, kids_of, terms = walk.key_of, walk.kids_of, sums.terms
    for v in reversed(walk.order):
        k = key_of[id(v)]
        if k not in terms:
            continue                        # no gradient reaches it
        code, extra = view.rule(v)
        if code in ("LEAF", "MAX", "NONE"):
            continue                        # (a leaf's is gathered if asked for)
        g = sums.take(k)
        kids = kids_of[k]
        if code in rules.unary:
            x, y = num(kids[0]), num(v)
            c = coef[code]
            if c is not None:
                add(kids[0], c(x, y), g)
            else:
                add(kids[0], rules.unary[code][1][1](x, y, g))
        elif code in rules.binary:
            a, b = kids
            _, (guard_a, rule_a), (guard_b, rule_b) = rules.binary[code]
            ca, cb = coef[code]
            da, db, dy = a.data, b.data, v.data
            na, nb, ny = num(a), num(b), num(v)
            if guard_a is None or guard_a(da, db, dy, 0.0):
                add(a, ca(na, nb, ny), g) if ca is not None else add(a, rule_a(na, nb, ny, g))
            if guard_b is None or guard_b(da, db, dy, 0.0):
                add(b, cb(na, nb, ny), g) if cb is not None else add(b, rule_b(na, nb, ny, g))
        elif code == "POWK":
            guard = rules.powk[1][0]
            if guard is None or guard(kids[0].data, extra, v.data, 0.0):
                add(kids[0], coef["POWK"](num(kids[0]), extra, num(v)), g)
        elif code == "SUM":
            for j in sum_order(len(kids)):
                add(kids[j], g)
        elif code == "LINEAR":
            _linear_grads(v, kids, extra, g, rules, num, sums)
        elif code == "LOGSUMEXP":
            # The plain graph: e_j = exp(x_j - m), s = e_0 + e_1 + ...,
            # x_j.grad += e_j * (g / s), last term first.
            m = _shift(kids)
            e = [ns["exp"](num(k) - m) for k in kids]
            s = e[0]
            for t in e[1:]:
                s = s + t
            q = ns["div"](g, s)
            for j in range(len(kids) - 1, -1, -1):
                add(kids[j], e[j], q)
        elif code == "FUNCTION" and not graph:      # C's rule: partial * g
            for kid, p in zip(kids, _function_partials(v)):
                add(kid, p, g)
        elif code == "FUNCTION":
            if extra is None:
                raise _function_error(v)
            _function_grads(extra, v, kids, g, add, view.Value)
        else:
            raise custom_op_error(v, "pygrad.grad")
    return sums


# MUL's rules, a * b -> (b * g, a * g): each factor's coefficient is the
# other factor, so a fused neuron's terms can be gathered without a call
# per term (the fast path below holds while op_rules says so).
_MUL_SWAPS = op_rules.BINARY["MUL"][1:] == ("b * g", "a * g")


def _linear_grads(v: Any, kids: Sequence[Any], variant: Tuple[Optional[str], bool], g: Any,
                  rules: Rules, num: Callable[..., Any], sums: "_Sums") -> None:
    """A fused neuron (``variant``: its activation's op code or None, and
    whether it has a bias) act(b + w0*x0 + ...) as its plain graph: the
    activation's rule, then each product's (MUL's rule), last term first,
    and b's add just before the first term's (csrc/ops.c's order)."""
    act, bias = variant
    if act is not None:
        _, (_, rule) = rules.unary[act]
        g = rule(None, num(v), g)           # these rules read the output only
    first = 1 if bias else 0
    if sums.graph and _MUL_SWAPS and sums.view.gather_products(kids, first, g, sums.terms):
        return                              # the loop below, in one C call
    add = sums.add
    w_coef, x_coef = rules.coefficients["MUL"]     # b * g and a * g
    j = len(kids)
    while j > first:
        if first and j - 2 == first:
            add(kids[0], g)
        w, x = kids[j - 2], kids[j - 1]
        add(w, w_coef(num(w), num(x), None), g)
        add(x, x_coef(num(w), num(x), None), g)
        j -= 2
    if first and len(kids) == 1:
        add(kids[0], g)


def _shift(kids: Sequence[Any]) -> float:
    """logsumexp's shift: the largest input (the first of equals), 0 if
    it is infinite (csrc/ops.c)."""
    m = kids[0].data
    for k in kids[1:]:
        if k.data > m:
            m = k.data
    return 0.0 if math.isinf(m) else m


def _function_grads(cls: Any, v: Any, kids: Sequence[Any], g: Any, add: Callable[..., None],
                    V: type) -> None:
    """A differentiable pygrad.Function node ``v``: its forward and backward
    run again on the Values, so the partials are Values of the graph; they
    are backward()'s only while the inputs hold apply()'s numbers."""
    at_apply = getattr(v, "__dict__", {}).get("_pg_function_inputs", ())
    # (compared as floats, bit for bit: a reference Value's data may be an int)
    if any(float(k.data).hex() != float(x).hex() for k, x in zip(kids, at_apply)):
        raise ValueError(
            f"pygrad.grad(create_graph=True): an input of {cls.__name__} (a pygrad.Function) "
            f"changed its .data after apply(); backward() uses the partials taken at apply(), "
            f"so a graph of the current numbers would disagree with it. Call "
            f"{cls.__name__}.apply again on the new numbers")
    from .function import Context
    ctx = Context()
    cls.forward(ctx, *kids)
    # backward(ctx, 1) times g, as apply() and the C rule take it: the same
    # numbers as backward()'s, bit for bit
    partials = cls.backward(ctx, V(1.0))
    if not isinstance(partials, (tuple, list)) or len(partials) != len(kids):
        raise ValueError(f"{cls.__name__}.backward must return {len(kids)} grads (one per input), "
                         f"got {partials!r}")
    for kid, p in zip(kids, partials):
        add(kid, p if is_value(p) else V(to_real(p, f"{cls.__name__}.backward's grads")), g)


# -- the public calls -------------------------------------------------------------


def _as_list(x: Any, what: str, ordered: bool = True) -> List[Any]:
    if is_value(x):
        return [x]
    if type(x).__module__ in ("pygrad.replay", "pygrad.token_programs"):
        raise TypeError(
            f"{what}: a {type(x).__name__} runs numbers, not Values, so it can't be "
            "differentiated twice: differentiate the eager graph it was made from "
            "(pygrad.grad(loss, params, create_graph=True) on the Values you compiled)")
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise TypeError(f"{what} must be a Value or a sequence of Values, not {type(x).__name__}")
    if ordered:
        refuse_unordered(x, what)
    items = list(x)
    for v in items:
        if not is_value(v):
            raise TypeError(f"{what} must be Values, not {type(v).__name__}")
    return items


def grad(outputs: Scalars, inputs: Scalars, grad_outputs: Optional[Scalars] = None,
         create_graph: bool = False) -> List[Any]:
    """The gradient of ``outputs`` with respect to each of ``inputs``, as
    ``torch.autograd.grad`` gives it: of ``sum(grad_outputs[j] *
    outputs[j])`` (each ``grad_outputs`` entry 1.0 by default).

    With ``create_graph=True`` each result is a Value of a new graph over
    the inputs, which ``grad`` or ``backward()`` can differentiate again,
    to any order.  Without it each result is a new leaf holding the number.
    An input no output depends on gets 0.0.  Every ``.grad`` is left as it
    was (``backward()`` is the call that accumulates into them).
    """
    # (outputs in any order when no grad_outputs names each one)
    outs = _as_list(outputs, "grad's outputs", ordered=grad_outputs is not None)
    ins = _as_list(inputs, "grad's inputs")
    if not outs:
        raise ValueError("grad needs at least one output")
    if grad_outputs is None:
        seeds: List[Any] = [1.0] * len(outs)
    else:
        seeds = list(grad_outputs) if hasattr(grad_outputs, "__iter__") else [grad_outputs]
        if len(seeds) != len(outs):
            raise ValueError(f"grad_outputs has {len(seeds)} entries for {len(outs)} outputs")
    view = _view_of(outs + ins + [s for s in seeds if is_value(s)], "grad's Values")
    V = view.Value
    if create_graph:
        seeds = [s if is_value(s) else V(_seed(s)) for s in seeds]
        rules = _rules_over(V)
        sums = view.paused(lambda _: _backprop(view, outs, seeds, rules, graph=True), None)
        found = [sums.get(x) for x in ins]
        return [V(0.0) if d is None else d for d in found]
    numbers = [_seed(s.data if is_value(s) else s) for s in seeds]
    return [V(x) for x in _grad_numbers(view, outs, numbers, ins)]


def _seed(s: Any) -> float:
    x = real_or_none(s)
    if x is None:
        raise TypeError(f"grad_outputs must be numbers or Values, not {type(s).__name__}")
    return x


def _grad_numbers(view: Any, outs: List[Any], seeds: List[float], ins: List[Any]) -> List[float]:
    """The numbers of grad(): one C call (the C engine's view), or the
    rules over floats (the reference engine); every .grad left as it was."""
    numbers = view.grad_numbers(outs, seeds, ins)
    if numbers is not None and not any(x != x for x in numbers):
        return numbers
    # (a nan may come from a rule backward() runs at a node no gradient
    # reaches, 0 * an infinite slope: the rules over floats run none there,
    # as create_graph and the reference engine do)
    sums = _backprop(view, outs, seeds, _reference_rules(), graph=False)
    found = [sums.get(x) for x in ins]
    return [0.0 if d is None else d for d in found]


def _items(xs: Any, what: str) -> List[Any]:
    """xs (a number, a Value, a 0-d or 1-d array, or a sequence of them) as
    a list; a mapping or a set (no order) is refused."""
    refuse_unordered(xs, what)
    if (is_value(xs) or isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__")
            or getattr(xs, "ndim", None) == 0):
        return [xs]
    return list(xs)


def _leaves(xs: Any, what: str) -> Tuple[type, List[Any]]:
    """New leaves (of the engine of any Values among ``xs``) holding xs."""
    items = _items(xs, what)
    if not items:
        raise ValueError(f"{what} needs at least one input")
    backend = _backend.backend_of(items, what)
    backend.graph.check(items, what)
    V = backend.Value
    return V, [V(to_real(x.data if is_value(x) else x, f"{what} input")) for x in items]


def _call(f: Callable[..., Any], leaves: List[Any], what: str) -> Any:
    if not callable(f):
        raise TypeError(f"{what}'s f must be callable, not {type(f).__name__}")
    y = f(*leaves)
    if not is_value(y):
        raise TypeError(f"{what}: f must return a Value (a scalar), got {type(y).__name__}")
    return y


def _numbers(xs: Any, n: int, what: str) -> List[float]:
    """xs (numbers, Values or a 1-d array) as n floats."""
    items = _items(xs, what)
    if len(items) != n:
        raise ValueError(f"{what} has {len(items)} numbers for {n} inputs")
    return [to_real(x.data if is_value(x) else x, what) for x in items]


def _second_order(view: Any, y: Any, leaves: List[Any], rows: Any, reverse: bool) -> Any:
    """(y's tangent along each row of tangents, and if reverse the Hessian
    of y times each row): forward-over-reverse in one C call, or the same
    sweep over floats (pygrad/_second_order.py) where C hands it back (the
    reference engine; a closure that does nothing).  None where only
    grad-of-grad can (reverse, with a Function below)."""
    found = view.hvp_numbers(y, leaves, rows, reverse)
    if found is not None:
        return found
    walk = _Walk([y], view)
    sweep = Sweep(walk, view, second_order(_reference_rules()), _function_partials)
    for v, (code, _) in zip(walk.order, sweep.rules):       # (each node's rule, read once)
        if code == "CUSTOM":
            if reverse:
                return None             # (grad-of-grad says which op)
            raise custom_op_error(v, "pygrad.jvp")
        if code == "FUNCTION" and reverse:
            return None
    runs = [sweep.run(y, leaves, row, reverse) for row in rows.tolist()]
    np = import_whole("numpy")
    products = np.array([p for _, p in runs], dtype=np.float64)
    return (np.array([t for t, _ in runs], dtype=np.float64),
            products.reshape(len(runs), len(leaves)) if reverse else products)


def _tangent_rows(rows: List[List[float]], n: int) -> Any:
    np = import_whole("numpy")
    return np.ascontiguousarray(np.array(rows, dtype=np.float64).reshape(len(rows), n))


def hvp(f: Callable[..., Any], xs: Any, vs: Any) -> Any:
    """The Hessian of ``f(*xs)`` (a scalar) times the vector ``vs``, as
    ``torch.autograd.functional.hvp`` gives it, by forward-over-reverse:
    one pass pushes ``vs`` forward as tangents, and one reverse pass runs
    every gradient rule over (number, tangent) pairs (one C call, after f
    builds its graph).  ``xs`` are numbers (or Values, whose data is
    used).  With a pygrad.Function below, the gradient is taken as a graph
    (``create_graph``) and its dot with ``vs`` differentiated instead."""
    _, leaves = _leaves(xs, "hvp")
    y = _call(f, leaves, "hvp")
    v = _numbers(vs, len(leaves), "hvp's vs")
    view = _view_of([y] + leaves, "hvp's Values")
    found = _second_order(view, y, leaves, _tangent_rows([v], len(leaves)), reverse=True)
    if found is not None:
        return found[1][0]
    first = grad(y, leaves, create_graph=True)
    np = import_whole("numpy")
    return np.array([x.data for x in grad(first, leaves, grad_outputs=v)], dtype=np.float64)


def hessian(f: Callable[..., Any], xs: Any) -> Any:
    """The matrix of second derivatives of ``f(*xs)`` (a scalar), n x n:
    column j is the Hessian times the j-th unit vector, all n by
    forward-over-reverse over f's one graph in one C call (with a
    pygrad.Function below: the gradient taken once as a graph, then each
    entry differentiated).  It is symmetric to the last bit: entry (i, j)
    is the mean of the (i, j) and (j, i) found, which are equal where the
    math is and differ by rounding only."""
    _, leaves = _leaves(xs, "hessian")
    y = _call(f, leaves, "hessian")
    n = len(leaves)
    np = import_whole("numpy")
    view = _view_of([y] + leaves, "hessian's Values")
    found = _second_order(view, y, leaves, np.eye(n, dtype=np.float64), reverse=True)
    if found is not None:
        h = found[1]
    else:
        first = grad(y, leaves, create_graph=True)
        rows = [[x.data for x in grad(gi, leaves)] for gi in first]
        h = np.array(rows, dtype=np.float64).reshape(n, n)
    return h * 0.5 + h.T * 0.5        # (halves first: h + h.T could overflow)


def jvp(f: Callable[..., Any], xs: Any, tangents: Any) -> Tuple[float, float]:
    """``(f(*xs), the derivative of f at xs along tangents)``, forward
    mode, as ``jax.jvp``: f runs once on new leaves, and each node's
    tangent follows from its inputs' by the op's rule, read forward (a
    scalar op's gradient rule is linear in the incoming grad), in one C
    call.  The graph is dropped on return."""
    _, leaves = _leaves(xs, "jvp")
    t = _numbers(tangents, len(leaves), "jvp's tangents")
    y = _call(f, leaves, "jvp")
    view = _view_of([y] + leaves, "jvp's Values")
    root_t, _ = _second_order(view, y, leaves, _tangent_rows([t], len(leaves)), reverse=False)
    return y.data, float(root_t[0])


def _function_partials(v: Any) -> Sequence[float]:
    """d v / d kid for each kid of a Function (or microgpt-made) node: the
    numbers taken when it was made, as backward() uses them."""
    return v._local_grads
