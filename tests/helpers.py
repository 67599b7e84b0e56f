"""Shared test helpers."""
import math


def micrograd_style_tanh(V):
    """tanh as a micrograd user adds it: a Value with a Python _backward."""
    def tanh(self):
        t = math.tanh(self.data)
        out = V(t, (self,), "mytanh")

        def _backward():
            self.grad += (1 - t ** 2) * out.grad
        out._backward = _backward
        return out
    return tanh
