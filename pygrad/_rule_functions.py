"""The rules of ``pygrad/op_rules.py`` as Python functions, over whatever
arithmetic a namespace gives: Python floats with C's IEEE results (the
reference engine), or Values (``pygrad.grad(..., create_graph=True)``).

Each expression is compiled once into a function of its variables, with
``/`` turned into a call of the namespace's ``div`` (Python's float
division raises where C's gives inf or nan; a Value's is its operator).
"""
import ast          # (loaded with this module, on the first rule's use)
from typing import Any, Callable, Dict, Optional, Tuple

from . import op_rules

Fn = Callable[..., Any]
#: One gradient rule: (guard or None, rule).  A guard takes numbers.
Grad = Tuple[Optional[Fn], Fn]


class _DivToCall(ast.NodeTransformer):
    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Div):
            return ast.copy_location(ast.Call(ast.Name("div", ast.Load()), [node.left, node.right], []),
                                     node)
        return node


def compile_rule(text: str, params: str, namespace: Dict[str, Any]) -> Fn:
    """``lambda <params>: <text>`` over ``namespace``, ``/`` made ``div``."""
    body = _DivToCall().visit(ast.parse(text, mode="eval").body)
    head = ast.parse(f"lambda {params}: 0", mode="eval").body
    assert isinstance(head, ast.Lambda)
    tree = ast.Expression(ast.Lambda(head.args, body))
    code = compile(ast.fix_missing_locations(tree), f"<op_rules: {text}>", "eval")
    return eval(code, dict(namespace))     # noqa: S307 - our own table's text


def _coefficient(rule: Any, params: str, namespace: Dict[str, Any]) -> Optional[Fn]:
    """For a rule of the form ``c * g`` (or ``g * c``), c not using g: c as
    a function, so that a graph of gradients can gather such terms into one
    fused sum (pygrad/higher_order.py); else None."""
    body = ast.parse(rule[1] if isinstance(rule, tuple) else rule, mode="eval").body
    if isinstance(body, ast.BinOp) and isinstance(body.op, ast.Mult):
        for c, other in ((body.left, body.right), (body.right, body.left)):
            uses_g = any(isinstance(n, ast.Name) and n.id == "g" for n in ast.walk(c))
            if isinstance(other, ast.Name) and other.id == "g" and not uses_g:
                return compile_rule(ast.unparse(c), params, namespace)
    return None


def _grad(rule: Any, params: str, namespace: Dict[str, Any], numbers: Dict[str, Any]) -> Grad:
    if isinstance(rule, tuple):
        return compile_rule(rule[0], params, numbers), compile_rule(rule[1], params, namespace)
    return None, compile_rule(rule, params, namespace)


class Rules:
    """Every plain op's rules over one arithmetic (``namespace``: its
    functions, ``div`` and the constants; ``numbers``: the float one, for
    guards)."""

    def __init__(self, namespace: Dict[str, Any], numbers: Optional[Dict[str, Any]] = None) -> None:
        ns = dict(op_rules.CONSTANTS, **namespace)
        nums = dict(op_rules.CONSTANTS, **(numbers if numbers is not None else namespace))
        #: the arithmetic itself (``exp``, ``div``, ...), for the fused ops'
        #: rules, which are written over it (pygrad/higher_order.py)
        self.namespace = ns
        #: code -> (forward(x), gradient(x, y, g))
        self.unary: Dict[str, Tuple[Fn, Grad]] = {
            code: (compile_rule(fwd, "x", ns), _grad(grad, "x, y, g", ns, nums))
            for code, (fwd, grad) in op_rules.UNARY.items()}
        #: code -> (forward(a, b), gradient for a, for b (a, b, y, g))
        self.binary: Dict[str, Tuple[Fn, Grad, Grad]] = {
            code: (compile_rule(fwd, "a, b", ns), _grad(ga, "a, b, y, g", ns, nums),
                   _grad(gb, "a, b, y, g", ns, nums))
            for code, (fwd, ga, gb) in op_rules.BINARY.items()}
        fwd, grad = op_rules.POWK
        #: (forward(x, k), gradient(x, k, y, g))
        self.powk: Tuple[Fn, Grad] = (compile_rule(fwd, "x, k", ns),
                                      _grad(grad, "x, k, y, g", ns, nums))
        #: each gradient's coefficient c where the rule is c * g (else None),
        #: by the same keys: unary[code], binary[code] (a, b), powk
        self.coefficients: Dict[str, Any] = {
            code: _coefficient(grad, "x, y", ns) for code, (_, grad) in op_rules.UNARY.items()}
        self.coefficients.update({
            code: (_coefficient(ga, "a, b, y", ns), _coefficient(gb, "a, b, y", ns))
            for code, (_, ga, gb) in op_rules.BINARY.items()})
        self.coefficients["POWK"] = _coefficient(grad, "x, k, y", ns)
