"""Interrupts injected at a chosen point, never timed: a trace function
raises KeyboardInterrupt at the n-th Python event (or bytecode) in pygrad's
code, where a Ctrl-C can land.  Sweeping n over every event checks every
point, whatever the machine's load."""
import dis
import os
import sys

import pygrad

PYGRAD_CODE = os.path.dirname(os.path.abspath(pygrad.__file__)) + os.sep
TEST_CODE = os.path.dirname(os.path.abspath(__file__)) + os.sep


_WITH_EXITS = {}


def with_exit_offsets(code):
    """The bytecodes a ``with`` block runs on leaving normally before its
    ``__exit__`` is called.  A Ctrl-C can't land there (none of them checks
    for signals), but a trace function's exception can, and would skip
    ``__exit__``: a lock left held by the fuzzer itself, not by pygrad."""
    offsets = _WITH_EXITS.get(code)
    if offsets is None:
        ins = list(dis.get_instructions(code))
        offsets = set()
        for k in range(len(ins) - 4):
            if all(i.opname == "LOAD_CONST" and i.argval is None for i in ins[k:k + 3]):
                call = k + 3 if ins[k + 3].opname == "CALL" else k + 4
                if ins[call].opname == "CALL" and ins[call].arg == 2:
                    start = k - 1 if k and ins[k - 1].opname == "SWAP" else k
                    offsets.update(i.offset for i in ins[start:call + 1])
            # 3.9 and 3.10: POP_BLOCK has left the block, then
            # LOAD_CONST None, DUP_TOP, DUP_TOP, CALL_FUNCTION 3 calls __exit__
            if (ins[k].opname == "LOAD_CONST" and ins[k].argval is None
                    and [i.opname for i in ins[k + 1:k + 4]] == ["DUP_TOP", "DUP_TOP", "CALL_FUNCTION"]
                    and ins[k + 3].arg == 3 and k and ins[k - 1].opname == "POP_BLOCK"):
                offsets.update(i.offset for i in ins[k:k + 4])
        _WITH_EXITS[code] = offsets
    return offsets


# CPython 3.9's tracing (maybe_call_line_trace) calls the opcode event right
# after a line event even when the line event's trace function raised, and the
# opcode event's success overwrites the error: the frame runs on with the
# KeyboardInterrupt set and ends in "SystemError: _PyEval_EvalFrameDefault
# returned a result with an error set".  The interpreter's fault, not pygrad's
# (tests/test_fuzz.py's test_py39_loses_a_line_event_error_with_opcodes shows
# it on plain Python code); 3.10 fixed it.  There, with opcode events on, the
# interrupt lands at the opcode event instead: the same point, between bytecodes.
_LINE_ERRORS_LOST = sys.version_info < (3, 10)


_HANDLER_EDGES = {}


def handler_edge_offsets(code):
    """The bytecodes that enter and leave an ``except`` block
    (PUSH_EXC_INFO, POP_EXCEPT).  No Ctrl-C lands there (none checks for
    signals), but a trace function's exception can, before the instruction
    runs, and CPython's unwinding then restores the wrong exception state:
    ``sys.exc_info()`` keeps the handled exception, with its frames and
    every Value they hold, after the KeyboardInterrupt is caught.  The
    interpreter's artefact, not pygrad's."""
    offsets = _HANDLER_EDGES.get(code)
    if offsets is None:
        offsets = {i.offset for i in dis.get_instructions(code)
                   if i.opname in ("PUSH_EXC_INFO", "POP_EXCEPT")}
        _HANDLER_EDGES[code] = offsets
    return offsets


class Interrupter:
    """A trace function (``sys.settrace``) that raises KeyboardInterrupt at
    the n-th Python event (call, line, return, exception; with ``opcodes``,
    every bytecode too) in a frame of code under ``prefixes``: where a
    Ctrl-C lands, between bytecodes.  ``n=None``: only count the events."""

    def __init__(self, n, opcodes=False, prefixes=(PYGRAD_CODE, TEST_CODE), action=None):
        self.n = n
        self.action = action    # run there instead of raising (a signal handler's body)
        self.opcodes = opcodes
        self.prefixes = prefixes
        self.events = 0
        self.first = None       # where the first event was
        self.fired = None       # where the interrupt was raised

    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(self.prefixes):
            return None
        if self.opcodes:
            frame.f_trace_opcodes = True
        return self.local(frame, event, arg)

    def local(self, frame, event, arg):
        if event == "line" and self.opcodes and _LINE_ERRORS_LOST:
            return self.local       # the opcode event of the same instruction fires instead
        self.events += 1
        if self.first is None:
            self.first = self.where(frame, event)
        if (self.n is not None and self.events >= self.n and self.fired is None
                and frame.f_lasti not in with_exit_offsets(frame.f_code)
                and frame.f_lasti not in handler_edge_offsets(frame.f_code)):
            self.fired = self.where(frame, event)
            if self.action is not None:
                sys.settrace(None)      # the handler's own code runs untraced
                try:
                    self.action()
                finally:
                    sys.settrace(self)
                return self.local
            raise KeyboardInterrupt(f"fuzzer interrupt at {self.fired}")
        return self.local

    @staticmethod
    def where(frame, event):
        code = frame.f_code
        return (f"{os.path.relpath(code.co_filename, os.path.dirname(PYGRAD_CODE[:-1]))}:"
                f"{frame.f_lineno} in {code.co_name} ({event}, opcode {frame.f_lasti})")
