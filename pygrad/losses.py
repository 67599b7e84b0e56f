"""Loss functions over Values; they work on both engines (the fused ops
come from the engine the Values belong to).

- ``mse(preds, targets)``: mean of (p - t)**2.
- ``svm_hinge(scores, labels, params=None, alpha=1e-4)``: micrograd's demo
  loss, mean of relu(1 - y*score) with y in {-1, +1}, plus alpha * sum(p*p).
- ``bce_with_logits(logits, targets)``: binary cross-entropy of sigmoid(z),
  computed stably from the logit z, targets in [0, 1].
- ``softmax_cross_entropy(logits, target)``: for one sample, k logits and a
  class index: logsumexp(logits) - logits[target]; for a batch, a list of
  logit lists and a list of indices, the mean.
"""
import operator
from typing import Any, Iterable, List, Optional, Sequence, Union

from ._backend import backend_of
from ._numbers import is_value, to_real
from ._value_ops import Scalar

__all__ = ["mse", "svm_hinge", "bce_with_logits", "softmax_cross_entropy"]


def _mean(terms: List[Scalar]) -> Scalar:
    if not terms:
        raise ValueError("loss of an empty batch")
    return backend_of(terms, "a loss's terms").sum(terms) * (1.0 / len(terms))


def _pairs(a: Iterable[Any], b: Iterable[Any], what: str) -> List[Any]:
    _a_batch(a, what, "predictions")
    _a_batch(b, what, "targets")
    a, b = list(a), list(b)
    for p in a:
        if not is_value(p) and not isinstance(p, (list, tuple)):   # a batch's rows
            raise TypeError(f"{what}: predictions must be Values, not {type(p).__name__}: {p!r}")
    if len(a) != len(b):
        raise ValueError(f"{what}: {len(a)} predictions but {len(b)} targets")
    return list(zip(a, b))


def _target(t: Any, what: str, role: str = "target") -> float:
    """A target as a float; a Value is refused as one (targets are numbers),
    not as a mix of engines."""
    if is_value(t):
        raise TypeError(f"{what}: each {role} must be a number, not a Value ({t!r}): pass "
                        f"t.data, or write the loss from Value ops (e.g. (p - t) ** 2) to "
                        f"differentiate through the {role} too")
    return to_real(t, role)


def _a_batch(x: Any, what: str, role: str) -> None:
    """A TypeError unless x is a batch (a list, tuple, array, ...): a single
    Value or number is the likely mix-up, and list() would only say it is
    not iterable."""
    if is_value(x) or isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise TypeError(f"{what}: {role} must be a list, one per sample, not a single "
                        f"{type(x).__name__} ({x!r}); for one sample, pass lists of one: "
                        f"{what}([prediction], [target])")


def mse(preds: Iterable[Scalar], targets: Iterable[float]) -> Scalar:
    """Mean squared error."""
    return _mean([(p - _target(t, "mse")) ** 2 for p, t in _pairs(preds, targets, "mse")])


def svm_hinge(scores: Iterable[Scalar], labels: Iterable[float],
              params: Optional[Iterable[Scalar]] = None, alpha: float = 1e-4) -> Scalar:
    """micrograd's max-margin loss; labels are -1 or +1."""
    pairs = [(s, _target(y, "svm_hinge", "label"), y)
             for s, y in _pairs(scores, labels, "svm_hinge")]
    for _, t, y in pairs:
        if t not in (-1.0, 1.0):
            raise ValueError(f"svm_hinge labels must be -1 or +1, not {y!r}")
    # (each label converted once: the number checked is the number used)
    loss = _mean([(1 + -t * s).relu() for s, t, _ in pairs])
    if params is not None:
        ps = list(params)
        if ps:
            # sum(p * p for p in ps) as one fused node
            loss = loss + alpha * backend_of(ps, "svm_hinge params").dot(ps, ps)
    return loss


def bce_with_logits(logits: Iterable[Scalar], targets: Iterable[float]) -> Scalar:
    """Binary cross-entropy on logits z: z - z*t + log(1 + exp(-z)) for
    z >= 0, and -z*t + log(1 + exp(z)) otherwise (no overflow)."""
    terms = []
    for z, t in _pairs(logits, targets, "bce_with_logits"):
        t = _target(t, "bce_with_logits")
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"bce_with_logits targets must be in [0, 1], not {t!r}")
        if z.data >= 0:
            terms.append(z - z * t + (1 + (-z).exp()).log())
        else:
            terms.append(-z * t + (1 + z.exp()).log())
    return _mean(terms)


def softmax_cross_entropy(logits: Union[Iterable[Scalar], Iterable[Iterable[Scalar]]],
                          target: Union[int, Sequence[int]]) -> Scalar:
    """Cross-entropy of softmax(logits) against a class index (or the mean
    over a batch of them)."""
    if is_value(logits) or not hasattr(logits, "__iter__"):
        raise TypeError(f"softmax_cross_entropy: logits must be a list, one Value per class "
                        f"(or a list of such lists), not a single {type(logits).__name__} "
                        f"({logits!r})")
    zs: List[Any] = list(logits)
    if not zs:
        raise ValueError("softmax_cross_entropy of no logits")
    if isinstance(zs[0], (list, tuple)):
        if not hasattr(target, "__iter__"):
            raise TypeError(f"a batch of logits needs a list of class indices, not "
                            f"{type(target).__name__}")
        return _mean([softmax_cross_entropy(z, t)
                      for z, t in _pairs(zs, target, "softmax_cross_entropy")])
    try:
        index = operator.index(target)  # type: ignore[arg-type]  # a wrong kind raises here
    except TypeError:
        raise TypeError(f"target must be an integer class index, not {type(target).__name__}") from None
    if isinstance(target, bool) or not 0 <= index < len(zs):
        raise ValueError(f"target must be a class index in [0, {len(zs)}), not {target!r}")
    return backend_of(zs, "softmax_cross_entropy logits").logsumexp(zs) - zs[index]
