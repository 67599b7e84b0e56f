"""Every plain op's forward rule and gradient rule, stated once.

Each rule is an expression in the op's input ``x`` (``a`` and ``b`` for a
binary op; ``k`` for the constant exponent of ``x ** number``), its output
``y`` and the grad ``g`` arriving at the output.  A gradient rule is the
addend to one input's grad: ``input.grad += rule``.  It is written in the
part of Python that is also C (``+ - * /``, unary ``-``, calls, names and
float constants; a guard may compare and use ``and`` / ``or`` / ``not``),
and from this one statement come:

- the C rules (``csrc/cffi_build.py`` writes ``rules.h`` from this table
  when the core is built, and ``csrc/ops.c`` makes the node, row and step
  rules from it): the numbers of ``backward()``, replay and batches;
- the reference engine's rules (``pygrad/reference.py``): the same
  expressions over Python floats, so the two engines agree bit for bit;
- the graph-building rules of ``pygrad.grad(..., create_graph=True)``: the
  same expressions over Values, so a gradient is a Value, differentiable
  again, whose numbers are the C rule's, bit for bit;
- the forward-mode and second-order rules of ``pygrad.jvp``, ``hvp`` and
  ``hessian``: a scalar op's gradient rule is linear in ``g``, so an
  output's tangent is the sum of the rules with ``g`` each input's
  tangent, and a rule over (number, tangent) pairs is the rule with each
  of its operations the op's own such pair (``csrc/cffi_build.py`` writes
  ``second_order_rules.h``; ``pygrad/_second_order.py`` over floats).

A rule is made of differentiable ops, except the helpers listed in
``CONSTANT_HELPERS``, whose value is a number that no gradient flows
through (a slope of 0 or 1, a sign).  A guard (``(guard, rule)``) says
when the rule adds anything at all; where it is false, nothing is added
(so a ``-0.0`` grad stays ``-0.0``), and the graph gets no node.

This module is data only: it imports nothing, so the build reads it
without importing pygrad.
"""

#: Unary ops: code -> (forward, gradient).  The codes are csrc/ops.def's.
UNARY = {
    "NEG": ("-x", "-g"),
    "EXP": ("exp(x)", "y * g"),
    "LOG": ("log(x)", "g / x"),
    "TANH": ("tanh(x)", "(1.0 - y * y) * g"),
    # micrograd's relu: 0 if x < 0 else x (relu(-0.0) is -0.0); the slope
    # is 1 where the output is > 0 (0 at 0, PyTorch's convention).
    "RELU": ("relu_of(x)", "relu_slope(y) * g"),
    "SIGMOID": ("sigmoid_of(x)", "(y * (1.0 - y)) * g"),
    # libm's functions, with PyTorch's derivative formulas.
    "SIN": ("sin(x)", "cos(x) * g"),
    "COS": ("cos(x)", "-sin(x) * g"),
    "TAN": ("tan(x)", "(1.0 + y * y) * g"),
    "ASIN": ("asin(x)", "g / sqrt(1.0 - x * x)"),
    "ACOS": ("acos(x)", "-g / sqrt(1.0 - x * x)"),
    "ATAN": ("atan(x)", "g / (1.0 + x * x)"),
    "SINH": ("sinh(x)", "cosh(x) * g"),
    "COSH": ("cosh(x)", "sinh(x) * g"),
    "ASINH": ("asinh(x)", "g / sqrt(x * x + 1.0)"),
    "ACOSH": ("acosh(x)", "g / sqrt(x * x - 1.0)"),
    "ATANH": ("atanh(x)", "g / (1.0 - x * x)"),
    "SQRT": ("sqrt(x)", "g / (2.0 * y)"),
    "LOG2": ("log2(x)", "g / (x * LN2)"),
    "LOG10": ("log10(x)", "g / (x * LN10)"),
    "LOG1P": ("log1p(x)", "g / (x + 1.0)"),
    "EXPM1": ("expm1(x)", "(y + 1.0) * g"),
    "ERF": ("erf(x)", "(TWO_OVER_SQRT_PI * exp(-(x * x))) * g"),
    "ERFC": ("erfc(x)", "(-TWO_OVER_SQRT_PI * exp(-(x * x))) * g"),
    # d|x|/dx = sign(x): 0 at +-0 (PyTorch), nan at nan.
    "ABS": ("fabs(x)", "sign_of(x) * g"),
}

#: Binary ops: code -> (forward, gradient for a, gradient for b).
BINARY = {
    "ADD": ("a + b", "g", "g"),
    "MUL": ("a * b", "b * g", "a * g"),
    "SUB": ("a - b", "g", "-g"),
    # As PyTorch writes them.
    "DIV": ("a / b", "g / b", "-g * a / (b * b)"),
    # a ** b, both Values.  d/db = a**b * log(a), taken as 0 where a == 0
    # and b >= 0 (PyTorch's convention: the limit, not 0 * -inf).
    "POW": ("pow(a, b)", ("b != 0.0", "(b * pow(a, b - 1.0)) * g"),
            ("not (a == 0.0 and b >= 0.0)", "(y * log(a)) * g")),
}

#: x ** k, k a number: (forward, gradient).  micrograd's k * x**(k-1); for
#: k == 0 the gradient is 0 (PyTorch), not 0 * x**-1 (nan at 0).  x ** 2
#: is x * x, the correctly rounded square (powk, a helper).
POWK = ("powk(x, k)", ("k != 0.0", "(k * pow(x, k - 1.0)) * g"))

#: micrograd makes a - b as a + (b * -1) and a / b as a * b**-1: a second
#: backward() without zeroing adds b's part again through a hidden grad,
#: which these ops keep in the node (csrc/ops.c, reference.py).  Their node
#: rule feeds that hidden grad to b's rule instead of g; a fresh sweep
#: (pygrad.grad, replay) starts it at zero, where the two agree.
HIDDEN_GRAD = ("SUB", "DIV")

#: Named constants, the same doubles in C and Python.
CONSTANTS = {
    "LN2": 0.6931471805599453,            # log(2), rounded
    "LN10": 2.302585092994046,            # log(10), rounded
    "TWO_OVER_SQRT_PI": 1.1283791670955126,
}

#: Helpers whose value no gradient flows through: a rule over Values calls
#: them with the Values' numbers and uses the result as a constant.
CONSTANT_HELPERS = ("relu_slope", "sign_of")

#: Helpers that are forward rules only (each is C in csrc/activation.h or
#: csrc/rule_helpers.h, and Python in pygrad/reference.py).
FORWARD_HELPERS = ("relu_of", "sigmoid_of", "powk", "fabs")


def functions_with_rules() -> dict:
    """Each function a gradient rule may call that has a derivative, and
    the op whose rules give it (its value is that op's forward rule, its
    tangent the op's gradient rule read forward): a unary op whose forward
    rule is ``f(x)``, and ``pow`` (POW).  The second-order rules over duals
    (csrc/second_order.c, pygrad/_second_order.py) call them."""
    found = {fwd.split("(")[0]: code for code, (fwd, _) in UNARY.items()
             if fwd.endswith("(x)") and fwd.split("(")[0] not in FORWARD_HELPERS}
    found["pow"] = "POW"
    return found
