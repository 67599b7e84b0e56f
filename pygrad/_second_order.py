"""Forward-over-reverse over Python floats: the Hessian of a Value times
tangent vectors, and tangents pushed forward, as csrc/second_order.c
computes them (the same operations in the same order, so the engines agree
bit for bit).  It runs for pygrad.reference.Value, and for pygrad.Value
where a Python closure lies below (one that does nothing: a custom op's
closure that does something, or a Function, goes to grad-of-grad instead,
pygrad/higher_order.py).

A dual is a number, its tangent, and whether it has one (whether it
depends on the inputs at all).  The dual of a plain op is the op's rules
of pygrad/op_rules.py read forward: its forward rule, and as its tangent
the sum of its gradient rules with ``g`` each input's tangent.  A gradient
rule over duals is the rule's own expression with every operation and
function its op's dual.
"""
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import op_rules
from ._rule_functions import Rules


class Dual:
    """A number ``v``, its tangent ``t`` and ``has`` (whether it has one);
    the operators are the plain ops' duals."""

    __slots__ = ("v", "t", "has")

    def __init__(self, v: float, t: float = 0.0, has: bool = False) -> None:
        self.v, self.t, self.has = v, t, has

    def __add__(self, o: Any) -> "Dual":
        return _DUALS["ADD"](self, _dual(o))

    def __radd__(self, o: Any) -> "Dual":
        return _DUALS["ADD"](_dual(o), self)

    def __sub__(self, o: Any) -> "Dual":
        return _DUALS["SUB"](self, _dual(o))

    def __rsub__(self, o: Any) -> "Dual":
        return _DUALS["SUB"](_dual(o), self)

    def __mul__(self, o: Any) -> "Dual":
        return _DUALS["MUL"](self, _dual(o))

    def __rmul__(self, o: Any) -> "Dual":
        return _DUALS["MUL"](_dual(o), self)

    def __neg__(self) -> "Dual":
        return _DUALS["NEG"](self)


def sum_order(n: int) -> List[int]:
    """The order an n-ary sum adds to its children's grads: csrc/ops.c's
    SUM_GRAD_ORDER (the plain graph's last add first)."""
    return [*range(n - 1, 1, -1), 0, *([1] if n > 1 else [])]


def _dual(x: Any) -> Dual:
    return x if isinstance(x, Dual) else Dual(x)


def _add_tangent(r: Dual, part: float) -> None:
    """A sum of tangent parts: the first as it is, then each added."""
    r.t = r.t + part if r.has else part
    r.has = True


class _Tangents:
    """Each plain op's tangent from its inputs' (``unary[code](x, y)``,
    ``binary[code](a, b, y)``, ``powk(x, k, y)``: the gradient rules over
    floats read forward, at output y)."""

    def __init__(self, rules: Rules) -> None:
        self.unary = {code: self._unary(grad) for code, (_, (_, grad)) in rules.unary.items()}
        self.binary = {code: self._binary(ga, gb) for code, (_, ga, gb) in rules.binary.items()}
        self.powk = self._powk(*rules.powk[1])

    @staticmethod
    def _unary(grad: Callable[..., float]) -> Callable[[Dual, float], Dual]:
        return lambda x, y: Dual(y, grad(x.v, y, x.t) if x.has else 0.0, x.has)

    @staticmethod
    def _binary(ga: Any, gb: Any) -> Callable[[Dual, Dual, float], Dual]:
        (guard_a, rule_a), (guard_b, rule_b) = ga, gb

        def tangent(a: Dual, b: Dual, y: float) -> Dual:
            r = Dual(y)
            if a.has and (guard_a is None or guard_a(a.v, b.v, y, 0.0)):
                _add_tangent(r, rule_a(a.v, b.v, y, a.t))
            if b.has and (guard_b is None or guard_b(a.v, b.v, y, 0.0)):
                _add_tangent(r, rule_b(a.v, b.v, y, b.t))
            r.has = a.has or b.has
            return r
        return tangent

    @staticmethod
    def _powk(guard: Any, rule: Callable[..., float]) -> Callable[[Dual, float, float], Dual]:
        def tangent(x: Dual, k: float, y: float) -> Dual:
            r = Dual(y, 0.0, x.has)
            if x.has and (guard is None or guard(x.v, k, y, 0.0)):
                r.t = rule(x.v, k, y, x.t)
            return r
        return tangent


#: each plain op's dual (its tangent at its forward rule's output), by code
_DUALS: Dict[str, Callable[..., Dual]] = {}


class SecondOrder:
    """The rules a sweep needs, made once (from the reference engine's
    rules over floats)."""

    def __init__(self, floats: Rules) -> None:
        self.tangents = tan = _Tangents(floats)
        for code, (fwd, _) in floats.unary.items():
            _DUALS[code] = (lambda f, t: lambda x: t(x, f(x.v)))(fwd, tan.unary[code])
        for code, (fwd, _, _) in floats.binary.items():
            _DUALS[code] = (lambda f, t: lambda a, b: t(a, b, f(a.v, b.v)))(fwd, tan.binary[code])
        numbers = floats.namespace
        ns: Dict[str, Any] = {name: (lambda d: lambda *xs: d(*map(_dual, xs)))(_DUALS[code])
                              for name, code in op_rules.functions_with_rules().items()}
        ns["div"] = lambda a, b: _DUALS["DIV"](_dual(a), _dual(b))
        for name in op_rules.CONSTANT_HELPERS:      # no tangent flows through a slope or a sign
            ns[name] = (lambda f: lambda d: Dual(f(_dual(d).v)))(numbers[name])
        #: the gradient rules over duals
        self.duals = Rules(ns, numbers=numbers)
        self.exp = numbers["exp"]
        self.div = numbers["div"]


_made: List[SecondOrder] = []


def second_order(floats: Rules) -> SecondOrder:
    if not _made:
        _made.append(SecondOrder(floats))
    return _made[0]


#: The codes of nodes through which nothing flows: a leaf, detached_max's
#: node, and a custom node whose closure does nothing.
_NO_TANGENT = ("LEAF", "MAX", "NONE")


class Sweep:
    """Forward-over-reverse over one walk of the graph below ``root``
    (pygrad/higher_order.py's _Walk: children first), by node index."""

    def __init__(self, walk: Any, view: Any, so: SecondOrder,
                 partials: Callable[[Any], Sequence[float]]) -> None:
        self.order = walk.order
        self.so = so
        self.partials = partials      # a Function's partials (numbers)
        self.index = {walk.key_of[id(v)]: i for i, v in enumerate(walk.order)}
        self.rules = [view.rule(v) for v in walk.order]
        self.kids = [[self.index[walk.key_of[id(k)]] for k in walk.kids_of[walk.key_of[id(v)]]]
                     for v in walk.order]
        self.data = [v.data for v in walk.order]
        self.kid_values = [walk.kids_of[walk.key_of[id(v)]] for v in walk.order]
        self.key_of = walk.key_of

    def index_of(self, v: Any) -> Optional[int]:
        k = self.key_of.get(id(v))
        return None if k is None else self.index.get(k)

    def run(self, root: Any, ins: Sequence[Any], tangent: Sequence[float],
            reverse: bool) -> "tuple[float, List[float]]":
        """Root's tangent along ``tangent`` (one number per input), and the
        Hessian of root times it (if reverse)."""
        n = len(self.order)
        t, has_t = [0.0] * n, [False] * n
        where = [self.index_of(x) for x in ins]
        for i, tx in zip(where, tangent):
            if i is not None and tx != 0.0:     # (0: held, in this row)
                t[i] = t[i] + tx if has_t[i] else tx
                has_t[i] = True
        for i in range(n):
            if not has_t[i]:
                d = self._tangent(i, t, has_t)
                t[i], has_t[i] = d.t, d.has
        r = self.index_of(root)
        assert r is not None
        root_t = t[r] if has_t[r] else 0.0
        if not reverse:
            return root_t, []
        self.t, self.has_t = t, has_t
        self.adj, self.gt, self.has_gt = [0.0] * n, [0.0] * n, [False] * n
        self.reached = [False] * n
        self.adj[r] += 1.0
        self.reached[r] = True
        for i in range(n - 1, -1, -1):
            self._reverse(i)
        return root_t, [self.gt[i] if i is not None and self.has_gt[i] else 0.0 for i in where]

    def _value(self, i: int, t: Sequence[float], has_t: Sequence[bool]) -> Dual:
        return Dual(self.data[i], t[i], has_t[i])

    def _tangent(self, i: int, t: List[float], has_t: List[bool]) -> Dual:
        code, extra = self.rules[i]
        kids, y, tan = self.kids[i], self.data[i], self.so.tangents
        if code in tan.binary:
            return tan.binary[code](self._value(kids[0], t, has_t), self._value(kids[1], t, has_t), y)
        if code in tan.unary:
            return tan.unary[code](self._value(kids[0], t, has_t), y)
        if code == "POWK":
            return tan.powk(self._value(kids[0], t, has_t), extra, y)
        r = Dual(y)
        if code in _NO_TANGENT:
            return r
        if code == "SUM":
            for j in kids:
                if has_t[j]:
                    _add_tangent(r, t[j])
        elif code == "LINEAR":
            act, bias = extra
            pre = self._linear_pre(kids, bias, lambda j: self._value(j, t, has_t))
            return Dual(y, pre.t, pre.has) if act is None else tan.unary[act](pre, y)
        elif code == "FUNCTION":       # (forward only: its partials are numbers)
            v = self.order[i]
            for j, p in zip(kids, self.partials(v)):
                if has_t[j]:
                    _add_tangent(r, p * t[j])
        elif code != "LOGSUMEXP":
            raise TypeError(f"pygrad: the second-order sweep has no rules for {code!r}")
        else:
            exp, div = self.so.exp, self.so.div
            m = self._shift(kids)
            total = exp(self.data[kids[0]] - m)
            for j in kids[1:]:
                total = total + exp(self.data[j] - m)
            for j in kids:          # the plain graph's: (e_0 t_0 + e_1 t_1 + ...) / s
                if has_t[j]:
                    _add_tangent(r, exp(self.data[j] - m) * t[j])
            if r.has:
                r.t = div(r.t, total)
        return r

    @staticmethod
    def _linear_pre(kids: Sequence[int], bias: bool, value: Callable[[int], Dual]) -> Dual:
        """A fused neuron's pre-activation over duals, as its plain graph
        computes it: b (or w0 * x0), then each product added."""
        if bias:
            acc, j = value(kids[0]), 1
        else:
            acc, j = value(kids[0]) * value(kids[1]), 2
        while j < len(kids):
            acc = acc + value(kids[j]) * value(kids[j + 1])
            j += 2
        return acc

    def _shift(self, kids: Sequence[int]) -> float:
        m = self.data[kids[0]]
        for j in kids[1:]:
            if self.data[j] > m:
                m = self.data[j]
        return 0.0 if math.isinf(m) else m

    def _add(self, j: int, r: Dual) -> None:
        self.adj[j] = self.adj[j] + r.v
        self.reached[j] = True
        if r.has:
            self.gt[j] = self.gt[j] + r.t if self.has_gt[j] else r.t
            self.has_gt[j] = True

    def _reverse(self, i: int) -> None:
        if not self.reached[i]:
            return                          # no gradient reaches it
        code, extra = self.rules[i]
        kids, rules, add = self.kids[i], self.so.duals, self._add
        value = lambda j: Dual(self.data[j], self.t[j], self.has_t[j])  # noqa: E731
        g, y = Dual(self.adj[i], self.gt[i], self.has_gt[i]), value(i)
        if code in rules.binary:
            a, b = value(kids[0]), value(kids[1])
            _, (guard_a, rule_a), (guard_b, rule_b) = rules.binary[code]
            if guard_a is None or guard_a(a.v, b.v, y.v, 0.0):
                add(kids[0], _dual(rule_a(a, b, y, g)))
            if guard_b is None or guard_b(a.v, b.v, y.v, 0.0):
                add(kids[1], _dual(rule_b(a, b, y, g)))
        elif code in rules.unary:
            add(kids[0], _dual(rules.unary[code][1][1](value(kids[0]), y, g)))
        elif code == "POWK":
            guard, rule = rules.powk[1]
            if guard is None or guard(self.data[kids[0]], extra, y.v, 0.0):
                add(kids[0], _dual(rule(value(kids[0]), extra, y, g)))
        elif code == "SUM":
            for j in sum_order(len(kids)):
                add(kids[j], g)
        elif code == "LINEAR":
            act, bias = extra
            if act is not None:
                g = _dual(rules.unary[act][1][1](Dual(0.0), y, g))     # reads y only
                g = Dual(0.0 + g.v, g.t, g.has)     # the plain graph's sum node's adjoint
            _, (_, w_rule), (_, x_rule) = rules.binary["MUL"]
            first = 1 if bias else 0
            j = len(kids)
            while j > first:
                if first and j - 2 == first:
                    add(kids[0], g)
                w, x = value(kids[j - 2]), value(kids[j - 1])
                add(kids[j - 2], _dual(w_rule(w, x, y, g)))
                add(kids[j - 1], _dual(x_rule(w, x, y, g)))
                j -= 2
            if first and len(kids) == 1:
                add(kids[0], g)
        elif code in _NO_TANGENT or code == "FUNCTION":
            return                  # (a Function below sends hvp to grad-of-grad)
        elif code != "LOGSUMEXP":
            raise TypeError(f"pygrad: the second-order sweep has no rules for {code!r}")
        else:
            exp = _DUALS["EXP"]
            m = Dual(self._shift(kids))
            total = exp(value(kids[0]) - m)
            for j in kids[1:]:
                total = total + exp(value(j) - m)
            q = _DUALS["DIV"](g, total)
            for j in reversed(kids):
                add(j, exp(value(j) - m) * q)
