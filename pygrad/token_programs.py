"""Compiled programs for models that pick by token id and vary in length
(microgpt): one program per number of tokens, traced on first use.

    def doc_loss(tokens):                         # your model's loss, as before
        ...  x = pygrad.embed(wte, tokens[i])     # was wte[tokens[i]]
        ...  -pygrad.pick(probs, tokens[i + 1]).log()   # was probs[tokens[i + 1]]
        ...  m = pygrad.detached_max(logits)      # was max(v.data for v in logits)
    train = pygrad.per_length(doc_loss, vocab, pygrad.optim.Adam(params, ...))
    for doc in docs:
        loss = train.step(token_ids)             # forward, backward and Adam, in C

A replayed graph freezes what Python decided while it was built, so what
varies between documents must be an input of the program:

- **token ids** are one-hot inputs: while tracing, each position is a
  ``Token`` (``vocab`` leaves), and ``embed``/``pick`` turn a row choice
  into a ``dot`` with them, which gives the picked numbers exactly (the
  other terms are zeros) and sends the gradient to the picked row only.
  With an int they index as ``table[i]`` does, so the same model code runs
  eagerly (sampling) and traced;
- **lengths** pick the program: one per number of tokens, compiled the
  first time that length comes, then replayed;
- **numbers** can't be read or set while the loss is traced (any
  ``v.data``, ``v.grad``): that would happen once, not on every run.  A
  softmax's max shift stays in the graph as ``detached_max``.  A Value
  made from a Token's inputs can't be read afterwards either, nor used in
  another trace (csrc/pygrad.h, PG_F_TRACED); one made without a token
  keeps the numbers it was made with (the runs don't write it).

The programs hold C nodes only (no Python Value), so the collector never
walks them.  Each step runs in C: forward, backward, and the optimizer's
step (``optim.Adam``/``SGD``, with an lr schedule as a callable).
"""
from typing import Any, Callable, Dict, List, Sequence, Union

from ._core import ffi, lib
from ._lifetime import Packed, pack
from ._node_factory import make_leaves
from .engine import Value
from .functional import detached_max, dot
from .replay import CallLock, alive, check_compile, rule_set_after_compile

# (the PerLength's lock keeps runs apart; C found another run anyway: its
# _lock was rebound)
_BUSY_ELSEWHERE = ("pygrad: per_length ran while another thread runs the same length's "
                   "program (its _lock was replaced): call it after that run returns")

__all__ = ["Token", "embed", "pick", "detached_max", "per_length", "PerLength"]


def _made_call_tracing() -> Callable[[Callable[[Any], Any], Any], Any]:
    out: list = []
    if lib.pg_call_tracing_function(id(out)):
        raise MemoryError("pygrad: out of memory making call_tracing")
    return out[0]


# fn(arg) as a trace: no number can be read or set, and the cyclic collector
# is paused (a trace's Values all live until it is compiled, and the
# collector would walk them again and again): csrc/value_binding.h.
_call_tracing = _made_call_tracing()


class Token:
    """A token id while ``per_length`` traces: ``vocab`` one-hot leaves,
    the program's inputs for that position.  Only ``embed`` and ``pick``
    take one: it is no int, so nothing can branch or index on it."""

    __slots__ = ("onehot",)

    def __init__(self, onehot: "List[Value]") -> None:
        self.onehot = onehot

    def _no_number(self, *args: Any) -> Any:
        raise TypeError("a token is a program input while pygrad traces, not an int: it "
                        "can't index, compare or branch (the program would keep the first "
                        "sequence's choice); pick with pygrad.embed(table, token) or "
                        "pygrad.pick(values, token)")

    __index__ = __int__ = __float__ = __bool__ = _no_number
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _no_number
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Token(one of {len(self.onehot)}, traced)"


TokenId = Union[int, Token]


def embed(table: Sequence[Sequence[Any]], token: TokenId) -> List[Any]:
    """``table[token]`` (a row of Values): for an int, that very row; for a
    traced Token, a row of ``dot(column, onehot)`` nodes, equal to it."""
    if isinstance(token, Token):
        if len(table) != len(token.onehot):
            raise ValueError(f"embed: a table of {len(table)} rows for a vocabulary of "
                             f"{len(token.onehot)}: give one row per token id")
        return [dot(column, token.onehot) for column in zip(*table)]
    return list(table[token])


def pick(values: Sequence[Any], token: TokenId) -> Any:
    """``values[token]``: for an int, that Value; for a traced Token, the
    ``dot`` of ``values`` with its one-hot inputs, equal to it."""
    if isinstance(token, Token):
        if len(values) != len(token.onehot):
            raise ValueError(f"pick: {len(values)} values for a vocabulary of "
                             f"{len(token.onehot)}: give one value per token id")
        return dot(values, token.onehot)
    return values[token]


class _Compiled:
    """One length's program: the C program, and its one-hot inputs."""

    __slots__ = ("program", "inputs", "vocab", "memory")
    memory: Any        # the program's struct, held apart from its ffi.gc object

    def __init__(self, program: Any, inputs: Packed, vocab: int) -> None:
        self.program = program
        self.inputs = inputs
        self.vocab = vocab

    def run(self, ids: Sequence[int], backward: bool) -> float:
        """The loss of ``ids``, and with ``backward`` its gradient (the
        caller holds the PerLength's lock).  One C call sets the one-hot
        inputs and runs the program: C keeps another thread's run of this
        length apart from all of it, even with the lock rebound."""
        program = alive(self.program)
        vocab = self.vocab
        for t in ids:
            if not 0 <= t < vocab:             # (as PerLength checks: never another slot)
                raise ValueError(f"token ids must be ints in range({vocab}), not {t!r}")
        loss = ffi.new("double *")
        nodes = self.inputs.nodes         # (held by a name for the call)
        rc = lib.pg_program_onehot_l(program, id(nodes), ffi.new("uint32_t[]", ids), len(ids),
                                     vocab, backward, loss)
        if rc == lib.PG_E_BUSY:
            raise RuntimeError(_BUSY_ELSEWHERE)
        if rc == lib.PG_E_SWEEP:
            raise ValueError(rule_set_after_compile("per_length's step"))
        if rc:
            raise ValueError(f"this length's program has {len(self.inputs)} one-hot inputs, "
                             f"not {len(ids)} x {vocab}: its attributes were rebound")
        return float(loss[0])


class PerLength:
    """``loss_fn(tokens)`` compiled once per number of tokens (see the
    module doc).  ``step(ids)`` trains on one sequence, ``ids`` token ids
    in ``range(vocab)``; ``loss(ids)`` only evaluates."""

    def __init__(self, loss_fn: Callable[[List[Token]], Value], vocab: int,
                 optimizer: Any = None) -> None:
        if not callable(loss_fn):
            raise TypeError(f"per_length needs the loss function, not {type(loss_fn).__name__}")
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise ValueError(f"vocab must be the number of token ids (an int >= 1), not {vocab!r}")
        self.loss_fn = loss_fn
        self._vocab = vocab
        self.optimizer = optimizer
        self._programs: Dict[int, _Compiled] = {}
        # One run at a time: a program's C arrays are its own, and the
        # runs let the GIL go (another thread's step would share them).
        # Held over C calls and SGD's or Adam's own steps, never over the
        # loss function (traced before it is taken), a schedule or your
        # own optimizer's methods.
        self._lock = CallLock(
            "this per_length is busy in this thread: a signal handler or callback (an lr "
            "schedule) called it while it runs, which would wait for itself forever. Call it "
            "after the running call returns (e.g. have the handler set a flag)")

    @property
    def vocab(self) -> int:
        """How many token ids there are (fixed: the programs are compiled
        for it)."""
        return self._vocab

    @property
    def lengths(self) -> List[int]:
        """The numbers of tokens compiled so far."""
        return sorted(self._programs)

    def _ids(self, ids: Sequence[int]) -> List[int]:
        out = []
        for t in ids:
            # (an int subclass as its int value: its own operators never run
            # where the id picks a slot, as eager indexing uses __index__)
            i = int.__index__(t) if isinstance(t, int) and not isinstance(t, bool) else -1
            if not 0 <= i < self.vocab:
                raise ValueError(f"token ids must be ints in range({self.vocab}), not {t!r}")
            out.append(i)
        if not out:
            raise ValueError("a sequence of no tokens: give at least one token id")
        return out

    def _compiled(self, n: int) -> _Compiled:
        """The program for n tokens, traced (the user's loss function runs)
        with no lock held; two threads tracing one length keep the first."""
        c = self._programs.get(n)
        if c is None:
            # Traced, compiled and its Values dropped in one call_tracing
            c = self._programs.setdefault(n, _call_tracing(self._trace, n))
        return c

    def _trace(self, n: int) -> _Compiled:
        leaves = make_leaves([0.0] * (n * self.vocab))
        for leaf in leaves:
            # (what depends on them can't be read: csrc/pygrad.h, PG_F_TRACED)
            lib.pg_set_traced_v(id(leaf))
        tokens = [Token(leaves[i * self.vocab:(i + 1) * self.vocab]) for i in range(n)]
        loss = self.loss_fn(tokens)
        if not isinstance(loss, Value):
            raise TypeError(f"per_length: the loss function must return a pygrad.Value, not "
                            f"{type(loss).__name__}")
        memory = ffi.new("pg_program *")    # (held by _Compiled too: replay.Program._held)
        program = ffi.gc(memory, lib.pg_program_release)
        bad = ffi.new("uintptr_t[2]")
        rc = lib.pg_compile_v(id(loss), program, bad)
        while rc == lib.PG_E_BUSY:      # another thread walks: signals run between tries
            rc = lib.pg_compile_v(id(loss), program, bad)
        if rc:
            check_compile(rc, bad, (loss,))
        inputs = pack(leaves)
        nodes = inputs.nodes         # (held by a name for the call)
        foreign = lib.pg_program_foreign_inputs_l(program, id(nodes))
        if foreign:
            if foreign == lib.PG_E_NOMEM:
                raise MemoryError("pygrad: out of memory checking a traced program")
            raise ValueError(f"per_length: the loss of {n} tokens uses {foreign} input(s) of "
                             "another trace (a Value made from tokens, kept from an earlier "
                             "call of the loss function or another per_length): make every "
                             "Value from this call's tokens")
        # The program holds its nodes (C), and the pack the inputs' nodes:
        # the traced Values go now, and no Value shows an interior node, so
        # the program need not write their numbers back.
        lib.pg_program_write_back(program, 0)
        c = _Compiled(program, inputs, self.vocab)
        c.memory = memory
        return c

    def loss(self, ids: Sequence[int]) -> float:
        """The loss of one sequence of token ids (forward only)."""
        ids = self._ids(ids)
        c = self._compiled(len(ids))
        with self._lock.free():
            return c.run(ids, backward=False)

    def step(self, ids: Sequence[int]) -> float:
        """One training step on a sequence of token ids: zero the grads,
        forward, backward, and the optimizer's step.  Returns the loss."""
        if self.optimizer is None:
            raise TypeError("per_length was made without an optimizer: pass one to step()")
        ids = self._ids(ids)
        c = self._compiled(len(ids))
        if lib.pg_program_rules_changed(alive(c.program)):
            # (refused before the optimizer zeroes a grad: nothing changes)
            raise ValueError(rule_set_after_compile("per_length's step"))
        opt = self.optimizer
        steps_are_pygrads = getattr(opt, "_steps_are_pygrads", None)
        if steps_are_pygrads is None or not steps_are_pygrads():
            # Your own optimizer's code runs with no lock held (two threads'
            # steps may then interleave between these calls).
            opt.zero_grad()
            with self._lock.free():
                loss = c.run(ids, backward=True)
            opt.step()
            return loss
        while True:
            # SGD's or Adam's steps run under the lock, the lr read before
            # it (a schedule may call this per_length); read again if
            # another thread stepped meanwhile.
            steps, lr = opt.steps, opt.current_lr()
            with self._lock.free():
                if opt.steps != steps:
                    continue
                opt.zero_grad()
                loss = c.run(ids, backward=True)
                opt._step_at(lr)
                return loss

    def __reduce__(self) -> Any:
        raise TypeError("a PerLength holds compiled C programs, which can't be pickled or "
                        "copied: make one in the other process with per_length(loss_fn, "
                        "vocab, optimizer)")

    def __repr__(self) -> str:
        return f"PerLength({getattr(self.loss_fn, '__name__', 'loss')}, vocab={self.vocab}, " \
               f"lengths={self.lengths})"


def per_length(loss_fn: Callable[[List[Token]], Value], vocab: int,
               optimizer: Any = None) -> PerLength:
    """``loss_fn`` (a list of tokens -> a loss Value) compiled once per
    sequence length; see the module doc."""
    return PerLength(loss_fn, vocab, optimizer)

